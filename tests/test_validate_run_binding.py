"""What a verdict is bound to is what the run ran: the image tests and the matrix as they were when the run started,
never as they are when it ends (a checkout edited, or another branch checked out, during a long validation)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from buildtool.contracts import label_keys
from buildtool.matrix.loader import load_matrix
from buildtool.validate import network, runner
from buildtool.validate.collect import image_tests_hash
from buildtool.validate.containers import Resolved
from buildtool.validate.options import Options
from buildtool.validate.probe import Inventory

IMAGE = Resolved(ref="pytorch-cpu-dev:t", run_ref="pytorch-cpu-dev:t", digest="sha256:" + "a" * 64, host=None,
                 repo=None, labels={label_keys.CELL: "pytorch-cpu:2.13"})
PASSED = {"id": "common/test_x.py::test_x", "group": "common", "result": "passed"}


def _validate(root: Path, monkeypatch: pytest.MonkeyPatch, during: Any) -> dict[str, Any]:
    """validate_image of a local image in `root` (--no-store), every step as it is up to pytest, which is replaced by
    one that runs `during()` and writes a passing run's results."""
    monkeypatch.setattr(runner, "gpu_inventory", lambda: Inventory([], problem="nvidia-smi not found"))
    monkeypatch.setattr(runner, "resolve", lambda *_a, **_k: IMAGE)
    monkeypatch.setattr(runner, "probe_flags", lambda _image, flags, *_a, **_k: (flags, []))
    monkeypatch.setattr("buildtool.validate.sbomref.verdict_sbom", lambda *_a: ("", "no registry"))
    monkeypatch.setattr(runner, "label_checks", lambda *_a: [])
    monkeypatch.setattr(network, "run_network", lambda *_a, **_k: contextlib.nullcontext("net"))
    monkeypatch.setattr(runner, "remove_run_containers", lambda *_a, **_k: None)

    def pytest_run(argv: list[str], *_a: Any, **_k: Any) -> int:
        during()
        Path(argv[argv.index("--results") + 1]).write_text(json.dumps({"tests": [PASSED]}))
        Path(argv[argv.index("--defined-tests") + 1]).write_text(
            json.dumps({"defined": [{"id": PASSED["id"], "gpu": False}], "deselected": []}))
        return 0
    monkeypatch.setattr(runner, "_run_pytest", pytest_run)
    matrix = load_matrix(root / "matrix.yaml", root / "templates")
    return runner.validate_image(IMAGE.ref, matrix, root, Options(store=False, jobs=1), lambda _line: None)


def test_image_tests_edited_during_the_run_are_not_the_test_code_the_verdict_names(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the test code was hashed after pytest ended, so a test changed meanwhile (an edit, a `git checkout`)
    was named as run: a later validate reused that pass for code that never ran, and release took it as a run of it."""
    tests = project / "image-tests"
    before = image_tests_hash(tests)
    test = next((tests / "common").glob("test_*.py"))

    def edit() -> None:
        test.write_text(test.read_text() + "\ndef test_added_meanwhile():\n    assert False\n")
    verdict = _validate(project, monkeypatch, edit)
    assert image_tests_hash(tests) != before
    assert verdict["test_code"] == before, "the verdict names test code that never ran"


def test_a_matrix_edited_during_the_run_is_not_the_matrix_the_verdict_names(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the matrix file was hashed after pytest ended, so a matrix changed meanwhile was named as the one the
    run read (its cell, library promises and run profile were those of the matrix as loaded)."""
    path = project / "matrix.yaml"
    before = runner.matrix_digest(load_matrix(path, project / "templates"), project)

    def edit() -> None:
        path.write_text(path.read_text() + "\n# changed during the run\n")
    verdict = _validate(project, monkeypatch, edit)
    assert verdict["matrix_digest"] == before, "the verdict names a matrix the run did not read"
