"""The version matrix: schema, loader and the cells it expands to.

`matrix.yaml` declares images; each image has one or more versions, and a cell is one
image at one version. Values are declared once and inherited: `defaults` < image < version.
Mappings merge key by key (so a version can change one package pin); lists and scalars
replace. Every error names file, line and key, and nothing is written before the matrix
is known to be good.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from buildtool.common.errors import MatrixError, UserError
from buildtool.contracts import frameworks, runprofile
from buildtool.matrix.yamlsource import Loc, Located, dotted, load_yaml

SCHEMA_VERSION = 1
_NAME_RE = re.compile(r"^[a-z0-9]+(?:[-.][a-z0-9]+)*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
_SIZE_RE = re.compile(r"^([0-9]+)([kmgKMG]?)$")
UlimitName = Literal["memlock", "stack", "nofile", "nproc", "core", "fsize", "cpu", "as", "data", "rss", "rtprio",
                     "sigpending"]


def _known_framework(value: str) -> str:
    if value not in frameworks.names():
        raise ValueError(f"unknown framework {value!r}; one of {', '.join(frameworks.names())} "
                         "(a new one needs a row in buildtool/contracts/frameworks.py)")
    return value


def _known_group(value: str) -> str:
    groups = frameworks.test_groups()
    if value not in groups:
        raise ValueError(f"unknown test group {value!r}; one of {', '.join(groups)}")
    return value


# Checked against the framework table when the matrix loads (not a Literal: the table can grow).
FrameworkName = Annotated[StrictStr, AfterValidator(_known_framework)]
TestGroup = Annotated[StrictStr, AfterValidator(_known_group)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class RunProfile(_Strict):
    """How the image must be run: the flags users pass to `docker run` and the tests use."""

    shm_size: StrictStr | None = None
    ipc: Literal["private", "host", "shareable"] | None = None
    ulimits: dict[UlimitName, StrictInt] | None = None
    gpus: Literal["none", "all"] | None = None

    @field_validator("shm_size")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is not None and not _SIZE_RE.match(value):
            raise ValueError("must be a size like 1g, 512m or 8G")
        return value


class PackageIndex(_Strict):
    """Public package index settings a cell needs. Host secrets (CA, tokens) never go here."""

    url: StrictStr | None = None
    extra_urls: list[StrictStr] | None = None


class ReleaseTags(_Strict):
    """Tag templates for `<name>:<tag>`; `{version}` is the cell version, `{release}` the release."""

    tags: list[StrictStr] | None = None
    moving: list[StrictStr] | None = None


class StandIn(_Strict):
    """A local stand-in for an unreachable base (test fixture, never released)."""

    base: StrictStr
    requirements: list[StrictStr]
    workdir: StrictStr = "/workspace"


# -- validate: how long the image tests of a cell may take (issue 14) ----------------------------
class ValidateSettings(_Strict):
    """How `buildtool validate` runs this cell's image tests."""

    # The whole image's budget: every probe is cut to what is left of it, a hang fails the step
    # that hung, and validation goes on with the next image.
    deadline_s: StrictInt | None = None

    @field_validator("deadline_s")
    @classmethod
    def _deadline(cls, value: int | None) -> int | None:
        if value is not None and not 60 <= value <= runprofile.MAX_DEADLINE_S:
            raise ValueError(f"must be between 60 and {runprofile.MAX_DEADLINE_S} seconds (got {value})")
        return value


def deadline_for(merged: dict[str, Any]) -> int:
    """The cell's deadline: its own, or the default for its accelerator."""
    own = (merged.get("validate_") or {}).get("deadline_s")
    return int(own or runprofile.DEFAULT_DEADLINE_S.get(merged.get("accelerator", "cpu"), 480))
# -- end of the validate block ------------------------------------------------------------------


class CellFields(_Strict):
    """Fields a cell may take; every one may be set in defaults, image or version."""

    framework: FrameworkName | None = None
    accelerator: Literal["cpu", "cuda"] | None = None
    template: StrictStr | None = None
    base: StrictStr | None = None
    standin: StandIn | None = None
    python: StrictStr | None = None
    framework_version: StrictStr | None = None
    framework_requirements: list[StrictStr] | None = None
    packages: dict[str, StrictStr] | None = None
    apt_packages: list[StrictStr] | None = None
    index: PackageIndex | None = None
    run: RunProfile | None = None
    tests: list[TestGroup] | None = None
    use: StrictStr | None = None
    release: ReleaseTags | None = None
    validate_: ValidateSettings | None = Field(default=None, alias="validate")  # `validate` would shadow BaseModel's


class VersionSpec(CellFields):
    version: StrictStr
    default: bool = False


class ImageSpec(CellFields):
    name: StrictStr
    versions: Annotated[list[VersionSpec], Field(min_length=1)]


class MatrixFile(_Strict):
    schema_: Literal[1] = Field(alias="schema")
    source: StrictStr
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
        number, unit = _SIZE_RE.match(self.shm_size).groups()  # type: ignore[union-attr]
        return int(number) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit.lower()]

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

    def select(self, framework: str | None) -> list[Cell]:
        """Cells of one image (`pytorch-cpu`), one cell (`pytorch-cpu:2.13`), a framework
        (`pytorch`), or all (`None`/`all`)."""
        if framework in (None, "", "all"):
            return list(self.cells)
        chosen = [c for c in self.cells if framework in (c.name, c.key, c.framework)]
        if not chosen:
            names = ", ".join(self.image_names)
            raise UserError(f"unknown FRAMEWORK={framework!r}; choose one of: all, "
                            f"{', '.join(frameworks.names())}, {names}")
        return chosen


_REQUIRED = ("framework", "accelerator", "template", "base", "python", "framework_version", "run", "tests", "use")
_REQUIRED_RUN = ("shm_size", "ipc", "ulimits", "gpus")


def _merge(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers win; mappings merge key by key, everything else replaces."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if value is None:
                continue
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = _merge(out[key], value)
            else:
                out[key] = value
    return out


def _fields(model: BaseModel) -> dict[str, Any]:
    names = CellFields.model_fields
    return {k: v for k, v in model.model_dump(exclude_none=True).items() if k in names}


def _pydantic_error(doc: Located, exc: ValidationError) -> MatrixError:
    first = exc.errors()[0]
    loc: Loc = tuple("schema" if part == "schema_" else part for part in first["loc"])
    kind, message = first["type"], first["msg"]
    if kind == "extra_forbidden":
        message = "unknown key; remove it or check its spelling"
    elif kind == "missing":
        message = "required key is missing"
    elif kind == "string_type" and isinstance(first.get("input"), int | float):
        message = f"must be a string; quote it (YAML read {first['input']!r})"
    elif kind.endswith("_type") or kind == "literal_error":
        message = f"{message} (got {first.get('input')!r})"
    message = message.removeprefix("Value error, ")
    return MatrixError(doc.path, doc.line_of(loc), dotted(loc), message)


def _check_templates(doc: Located, cells: Iterable[tuple[Cell, Loc]], templates_dir: Path) -> None:
    for cell, loc in cells:
        if not (templates_dir / cell.template).is_file():
            raise MatrixError(doc.path, doc.line_of(loc), dotted(loc),
                              f"template {cell.template!r} not found under {templates_dir}/")


def _template_loc(spec: MatrixFile, image_index: int, version_index: int) -> Loc:
    image = spec.images[image_index]
    if image.versions[version_index].template is not None:
        return ("images", image_index, "versions", version_index, "template")
    if image.template is not None:
        return ("images", image_index, "template")
    return ("defaults", "template")


def parse_matrix(doc: Located, templates_dir: Path | None = None) -> Matrix:
    """Validate a located YAML document and expand it into cells."""
    if not isinstance(doc.data, dict):
        raise MatrixError(doc.path, 1, "", "the top level must be a mapping with `schema`, `source` and `images`")
    try:
        spec = MatrixFile.model_validate(doc.data)
    except ValidationError as exc:
        raise _pydantic_error(doc, exc) from None

    cells: list[tuple[Cell, Loc]] = []
    seen_images: dict[str, int] = {}
    for i, image in enumerate(spec.images):
        name_loc: Loc = ("images", i, "name")
        if not _NAME_RE.match(image.name):
            raise MatrixError(doc.path, doc.line_of(name_loc), dotted(name_loc),
                              f"{image.name!r} is not a valid image name (lower case, digits, '-' and '.')")
        if image.name in seen_images:
            raise MatrixError(doc.path, doc.line_of(name_loc), dotted(name_loc),
                              f"duplicate image {image.name!r} (first declared on line {seen_images[image.name]})")
        seen_images[image.name] = doc.line_of(name_loc) or 0
        seen_versions: dict[str, int] = {}
        defaults_in_image = 0
        for j, ver in enumerate(image.versions):
            loc: Loc = ("images", i, "versions", j)
            vloc = (*loc, "version")
            line = doc.line_of(vloc) or 0
            try:
                Version(ver.version)
            except InvalidVersion:
                raise MatrixError(doc.path, line, dotted(vloc),
                                  f"{ver.version!r} does not parse as a version (PEP 440, e.g. 25.10 or 2.13)"
                                  ) from None
            if not _TAG_RE.match(ver.version):
                raise MatrixError(doc.path, line, dotted(vloc), f"{ver.version!r} cannot be used in an image tag")
            if ver.version in seen_versions:
                raise MatrixError(doc.path, line, dotted(vloc),
                                  f"duplicate version {ver.version!r} of {image.name} "
                                  f"(first declared on line {seen_versions[ver.version]})")
            seen_versions[ver.version] = line
            defaults_in_image += ver.default
            merged = _merge(_fields(spec.defaults), _fields(image), _fields(ver))
            for key in _REQUIRED:
                if key not in merged:
                    raise MatrixError(doc.path, doc.line_of(loc), dotted((*loc, key)),
                                      "required key is missing (set it in defaults, the image or this version)")
            for key in _REQUIRED_RUN:
                if key not in merged["run"]:
                    raise MatrixError(doc.path, doc.line_of(loc), dotted((*loc, "run", key)),
                                      "required key is missing (set it in defaults.run, the image or this version)")
            index = merged.get("index", {})
            release = merged.get("release", {})
            run = merged["run"]
            standin = merged.get("standin")
            cell = Cell(
                name=image.name,
                version=ver.version,
                default=ver.default,
                framework=merged["framework"],
                accelerator=merged["accelerator"],
                template=merged["template"],
                base=merged["base"],
                standin=StandIn(**standin) if standin else None,
                python=merged["python"],
                framework_version=merged["framework_version"],
                framework_requirements=tuple(merged.get("framework_requirements", ())),
                packages=tuple(sorted(merged.get("packages", {}).items())),
                apt_packages=tuple(merged.get("apt_packages", ())),
                index_url=index.get("url"),
                extra_index_urls=tuple(index.get("extra_urls", ())),
                run=Run(shm_size=run["shm_size"], ipc=run["ipc"], ulimits=tuple(sorted(run["ulimits"].items())),
                        gpus=run["gpus"]),
                tests=tuple(merged["tests"]),
                use=merged["use"],
                release_tags=tuple(release.get("tags", ("{version}",))),
                moving_tags=tuple(release.get("moving", ())),
                line=doc.line_of(loc) or 0,
                validate_deadline_s=deadline_for(merged),
            )
            if cell.framework not in cell.tests:
                raise MatrixError(doc.path, doc.line_of(loc), dotted((*loc, "tests")),
                                  f"a {cell.framework} image must run the {cell.framework!r} test group")
            cells.append((cell, _template_loc(spec, i, j)))
        if defaults_in_image > 1:
            loc = ("images", i, "versions")
            raise MatrixError(doc.path, doc.line_of(loc), dotted(loc), "more than one version has `default: true`")
    if templates_dir is not None:
        _check_templates(doc, cells, templates_dir)
    return Matrix(path=doc.path, source=spec.source, cells=tuple(cell for cell, _ in cells))


def load_matrix(path: Path, templates_dir: Path | None = None, display: str | None = None) -> Matrix:
    """Load and validate `matrix.yaml`; raises MatrixError (exit 2) naming file:line and key."""
    return parse_matrix(load_yaml(path, display), templates_dir)
