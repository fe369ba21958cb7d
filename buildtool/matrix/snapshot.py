"""A snapshot of the loaded matrix, for commands that must start fast (`buildtool release`).

Loading the matrix means importing pydantic and building the schema's models, which costs more
than releasing one image to a loopback registry. A snapshot is what `load_matrix` returned,
written as JSON under ~/.cache/dl-images/matrix/, keyed by a hash of matrix.yaml, the names of
the template files (and their first lines, where a template names the cell fields it needs), the
folders of image-tests (every test group a cell names must be one), each framework's framework.yaml and
the entries of the folders the load checks it against (contracts.frameworks.row_inputs) and
the code that turns them into cells (buildtool/matrix/, buildtool/contracts/ with the framework
table, buildtool/common/). Reading it gives objects with every field, property and argument-less
method of the real Cell, Run and Matrix, with the values the real code computed when the
snapshot was made: nothing here re-implements a rule. `Matrix.select` is answered from the
selections the real matrix made for every name it knows; any other name is loaded for real (to
raise its error). The site folders the cells name (`validate.extra_tests`) are not in the key (which of
them the matrix names is known only once it is loaded): reading a snapshot checks each again with the
load's own rule (contracts.sitetests.problem). A missing, stale or unreadable snapshot, or one whose
site folder the load would now refuse, means a real load, which writes a fresh one (or raises its error).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from buildtool.common.files import cache_root, write_atomic
from buildtool.contracts import frameworks

_VERSION = 1
MAX_CELLS = 1000
# Every module whose code decides what the loaded matrix holds (value checks, the framework table).
_CODE_DIRS = ("common", "contracts", "matrix")


class Record:
    """Attribute access to a stored object's values; zero-argument methods return their stored result."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.__dict__.update({name: _rebuild(value) for name, value in record["values"].items()})
        for name, result in record["calls"].items():
            self.__dict__[name] = _returning(_rebuild(result))

    def __repr__(self) -> str:
        return f"Record({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items() if not callable(v))})"


def _returning(result: Any) -> Callable[[], Any]:
    def call() -> Any:
        return list(result) if isinstance(result, list) else result
    return call


class MatrixSnapshot(Record):
    cells: tuple[Any, ...]

    def __init__(self, data: dict[str, Any], load: Callable[[], Any]) -> None:
        super().__init__(data["matrix"])
        self.cells = tuple(Record(c) for c in data["cells"])
        self._selections, self._load = data["selections"], load

    def select(self, framework: str | None) -> list[Any]:
        picked = self._selections.get("" if framework is None else framework)
        if picked is None:
            return self._load().select(framework)   # unknown: the real matrix raises the real error
        return [self.cells[i] for i in picked]


def cache_dir() -> Path:
    return cache_root() / "matrix"


def snapshot_key(matrix_path: Path, templates: Path, display: str) -> str:
    """The snapshot's name; "" (no snapshot) when the matrix is not a readable regular file or a folder
    it depends on cannot be listed, so the real load reports that (a directory, a pipe or /dev/zero is never
    read here)."""
    digest = hashlib.sha256(f"v{_VERSION}\0{display}\0".encode())
    try:
        if not matrix_path.is_file():
            return ""
        digest.update(matrix_path.read_bytes())
    except OSError:
        return ""
    tests_dir = matrix_path.parent / "image-tests"   # whose group folders the load checks
    try:   # a folder that cannot be listed: no snapshot, the real load reports it
        names = sorted(str(p.relative_to(templates)) for p in templates.rglob("*") if p.is_file()) \
            if templates.is_dir() else []
        digest.update("\0".join(names).encode())
        # Every test group a cell names must be a folder there (schema.py checks them).
        groups = sorted(p.name for p in tests_dir.iterdir() if p.is_dir()) if tests_dir.is_dir() else []
        digest.update(b"\0groups\0" + "\0".join(groups).encode())
        # A framework is the folder with its framework.yaml: its row decides what a cell of it is, and the
        # load refuses a row the folders around it do not bear out (frameworks.row_inputs: what it looks at).
        inputs: dict[Path, None] = {}
        for group in groups:
            row = tests_dir / group / frameworks.FRAMEWORK_FILE
            digest.update(b"\0" + group.encode() + b"\0" + (row.read_bytes() if row.is_file() else b"-"))
            if row.is_file():
                inputs.update(dict.fromkeys(frameworks.row_inputs(tests_dir / group)))
        for folder in inputs:
            digest.update(b"\0" + os.path.relpath(folder, tests_dir).encode() + b"\0" + _listing(folder))
        # A template's first line may name the cell fields it needs (cells.py reads them): the same text the
        # load reads, whole (512 bytes of it once: a change past them kept the stale snapshot).
        for name in names:
            digest.update(b"\0" + template_first_line(templates / name).encode())
    except OSError:
        return ""
    package = Path(__file__).resolve().parents[1]
    for path in sorted(p for folder in _CODE_DIRS for p in (package / folder).glob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def template_first_line(path: Path) -> str:
    """A template's first line, where it may name the cell fields it needs (cells._template_needs): read here for
    the load and for the snapshot's key alike, so the key covers what the load reads. OSError when unreadable."""
    with path.open(encoding="utf-8", errors="replace") as handle:
        return handle.readline()


def _listing(folder: Path) -> bytes:
    """`folder`'s entries, each with its kind as the load's checks see it (links followed); b"-" when it is no
    folder. Raises OSError when it cannot be listed."""
    if not folder.is_dir():
        return b"-"
    with os.scandir(folder) as entries:
        kinds = sorted(f"{e.name}/{_kind(e)}" for e in entries if e.name not in frameworks.NOT_INPUTS)
    return "\0".join(kinds).encode()


def _kind(entry: os.DirEntry[str]) -> str:
    if entry.is_file():
        return "f"
    if entry.is_dir():
        return "d"
    return "o" if os.path.exists(entry.path) else "-"   # something else, or a link to nothing


def _plain(value: Any) -> Any:
    """A value as JSON, with enough structure to rebuild it (tuples stay tuples)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, tuple | list):
        return {"t" if isinstance(value, tuple) else "l": [_plain(v) for v in value]}
    if isinstance(value, dict):
        return {"d": {str(k): _plain(v) for k, v in value.items()}}
    if dataclasses.is_dataclass(value) or hasattr(value, "model_dump"):
        return {"o": _record(value)}
    raise TypeError(f"cannot snapshot a {type(value).__name__}")


@functools.lru_cache(maxsize=64)
def _members(kind: type) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(fields, properties, argument-less public methods) of a dataclass type, worked out once
    per type: a big matrix has thousands of cells of the same few types."""
    import inspect  # only when writing a snapshot

    fields = tuple(f.name for f in dataclasses.fields(kind))
    public = [(name, member) for name, member in inspect.getmembers(kind)
              if not name.startswith("_") and name not in fields]
    properties = tuple(name for name, member in public if isinstance(member, property))
    calls = tuple(name for name, member in public
                  if inspect.isfunction(member) and len(inspect.signature(member).parameters) == 1)
    return fields, properties, calls


def _record(obj: Any) -> dict[str, Any]:
    """Every field, property and argument-less public method of `obj` (a dataclass), evaluated;
    of a pydantic model (the stand-in settings), its fields."""
    if not dataclasses.is_dataclass(obj):
        return {"values": {name: _plain(getattr(obj, name)) for name in type(obj).model_fields}, "calls": {}}
    kind: type = type(obj)   # a dataclass instance here, not the class
    fields, properties, methods = _members(kind)
    values = {name: _plain(getattr(obj, name)) for name in (*fields, *properties)}
    calls = {name: _plain(getattr(obj, name)()) for name in methods}
    return {"values": values, "calls": calls}


def _rebuild(data: Any) -> Any:
    if isinstance(data, dict):
        if "t" in data:
            return tuple(_rebuild(v) for v in data["t"])
        if "l" in data:
            return [_rebuild(v) for v in data["l"]]
        if "d" in data:
            return {k: _rebuild(v) for k, v in data["d"].items()}
        if "o" in data:
            return Record(data["o"])
    return data


def write(matrix: Any, key: str, names: list[str]) -> None:
    """Store `matrix` (a real Matrix) under `key`; `names` are the selections to remember.
    Every command that loads the matrix writes one, so a matrix too big for a snapshot to pay
    off gets none (writing costs about 0.2 ms a cell; release then loads it for real)."""
    if not key or len(matrix.cells) > MAX_CELLS:
        return
    record = _record(matrix)
    record["values"].pop("cells")
    cells = [_record(c) for c in matrix.cells]
    index = {id(c): i for i, c in enumerate(matrix.cells)}
    selections = {}
    for name in names:
        try:
            selections[name] = [index[id(c)] for c in matrix.select(name or None)]
        except Exception:  # noqa: BLE001 - a name the matrix refuses is simply not remembered
            continue
    body = json.dumps({"version": _VERSION, "matrix": record, "cells": cells, "selections": selections})
    path = cache_dir() / f"{key}.json"
    # No cache where it cannot be written: the next command loads for real again. A write that fails (a full disk,
    # Ctrl-C) leaves no temporary file behind.
    with contextlib.suppress(OSError):
        write_atomic(path, body)


def read(key: str, load: Callable[[], Any], matrix_dir: Path | None = None) -> MatrixSnapshot | None:
    """The snapshot under `key`, or None (load for real). `matrix_dir`: where the cells' site folders are."""
    if not key:
        return None
    try:
        data = json.loads((cache_dir() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    if not _well_formed(data):
        return None
    try:
        found = MatrixSnapshot(data, load)
    except (KeyError, TypeError, AttributeError, ValueError):   # damaged inside a record
        return None
    return found if _sites_still_pass(found, matrix_dir) else None


def _is_record(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("values"), dict) and isinstance(value.get("calls"), dict)


def _well_formed(data: Any) -> bool:
    """Whether `data` has the shape `write` gives it (this version, the matrix, its cells, selections of them):
    a snapshot damaged or written by other code is not read, so a real load replaces it."""
    if not isinstance(data, dict) or data.get("version") != _VERSION or not _is_record(data.get("matrix")):
        return False
    cells, selections = data.get("cells"), data.get("selections")
    if not isinstance(cells, list) or not all(map(_is_record, cells)) or not isinstance(selections, dict):
        return False
    return all(isinstance(picked, list) and all(type(i) is int and 0 <= i < len(cells) for i in picked)
               for picked in selections.values())


def _sites_still_pass(found: MatrixSnapshot, matrix_dir: Path | None) -> bool:
    """Whether every site folder a cell names would pass the load's check now (renamed, emptied of its
    test_*.py, or its name taken by image-tests since the snapshot: the real load must refuse it)."""
    folders = {c.extra_tests for c in found.cells if getattr(c, "extra_tests", None)}
    if not folders:
        return True
    if matrix_dir is None:   # nowhere to look: load for real
        return False
    from buildtool.contracts import sitetests  # only for a matrix with site folders: release starts fast

    return not any(sitetests.problem(matrix_dir / f, matrix_dir / "image-tests") for f in folders)


def selection_names(matrix: Any) -> list[str]:
    """Every name `select` knows: all, each image, each cell, each framework."""
    return ["", "all", *matrix.image_names, *(c.key for c in matrix.cells),
            *dict.fromkeys(c.framework for c in matrix.cells)]
