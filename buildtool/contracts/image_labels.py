"""An image's labels as one typed object: parsed from the dict an engine or a registry returns, and
written back to one. Keys come from label_keys; the values that carry structure are parsed here:

- the run profile (JSON: shm_size in the one size grammar, ipc, ulimits, gpus, docker_flags),
- the locked packages (JSON object name -> version) and the per-package labels,
- the test groups (a comma list), the stand-in flag (`true` or `false`),
- the archive state a base was made from (`<InRelease URL> sha256:<hex> <Date, RFC 3339>`, archive_label).

A value that does not parse is a LabelError naming the key and the value, never a default. An empty
value states nothing: Docker cannot remove a label in a derived image, only empty it (`LABEL k=""`), so
its field is left unset, and the key is kept in `emptied` (a stand-in key emptied is still a stand-in
key). Labels this type has no field for are kept in `other`, so `ImageLabels.parse(d).to_dict() == d`
for every dict that parses (JSON labels in the builder's spelling: sorted keys, compact).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from buildtool.common.sizes import SizeError, parse_size
from buildtool.contracts import label_keys


class LabelError(ValueError):
    """A label whose value does not parse; the message names the key and the value."""


_ARCHIVE = re.compile(r"(https?://\S+/dists/[A-Za-z0-9.-]+/InRelease) sha256:([0-9a-f]{64}) "
                      r"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z)")


def archive_label(uri: str, sha256: str, date: str) -> str:
    """The BASE_ARCHIVE value of a base made from the release file `uri` (its sha256 and Date)."""
    value = f"{uri} sha256:{sha256} {date}"
    parse_archive_label(value)
    return value


def parse_archive_label(value: str) -> tuple[str, str, str]:
    """(InRelease URL, sha256 hex, Date) of a BASE_ARCHIVE value; LabelError naming it otherwise."""
    match = _ARCHIVE.fullmatch(value)
    if match is None:
        raise LabelError(f"label {label_keys.BASE_ARCHIVE}={value[:120]!r} is not `<InRelease URL> sha256:<hex> "
                         "<Date>`")
    return match.group(1), match.group(2), match.group(3)


def _compact(data: object) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _json_object(key: str, text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise LabelError(f"label {key}={text[:80]!r} is not a JSON object")
    return data


@dataclass(frozen=True)
class RunProfile:
    """The `docker run` settings an image was built for (label_keys.RUN_PROFILE)."""

    shm_size: str
    ipc: str | None = None
    ulimits: tuple[tuple[str, int], ...] | None = None
    gpus: str | None = None
    docker_flags: tuple[str, ...] | None = None

    @classmethod
    def from_json(cls, text: str, key: str = label_keys.RUN_PROFILE) -> RunProfile:
        data = _json_object(key, text)
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise LabelError(f"label {key} has the unknown field {unknown[0]!r} ({text[:80]!r})")
        shm = data.get("shm_size")
        try:
            parse_size(shm)
        except SizeError as exc:
            raise LabelError(f"label {key}: shm_size {exc}") from None
        for name in ("ipc", "gpus"):
            if data.get(name) is not None and not isinstance(data[name], str):
                raise LabelError(f"label {key}: {name} {data[name]!r} is not text")
        ulimits = data.get("ulimits")
        if ulimits is not None and (not isinstance(ulimits, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in ulimits.values())):
            raise LabelError(f"label {key}: ulimits {ulimits!r} is not an object of whole numbers")
        flags = data.get("docker_flags")
        if flags is not None and (not isinstance(flags, list) or not all(isinstance(f, str) for f in flags)):
            raise LabelError(f"label {key}: docker_flags {flags!r} is not a list of text")
        return cls(shm_size=str(shm), ipc=data.get("ipc"), gpus=data.get("gpus"),
                   ulimits=None if ulimits is None else tuple(sorted((str(k), v) for k, v in ulimits.items())),
                   docker_flags=None if flags is None else tuple(flags))

    def to_json(self) -> str:
        data = {**asdict(self), "ulimits": None if self.ulimits is None else dict(self.ulimits)}
        return _compact({k: v for k, v in data.items() if v is not None})


def _text(key: str) -> Any:
    """A field of a label that is plain text: its key rides in the field's metadata (TEXT_FIELDS)."""
    return field(default="", metadata={"key": key})


_STRUCTURED = frozenset({label_keys.TESTS, label_keys.RUN_PROFILE, label_keys.PACKAGES, label_keys.STANDIN})


@dataclass(frozen=True)
class ImageLabels:
    cell: str = _text(label_keys.CELL)
    framework: str = _text(label_keys.FRAMEWORK)
    framework_version: str = _text(label_keys.FRAMEWORK_VERSION)
    python: str = _text(label_keys.PYTHON)
    accelerator: str = _text(label_keys.ACCELERATOR)
    cuda: str = _text(label_keys.CUDA)
    run_flags: str = _text(label_keys.RUN_FLAGS)
    title: str = _text(label_keys.OCI_TITLE)
    description: str = _text(label_keys.OCI_DESCRIPTION)
    version: str = _text(label_keys.OCI_VERSION)
    source: str = _text(label_keys.OCI_SOURCE)
    revision: str = _text(label_keys.OCI_REVISION)
    created: str = _text(label_keys.OCI_CREATED)
    base_name: str = _text(label_keys.OCI_BASE_NAME)
    base_digest: str = _text(label_keys.OCI_BASE_DIGEST)
    base_upstream: str = _text(label_keys.BASE_UPSTREAM)
    authors: str = _text(label_keys.OCI_AUTHORS)
    url: str = _text(label_keys.OCI_URL)
    documentation: str = _text(label_keys.OCI_DOCUMENTATION)
    vendor: str = _text(label_keys.OCI_VENDOR)
    licenses: str = _text(label_keys.OCI_LICENSES)
    base_ref: str = _text(label_keys.BASE_REF)
    base_source: str = _text(label_keys.BASE_SOURCE)
    base_archive: str = _text(label_keys.BASE_ARCHIVE)
    content_key: str = _text(label_keys.CONTENT_KEY)
    build_base_digest: str = _text(label_keys.BUILD_BASE_DIGEST)
    standin_framework: str = _text(label_keys.STANDIN_FRAMEWORK)
    standin_python: str = _text(label_keys.STANDIN_PYTHON)
    standin_for: str = _text(label_keys.STANDIN_FOR)
    tests: tuple[str, ...] = ()
    run_profile: RunProfile | None = None
    packages: Mapping[str, str] | None = None         # the locks' packages; None: the image states none
    package_labels: Mapping[str, str] = field(default_factory=dict)   # one label per package (older images)
    standin: bool | None = None                       # the stand-in flag itself; None: absent
    other: Mapping[str, str] = field(default_factory=dict)   # labels this type has no field for
    emptied: tuple[str, ...] = ()                     # keys present with an empty value

    @classmethod
    def parse(cls, labels: Mapping[str, str]) -> ImageLabels:
        """LabelError naming the key for a value that does not parse."""
        present = {k: v for k, v in labels.items() if v != ""}
        values: dict[str, Any] = {name: present.get(key, "") for name, key in TEXT_FIELDS.items()}
        if label_keys.TESTS in present:
            groups = tuple(present[label_keys.TESTS].split(","))
            if not all(g.strip() == g and g for g in groups):
                raise LabelError(f"label {label_keys.TESTS}={present[label_keys.TESTS]!r} is not a comma list "
                                 "of test groups")
            values["tests"] = groups
        if label_keys.RUN_PROFILE in present:
            values["run_profile"] = RunProfile.from_json(present[label_keys.RUN_PROFILE])
        if label_keys.PACKAGES in present:
            packages = _json_object(label_keys.PACKAGES, present[label_keys.PACKAGES])
            if not all(isinstance(v, str) for v in packages.values()):
                raise LabelError(f"label {label_keys.PACKAGES}: every version must be text "
                                 f"({present[label_keys.PACKAGES][:80]!r})")
            values["packages"] = dict(sorted(packages.items()))
        if label_keys.BASE_ARCHIVE in present:
            parse_archive_label(present[label_keys.BASE_ARCHIVE])
        if label_keys.STANDIN in present:
            values["standin"] = standin_flag(present)
        known = set(TEXT_FIELDS.values()) | _STRUCTURED
        values["package_labels"] = {k.removeprefix(label_keys.PACKAGE_PREFIX): v for k, v in sorted(present.items())
                                    if k.startswith(label_keys.PACKAGE_PREFIX)}
        values["other"] = {k: v for k, v in sorted(present.items())
                           if k not in known and not k.startswith(label_keys.PACKAGE_PREFIX)}
        values["emptied"] = tuple(sorted(k for k, v in labels.items() if v == ""))
        return cls(**values)

    def to_dict(self) -> dict[str, str]:
        out = {key: getattr(self, name) for name, key in TEXT_FIELDS.items() if getattr(self, name)}
        if self.tests:
            out[label_keys.TESTS] = ",".join(self.tests)
        if self.run_profile is not None:
            out[label_keys.RUN_PROFILE] = self.run_profile.to_json()
        if self.packages is not None:
            out[label_keys.PACKAGES] = _compact(dict(self.packages))
        if self.standin is not None:
            out[label_keys.STANDIN] = "true" if self.standin else "false"
        out.update({f"{label_keys.PACKAGE_PREFIX}{name}": v for name, v in self.package_labels.items()})
        out.update(self.other)
        out.update({key: "" for key in self.emptied})
        return dict(sorted(out.items()))

    @property
    def standin_keys(self) -> list[str]:
        """label_keys.standin_keys of its labels: every stand-in key, an emptied one too (issue 11)."""
        return label_keys.standin_keys(self.to_dict())


def standin_flag(labels: Mapping[str, str]) -> bool:
    """The stand-in flag, the one reading of it: `true` or `false` as the builder writes it; absent or empty, no flag
    (False); any other value (`True`, `yes`) a LabelError naming the label, never read as "not a stand-in"."""
    flag = labels.get(label_keys.STANDIN, "")
    if flag not in ("", "true", "false"):
        raise LabelError(f"label {label_keys.STANDIN}={flag!r} is neither true nor false")
    return flag == "true"


# Field -> key of every label that is plain text.
TEXT_FIELDS = {f.name: f.metadata["key"] for f in fields(ImageLabels) if "key" in f.metadata}
