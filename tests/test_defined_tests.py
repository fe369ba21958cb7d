"""What a cell's groups define (collected from image-tests/, no engine) and the verdict validate
builds from a run: selection, deselected tests and an incomplete run recorded as such."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest

from buildtool.contracts.verdict import SCHEMA, Verdict
from buildtool.validate.collect import defined_tests
from buildtool.validate.options import Options
from buildtool.validate.run_plan import RunOutcome, RunPlan
from buildtool.validate.runner import Inventory, Resolved, make_verdict
from tests.conftest import fixture_matrix

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "image-tests"
CELLS = {c.key: c for c in fixture_matrix().cells}
CPU, NGC = CELLS["pytorch-cpu:2.13"], CELLS["pytorch-ngc:25.10"]


def test_collection_lists_every_test_of_the_cells_groups_with_its_ulimits(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = defined_tests(CPU, TESTS)
    assert cpu and all(i.split("/", 1)[0] in ("common", "pytorch") and "::" in i for i in cpu)
    assert "common/test_run_profile.py::test_ulimit[stack]" in cpu
    assert "common/test_run_profile.py::test_ulimit[memlock]" not in cpu      # the CPU profile sets no memlock
    ngc = defined_tests(NGC, TESTS)
    assert "common/test_run_profile.py::test_ulimit[memlock]" in ngc
    # Cached by the test code's hash: a second release does not run pytest again.
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("collected again"))
    assert defined_tests(CPU, TESTS) == cpu


def _verdict(tmp_path: Path, ran: list[dict], defined: list[str], deselected: list[str], rc: int = 0,
             select: str | None = None) -> Verdict:
    (tmp_path / "defined.json").write_text(json.dumps({"defined": [{"id": i, "gpu": False} for i in defined],
                                                       "deselected": deselected}))
    image = Resolved("r", "r@d", "sha256:" + "1" * 64, "h", "repo", {})
    plan = RunPlan("r", image, CPU, None, Options(select=select), Inventory([]), flags=[],  # type: ignore[arg-type]
                   tree=TESTS, groups=["common", "pytorch"])
    run = RunOutcome(dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"), 1.0, rc,
                     {"tests": ran, "figures": {}}, tmp_path / "defined.json")
    return make_verdict(plan, run, ("sha256:" + "5" * 64, ""), "sha256:" + "c" * 64)


def entry(id_: str, result: str = "passed") -> dict:
    return {"id": id_, "group": id_.split("/", 1)[0], "result": result, "duration_s": 0.1, "message": "",
            "skip_code": "", "skip_subject": "", "skip_reason": "", "gpu": False}


def test_a_selection_is_recorded_with_what_it_left_out(tmp_path: Path) -> None:
    v = _verdict(tmp_path, [entry("common/a.py::t")], ["common/a.py::t", "pytorch/b.py::u"], ["pytorch/b.py::u"],
                 select="t")
    # A selection never gives `passed`: the verdict does not cover the cell (the gate refuses it too).
    assert v.result == "incomplete" and "1 of the cell's 2 tests deselected by -k 't'" in v.incomplete[0]
    assert v.selection.expression == "t" and v.selection.deselected == ["pytorch/b.py::u"]
    assert v.defined_tests == ["common/a.py::t", "pytorch/b.py::u"] and v.schema_ == SCHEMA == 6
    assert (v.platform, v.emulated) == ("linux/amd64", False)     # the image's platform, native here


def test_a_run_that_stopped_early_is_incomplete_not_passed(tmp_path: Path) -> None:
    v = _verdict(tmp_path, [entry("common/a.py::t")], ["common/a.py::t", "pytorch/b.py::u"], [])
    assert v.result == "incomplete"
    assert _verdict(tmp_path, [entry("common/a.py::t", "failed")], ["common/a.py::t"], [], rc=1).result == "failed"
    assert _verdict(tmp_path, [entry("common/a.py::t")], ["common/a.py::t"], []).result == "passed"
