"""Loading the version matrix: a located YAML document validated by the schema (buildtool.matrix.schema), its
errors turned into one located line (`pydantic_error`), expanded into cells (buildtool.matrix.cells).
Every error names file, line and key, and nothing is written before the matrix is known to be good."""

from __future__ import annotations

import re
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from buildtool.common.errors import MatrixError, UserError
from buildtool.contracts import frameworks
from buildtool.matrix import values
from buildtool.matrix.cells import expand
from buildtool.matrix.schema import (
    EMPTY_IN_LAYER,
    Matrix,
    MatrixFile,
    OciLabels,
    PackageIndex,
    ReleaseTags,
    RunProfile,
    UlimitName,
)
from buildtool.matrix.yamlsource import Loc, Located, load_yaml, paused_gc


def parse_matrix(doc: Located, templates_dir: Path | None = None, tests_dir: Path | None = None,
                 tests_display: str | None = None, matrix_dir: Path | None = None) -> Matrix:
    """Validate a located YAML document and expand it into cells (buildtool.matrix.cells). `templates_dir`,
    `tests_dir`: the folders a template and a test group must be in (None: not looked at; `load_matrix` always
    looks for the test groups); `tests_display`: how errors name `tests_dir`; `matrix_dir`: the folder a site
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
        raise pydantic_error(doc, exc) from None
    return Matrix(path=doc.path, source=spec.source, cells=expand(doc, spec, templates_dir))


IMAGE_TESTS = "image-tests"


def load_matrix(path: Path, templates_dir: Path | None = None, display: str | None = None,
                tests_dir: Path | None = None) -> Matrix:
    """Load and validate `matrix.yaml`; raises MatrixError (exit 2) naming file:line and key. Every
    test group a cell names must be a folder of `tests_dir` (default: image-tests/ beside the matrix), which
    errors show relative to the matrix's folder when inside it."""
    folder = tests_dir if tests_dir is not None else path.parent / IMAGE_TESTS
    try:
        shown = str(folder.resolve().relative_to(path.parent.resolve()))
    except ValueError:
        shown = str(folder)
    with paused_gc():
        return parse_matrix(load_yaml(path, display), templates_dir, folder, shown, path.parent)


# -- pydantic's errors on the matrix, turned into one located line that says what to write: the key as the
# matrix spells it, a suggestion for a misspelt key or value, where a key written one level off belongs.

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


# Words users write for a choice the schema names otherwise.
_ALIASES = {"gpu": "cuda", "nvidia": "cuda", "shared": "shareable", "true": "all", "false": "none", "no": "none"}
_ULIMIT_KEYS = get_args(UlimitName)


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated and Optional from a field's type (the schema's unions are all `X | None`)."""
    while get_origin(annotation) in (Annotated, Union, UnionType):
        annotation = get_args(annotation)[0]
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
    allowed = _keys_at(loc[:-1])   # the keys of the mapping that holds `loc`
    if kind == "extra_forbidden":
        hint = values.suggest(str(name), allowed)
        if not hint and name in _HOME:
            hint = f"; `{name}` belongs {_HOME[name]}"
        return f"unknown key `{name}`{hint or '; remove it or check its spelling'}"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error" and on_key:
        return f"unknown key `{name}`{values.suggest(str(name), allowed)} (one of {', '.join(allowed)})"
    if given is None:
        if isinstance(loc[-1] if loc else None, int):
            return "is an empty entry; remove it or give it a value"
        if name in allowed and allowed != _ULIMIT_KEYS and kind != EMPTY_IN_LAYER:
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


def pydantic_error(doc: Located, exc: ValidationError) -> MatrixError:
    """The error to show first: by line, a missing key last (a misspelt key explains it)."""
    found = []
    for index, error in enumerate(exc.errors()):
        loc: Loc = tuple("schema" if part == "schema_" else part for part in error["loc"])
        on_key = bool(loc) and loc[-1] == "[key]"
        loc = loc[:-1] if on_key else loc
        found.append(((error["type"] == "missing", doc.line_of(loc) or 0, index), loc, error, on_key))
    _, loc, error, on_key = min(found, key=lambda item: item[0])
    return doc.error(loc, _message(doc, error, loc, on_key))
