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
    assert flags["driver_rule"].startswith("driver 580.65.06 admitted: it supports CUDA 13.0 natively"), flags
    assert {"--gpus=all", "--ulimit=stack=67108864", "--shm-size=8g"} <= set(flags["figures"]["flags"]), flags
    # The cell asks for memlock=-1; an engine that cannot grant it (this one, measured) runs without it, as validate.
    granted = "--ulimit=memlock=-1" in flags["figures"]["flags"]
    assert granted != (flags["figures"]["not_granted"] == ["memlock"]), flags
    assert report["result"] == "failed" and proc.returncode == 2 and "stopped" not in report, printed


@pytest.mark.parametrize(("gpu_name", "driver", "rule"), [
    # NGC's forward compatibility admits R550 >= 550.163 for 25.10, on data-center GPUs only.
    ("NVIDIA GeForce RTX 4090", "550.163.01", "applies to data-center GPUs only, and NVIDIA GeForce RTX 4090"),
    ("NVIDIA H100 80GB HBM3", "545.23.08", "R545 is not a forward-compatible branch for CUDA 13.0"),
])
def test_gpu_smoke_refuses_a_driver_the_cell_cannot_run_on_naming_the_rule(tmp_path, gpu_cell_image,  # noqa: F811
                                                                          gpu_name, driver, rule):
    """gpu-smoke admits the host driver as validate does (buildtool/contracts/driver_rules.py) before any
    check: a refused driver fails the run_flags step with the rule's sentence, and no check runs.
    (FakeGpus' header says CUDA 12.4; gpu-smoke decides on the driver number, as nvidia-smi's query gives.)"""
    env = {**runner_env(tmp_path, FakeGpus(count=1, name=gpu_name, driver=driver, cuda="12.4"), engine="drop"),
           "PYTHONPATH": str(REPO)}
    out = tmp_path / "smoke.json"
    subprocess.run(["make", "-s", "gpu-smoke", f"GPU_SMOKE_OUT={out}", f"PYTHON={sys.executable}",
                    f"GPU_SMOKE_IMAGE={gpu_cell_image}"], cwd=REPO, env=env, capture_output=True, text=True,
                   timeout=300)
    report = json.loads(out.read_text())
    flags = report["steps"]["run_flags"]
    assert flags["status"] == "failed" and flags["reason"].startswith(f"cannot run {GPU_CELL} here: refused:"), flags
    assert rule in flags["reason"], flags
    # No check ran: each is failed for the runner's driver (a GPU runner that cannot run the cell is at fault).
    assert {name: (c["status"], c["reason"]) for name, c in report["checks"].items()} == {
        name: ("failed", flags["reason"])
        for name in ("nccl_ddp", "busbw", "profiler_kernel_view", "shm", "fsdp", "deepspeed_zero2")}
    assert report["result"] == "failed"
