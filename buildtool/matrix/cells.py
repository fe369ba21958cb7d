"""The matrix expanded into cells: `defaults` < image < version, merged key by key (mappings merge, lists and
scalars replace), each cell checked where a check needs more than one value (required keys, the template's
needs, the framework and its requirements, tags that name one cell, GPU, library and platform fields, the
stand-in), every error naming file, line and the layer that set the value."""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable
from functools import cache, lru_cache, partial
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from pydantic import ValidationError

from buildtool.common.errors import MatrixError
from buildtool.contracts import frameworks, names, platforms, runprofile
from buildtool.matrix import values
from buildtool.matrix.schema import (
    DEFAULT_TAGS,
    Cell,
    CellFields,
    ImageSpec,
    MatrixFile,
    NvidiaLibraries,
    OciLabels,
    Run,
    StandIn,
    VersionSpec,
)
from buildtool.matrix.snapshot import template_first_line
from buildtool.matrix.yamlsource import Loc, Located

_REQUIRED = ("framework", "accelerator", "template", "base", "python", "framework_version", "run", "tests", "use")
_REQUIRED_RUN = ("shm_size", "ipc", "ulimits", "gpus")
# Required keys a Cell takes as the matrix wrote them.
_AS_WRITTEN = ("framework", "accelerator", "template", "base", "python", "framework_version", "use")


def _check_layer(doc: Located, base: Loc, fields: CellFields) -> None:
    """Within one layer (defaults, an image, a version): no package or test group twice."""
    seen: dict[str, str] = {}
    for name in fields.packages or {}:
        canonical = canonicalize_name(name)
        if canonical in seen:
            raise doc.error((*base, "packages", name), f"{name!r} is the same package as {seen[canonical]!r} "
                                                       "(names compare without case, '-', '_' or '.'); keep one")
        seen[canonical] = name
    for key in ("tests", "apt_packages", "framework_requirements", "platforms"):
        items: list[str] = getattr(fields, key) or []
        for k, item in enumerate(items):
            if item in items[:k]:
                raise doc.error((*base, key, k), f"{item!r} is listed twice; keep one")


# The keys a layer may set, as the matrix spells them (`validate`, not the field's `validate_`).
_CELL_KEYS = frozenset(f.alias or name for name, f in CellFields.model_fields.items())


def _layer(data: Any) -> dict[str, Any]:
    """A layer's cell fields as written (already validated: a null is refused there)."""
    return {k: v for k, v in data.items() if k in _CELL_KEYS} if isinstance(data, dict) else {}


def _merge(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """Later layer wins; mappings merge key by key, everything else replaces (a layer holds no null: the schema
    refuses it).
    New dicts only: the layers (shared by YAML aliases, or by every version of an image) are never changed."""
    out = dict(base)
    for key, value in layer.items():
        if isinstance(value, dict):
            old = out.get(key)
            out[key] = _merge(old if isinstance(old, dict) else {}, value)
        else:
            out[key] = value
    return out


_NEEDS_RE = re.compile(r"^\{#-?\s*needs\s*:")
_NEEDS_END = re.compile(r"\(|-?#\}")   # a note in parentheses, or the comment's end, closes the names


def _template_needs(templates_dir: Path | None, template: str) -> tuple[str, ...]:
    """Cell fields a template declares it needs: `{# needs: framework_requirements #}` as its first line.
    A name there that is no cell field is an error at the template's line (a typo would drop the check)."""
    if templates_dir is None:
        return ()
    try:
        first = template_first_line(templates_dir / template)
    except OSError:
        first = ""
    match = _NEEDS_RE.match(first)
    if not match:
        return ()
    names = tuple(n.strip() for n in _NEEDS_END.split(first[match.end():], 1)[0].split(","))
    for name in names:
        if not name:
            raise MatrixError(f"templates/{template}", 1, "needs", "lists no field (or an empty one between "
                                                                   "commas); e.g. {# needs: framework_requirements #}")
        if name not in _CELL_KEYS:
            hint = values.suggest(name, sorted(_CELL_KEYS)) or f" (one of {', '.join(sorted(_CELL_KEYS))})"
            raise MatrixError(f"templates/{template}", 1, "needs", f"{name!r} is not a cell field{hint}")
    return names


_canonical = lru_cache(maxsize=65536)(canonicalize_name)


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
        return self.doc.error(loc, message)

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

    def packages(self) -> None:
        """One pin a package: a layer that spells a package another layer pins otherwise (`TensorBoard` over
        defaults' `tensorboard`) would pin it twice, not override the pin."""
        seen: dict[str, str] = {}
        for name in self.merged.get("packages", {}):
            first = seen.setdefault(_canonical(name), name)
            if first != name:
                line = self.doc.line_of(self.where("packages", first))
                raise self.fail(self.where("packages", name), f"{name!r} is the same package as {first!r} (line "
                                f"{line}; names compare without case, '-', '_' or '.'), so the cell would pin it "
                                f"twice; write {first!r} to change its pin")

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
            raise self.fail(self.where("release", "tags"), "lists no immutable tag; keep at least one, e.g. "
                                                           "tags: [\"{version}-{release}\"]")
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

def _nvidia_fields(check: _CellCheck) -> dict[str, Any]:
    """`cuda` (above) and `libraries`: required where the base is an NGC release (its notes promise a cuDNN and
    an NCCL, and nothing else says which the image must carry); any other cell may declare what its base
    promises."""
    from buildtool.contracts.driver_rules import ngc_rule
    from buildtool.contracts.gpu import check_cuda
    from buildtool.contracts.versions import ngc_release

    merged = check.merged
    cuda, libraries = merged.get("cuda"), merged.get("libraries")
    gpu = merged["accelerator"] == "cuda"
    release = ngc_release(str(merged.get("base") or ""))
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
        if release is not None:
            try:
                rule = ngc_rule(release)
            except ValueError as exc:
                raise check.fail(check.where("base"), str(exc)) from None
            if rule.cuda != cuda:
                raise check.fail(check.where("cuda"), f"NGC {release} is built on CUDA {rule.cuda} "
                                 f"({rule.source}), not {cuda}")
    if release is not None and libraries is None:
        raise check.fail((*check.loc, "libraries"), f"an NGC {release} base needs the cuDNN and NCCL its release "
                         "notes list, e.g. libraries: {cudnn: \"9.7.0.66\", nccl: \"2.25.1\", source: "
                         "https://docs.nvidia.com/deeplearning/frameworks/<framework>-release-notes/rel-YY-MM.html}")
    return {"cuda": cuda, "libraries": None if libraries is None else NvidiaLibraries.model_validate(libraries)}


def _platform_fields(check: _CellCheck) -> dict[str, Any]:
    """The cell's platforms (default linux/amd64) and, where it has another, its emulation factor."""
    merged = check.merged
    names = tuple(merged.get("platforms") or platforms.DEFAULT)
    factor = merged.get("validate", {}).get("emulation_factor")
    if names != platforms.DEFAULT and factor is None:
        raise check.fail(check.where("platforms"), f"a cell built for {', '.join(names)} needs "
                         "validate.emulation_factor (how much slower its tests run under QEMU on another "
                         "architecture's runner); set it in defaults or on the image")
    return {"platforms": names, "emulation_factor": int(factor or 1)}


@lru_cache(maxsize=1024)
def _standin_model(fields: str) -> StandIn:
    """The stand-in of a cell's merged fields, given as JSON: cells that share a stand-in validate it once."""
    return StandIn.model_validate_json(fields)


def _standin(check: _CellCheck, fields: dict[str, Any], cell_platforms: tuple[str, ...]) -> StandIn:
    """A stand-in merged from several layers must still be whole (a key no layer set is missing, named so), and
    name only the cell's platforms."""
    try:
        standin = _standin_model(json.dumps(fields))
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


Needs = Callable[[str], tuple[str, ...]]


def expand(doc: Located, spec: MatrixFile, templates_dir: Path | None) -> tuple[Cell, ...]:
    """Every cell of a validated matrix document, in matrix order."""
    # Merging works on the validated document itself (strict validation keeps values as written): cheaper
    # than dumping the models again, and the same values.
    _check_layer(doc, ("defaults",), spec.defaults)
    defaults = _layer(doc.data.get("defaults"))
    needs: Needs = cache(partial(_template_needs, templates_dir))   # each template read once per expansion
    cells: list[Cell] = []
    seen_images: dict[str, int] = {}
    for i, (image, raw_image) in enumerate(zip(spec.images, doc.data["images"], strict=True)):
        name_loc: Loc = ("images", i, "name")
        if image.name in seen_images:
            raise doc.error(name_loc, f"duplicate image {image.name!r} (first declared on line "
                                      f"{seen_images[image.name]})")
        seen_images[image.name] = doc.line_of(name_loc) or 0
        _selectable_alone(doc, name_loc, image.name)
        cells += _image_cells(doc, defaults, needs, ("images", i), image, raw_image)
    return tuple(cells)


def _selectable_alone(doc: Located, loc: Loc, name: str) -> None:
    """FRAMEWORK=<name> (and the release workflow's choice of images) selects `all`, a framework or an image: an
    image named `all` or like a framework would be selected with every image of it, never alone."""
    if name == "all":
        raise doc.error(loc, "'all' is what FRAMEWORK=all means (every image), so this image could never be "
                             "chosen alone; choose another name")
    if name in frameworks.names():
        raise doc.error(loc, f"{name!r} is the name of the framework {name} (image-tests/{name}/), and "
                             f"FRAMEWORK={name} selects every image of that framework, so this image could never be "
                             f"chosen alone (nor released alone); choose another name, e.g. {name}-<accelerator>")


def _image_cells(doc: Located, defaults: dict[str, Any], needs: Needs, image_loc: Loc, image: ImageSpec,
                 raw_image: dict[str, Any]) -> list[Cell]:
    """The cells of one image: one per version, exactly one of them the default."""
    _check_layer(doc, image_loc, image)
    image_layer = _layer(raw_image)
    image_fields = _merge(defaults, image_layer)
    # One version, one spelling (release refuses a second): 2.13 and 2.13.0 (or 2.13rc1 and 2.13RC1) are one.
    seen_versions: dict[Version, tuple[str, int]] = {}
    first_default: tuple[str, int | None] | None = None
    claimed: dict[str, tuple[str, _CellCheck, str, int]] = {}   # tag -> the version of this image it names
    cells, checks = [], []
    for j, (ver, raw_ver) in enumerate(zip(image.versions, raw_image["versions"], strict=True)):
        loc: Loc = (*image_loc, "versions", j)
        line = doc.line_of((*loc, "version")) or 0
        parsed = Version(ver.version)   # values.cell_version checked it parses
        if parsed in seen_versions:
            first, first_line = seen_versions[parsed]
            if first == ver.version:
                raise doc.error((*loc, "version"), f"duplicate version {ver.version!r} of {image.name} "
                                                   f"(first declared on line {first_line})")
            raise doc.error((*loc, "version"), f"version {ver.version!r} of {image.name} is version {first!r} "
                                               f"(line {first_line}) spelt otherwise (PEP 440); one version has "
                                               "one spelling: keep one")
        seen_versions[parsed] = (ver.version, line)
        if ver.default:
            if first_default is not None:
                raise doc.error((*loc, "default"), f"a second version of {image.name} with `default: true` (the "
                                                   f"first is {first_default[0]}, line {first_default[1]}); keep one")
            first_default = (ver.version, doc.line_of((*loc, "default")))
        _check_layer(doc, loc, ver)
        version_layer = _layer(raw_ver)
        check = _CellCheck(doc, loc, _merge(image_fields, version_layer),
                           ((defaults, ("defaults",)), (image_layer, image_loc), (version_layer, loc)))
        cells.append(_cell(check, needs, image.name, ver, claimed))
        checks.append(check)
    if first_default is None:
        raise doc.error(image_loc, f"no version of {image.name} has `default: true`; set it on exactly one (the "
                                   "version `latest` and the nightly jobs use)")
    _moving_tags_name_no_release(checks, cells)
    return cells


# A release as `buildtool release --version` writes it into a tag (PEP 440's normal form, which is tag-safe only
# without an epoch or a local part: release.gates.check_version).
_RELEASE_IN_TAG = r"[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?"


def _moving_tags_name_no_release(checks: list[_CellCheck], cells: list[Cell]) -> None:
    """A moving tag without {release} (`{version}`, `latest`) that some release of a cell of the image would make
    as an immutable tag (version `2.13-1`'s `{version}` is release 1 of 2.13's `{version}-{release}`): releasing
    the one would move the other's immutable tag. Checked per template, for every version at once."""
    by_template: dict[str, list[int]] = {}
    for i, cell in enumerate(cells):
        for template in cell.release_tags:
            by_template.setdefault(template, []).append(i)
    patterns = []
    for template, owners in by_template.items():
        versions = "|".join(re.escape(v) for v in sorted({cells[i].version for i in owners}, key=len, reverse=True))
        regex = ""
        for literal, field, _, _ in string.Formatter().parse(template):
            regex += re.escape(literal)
            if field is not None and f"(?P<{field}>" in regex:
                regex += f"(?P={field})"
            elif field is not None:
                regex += f"(?P<{field}>{versions if field == 'version' else _RELEASE_IN_TAG})"
        patterns.append((template, owners, re.compile(regex)))
    for check, cell in zip(checks, cells, strict=True):
        for k, template in enumerate(cell.moving_tags):
            if "{release}" in template:
                continue
            tag = names.expand_tag(template, cell.version, "")
            for other_template, owners, pattern in patterns:
                match = pattern.fullmatch(tag)
                if match is None:
                    continue
                version = match.groupdict().get("version")
                other = next(i for i in owners if version is None or cells[i].version == version)
                line = checks[other].doc.line_of(checks[other].tag_loc("tags", cells[other].release_tags.index(
                    other_template)))
                raise check.fail(check.tag_loc("moving", k), f"moving tag template {template!r} gives {tag!r}, "
                                 f"which is also the immutable tag of release {match.group('release')} of "
                                 f"{cells[other].key} ({other_template!r}, line {line}): releasing {cell.key} "
                                 "would move it; change the version or one of the two templates")


def _cell(check: _CellCheck, needs: Needs, name: str, ver: VersionSpec,
          claimed: dict[str, tuple[str, _CellCheck, str, int]]) -> Cell:
    """One cell from its merged fields, once every check that needs more than one value passed."""
    merged = check.merged
    check.required()
    check.packages()
    check.needs(needs(merged["template"]))
    check.framework()
    release_tags, moving_tags = check.tags(ver.version, claimed, f"{name}:{ver.version}")
    index = merged.get("index", {})
    profile = merged["run"]
    validate = merged.get("validate", {})
    standin = merged.get("standin")
    placed = _platform_fields(check)
    return Cell(
        name=name,
        version=ver.version,
        default=ver.default,
        **{key: merged[key] for key in _AS_WRITTEN},
        standin=_standin(check, standin, placed["platforms"]) if standin else None,
        framework_requirements=tuple(merged.get("framework_requirements", ())),
        packages=tuple(sorted(merged.get("packages", {}).items())),
        apt_packages=tuple(merged.get("apt_packages", ())),
        index_url=index.get("url"),
        extra_index_urls=tuple(index.get("extra_urls", ())),
        # A whole number of bytes (YAML int) is Docker's size without a unit.
        run=Run(shm_size=str(profile["shm_size"]), ipc=profile["ipc"],
                ulimits=tuple(sorted(profile["ulimits"].items())), gpus=profile["gpus"]),
        tests=tuple(merged["tests"]),
        release_tags=release_tags,
        moving_tags=moving_tags,
        line=check.doc.line_of(check.loc) or 0,
        validate_deadline_s=validate.get("deadline_s") or runprofile.DEFAULT_DEADLINE_S[merged["accelerator"]],
        extra_tests=validate.get("extra_tests"),
        oci=tuple((k, merged["oci"][k]) for k in OciLabels.model_fields if k in merged.get("oci", {})),
        **placed,
        **_nvidia_fields(check),
    )
