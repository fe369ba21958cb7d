"""`make gpu-smoke` end to end on a simulated one-GPU runner: a fake nvidia-smi listing one GPU first on
PATH, and an engine shim (DOCKER_CLIENT) that drops `--gpus`, so the containers run on CPU. The image
is test_gpu_runner's GPU-cell fixture (this commit's pytorch-cpu dev image relabelled as a stand-in of
pytorch-ngc:25.10). Every path must say what really happened: what ran and worked passed, busbw
"not run" (one GPU), and NCCL and the profiler's CUDA view failed because torch sees no CUDA device,
never passed. Cost: about a minute (one DDP run, a profile, TensorBoard, the /dev/shm workers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_gpu_runner import GPU_CELL, gpu_cell_image  # noqa: E402, F401  (the fixture)

from tests.gpu_sim import FakeGpus, runner_env  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.engine]
REPO = Path(__file__).resolve().parents[2]


def test_make_gpu_smoke_on_a_one_gpu_runner_whose_engine_drops_the_gpus(tmp_path, gpu_cell_image):  # noqa: F811
    env = {**runner_env(tmp_path, FakeGpus(count=1), engine="drop"), "PYTHONPATH": str(REPO)}
    out = tmp_path / "smoke.json"
    proc = subprocess.run(["make", "-s", "gpu-smoke", f"GPU_SMOKE_OUT={out}", f"PYTHON={sys.executable}",
                           f"GPU_SMOKE_IMAGE={gpu_cell_image}", "GPU_SMOKE_DEADLINE_S=400"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    report = json.loads(out.read_text())
    checks, printed = report["checks"], proc.stdout + proc.stderr
    assert checks["shm"]["status"] == "passed", checks["shm"]
    assert checks["shm"]["figures"]["shm_bytes"] >= 8 << 30
    profiler = checks["profiler_kernel_view"]
    assert profiler["status"] == "failed" and profiler["reason"].startswith(
        "torch sees no CUDA device, so the profile has no CUDA activity"), profiler
    assert {"Overview", "Operator", "Trace"} <= set(profiler["figures"]["views"]), profiler
    ddp = checks["nccl_ddp"]
    assert ddp["status"] == "failed" and "torch sees no CUDA device, so NCCL did not run" in ddp["reason"], ddp
    assert ddp["figures"]["backend"] == "gloo" and ddp["figures"]["world_size"] == 1
    assert checks["busbw"] == {"status": "not run", "reason": "one GPU: the bus bandwidth needs two or more GPUs"}
    steps = report["steps"]
    assert steps["pull"]["status"] == "passed" and "not pulled" in steps["pull"]["reason"], steps
    flags = steps["run_flags"]
    assert flags["status"] == "passed" and flags["reason"] == f"cell {GPU_CELL}", flags
    assert {"--gpus=all", "--ulimit=stack=67108864", "--shm-size=8g"} <= set(flags["figures"]["flags"]), flags
    # The cell asks for memlock=-1; an engine that cannot grant it (this one, measured) runs without it, as validate.
    granted = "--ulimit=memlock=-1" in flags["figures"]["flags"]
    assert granted != (flags["figures"]["not_granted"] == ["memlock"]), flags
    assert report["result"] == "failed" and proc.returncode == 2 and "stopped" not in report, printed
