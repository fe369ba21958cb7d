"""A pytest plugin (`-p buildtool.validate.collect_plugin`) that records which tests a run defines.

`--defined-tests FILE` writes, when collection ends, every collected test before any `-k`
deselection (id `<group>/<file>::<name>` relative to the rootdir, which validate sets to
image-tests/, and whether it is marked `gpu`), plus the ids a selection deselected. validate
loads it into every run; release runs it with `--collect-only` to see what this checkout defines.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from buildtool.common.files import write_atomic

_DEFINED: list[dict[str, object]] = []
_DESELECTED: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--defined-tests", help="write the collected tests (before -k) here, as JSON")


def _id(config: pytest.Config, item: pytest.Item) -> str:
    name = item.nodeid.split("::", 1)[1] if "::" in item.nodeid else item.name
    return f"{item.path.resolve().relative_to(Path(config.rootpath).resolve()).as_posix()}::{name}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _DEFINED[:] = [{"id": _id(config, item), "gpu": item.get_closest_marker("gpu") is not None} for item in items]


def pytest_deselected(items: list[pytest.Item]) -> None:
    _DESELECTED.extend(_id(item.config, item) for item in items)


def pytest_collection_finish(session: pytest.Session) -> None:
    path = session.config.getoption("--defined-tests")
    if path:
        # Every xdist worker collects the same tests and writes them: each whole, never interleaved.
        write_atomic(Path(path), json.dumps({"defined": _DEFINED, "deselected": _DESELECTED}, indent=1))
