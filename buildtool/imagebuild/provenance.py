"""The SLSA provenance a push signs for each dev image (buildtool.attest.provenance_model is the model;
docs/release-trust.md#cell-build-v3 documents what each field means and where it comes from).

What it states comes from what the build used, not from what it meant to use: the pushed image's own labels
and history, engine.build's record of the build (BuildFacts), the cell's files by sha256 as committed now (the
content key covers the build context, so an image reused by content key was built from the same bytes), the
Debian release files its apt step read (buildtool.imagebuild.archive_state) and the tools, each with a
version-pinned URI and a digest where one can be taken. Anything missing is an error naming it: a provenance
with a gap would be a signed guess.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from buildtool.attest.provenance_model import (
    ARCHIVE_PREFIX,
    BASE,
    BUILD_TYPE,
    BUILDER_ID_ENV,
    CACHE_PREFIX,
    INLINE_CACHE,
    LOCK_PREFIX,
    SOURCE,
    TOOL_PREFIX,
    Provenance,
    builder_id_problem,
    local_builder_id,
    parse_provenance,
)
from buildtool.common import docker_cli
from buildtool.common.errors import FailedError, UserError
from buildtool.common.files import sha256_file
from buildtool.contracts import label_keys
from buildtool.contracts.apt_lock_format import APT_LOCK, parse_apt_lock
from buildtool.contracts.image_labels import ImageLabels, LabelError, parse_archive_label
from buildtool.contracts.names import check_full_revision
from buildtool.imagebuild import aptlock, archive_state
from buildtool.imagebuild.archive_state import Fetch, ReleaseFile
from buildtool.imagebuild.bases import MADE_HERE
from buildtool.imagebuild.lock import lock_paths
from buildtool.matrix.plan import CellPlan

TIMEOUT_S = 30   # docker version, dpkg-query, git
NOT_RUN = ("the apt step did not run in this build: its layer came from the build cache (an earlier build's, "
           "whose provenance records the release files it read)")


@dataclass(frozen=True)
class Built:
    """The pushed image as the registry serves it: its config's labels, platform and history."""

    labels: dict[str, str]
    platform: str          # os/architecture[/variant]
    history: tuple[dict[str, Any], ...] = ()


# BuildKit's record of a RUN step's build arguments: `RUN |2 SOURCE_DATE_EPOCH=0 DEBIAN_FRONTEND=... <command>`.
_RUN_ARGS = re.compile(r"^RUN \|\d+ (?:\S+=\S* )*?SOURCE_DATE_EPOCH=(\d+) ")


def steps_source_date_epoch(history: tuple[dict[str, Any], ...]) -> int | None:
    """The SOURCE_DATE_EPOCH the image's RUN steps ran with, as its history records them (BuildKit writes each
    step's build arguments into `created_by`); None when no step had one; FailedError when steps disagree."""
    found = {int(m.group(1)) for h in history if (m := _RUN_ARGS.match(str(h.get("created_by", ""))))}
    if len(found) > 1:
        raise FailedError(f"the image's RUN steps ran with different SOURCE_DATE_EPOCH values "
                          f"({', '.join(map(str, sorted(found)))}): no one value rebuilds it")
    return found.pop() if found else None


@dataclass(frozen=True)
class BuildFacts:
    """How the builder ran the build (engine.build's arguments), for the provenance. `created_epoch`: the commit
    time the push writes into the config's times; `package_indexes`: (URL without credentials, role) of each
    location the build's pip/uv settings named; `archive`: the release files the apt step read (None: not
    observed, the image was not built by this run); `inline_cache`: the digest-pinned reference of the build's
    BuildKit cache kept apart from the image ("" when none)."""

    build_args: dict[str, str]
    secrets: tuple[str, ...]
    network: str
    buildkit: str
    created_epoch: int
    package_indexes: tuple[tuple[str, str], ...] = ()
    cache_from: tuple[str, ...] = ()
    archive: tuple[ReleaseFile, ...] | None = None
    inline_cache: str = ""
    config_rewrite: str = ""
    not_observed: str = field(default="")     # why `archive` is None


def facts_from_build(log_path: Path, image_id: str | None, created_epoch: int, inline_cache: str = "",
                     config_rewrite: tuple[str, ...] = (), fetch: Fetch | None = None) -> BuildFacts:
    """The facts of the build logged at `log_path` (engine.build's record beside it, and the release files its
    apt step read, archive_state), checked to be the build of `image_id` when given (None: the caller pushed
    that build itself); FailedError when there is no record of that build."""
    from buildtool.imagebuild.engine import facts_path, image_record

    # The cell's last build, else the record engine.build kept of this very image (another build of the cell,
    # a later revision or a test beside it, has replaced the cell's files since).
    kept = image_record(log_path.parent, image_id) if image_id else None
    if kept is not None and kept[0].is_file() and not _records(facts_path(log_path), image_id):
        facts_file, log_path = kept
    else:
        facts_file = facts_path(log_path)
    try:
        data = json.loads(facts_file.read_text())
        log_text = log_path.read_text(errors="replace")
    except (OSError, ValueError):
        raise FailedError(f"no record of the build of {(image_id or 'the image')[:19]} at {facts_file}: "
                          "rebuild it with `buildtool build --force --push` to state how it was built") from None
    record = _build_record(facts_file, data, image_id)
    began = datetime.fromtimestamp(record.started, UTC)
    # No release file fetched: the apt step did not run in this build, its layer came from the build cache
    # (this engine's, or a cache source's, which the provenance names; that image's provenance has them).
    archive = tuple(archive_state.observe(log_text, began, fetch))
    return BuildFacts(build_args=record.build_args, secrets=tuple(record.secrets), network=record.network,
                      buildkit=record.buildkit, created_epoch=created_epoch, cache_from=tuple(record.cache_from),
                      package_indexes=tuple((i.url, i.role) for i in record.package_indexes),
                      archive=archive or None, inline_cache=inline_cache, config_rewrite=", ".join(config_rewrite),
                      not_observed="" if archive else NOT_RUN)


class _PackageIndex(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    url: str
    role: str


class _BuildRecord(BaseModel):
    """The fields of engine.build's record that the provenance states (the rest is ignored)."""
    model_config = ConfigDict(extra="ignore", strict=True)
    image: str
    build_args: dict[str, str]
    secrets: list[str]
    network: str
    buildkit: str
    cache_from: list[str]
    started: int
    package_indexes: list[_PackageIndex]


def _build_record(facts_file: Path, data: Any, image_id: str | None) -> _BuildRecord:
    """engine.build's record `data` read from `facts_file`, checked to be of `image_id` (None: any) and whole
    before anything is fetched; FailedError naming the file and the field that is missing or wrong."""
    rebuild = "rebuild with `buildtool build --force --push`"
    if not isinstance(data, dict):
        raise FailedError(f"{facts_file} is not a build record (a JSON object, not {type(data).__name__}): {rebuild}")
    if image_id is not None and data.get("image") != image_id:
        raise FailedError(f"{facts_file} records the build of {data.get('image')}, not {image_id}: {rebuild}")
    if "package_indexes" not in data:
        raise FailedError(f"{facts_file} is a record of an older buildtool (it names no package indexes): {rebuild}")
    try:
        return _BuildRecord.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        field_name = ".".join(str(part) for part in error["loc"])
        raise FailedError(f"{facts_file}: field {field_name!r} of the build record: {error['msg'].lower()}: "
                          f"{rebuild}") from None


def _records(facts_file: Path, image_id: str | None) -> bool:
    """Whether `facts_file` is the record of the build of `image_id`."""
    try:
        return json.loads(facts_file.read_text()).get("image") == image_id
    except (OSError, ValueError, AttributeError):
        return False


def builder_id(keyid: str) -> str:
    """DL_IMAGES_BUILDER_ID (a CI run's URL, checked to be an https URI), else the documented id of a machine
    holding builder key `keyid` (contracts.provenance.local_builder_id)."""
    named = os.environ.get(BUILDER_ID_ENV, "").strip()
    if not named:
        return local_builder_id(keyid)
    problem = builder_id_problem(named)
    if problem:
        raise UserError(f"{BUILDER_ID_ENV}: {problem}")
    return named


def rfc3339(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


@lru_cache(maxsize=1)
def docker_versions() -> tuple[str, str]:
    """(client version, engine version) of the docker the builds run with; FailedError when unknown."""
    proc = docker_cli.docker("version", "--format", "{{json .}}", timeout=TIMEOUT_S)
    try:
        data = json.loads(proc.stdout)
        client, server = str(data["Client"]["Version"]), str(data["Server"]["Version"])
    except (ValueError, KeyError, TypeError):
        raise FailedError(f"cannot read the docker client and engine versions from `docker version` "
                          f"({(proc.stderr or proc.stdout).strip()[:200]!r})") from None
    return client, server


def client_binary() -> str:
    """The docker client the builds run (DOCKER_CLIENT's choice, buildtool.common.docker_cli)."""
    return docker_cli.resolve(docker_cli.setting())


def _stdout(argv: list[str]) -> str:
    """stdout of a short local command; "" when it cannot run, runs past TIMEOUT_S or exits non-zero."""
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return run.stdout if run.returncode == 0 else ""


def deb_owner(path: str) -> tuple[str, str, str] | None:
    """(package, version, architecture) of the Debian package that installed `path`; None when dpkg has
    no record of it (not a Debian system, or a binary installed another way)."""
    package = _stdout(["dpkg-query", "-S", path]).split(":", 1)[0].strip()
    if not package:
        return None
    version, _, arch = _stdout(["dpkg-query", "-W", "-f", "${Version} ${Architecture}", package]).strip().partition(" ")
    return (package, version, arch) if version and arch else None


def deb_purl(package: str, version: str, arch: str) -> str:
    from packageurl import PackageURL

    return str(PackageURL("deb", namespace="debian", name=package, version=version, qualifiers={"arch": arch}))


def tools(root: Path) -> list[dict[str, Any]]:
    """The tools of the build that are not this repository: the docker client (its binary's sha256, and its
    Debian package's purl or a generic version-pinned purl), the engine (its Debian package when the engine
    runs this machine's dockerd of that version, else a generic purl) and uv (PyPI purl, its lock's sha256)."""
    from buildtool.contracts.locks import UV_LOCK
    from buildtool.render.dockerfiles import TemplateError, uv_pin

    client, server = docker_versions()
    binary = client_binary()
    owner = deb_owner(binary)
    client_uri = deb_purl(*owner) if owner else f"pkg:generic/docker-cli@{client}"
    engine = deb_owner(shutil.which("dockerd") or "/usr/sbin/dockerd")
    # Debian's docker.io says 20.10.24+dfsg1 as the engine's version and 20.10.24+dfsg1-1+deb12u1+b6 as the package's.
    engine_uri = deb_purl(*engine) if engine and engine[1].startswith(f"{server}-") else \
        f"pkg:generic/docker-engine@{server}"
    uv_lock = root / "templates" / UV_LOCK
    try:
        uv = uv_pin(root / "templates")["version"]
    except TemplateError as exc:
        raise FailedError(str(exc)) from None
    return [
        {"name": f"{TOOL_PREFIX}docker-client", "uri": client_uri, "digest": {"sha256": sha256_file(Path(binary))},
         "annotations": {"version": client, "path": binary}},
        {"name": f"{TOOL_PREFIX}docker-engine", "uri": engine_uri,
         "annotations": {"version": server, "buildkit": "the engine's own (Docker 20.10: BuildKit v0.8)"
                         if server.startswith("20.10") else "the engine's own"}},
        {"name": f"{TOOL_PREFIX}uv", "uri": f"pkg:pypi/uv@{uv}", "digest": {"sha256": sha256_file(uv_lock)},
         "annotations": {"version": uv, "lock": f"templates/{UV_LOCK}"}},
    ]


def buildtool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dl-images-buildtool")
    except PackageNotFoundError:
        raise FailedError("buildtool's own version is unknown (dl-images-buildtool is not installed: run "
                          "`bash scripts/setup.sh`)") from None


def git_ref(root: Path) -> str:
    """The ref the checkout is on (refs/heads/main), "" when detached or not a git checkout."""
    return _stdout(["git", "-C", str(root), "symbolic-ref", "-q", "HEAD"]).strip()


def source_descriptor(source: str, revision: str, ref: str) -> dict[str, Any]:
    """The source as a resolved dependency (SLSA's form: git+<URL>@<ref>, digest gitCommit); a revision built
    from a dirty tree (`<commit>-dirty.<hash>`) says so in an annotation."""
    if not source.startswith(("https://", "http://", "ssh://", "git://", "file://")):
        raise FailedError(f"the image's {label_keys.OCI_SOURCE} label {source!r} is no repository URL (matrix.yaml "
                          "`source`): the provenance names the source as git+<URL>@<ref>")
    commit, _, dirty = revision.partition("-dirty.")
    descriptor: dict[str, Any] = {"name": SOURCE, "uri": f"git+{source}@{ref or commit}",
                                  "digest": {"gitCommit": commit}}
    if dirty:
        descriptor["annotations"] = {"dirty": dirty}
    return descriptor


def base_descriptor(labels: ImageLabels, upstream: str, base_hex: str) -> dict[str, Any]:
    """The base as the build pulled it (by tag and digest), with what an outsider needs: the upstream it stands
    for (by digest too where the base is a copy of it: made elsewhere, a mirror's copy keeps the digest), and for
    a base made here its recipe and the archive state it was made from, which remake it (the same digest)."""
    annotations: dict[str, Any] = {"standin": bool(labels.standin_keys), "upstream": upstream}
    made = labels.base_source.startswith(MADE_HERE)
    if labels.base_source:
        annotations["madeBy"] = labels.base_source
    if labels.base_archive:
        uri, sha256, date = parse_archive_label(labels.base_archive)
        annotations["archive"] = {"uri": uri, "sha256": sha256, "date": date}
    if not made and not labels.standin_keys:
        annotations["upstreamDigest"] = f"sha256:{base_hex}"
    name = labels.base_name.rpartition("@")[0] or labels.base_name
    return {"name": BASE, "uri": f"oci://{name}@sha256:{base_hex}", "digest": {"sha256": base_hex},
            "annotations": annotations}


CONTEXT = "context"


def context_descriptor(root: Path, folder: str, source_uri: str) -> dict[str, Any]:
    """The build context (the Dockerfile's folder, what the build sent) as a resolved dependency: its files by
    sha256, one digest over `sha256  path` lines sorted by path (sha256sum's form), the folder within the source."""
    base = root / folder
    lines = [f"{sha256_file(path)}  {path.relative_to(base).as_posix()}\n"
             for path in sorted(p for p in base.rglob("*") if p.is_file())]
    if not lines:
        raise FailedError(f"the build context {folder} holds no file")
    digest = hashlib.sha256("".join(lines).encode()).hexdigest()
    return {"name": CONTEXT, "uri": f"{source_uri}#{folder}", "digest": {"sha256": digest},
            "annotations": {"files": len(lines), "listing": "sha256sum of every file, sorted by path"}}


def lock_descriptor(root: Path, path: Path) -> dict[str, Any]:
    """A lock file by sha256; an apt.lock names the base it was resolved in (its header's `resolved-in`)."""
    descriptor: dict[str, Any] = {"name": f"{LOCK_PREFIX}{path.relative_to(root)}",
                                  "digest": {"sha256": sha256_file(path)}}
    if path.name == APT_LOCK:
        try:
            descriptor["annotations"] = {"resolvedIn": parse_apt_lock(path.read_text()).header["resolved-in"]}
        except ValueError as exc:
            raise FailedError(f"{path.relative_to(root)}: {exc}") from None
    return descriptor


def archive_descriptors(facts: BuildFacts) -> list[dict[str, Any]]:
    return [{"name": f"{ARCHIVE_PREFIX}{f.uri}", "uri": f.uri, "digest": {"sha256": f.sha256},
             "annotations": {"date": f.date, "publishedDuringBuild": f.published_during_build}}
            for f in facts.archive or ()]


def cache_descriptors(facts: BuildFacts) -> list[dict[str, Any]]:
    found = []
    for n, ref in enumerate(facts.cache_from, 1):
        algorithm, _, hexdigest = ref.rpartition("@")[2].partition(":")
        if algorithm != "sha256" or len(hexdigest) != 64:
            raise FailedError(f"cache source {ref!r} is not pinned by a sha256 digest")
        found.append({"name": f"{CACHE_PREFIX}{n}", "uri": f"oci://{ref}", "digest": {"sha256": hexdigest}})
    return found


def make_provenance(root: Path, matrix_path: Path, plan: CellPlan, built: Built, window: tuple[datetime, datetime],
                    tool_list: list[dict[str, Any]], facts: BuildFacts, builder_keyid: str) -> Provenance:
    """The provenance of `plan`'s pushed image, built between `window`'s (started, finished); FailedError naming
    what is missing or malformed."""
    started, finished = window
    cell = plan.cell
    try:
        labels = ImageLabels.parse(built.labels)
    except LabelError as exc:
        raise FailedError(f"{plan.dev_ref}: {exc}") from None
    try:
        revision = check_full_revision(labels.revision)
    except ValueError as exc:
        raise FailedError(f"{plan.dev_ref}: {label_keys.OCI_REVISION}: {exc}") from None
    algorithm, _, base_hex = labels.base_digest.partition(":")
    if algorithm != "sha256" or len(base_hex) != 64 or not labels.base_name:
        raise FailedError(f"{plan.dev_ref} names no base by name and sha256 digest ({label_keys.OCI_BASE_NAME}="
                          f"{labels.base_name!r}, {label_keys.OCI_BASE_DIGEST}={labels.base_digest!r}); rebuild it "
                          "with `buildtool build --force --push`")
    if labels.cell and labels.cell != cell.key:
        raise FailedError(f"{plan.dev_ref} is labelled {label_keys.CELL}={labels.cell}, not {cell.key}")
    # The Python locks, and for a cell with an apt step its apt lock, the base's package list it sits on and
    # the .debs' hashes (a multi-platform cell: the built platform's).
    platform = built.platform if cell.multi_platform else None
    apt = ((*aptlock.paths(root, cell, platform), aptlock.hashes_path(root, cell, platform))
           if aptlock.has_apt_step(cell) else ())
    files = [*lock_paths(root, cell, platform).values(), *apt]
    try:
        locks = [lock_descriptor(root, path) for path in files]
    except OSError as exc:
        raise UserError(f"{exc.filename}: cannot be read ({exc.strerror}); run `make lock FRAMEWORK={cell.key}`") \
            from None
    try:
        matrix_digest = "sha256:" + sha256_file(matrix_path)
    except OSError as exc:
        raise UserError(f"the matrix {matrix_path} cannot be read ({exc.strerror})") from None
    source = source_descriptor(labels.source, revision, git_ref(root))
    context = Path(cell.dockerfile).parent.as_posix()
    ours = buildtool_version()
    buildtool = {"name": f"{TOOL_PREFIX}buildtool", "uri": source["uri"], "digest": dict(source["digest"]),
                 "annotations": {"version": ours}}
    internal: dict[str, Any] = {"buildkit": facts.buildkit, "configRewrite": facts.config_rewrite}
    if facts.archive is None and aptlock.has_apt_step(cell):
        internal["aptArchive"] = f"not observed: {facts.not_observed or 'the image was not built by this run'}"
    predicate = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"cell": cell.key, "matrix_digest": matrix_digest, "revision": revision,
                                   "source": labels.source, "dockerfile": cell.dockerfile, "context": context,
                                   "platform": built.platform, "buildArgs": dict(sorted(facts.build_args.items())),
                                   "sourceDateEpoch": steps_source_date_epoch(built.history),
                                   "createdEpoch": facts.created_epoch, "secrets": sorted(facts.secrets),
                                   "network": facts.network,
                                   "packageIndexes": [{"url": u, "role": r} for u, r in facts.package_indexes]},
            "internalParameters": internal,
            "resolvedDependencies": [source, base_descriptor(labels, labels.base_upstream or cell.base, base_hex),
                                     context_descriptor(root, context, source["uri"]),
                                     *locks, *tool_list, buildtool, *archive_descriptors(facts),
                                     *cache_descriptors(facts)],
        },
        "runDetails": {
            "builder": {"id": builder_id(builder_keyid), "version": {"buildtool": ours}},
            "metadata": {"invocationId": f"urn:uuid:{uuid.uuid4()}", "startedOn": rfc3339(started),
                         "finishedOn": rfc3339(finished)},
            "byproducts": ([{"name": INLINE_CACHE, "uri": f"oci://{facts.inline_cache}",
                             "digest": {"sha256": facts.inline_cache.rpartition("@sha256:")[2]}}]
                           if facts.inline_cache else []),
        },
    }
    return parse_provenance(predicate, f"the provenance made for {plan.dev_ref}")
