"""A cell whose run profile gives its containers GPUs (`run.gpus` not none) is a GPU cell for validate as it is for
release (release.gates.is_gpu_cell), whatever its accelerator: its GPU tests, run on a runner without GPUs, are
`no-gpu-on-runner` skips naming why, and its verdict is `incomplete`, never `passed`."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from buildtool.contracts import skips
from buildtool.contracts.target import Expectations, FrameworkInfo, Target, write_target
from buildtool.release.gates import is_gpu_cell
from buildtool.validate import runner
from buildtool.validate.options import Options
from buildtool.validate.run_plan import RunOutcome, RunPlan, make_verdict
from buildtool.validate.runner import Inventory, Resolved
from tests.conftest import fixture_matrix

REPO = Path(__file__).resolve().parent.parent
MATRIX = fixture_matrix()
CPU = {c.key: c for c in MATRIX.cells}["pytorch-cpu:2.13"]
# A CPU build run with the host's GPUs (the matrix accepts it; release counts it a GPU cell).
CPU_WITH_GPUS = dataclasses.replace(CPU, run=dataclasses.replace(CPU.run, gpus="all"))
NO_GPU = Inventory([], problem="nvidia-smi not found (no NVIDIA driver on this runner)")


def _entry(id_: str, result: str, code: str = "") -> dict:
    return {"id": id_, "group": id_.split("/", 1)[0], "result": result, "skip_code": code, "gpu": "gpu" in id_}


def test_a_run_profile_with_gpus_makes_a_gpu_cell_whose_skipped_gpu_tests_are_not_a_pass(tmp_path: Path) -> None:
    assert is_gpu_cell(CPU_WITH_GPUS) and not is_gpu_cell(CPU)
    (tmp_path / "defined.json").write_text(json.dumps({"defined": [{"id": "common/a.py::t", "gpu": False},
                                                                   {"id": "common/gpu.py::t", "gpu": True}],
                                                       "deselected": []}))
    image = Resolved("r", "r@d", "sha256:" + "1" * 64, "h", "repo", {})
    plan = RunPlan("r", image, CPU_WITH_GPUS, MATRIX, Options(), NO_GPU, flags=[], gpu_problem=NO_GPU.problem,
                   tree=REPO / "image-tests", groups=["common"])
    run = RunOutcome(dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"), 1.0, 0,
                     {"tests": [_entry("common/a.py::t", "passed"),
                                _entry("common/gpu.py::t", "skipped", skips.NO_GPU_ON_RUNNER.code)]},
                     tmp_path / "defined.json")
    verdict = make_verdict(plan, run, ("sha256:" + "5" * 64, ""), "sha256:" + "c" * 64)
    assert verdict.result == "incomplete", verdict.result
    assert "1 GPU test(s) of this GPU cell did not pass on a GPU (nvidia-smi not found" in verdict.incomplete[0]
    assert verdict.runner.gpus_usable is False


def test_the_plan_of_a_cell_with_gpus_in_its_run_profile_says_why_its_run_has_none(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(runner, "probe_flags", lambda image, flags, log, cuda=None: (list(flags), []))
    image = Resolved("r", "r@d", "sha256:" + "1" * 64, "h", "repo", {})
    planned = runner._plan(RunPlan("r", image, CPU_WITH_GPUS, MATRIX, Options(reports=tmp_path), NO_GPU, flags=[]),
                           REPO, lambda line: None)
    assert planned.usable == [] and planned.gpu_problem == NO_GPU.problem
    plain = runner._plan(RunPlan("r", image, CPU, MATRIX, Options(reports=tmp_path), NO_GPU, flags=[]), REPO,
                         lambda line: None)
    assert plain.gpu_problem == ""


def _gpu_check_on(tmp_path: Path, gpu_problem: str) -> dict:
    """The result of a GPU check run by image-tests' conftest without GPUs, the target naming `gpu_problem`."""
    suite = tmp_path / "suite"
    suite.mkdir(parents=True)
    for name in ("conftest.py", "harness.py", "infra.py", "lanes.py", "pytest.ini"):
        shutil.copy2(REPO / "image-tests" / name, suite / name)
    (suite / "test_unit.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.gpu(what="CUDA kernels")
        def test_kernels():
            pass

        @pytest.mark.gpu(what="NCCL")
        def test_nccl(require_gpu):
            require_gpu("NCCL")
    """))
    info = FrameworkInfo(name="pytorch", module="torch", gpu_count_expr="0", events_writer=["x.py"])
    write_target(tmp_path / "target.json", Target(
        image="img", ref="img", digest="sha256:0", cell=CPU_WITH_GPUS.key, framework="pytorch", framework_info=info,
        accelerator="cpu", needs_gpu=False, run_flags=[], shm_promised="8g", shm_expected_bytes=8 << 30,
        expect=Expectations(), run_id="unit", deadline_s=480, probe_budget_s=300, gpu_problem=gpu_problem))
    subprocess.run([sys.executable, "-m", "pytest", str(suite), "-c", str(suite / "pytest.ini"), "--rootdir",
                    str(suite), "--target", str(tmp_path / "target.json"), "--results", str(tmp_path / "results.json"),
                    "-q", "-p", "no:xdist", "-p", "no:cacheprovider"],
                   env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    return {t["id"].split("::")[-1]: t for t in json.loads((tmp_path / "results.json").read_text())["tests"]}


def test_a_gpu_check_of_a_cpu_image_whose_run_profile_has_gpus_is_not_run_never_not_applicable(tmp_path) -> None:
    found = _gpu_check_on(tmp_path / "wanted", NO_GPU.problem)
    for name in ("test_kernels", "test_nccl"):
        assert found[name]["result"] == "skipped" and found[name]["skip_code"] == skips.NO_GPU_ON_RUNNER.code, found
        assert NO_GPU.problem in found[name]["skip_reason"]
    # A cell whose run profile has no GPUs: the check does not apply (as before).
    found = _gpu_check_on(tmp_path / "none", "")
    assert {t["skip_code"] for t in found.values()} == {skips.GPU_NOT_IN_CELL.code}
