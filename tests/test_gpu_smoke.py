"""`make gpu-smoke` on a machine without a GPU: every check says "no GPU: not run", the result is
"not run" (exit 1), never "passed"; GPUs that cannot be used are failures, not passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.gpu_sim import FakeGpus, runner_env

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "scripts" / "gpu_smoke.py"
CHECKS = {"nccl_ddp", "busbw", "profiler_kernel_view", "shm"}


def smoke(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, dict, str]:
    out = tmp_path / "smoke.json"
    proc = subprocess.run([sys.executable, str(SMOKE), *args, "--out", str(out)], capture_output=True, text=True,
                          timeout=300, env=env)
    return proc.returncode, json.loads(out.read_text()), proc.stdout + proc.stderr


def test_without_a_gpu_every_check_is_not_run(tmp_path):
    env = runner_env(tmp_path, None)  # no nvidia-smi anywhere on PATH
    for mode in (["--image", "127.0.0.1:5000/pytorch-cuda-dev:x-2.13"], ["--python", sys.executable]):
        code, report, printed = smoke(tmp_path, env, *mode)
        assert code == 1 and report["result"] == "not run", report
        assert set(report["checks"]) == CHECKS
        for name, check in report["checks"].items():
            assert check["status"] == "not run" and check["reason"].startswith("no GPU: not run"), (name, check)
            assert f"{name}" in printed and "passed" not in json.dumps(check)
        assert "gpu-smoke: not run" in printed and report["gpus"] == []


def test_gpus_that_torch_cannot_use_are_failures(tmp_path):
    """nvidia-smi lists GPUs but the host Python cannot use them (here: a CPU build of torch, and
    no TensorBoard in the toolkit's venv)."""
    env = runner_env(tmp_path, FakeGpus(count=2))
    code, report, printed = smoke(tmp_path, env, "--python", sys.executable)
    assert code == 1 and report["result"] == "failed", report
    for check in report["checks"].values():
        assert check["status"] == "failed", check
        assert "sees no CUDA device" in check["reason"] or "lacks torch or tensorboard" in check["reason"], check


def test_an_engine_that_refuses_gpus_fails_the_checks(tmp_path):
    """The engine shim is DOCKER_CLIENT (no --docker): its refusal of --gpus is what fails the checks."""
    env = runner_env(tmp_path, FakeGpus(count=2), engine="refuse")
    code, report, _ = smoke(tmp_path, env, "--image", "t-none:1", "--deadline", "60")
    assert code == 1 and report["result"] == "failed", report
    assert report["checks"]["nccl_ddp"]["status"] == "failed"
    assert "could not select device driver" in report["checks"]["nccl_ddp"]["reason"]
    assert not any(c["status"] == "passed" for c in report["checks"].values())


def test_make_gpu_smoke_writes_the_json(tmp_path):
    env = {**runner_env(tmp_path, None), "PYTHONPATH": str(REPO)}
    out = tmp_path / "make.json"
    proc = subprocess.run(["make", "-s", "gpu-smoke", f"GPU_SMOKE_OUT={out}", f"PYTHON={sys.executable}",
                           "GPU_SMOKE_IMAGE=127.0.0.1:5000/pytorch-cuda-dev:x-2.13"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and json.loads(out.read_text())["result"] == "not run", proc.stdout + proc.stderr
    assert os.path.getsize(out) > 0
