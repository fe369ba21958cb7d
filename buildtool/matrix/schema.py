"""The version matrix's schema (the models every value is validated by), the cell and the matrix of cells.

`matrix.yaml` declares images; each image has one or more versions, and a cell is one image at one version,
its values declared once and inherited, `defaults` < image < version (merged by buildtool.matrix.cells; pydantic's
errors turned into one located line by buildtool.matrix.loader).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from buildtool.common.errors import UserError
from buildtool.common.sizes import size_bytes
from buildtool.contracts import frameworks, nvlibs, platforms, runprofile, sitetests
from buildtool.matrix import values

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
    nvlibs.parse_promise(value)
    return value


LibraryVersion = Annotated[StrictStr, AfterValidator(_library_version)]
ShmSize = Annotated[Any, PlainValidator(values.shm_size)]
UlimitValue = Annotated[Any, PlainValidator(values.ulimit)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


EMPTY_IN_LAYER = "empty_in_layer"   # the error type of a null in a layer (loader's message names the fix)


class _Layer(_Strict):
    """A mapping a layer sets key by key: an empty value (YAML null) is refused, as an empty package or ulimit
    is; it has no meaning (leaving the key out takes the layer above's)."""

    @field_validator("*", mode="before")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if value is None:
            raise PydanticCustomError(EMPTY_IN_LAYER, "is empty; give it a value or remove the line")
        return value


class RunProfile(_Layer):
    """How the image must be run: the flags users pass to `docker run` and the tests use."""

    shm_size: ShmSize | None = None
    ipc: Literal["private", "host", "shareable"] | None = None
    ulimits: dict[UlimitName, UlimitValue] | None = None
    gpus: Literal["none", "all"] | None = None


class PackageIndex(_Layer):
    """Public package index settings a cell needs. Host secrets (CA, tokens) never go here."""

    url: IndexUrl | None = None
    extra_urls: list[IndexUrl] | None = None


class ReleaseTags(_Layer):
    """Tag templates for `<name>:<tag>`; `{version}` is the cell version, `{release}` the release."""

    tags: list[TagTemplate] | None = None
    moving: list[TagTemplate] | None = None


class OciLabels(_Layer):
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


class StandInFields(_Layer):
    """A layer's part of a stand-in (defaults, image or version): merged key by key, then checked whole
    as a StandIn, so a version can add one platform's requirements."""

    base: ImageRef | None = None
    requirements: Annotated[list[PinnedRequirement], Field(min_length=1)] | None = None
    platform_requirements: dict[PlatformName, Annotated[list[PinnedRequirement], Field(min_length=1)]] | None = None
    workdir: WorkDir | None = None


# -- validate: how long the image tests of a cell may take (issue 14) ----------------------------
MAX_EMULATION_FACTOR = 20


class ValidateSettings(_Layer):
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

    @field_validator("emulation_factor", "deadline_s")
    @classmethod
    def _within(cls, value: int | None, info: ValidationInfo) -> int | None:
        low, high, unit = _BOUNDS[info.field_name or ""]
        if value is not None and not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}{unit} (got {value})")
        return value


# field of ValidateSettings -> (lowest, highest, unit)
_BOUNDS = {"emulation_factor": (1, MAX_EMULATION_FACTOR, ""), "deadline_s": (60, runprofile.MAX_DEADLINE_S, " seconds")}


class CellFields(_Layer):
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
            # Only the frameworks some cell is of: a framework folder no image uses selects nothing.
            used = [f for f in frameworks.names() if f in {c.framework for c in self.cells}]
            names = self.image_names
            shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more images" if len(names) > 20 else "")
            choices = f"all, {', '.join(used)}, {shown}"
            if framework in frameworks.names():
                raise UserError(f"FRAMEWORK={framework!r}: the framework {framework} has no cells in {self.path} (no "
                                f"image there has `framework: {framework}`); add one, or choose one of: {choices}")
            name, sep, _ = framework.partition(":")
            if sep and name in self.image_names:
                versions = ", ".join(c.version for c in self.cells if c.name == name)
                hint = f"; {name} has version(s) {versions}"
            else:
                hint = values.suggest(framework, ["all", *used, *self.image_names, *(c.key for c in self.cells)])
            raise UserError(f"unknown FRAMEWORK={framework!r}; choose one of: {choices}{hint}")
        return chosen


# Without `release.tags`, one immutable tag per release (an immutable tag names its release).
DEFAULT_TAGS = ("{version}-{release}",)
