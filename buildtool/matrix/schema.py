"""The version matrix: schema, loader and the cells it expands to.

`matrix.yaml` declares images; each image has one or more versions, and a cell is one
image at one version. Values are declared once and inherited: `defaults` < image < version.
Mappings merge key by key (so a version can change one package pin); lists and scalars
replace. Every error names file, line and key, and nothing is written before the matrix
is known to be good.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, get_args, get_origin

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from buildtool.common.errors import MatrixError, UserError
from buildtool.common.sizes import size_bytes
from buildtool.contracts import frameworks, platforms, runprofile, sitetests
from buildtool.matrix import values
from buildtool.matrix.yamlsource import Loc, Located, dotted, load_yaml, paused_gc

SCHEMA_VERSION = values.SCHEMA_VERSION
UlimitName = Literal["memlock", "stack", "nofile", "nproc", "core", "fsize", "cpu", "as", "data", "rss", "rtprio",
                     "sigpending"]


def _known_framework(value: str) -> str:
    if value not in frameworks.names():
        raise ValueError(f"unknown framework {value!r}; one of {', '.join(frameworks.names()) or '(none)'} "
                         "(a new one is a folder image-tests/<name>/ with its framework.yaml)"
                         f"{values.suggest(value, frameworks.names())}")
    return value


def _known_group(value: str, info: ValidationInfo) -> str:
    """A group the framework table knows, and (when the image-tests folder is known) a folder of it."""
    groups = frameworks.test_groups()
    if value not in groups:
        raise ValueError(f"unknown test group {value!r}; one of {', '.join(groups)}{values.suggest(value, groups)}")
    context = info.context or {}
    tests_dir: Path | None = context.get("tests_dir")
    if tests_dir is None:
        return value
    seen: dict[str, bool] = context.setdefault("groups_seen", {})   # one look per group, not per cell
    if value not in seen:
        seen[value] = (tests_dir / value).is_dir()
    if not seen[value]:
        shown = context.get("tests_display") or str(tests_dir)
        raise ValueError(f"test group {value!r} has no folder {shown}/{value}/; add the group's tests there, or "
                         "remove it from tests")
    return value


# Each string field checked by one of `values`' grammars (or the framework table, which can grow).
FrameworkName = Annotated[StrictStr, AfterValidator(_known_framework)]
TestGroup = Annotated[StrictStr, AfterValidator(_known_group)]
ImageRef = Annotated[StrictStr, AfterValidator(values.reference)]
PinnedRequirement = Annotated[StrictStr, AfterValidator(values.requirement)]
PackageName = Annotated[StrictStr, AfterValidator(values.dist_name)]
PackageVersion = Annotated[StrictStr, AfterValidator(values.version)]
AptPackage = Annotated[StrictStr, AfterValidator(values.apt_package)]
IndexUrl = Annotated[StrictStr, AfterValidator(values.index_url)]
TagTemplate = Annotated[StrictStr, AfterValidator(values.tag_template)]
OneLine = Annotated[StrictStr, AfterValidator(values.one_line)]
PythonVersion = Annotated[StrictStr, AfterValidator(values.python_version)]
WorkDir = Annotated[StrictStr, AfterValidator(values.workdir)]
CellVersion = Annotated[StrictStr, AfterValidator(values.cell_version)]
ImageName = Annotated[StrictStr, AfterValidator(values.image_name)]
SourceUrl = Annotated[StrictStr, AfterValidator(values.source_url)]
WebUrl = Annotated[StrictStr, AfterValidator(values.web_url)]
SpdxExpression = Annotated[StrictStr, AfterValidator(values.spdx_expression)]


def _known_platform(value: str) -> str:
    try:
        return platforms.get(value).name
    except platforms.UnknownPlatform as exc:
        raise ValueError(f"{exc}{values.suggest(value, list(platforms.KNOWN))}") from None


PlatformName = Annotated[StrictStr, AfterValidator(_known_platform)]


def _library_version(value: str) -> str:
    from buildtool.contracts.nvlibs import parse_promise

    parse_promise(value)
    return value


LibraryVersion = Annotated[StrictStr, AfterValidator(_library_version)]
ShmSize = Annotated[Any, PlainValidator(values.shm_size)]
UlimitValue = Annotated[Any, PlainValidator(values.ulimit)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class RunProfile(_Strict):
    """How the image must be run: the flags users pass to `docker run` and the tests use."""

    shm_size: ShmSize | None = None
    ipc: Literal["private", "host", "shareable"] | None = None
    ulimits: dict[UlimitName, UlimitValue] | None = None
    gpus: Literal["none", "all"] | None = None


class PackageIndex(_Strict):
    """Public package index settings a cell needs. Host secrets (CA, tokens) never go here."""

    url: IndexUrl | None = None
    extra_urls: list[IndexUrl] | None = None


class ReleaseTags(_Strict):
    """Tag templates for `<name>:<tag>`; `{version}` is the cell version, `{release}` the release."""

    tags: list[TagTemplate] | None = None
    moving: list[TagTemplate] | None = None


class OciLabels(_Strict):
    """OCI labels every image of a layer carries (label_keys.OCI_FROM_MATRIX); a mapping, so an image or a
    version overrides one key and keeps the rest."""

    authors: OneLine | None = None
    url: WebUrl | None = None
    documentation: WebUrl | None = None
    vendor: OneLine | None = None
    licenses: SpdxExpression | None = None


class NvidiaLibraries(_Strict):
    """The cuDNN and NCCL the base promises, and the page that says so (an NGC release's notes):
    image-tests/common/test_nvidia_libraries.py compares them with what the image's libraries report."""

    cudnn: LibraryVersion
    nccl: LibraryVersion
    source: WebUrl


class StandIn(_Strict):
    """A local stand-in for an unreachable base (test fixture, never released)."""

    base: ImageRef
    requirements: Annotated[list[PinnedRequirement], Field(min_length=1)]
    # A platform whose stand-in carries other requirements (PyPI has another build of the framework there).
    platform_requirements: dict[PlatformName, Annotated[list[PinnedRequirement], Field(min_length=1)]] = Field(
        default_factory=dict)
    workdir: WorkDir = "/workspace"

    def __hash__(self) -> int:   # a Cell (frozen, hashed) holds it; a dict field is not hashable as it is
        return hash((self.base, tuple(self.requirements), self.workdir,
                     tuple(sorted((k, tuple(v)) for k, v in self.platform_requirements.items()))))

    def requirements_for(self, platform: str) -> list[str]:
        """What the stand-in of `platform` installs: its own requirements, else the common ones."""
        return list(self.platform_requirements.get(platform, self.requirements))


class StandInFields(_Strict):
    """A layer's part of a stand-in (defaults, image or version): merged key by key, then checked whole
    as a StandIn, so a version can add one platform's requirements."""

    base: ImageRef | None = None
    requirements: Annotated[list[PinnedRequirement], Field(min_length=1)] | None = None
    platform_requirements: dict[PlatformName, Annotated[list[PinnedRequirement], Field(min_length=1)]] | None = None
    workdir: WorkDir | None = None


# -- validate: how long the image tests of a cell may take (issue 14) ----------------------------
class ValidateSettings(_Strict):
    """How `buildtool validate` runs this cell's image tests."""

    # The whole image's budget: every probe is cut to what is left of it, a hang fails the step
    # that hung, and validation goes on with the next image.
    deadline_s: StrictInt | None = None
    # An emulated platform (arm64 under QEMU on an amd64 runner) runs the same tests this many times slower:
    # its deadline is deadline_s times this. Required where a cell has more than one platform.
    emulation_factor: StrictInt | None = None
    # A site's own checks (contracts.sitetests): a folder beside the matrix, run as one more test group named after
    # it; release takes only verdicts that ran it.
    extra_tests: StrictStr | None = None

    @field_validator("extra_tests")
    @classmethod
    def _extra_tests(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        path = PurePosixPath(value)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise ValueError(f"{value!r} must be a folder beside the matrix (a relative path without ..)")
        context = info.context or {}
        where: Path | None = context.get("matrix_dir")
        if where is not None:
            wrong = sitetests.problem(where / path, context.get("tests_dir"))
            if wrong:
                raise ValueError(wrong)
        return str(path)

    @field_validator("emulation_factor")
    @classmethod
    def _factor(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= MAX_EMULATION_FACTOR:
            raise ValueError(f"must be between 1 and {MAX_EMULATION_FACTOR} (got {value})")
        return value

    @field_validator("deadline_s")
    @classmethod
    def _deadline(cls, value: int | None) -> int | None:
        if value is not None and not 60 <= value <= runprofile.MAX_DEADLINE_S:
            raise ValueError(f"must be between 60 and {runprofile.MAX_DEADLINE_S} seconds (got {value})")
        return value


MAX_EMULATION_FACTOR = 20


def deadline_for(merged: dict[str, Any]) -> int:
    """The cell's deadline: its own, or the default for its accelerator (`merged` holds the
    matrix's own keys: `validate`)."""
    own = (merged.get("validate") or {}).get("deadline_s")
    return int(own or runprofile.DEFAULT_DEADLINE_S.get(merged.get("accelerator", "cpu"), 480))
# -- end of the validate block ------------------------------------------------------------------


class CellFields(_Strict):
    """Fields a cell may take; every one may be set in defaults, image or version."""

    framework: FrameworkName | None = None
    accelerator: Literal["cpu", "cuda"] | None = None
    template: StrictStr | None = None
    base: ImageRef | None = None
    standin: StandInFields | None = None
    python: PythonVersion | None = None
    framework_version: PackageVersion | None = None
    framework_requirements: list[PinnedRequirement] | None = None
    packages: dict[PackageName, PackageVersion] | None = None
    apt_packages: list[AptPackage] | None = None
    index: PackageIndex | None = None
    run: RunProfile | None = None
    tests: list[TestGroup] | None = None
    use: OneLine | None = None
    oci: OciLabels | None = None
    release: ReleaseTags | None = None
    # The platforms the cell's image index holds (os/arch); one Dockerfile builds each (BuildKit TARGETARCH).
    platforms: Annotated[list[PlatformName], Field(min_length=1)] | None = None
    validate_: ValidateSettings | None = Field(default=None, alias="validate")  # `validate` would shadow BaseModel's
    # GPU fields (see the GPU block below): the CUDA of a GPU cell. busbw_floor_GBps is kept only to be
    # refused by name (floors moved to buildtool/contracts/busbw.py).
    cuda: StrictStr | None = None
    busbw_floor_GBps: Any = None
    libraries: NvidiaLibraries | None = None

    @field_validator("template")
    @classmethod
    def _template(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Inside templates/ (and there, when the folder is known): checked at the matrix's line."""
        if value is None:
            return value
        context = info.context or {}
        seen: dict[str, str] = context.setdefault("templates_seen", {})
        if value not in seen:
            seen[value] = values.template_path(value, context.get("templates_dir"))
        return seen[value]


class VersionSpec(CellFields):
    version: CellVersion
    default: StrictBool = False


class ImageSpec(CellFields):
    name: ImageName
    versions: Annotated[list[VersionSpec], Field(min_length=1)]


class MatrixFile(_Strict):
    schema_: Annotated[Any, PlainValidator(values.schema_version)] = Field(alias="schema")
    source: SourceUrl
    defaults: CellFields = CellFields()
    images: Annotated[list[ImageSpec], Field(min_length=1)]


@dataclass(frozen=True)
class Run:
    shm_size: str
    ipc: str
    ulimits: tuple[tuple[str, int], ...]
    gpus: str

    @property
    def shm_bytes(self) -> int:
        return size_bytes(self.shm_size)

    def docker_flags(self) -> list[str]:
        """The `docker run` flags this profile means, in a stable order."""
        flags = [f"--shm-size={self.shm_size}"]
        if self.ipc != "private":
            flags.append(f"--ipc={self.ipc}")
        flags += [f"--ulimit={name}={value}" for name, value in self.ulimits]
        if self.gpus != "none":
            flags.append(f"--gpus={self.gpus}")
        return flags


@dataclass(frozen=True)
class Cell:
    """One image at one version, with everything inherited filled in."""

    name: str
    version: str
    default: bool
    framework: str
    accelerator: str
    template: str
    base: str
    standin: StandIn | None
    python: str
    framework_version: str
    framework_requirements: tuple[str, ...]
    packages: tuple[tuple[str, str], ...]
    apt_packages: tuple[str, ...]
    index_url: str | None
    extra_index_urls: tuple[str, ...]
    run: Run
    tests: tuple[str, ...]
    use: str
    release_tags: tuple[str, ...]
    moving_tags: tuple[str, ...]
    line: int
    validate_deadline_s: int = runprofile.DEFAULT_DEADLINE_S["cpu"]
    extra_tests: str | None = None                          # the site's own checks: a folder beside the matrix
    cuda: str | None = None                                 # GPU cells: the CUDA the image is built for
    oci: tuple[tuple[str, str], ...] = ()                   # (key of OciLabels, value), in OciLabels' order
    platforms: tuple[str, ...] = platforms.DEFAULT          # os/arch of each image in the cell's index
    emulation_factor: int = 1                               # deadline multiplier of an emulated platform
    libraries: NvidiaLibraries | None = None                # cuDNN/NCCL the base promises (required on NGC)

    @property
    def site_group(self) -> str | None:
        """The test group of the cell's site checks (its folder's name; contracts.sitetests), or None."""
        return PurePosixPath(self.extra_tests).name if self.extra_tests else None

    @property
    def groups(self) -> tuple[str, ...]:
        """Every test group a verdict of the cell must have run: its image-tests groups and its site checks."""
        return (*self.tests, self.site_group) if self.site_group else self.tests

    @property
    def multi_platform(self) -> bool:
        return self.platforms != platforms.DEFAULT

    @property
    def native_installs(self) -> bool:
        """Whether uv installs the cell's locks on the build machine for each target platform (BuildKit's
        BUILDPLATFORM stage, docs/multiplatform.md): every multi-platform cell. A pip cell's venv is made there
        whole; an NGC cell's tools are installed there into the build machine's image of the same base and the
        files they add are copied into the target's."""
        return self.multi_platform

    @property
    def key(self) -> str:
        """Cell id used on the command line, in paths and in reports: `name:version`."""
        return f"{self.name}:{self.version}"

    @property
    def dockerfile(self) -> str:
        """Where the rendered Dockerfile lives, relative to the repository root."""
        return f"dockerfiles/{self.framework}/{self.name}/{self.version}/Dockerfile"

    @property
    def needs_gpu(self) -> bool:
        return self.accelerator == "cuda"


@dataclass(frozen=True)
class Matrix:
    path: str
    source: str
    cells: tuple[Cell, ...]

    @property
    def image_names(self) -> list[str]:
        return list(dict.fromkeys(cell.name for cell in self.cells))

    @cached_property
    def _by_name(self) -> dict[str, list[Cell]]:
        """Cells by image name, cell key and framework, in matrix order (`select` is asked
        for every name when a snapshot is written: a scan per name is quadratic)."""
        index: dict[str, list[Cell]] = {}
        for cell in self.cells:
            for name in dict.fromkeys((cell.name, cell.key, cell.framework)):
                index.setdefault(name, []).append(cell)
        return index

    def select(self, framework: str | None) -> list[Cell]:
        """Cells of one image (`pytorch-cpu`), one cell (`pytorch-cpu:2.13`), a framework
        (`pytorch`), or all (`None`/`all`)."""
        if not framework or framework == "all":
            return list(self.cells)
        chosen = list(self._by_name.get(framework, ()))
        if not chosen:
            name, sep, _ = framework.partition(":")
            if sep and name in self.image_names:
                versions = ", ".join(c.version for c in self.cells if c.name == name)
                hint = f"; {name} has version(s) {versions}"
            else:
                hint = values.suggest(framework, ["all", *frameworks.names(), *self.image_names,
                                                  *(c.key for c in self.cells)])
            names = self.image_names
            shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more images" if len(names) > 20 else "")
            raise UserError(f"unknown FRAMEWORK={framework!r}; choose one of: all, "
                            f"{', '.join(frameworks.names())}, {shown}{hint}")
        return chosen


# Without `release.tags`, one immutable tag per release (an immutable tag names its release).
DEFAULT_TAGS = ("{version}-{release}",)
_REQUIRED = ("framework", "accelerator", "template", "base", "python", "framework_version", "run", "tests", "use")
_REQUIRED_RUN = ("shm_size", "ipc", "ulimits", "gpus")
# Where a key belongs, for a key written one level off ("`shm_size` belongs under `run:`").
_HOME = {
    "default": "on one entry under `versions:` (`default: true`)",
    "version": "on an entry under `versions:` (`- version: \"1.0\"`)",
    "name": "on an image under `images:` (`- name: ...`)",
    "versions": "on an image under `images:`",
    **{key: "at the top level" for key in ("schema", "source", "defaults", "images")},
    **{key: "under `run:`" for key in RunProfile.model_fields},
    **{key: "under `oci:`" for key in OciLabels.model_fields},   # before index: `url` is more often an index's
    **{key: "under `index:`" for key in PackageIndex.model_fields},
    **{key: "under `release:`" for key in ReleaseTags.model_fields},
    **{key: "under `standin:`" for key in ("requirements", "platform_requirements", "workdir")},
}


# -- errors: pydantic's, turned into one located line that says what to write -----------------

# Words users write for a choice the schema names otherwise.
_ALIASES = {"gpu": "cuda", "nvidia": "cuda", "shared": "shareable", "true": "all", "false": "none", "no": "none"}
_ULIMIT_KEYS = get_args(UlimitName)

def _unwrap(annotation: Any) -> Any:
    """Strip Annotated and Optional from a field's type."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin is not None and type(None) in get_args(annotation):
            rest = [a for a in get_args(annotation) if a is not type(None)]
            if len(rest) != 1:
                return annotation
            annotation = rest[0]
        else:
            return annotation


def _keys_at(loc: Loc) -> tuple[str, ...]:
    """The keys the schema allows in the mapping at `loc` (model fields, or a dict's literal keys)."""
    target: Any = MatrixFile
    for part in loc:
        target = _unwrap(target)
        if isinstance(part, int):
            if get_origin(target) is not list:
                return ()
            target = get_args(target)[0]
        elif isinstance(target, type) and issubclass(target, BaseModel):
            fields = {f.alias or name: f for name, f in target.model_fields.items()}
            if part not in fields:
                return ()
            target = fields[part].annotation
        elif get_origin(target) is dict:
            target = get_args(target)[1]
        else:
            return ()
    target = _unwrap(target)
    if isinstance(target, type) and issubclass(target, BaseModel):
        return tuple(f.alias or name for name, f in target.model_fields.items())
    if get_origin(target) is dict:
        key_type = _unwrap(get_args(target)[0])
        if get_origin(key_type) is Literal:
            return get_args(key_type)
    return ()


def _quoted_example(doc: Located, loc: Loc, given: object) -> str:
    raw = doc.raw.get(loc, str(given).lower() if isinstance(given, bool) else str(given))
    text = '"' + raw.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{loc[-1]}: {text}" if loc and isinstance(loc[-1], str) else f"- {text}"


def _message(doc: Located, error: Any, loc: Loc, on_key: bool) -> str:
    kind, given = error["type"], error.get("input")
    name = loc[-1] if loc and isinstance(loc[-1], str) else "this entry"
    if kind == "extra_forbidden":
        allowed = _keys_at(loc[:-1])
        hint = values.suggest(str(name), allowed)
        if not hint and name in _HOME:
            hint = f"; `{name}` belongs {_HOME[name]}"
        return f"unknown key `{name}`{hint or '; remove it or check its spelling'}"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error" and on_key:
        allowed = _keys_at(loc[:-1])
        return f"unknown key `{name}`{values.suggest(str(name), allowed)} (one of {', '.join(allowed)})"
    if given is None:
        if isinstance(loc[-1] if loc else None, int):
            return "is an empty entry; remove it or give it a value"
        if name in _keys_at(loc[:-1]) and _keys_at(loc[:-1]) != _ULIMIT_KEYS:
            return "is empty; give it a value"
        return "is empty; give it a value or remove the line"
    if kind == "string_type":
        if isinstance(given, dict | list):
            return f"must be a string, not a {'mapping' if isinstance(given, dict) else 'list'}"
        return f"must be a string; quote it: {_quoted_example(doc, loc, given)}"
    if kind == "bool_type":
        return f"must be true or false (got {given!r})"
    if kind == "list_type":
        shown = doc.raw.get(loc, given)
        if isinstance(given, str | int | float) and values.is_plain_word(str(shown)):
            return f"must be a list; write {name}: [{shown}]"
        return "must be a list (`- item` lines or [a, b])"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        shown = "a list" if isinstance(given, list) else repr(given)
        return f"must be a mapping (`key: value` lines), not {shown}"
    if kind == "too_short":
        return "is empty; list at least one entry"
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", str((error.get("ctx") or {}).get("expected", "")))
        alias = _ALIASES.get(given) if isinstance(given, str) else None
        hint = f"; did you mean `{alias}`?" if alias in choices else ""
        message = f"{message} (got {given!r}){hint or values.suggest(str(given), choices)}"
        if isinstance(given, bool):
            message += "; YAML reads yes, no, on and off as true/false"
        return message
    if kind != "value_error":
        message = f"{message} (got {given!r})"
    return message


def _pydantic_error(doc: Located, exc: ValidationError) -> MatrixError:
    """The error to show first: by line, a missing key last (a misspelt key explains it)."""
    found = []
    for index, error in enumerate(exc.errors()):
        loc: Loc = tuple("schema" if part == "schema_" else part for part in error["loc"])
        on_key = bool(loc) and loc[-1] == "[key]"
        loc = loc[:-1] if on_key else loc
        line = doc.line_of(loc)
        found.append(((error["type"] == "missing", line or 0, index), line, loc, error, on_key))
    _, line, loc, error, on_key = min(found, key=lambda item: item[0])
    return MatrixError(doc.path, line, dotted(loc), _message(doc, error, loc, on_key))


# -- checks that need more than one value ----------------------------------------------------

def _check_layer(doc: Located, base: Loc, fields: CellFields) -> None:
    """Within one layer (defaults, an image, a version): no package or test group twice."""
    def fail(loc: Loc, message: str) -> MatrixError:
        return MatrixError(doc.path, doc.line_of(loc), dotted(loc), message)

    seen: dict[str, str] = {}
    for name in fields.packages or {}:
        canonical = canonicalize_name(name)
        if canonical in seen:
            raise fail((*base, "packages", name), f"{name!r} is the same package as {seen[canonical]!r} "
                                                  "(names compare without case, '-', '_' or '.'); keep one")
        seen[canonical] = name
    for key in ("tests", "apt_packages", "framework_requirements", "platforms"):
        items: list[str] = getattr(fields, key) or []
        for k, item in enumerate(items):
            if item in items[:k]:
                raise fail((*base, key, k), f"{item!r} is listed twice; keep one")


# The keys a layer may set, as the matrix spells them (`validate`, not the field's `validate_`).
_CELL_KEYS = frozenset(f.alias or name for name, f in CellFields.model_fields.items())


def _unset_nulls(value: Any) -> Any:
    """A null anywhere in a mapping means "not set here"."""
    if isinstance(value, dict):
        return {k: _unset_nulls(v) for k, v in value.items() if v is not None}
    return value


def _layer(data: Any) -> dict[str, Any]:
    """A layer's cell fields as written (already validated)."""
    if not isinstance(data, dict):
        return {}
    return {k: _unset_nulls(v) for k, v in data.items() if k in _CELL_KEYS and v is not None}


def _merge(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """Later layer wins; mappings merge key by key, everything else replaces. New dicts only:
    the layers (shared by YAML aliases, or by every version of an image) are never changed."""
    out = dict(base)
    for key, value in layer.items():
        if value is None:
            continue
        if isinstance(value, dict):
            old = out.get(key)
            out[key] = _merge(old if isinstance(old, dict) else {}, value)
        else:
            out[key] = value
    return out


_NEEDS_RE = re.compile(r"^\{#-?\s*needs:\s*([a-z_]+(?:\s*,\s*[a-z_]+)*)")


def _template_needs(templates_dir: Path | None, template: str, cache: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Cell fields a template declares it needs: `{# needs: framework_requirements #}` as its first line."""
    if templates_dir is None:
        return ()
    if template not in cache:
        try:
            with (templates_dir / template).open(encoding="utf-8", errors="replace") as handle:
                first = handle.readline()
        except OSError:
            first = ""
        match = _NEEDS_RE.match(first)
        found = tuple(n.strip() for n in match.group(1).split(",")) if match else ()
        cache[template] = tuple(n for n in found if n in _CELL_KEYS)
    return cache[template]


@lru_cache(maxsize=65536)
def _installs(requirement: str, framework: str, version: str) -> bool:
    """Whether `requirement` leaves `version` of `framework` installable (True when it names
    another distribution)."""
    req = Requirement(requirement)
    carriers = {canonicalize_name(d) for d in frameworks.get(framework).distributions}
    return canonicalize_name(req.name) not in carriers or req.specifier.contains(version, prereleases=True)


Layers = tuple[tuple[dict[str, Any], Loc], ...]


class _CellCheck:
    """Checks on one cell's merged fields. Where a value came from (which layer set it) is
    worked out only for an error, so a valid matrix pays nothing for it."""

    def __init__(self, doc: Located, loc: Loc, merged: dict[str, Any], layers: Layers):
        self.doc, self.loc, self.merged, self.layers = doc, loc, merged, layers

    def where(self, *path: str | int) -> Loc:
        """The matrix location of the merged value at `path` (the last layer that sets it)."""
        keys = tuple(p for p in path if isinstance(p, str))
        index = tuple(p for p in path if isinstance(p, int))
        found: Loc = (*self.loc, *keys)
        for data, base in self.layers:
            node: Any = data
            for key in keys:
                node = node.get(key) if isinstance(node, dict) else None
            if node is not None:
                found = (*base, *keys)
        return (*found, *index)

    def fail(self, loc: Loc, message: str) -> MatrixError:
        return MatrixError(self.doc.path, self.doc.line_of(loc), dotted(loc), message)

    def required(self) -> None:
        for key in _REQUIRED:
            if key not in self.merged:
                raise self.fail((*self.loc, key), "required key is missing (set it in defaults, the image or "
                                                  "this version)")
        for key in _REQUIRED_RUN:
            if key not in self.merged["run"]:
                raise self.fail((*self.loc, "run", key), "required key is missing (set it in defaults.run, the "
                                                         "image or this version)")

    def framework(self) -> None:
        framework, version = self.merged["framework"], self.merged["framework_version"]
        if framework not in self.merged["tests"]:
            raise self.fail(self.where("tests"), f"a {framework} image must run the {framework!r} test group; "
                                                 f"add it to tests")
        for k, text in enumerate(self.merged.get("framework_requirements", ())):
            if not _installs(text, framework, version):
                line = self.doc.line_of(self.where("framework_version"))
                raise self.fail(self.where("framework_requirements", k),
                                f"{text!r} does not install framework_version {version} (line {line}); "
                                "make the two agree")

    def needs(self, needed: tuple[str, ...]) -> None:
        """Fields the cell's template says (in its first line) it cannot do without."""
        for key in needed:
            if not self.merged.get(key):
                where = self.where(key) if key in self.merged else (*self.loc, key)
                example = ""
                if key == "framework_requirements" and "framework" in self.merged:
                    dist = frameworks.get(self.merged["framework"]).distributions[0]
                    example = f', e.g. {key}: ["{dist}=={self.merged.get("framework_version", "1.0")}"]'
                raise self.fail(where, f"template {self.merged['template']} needs {key} (its first line says so); "
                                       f"set it in defaults, the image or this version{example}")

    def tag_loc(self, field: str, k: int) -> Loc:
        release = self.merged.get("release", {})
        return self.where("release", field, k) if field in release else (*self.loc, "release", field)

    def tags(self, version: str, claimed: dict[str, tuple[str, _CellCheck, str, int]],
             key: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Render every dev and release tag now (not at release time); a tag names one cell."""
        try:
            values.dev_tag(version)
        except ValueError as exc:
            raise self.fail((*self.loc, "version"), str(exc)) from None
        release = self.merged.get("release", {})
        rendered: dict[str, list[str]] = {"tags": list(release.get("tags", DEFAULT_TAGS)),
                                          "moving": list(release.get("moving", ()))}
        if not rendered["tags"]:
            raise self.fail(self.tag_loc("tags", 0)[:-1] if "tags" in release else (*self.loc, "release", "tags"),
                            "lists no immutable tag; keep at least one, e.g. tags: [\"{version}-{release}\"]")
        for k, template in enumerate(rendered["tags"]):
            if "{release}" not in template:
                raise self.fail(self.tag_loc("tags", k), f"immutable tag template {template!r} has no {{release}}, "
                                                         "so a second release would need to move it; add "
                                                         "{release} or list it under moving")
        mine: set[str] = set()
        for field, templates in rendered.items():
            for k, template in enumerate(templates):
                try:
                    tag = values.rendered_tag(template, version)
                except ValueError as exc:
                    raise self.fail(self.tag_loc(field, k), str(exc)) from None
                if tag in mine:
                    raise self.fail(self.tag_loc(field, k), f"tag template {template!r} gives the tag {tag!r} "
                                                            f"twice for {key}; keep one")
                if tag in claimed:
                    other, check, other_field, other_k = claimed[tag]
                    line = self.doc.line_of(check.tag_loc(other_field, other_k))
                    raise self.fail(self.tag_loc(field, k), f"tag template {template!r} gives {tag!r}, also a tag "
                                                            f"of {other} (line {line}); a tag names one cell, so "
                                                            "keep it on one version")
                mine.add(tag)
                claimed[tag] = (key, self, field, k)
        return tuple(rendered["tags"]), tuple(rendered["moving"])


# -- GPU fields (issue 10: GPU runners) ----------------------------------------------------------
# `cuda` is required on GPU cells (accelerator: cuda) and refused on CPU cells: it decides the
# NVIDIA_REQUIRE_CUDA of the image, the minimum driver the catalogue states, and the local version
# (+cu130) PyTorch's CUDA wheels report. An NGC GPU cell's release must have a forward-compatibility
# rule (contracts.driver_rules), so validate and the catalogue never guess which older drivers NGC admits.
# Bus-bandwidth floors are not set here: they are hardware figures, one table keyed by GPU model and
# interconnect in buildtool/contracts/busbw.py; the old per-cell `busbw_floor_GBps` is refused by name.

def _gpu_fields(check: _CellCheck) -> dict[str, Any]:
    from buildtool.contracts.driver_rules import ngc_rule
    from buildtool.contracts.gpu import check_cuda
    from buildtool.contracts.versions import ngc_release

    merged = check.merged
    cuda = merged.get("cuda")
    gpu = merged["accelerator"] == "cuda"
    if merged.get("busbw_floor_GBps") is not None:
        raise check.fail(check.where("busbw_floor_GBps"), "bus-bandwidth floors are not set in the matrix: they "
                         "live in one table keyed by GPU model and interconnect (buildtool/contracts/busbw.py); "
                         "remove busbw_floor_GBps")
    if gpu and cuda is None:
        raise check.fail((*check.loc, "cuda"), "a GPU cell (accelerator: cuda) needs its CUDA version, "
                                               "e.g. cuda: \"13.0\"")
    if not gpu and cuda is not None:
        raise check.fail(check.where("cuda"), "only GPU cells (accelerator: cuda) have a CUDA version; remove it")
    if cuda is not None:
        try:
            check_cuda(cuda)
        except ValueError as exc:
            raise check.fail(check.where("cuda"), str(exc)) from None
        release = ngc_release(str(merged.get("base") or ""))
        if release is not None:
            try:
                rule = ngc_rule(release)
            except ValueError as exc:
                raise check.fail(check.where("base"), str(exc)) from None
            if rule.cuda != cuda:
                raise check.fail(check.where("cuda"), f"NGC {release} is built on CUDA {rule.cuda} "
                                 f"({rule.source}), not {cuda}")
    return {"cuda": cuda}


def _library_fields(check: _CellCheck) -> dict[str, Any]:
    """`libraries`: required where the base is an NGC release (its notes promise a cuDNN and an NCCL, and
    nothing else says which the image must carry); any other cell may declare what its base promises."""
    from buildtool.contracts.versions import ngc_release

    merged = check.merged
    libraries = merged.get("libraries")
    release = ngc_release(str(merged.get("base") or ""))
    if release is not None and libraries is None:
        raise check.fail((*check.loc, "libraries"), f"an NGC {release} base needs the cuDNN and NCCL its release "
                         "notes list, e.g. libraries: {cudnn: \"9.7.0.66\", nccl: \"2.25.1\", source: "
                         "https://docs.nvidia.com/deeplearning/frameworks/<framework>-release-notes/rel-YY-MM.html}")
    if libraries is None:
        return {"libraries": None}
    return {"libraries": NvidiaLibraries.model_validate(libraries)}


def _platform_fields(check: _CellCheck) -> dict[str, Any]:
    """The cell's platforms (default linux/amd64) and, where it has another, its emulation factor."""
    merged = check.merged
    names = tuple(merged.get("platforms") or platforms.DEFAULT)
    factor = (merged.get("validate") or {}).get("emulation_factor")
    if names != platforms.DEFAULT and factor is None:
        raise check.fail(check.where("platforms"), f"a cell built for {', '.join(names)} needs "
                         "validate.emulation_factor (how much slower its tests run under QEMU on another "
                         "architecture's runner); set it in defaults or on the image")
    return {"platforms": names, "emulation_factor": int(factor or 1)}


def parse_matrix(doc: Located, templates_dir: Path | None = None, tests_dir: Path | None = None,
                 tests_display: str | None = None, matrix_dir: Path | None = None) -> Matrix:
    """Validate a located YAML document and expand it into cells. `templates_dir`, `tests_dir`: the
    folders a template and a test group must be in (None: not looked at; `load_matrix` always looks
    for the test groups); `tests_display`: how errors name `tests_dir`; `matrix_dir`: the folder a site
    folder (`validate.extra_tests`) is named from, looked at when given."""
    if not isinstance(doc.data, dict):
        raise MatrixError(doc.path, 1, "", "the top level must be a mapping with `schema`, `source` and `images`")
    if tests_dir is not None:
        if not tests_dir.is_dir():
            raise UserError(f"{doc.path}: no folder {tests_display or tests_dir}/ for its image tests: every framework "
                            "is a folder there (framework.yaml, its tests, its scripts), and so is every test group")
        try:
            frameworks.use(tests_dir)   # the frameworks are the folders of this matrix's image-tests
        except frameworks.TableError as exc:
            raise UserError(str(exc)) from None
    try:
        spec = MatrixFile.model_validate(doc.data, context={"templates_dir": templates_dir, "tests_dir": tests_dir,
                                                            "tests_display": tests_display,
                                                            "matrix_dir": matrix_dir})
    except ValidationError as exc:
        raise _pydantic_error(doc, exc) from None

    # Merging works on the validated document itself (strict validation keeps values as
    # written): cheaper than dumping the models again, and the same values.
    _check_layer(doc, ("defaults",), spec.defaults)
    defaults = _layer(doc.data.get("defaults"))
    needs_cache: dict[str, tuple[str, ...]] = {}
    cells: list[Cell] = []
    seen_images: dict[str, int] = {}
    for i, (image, raw_image) in enumerate(zip(spec.images, doc.data["images"], strict=True)):
        image_loc: Loc = ("images", i)
        name_loc: Loc = (*image_loc, "name")
        if image.name in seen_images:
            raise MatrixError(doc.path, doc.line_of(name_loc), dotted(name_loc),
                              f"duplicate image {image.name!r} (first declared on line {seen_images[image.name]})")
        seen_images[image.name] = doc.line_of(name_loc) or 0
        _check_layer(doc, image_loc, image)
        image_layer = _layer(raw_image)
        image_fields = _merge(defaults, image_layer)
        seen_versions: dict[str, int] = {}
        first_default: tuple[str, int | None] | None = None
        claimed: dict[str, tuple[str, _CellCheck, str, int]] = {}
        for j, (ver, raw_ver) in enumerate(zip(image.versions, raw_image["versions"], strict=True)):
            loc: Loc = (*image_loc, "versions", j)
            vloc = (*loc, "version")
            line = doc.line_of(vloc) or 0
            if ver.version in seen_versions:
                raise MatrixError(doc.path, line, dotted(vloc),
                                  f"duplicate version {ver.version!r} of {image.name} "
                                  f"(first declared on line {seen_versions[ver.version]})")
            seen_versions[ver.version] = line
            if ver.default:
                dloc = (*loc, "default")
                if first_default is not None:
                    raise MatrixError(doc.path, doc.line_of(dloc), dotted(dloc),
                                      f"a second version of {image.name} with `default: true` (the first is "
                                      f"{first_default[0]}, line {first_default[1]}); keep one")
                first_default = (ver.version, doc.line_of(dloc))
            _check_layer(doc, loc, ver)
            version_layer = _layer(raw_ver)
            merged = _merge(image_fields, version_layer)
            check = _CellCheck(doc, loc, merged, ((defaults, ("defaults",)), (image_layer, image_loc),
                                                  (version_layer, loc)))
            check.required()
            check.needs(_template_needs(templates_dir, merged["template"], needs_cache))
            check.framework()
            key = f"{image.name}:{ver.version}"
            release_tags, moving_tags = check.tags(ver.version, claimed, key)
            index = merged.get("index", {})
            run = merged["run"]
            standin = merged.get("standin")
            placed = _platform_fields(check)
            cells.append(Cell(
                name=image.name,
                version=ver.version,
                default=ver.default,
                framework=merged["framework"],
                accelerator=merged["accelerator"],
                template=merged["template"],
                base=merged["base"],
                standin=_standin(check, standin, placed["platforms"]) if standin else None,
                python=merged["python"],
                framework_version=merged["framework_version"],
                framework_requirements=tuple(merged.get("framework_requirements", ())),
                packages=tuple(sorted(merged.get("packages", {}).items())),
                apt_packages=tuple(merged.get("apt_packages", ())),
                index_url=index.get("url"),
                extra_index_urls=tuple(index.get("extra_urls", ())),
                # A whole number of bytes (YAML int) is Docker's size without a unit.
                run=Run(shm_size=str(run["shm_size"]), ipc=run["ipc"],
                        ulimits=tuple(sorted(run["ulimits"].items())), gpus=run["gpus"]),
                tests=tuple(merged["tests"]),
                use=merged["use"],
                release_tags=release_tags,
                moving_tags=moving_tags,
                line=doc.line_of(loc) or 0,
                validate_deadline_s=deadline_for(merged),
                extra_tests=(merged.get("validate") or {}).get("extra_tests"),
                oci=tuple((k, merged["oci"][k]) for k in OciLabels.model_fields if k in merged.get("oci", {})),
                **placed,
                **_gpu_fields(check),
                **_library_fields(check),
            ))
        if first_default is None:
            raise MatrixError(doc.path, doc.line_of(image_loc), dotted(image_loc),
                              f"no version of {image.name} has `default: true`; set it on exactly one (the "
                              "version `latest` and the nightly jobs use)")
    return Matrix(path=doc.path, source=spec.source, cells=tuple(cells))


@lru_cache(maxsize=1024)
def _standin_model(base: str, requirements: tuple[str, ...], workdir: str,
                   platform_requirements: tuple[tuple[Any, Any], ...]) -> StandIn:
    fields = {"base": base, "requirements": list(requirements) or None, "workdir": workdir,
              "platform_requirements": {k: list(v) if isinstance(v, tuple) else v for k, v in platform_requirements}}
    # A key no layer set is missing (named so), not None.
    return StandIn.model_validate({k: v for k, v in fields.items() if v is not None})


def _standin(check: _CellCheck, fields: dict[str, Any], cell_platforms: tuple[str, ...]) -> StandIn:
    """A stand-in merged from several layers must still be whole, and name only the cell's platforms."""
    by_platform = fields.get("platform_requirements") or {}
    try:
        if not isinstance(by_platform, dict):
            raise check.fail((*check.where("standin"), "platform_requirements"),
                             "must be a mapping of platform to requirements, e.g. {linux/arm64: [\"torch==2.13.0\"]}")
        standin = _standin_model(fields.get("base"), tuple(fields.get("requirements") or ()),
                                 fields.get("workdir", "/workspace"),
                                 tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in by_platform.items()))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise check.fail((*check.where("standin"), *first["loc"]),
                         "required key is missing" if first["type"] == "missing" else first["msg"]) from None
    for platform in standin.platform_requirements:
        if platform not in cell_platforms:
            raise check.fail((*check.where("standin"), "platform_requirements", platform),
                             f"{platform} is not one of the cell's platforms ({', '.join(cell_platforms)}); "
                             "add it to `platforms:` or remove its requirements")
    return standin


IMAGE_TESTS = "image-tests"


def tests_dir_for(path: Path, tests_dir: Path | None = None) -> tuple[Path, str]:
    """The image-tests folder of the matrix at `path` (beside it, unless named) and how errors show
    it: relative to the matrix's folder when inside it."""
    folder = tests_dir if tests_dir is not None else path.parent / IMAGE_TESTS
    try:
        shown = str(folder.resolve().relative_to(path.parent.resolve()))
    except ValueError:
        shown = str(folder)
    return folder, shown


def load_matrix(path: Path, templates_dir: Path | None = None, display: str | None = None,
                tests_dir: Path | None = None) -> Matrix:
    """Load and validate `matrix.yaml`; raises MatrixError (exit 2) naming file:line and key. Every
    test group a cell names must be a folder of `tests_dir` (default: image-tests/ beside the matrix)."""
    folder, shown = tests_dir_for(path, tests_dir)
    with paused_gc():
        return parse_matrix(load_yaml(path, display), templates_dir, folder, shown, path.parent)
