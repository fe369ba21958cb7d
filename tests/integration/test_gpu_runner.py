"""A GPU runner, simulated (tests/gpu_sim.py: a fake nvidia-smi first on PATH, an engine shim
that refuses or drops `--gpus`), against real containers: `buildtool validate` as a process.

The GPU cell under test is a small fixture, not pytorch-cuda (5 GB, never built in CI): the image
tests' PyTorch fixture (this commit's pytorch-cpu dev image) relabelled, in a config-only layer, as
a stand-in of the GPU cell pytorch-ngc:25.10, with the NVIDIA_* variables a GPU image carries.
Stand-ins are what the pipeline builds for NGC cells here, so the contents checks apply as they
do to a real stand-in.

What must hold: a runner that lists GPUs the engine cannot give to containers fails loudly
(exit 1, the fix named); a driver too old for the cell's CUDA fails naming the minimum driver;
a runner without usable GPUs gets an `incomplete` verdict, never `passed`, with the selection,
the defined tests and the GPU inventory recorded; a runner whose engine silently drops the
GPUs fails the GPU visibility check. Cost: about 1.5 minutes (one short DDP run; the rest fail
before or right after the first container).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_images  # noqa: E402

from buildtool.common import docker_cli  # noqa: E402
from buildtool.contracts import label_keys  # noqa: E402
from buildtool.contracts.verdict import SCHEMA  # noqa: E402
from tests.gpu_sim import (  # noqa: E402
    HOOK_NVML_MISMATCH,
    NO_RUNTIME_CLIENT_28,
    NVML_MISMATCH,
    FakeGpus,
    runner_env,
)

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]
REPO = Path(__file__).resolve().parents[2]
GPU_CELL = "pytorch-ngc:25.10"
GPU_LABELS = {
    label_keys.CELL: GPU_CELL, label_keys.FRAMEWORK: "pytorch",
    label_keys.FRAMEWORK_VERSION: "2.9.0a0", label_keys.ACCELERATOR: "cuda",
    label_keys.CUDA: "13.0", label_keys.TESTS: "common,pytorch",
    label_keys.STANDIN: "true", label_keys.STANDIN_FRAMEWORK: "2.13.0+cpu",
    label_keys.STANDIN_PYTHON: "3.11", label_keys.FIXTURE: "true",
}
GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
           "NVIDIA_REQUIRE_CUDA": "cuda>=13.0"}
GPU_TESTS = {"common/test_contents.py::test_gpus_visible", "pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw",
             "pytorch/test_profiler.py::test_profiler_cuda_kernels"}


def _docker(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return docker_cli.docker(*args, timeout=timeout, check=True)


@pytest.fixture(scope="module")
def gpu_cell_image() -> str:
    """The PyTorch fixture relabelled as a stand-in of a GPU cell (a config-only layer, reused by tag)."""
    base = fixture_images.ensure("pytorch")
    changes = [f"LABEL {k}={json.dumps(v)}" for k, v in sorted(GPU_LABELS.items())]
    changes += [f"ENV {k}={v}" for k, v in sorted(GPU_ENV.items())]
    ref = f"t-imgtest-gpucell:{hashlib.sha256(json.dumps([base, changes]).encode()).hexdigest()[:12]}"
    if fixture_images.image_id(ref) is None:
        name = _docker("create", base, "true").stdout.strip()
        try:
            _docker("commit", *[a for c in changes for a in ("--change", c)], name, ref)
        finally:
            docker_cli.remove(name, timeout=60)
    return ref


def validate(tmp_path: Path, env: dict[str, str], image: str, *args: str) -> tuple[int, str, str, dict[str, Any]]:
    """`python -m buildtool validate IMAGE --no-store --json ARGS` on the simulated runner."""
    reports = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "buildtool", "validate", image, "--no-store", "--json",
                           "--reports", str(reports), "--matrix", str(REPO / "matrix.yaml"), *args],
                          cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=1200)
    verdicts = json.loads(proc.stdout) if proc.stdout.strip().startswith("[") else []
    return proc.returncode, proc.stdout, proc.stderr, (verdicts[0] if verdicts else {})


def leftover_containers(image: str) -> list[str]:
    """Validation containers of `image` (its own tag: other tests' validations on other xdist workers
    are never counted)."""
    proc = docker_cli.docker("ps", "-aq", "--filter", f"label={label_keys.IMAGETEST_RUN}",
                             "--filter", f"ancestor={image}", timeout=60)
    return proc.stdout.split()


def test_gpus_listed_but_engine_without_nvidia_runtime_fails_loudly(gpu_cell_image, tmp_path):
    before = set(leftover_containers(gpu_cell_image))
    env = runner_env(tmp_path, FakeGpus(), engine="refuse")
    code, out, err, _ = validate(tmp_path, env, gpu_cell_image)
    print(err.strip().splitlines()[-1])
    assert code == 1, (code, err[-2000:])
    assert "NVIDIA Container Toolkit" in err and "could not select device driver" in err, err[-2000:]
    assert not list((tmp_path / "reports").rglob("verdict.json")), "a runner fault must not leave a verdict"
    assert set(leftover_containers(gpu_cell_image)) <= before


@pytest.mark.parametrize("refusal, cause", [
    (NO_RUNTIME_CLIENT_28, 'could not select device driver "" with capabilities: [[gpu]])'),
    (HOOK_NVML_MISMATCH, "(nvidia-container-cli: initialization error: nvml error: driver/library version mismatch)"),
], ids=["client-28-no-runtime", "hook-nvml-mismatch"])
def test_engine_refusal_quotes_the_cause_not_the_clients_usage_hint(gpu_cell_image, tmp_path, refusal, cause):
    """Engines end a refusal with "Run 'docker run --help' for more information" (client 23 on) or an ERRO
    line (20.10): the one-line error quotes the line before them that says why."""
    env = runner_env(tmp_path, FakeGpus(), engine="refuse", refusal=refusal)
    code, _, err, _ = validate(tmp_path, env, gpu_cell_image)
    last = err.strip().splitlines()[-1]
    assert code == 1 and cause in last, (code, err[-2000:])
    assert "--help" not in last and "ERRO[" not in last


def test_driver_too_old_for_the_cells_cuda_fails_naming_the_minimum(gpu_cell_image, tmp_path):
    env = runner_env(tmp_path, FakeGpus(driver="550.54.14", cuda="12.4"))
    code, out, err, _ = validate(tmp_path, env, gpu_cell_image)
    print(err.strip().splitlines()[-1])
    assert code == 1, (code, err[-2000:])
    # An NGC cell on an R550 driver older than NGC 25.10's forward-compatibility minimum: the rule is named.
    assert "too old for CUDA 13.0" in err and "forward-compatibility rule needs R550 >= 550.163" in err, err[-2000:]
    assert "580.65.06 or newer" in err, err[-2000:]


def test_gpu_cell_without_usable_gpus_is_incomplete_never_passed(gpu_cell_image, tmp_path):
    """nvidia-smi fails (driver/NVML mismatch after a kernel update): the GPU checks are skipped
    with the reason and the verdict is `incomplete`; -k narrows the run and is recorded."""
    env = runner_env(tmp_path, FakeGpus(broken=NVML_MISMATCH))
    select = "framework_version or nvidia_runtime or gpus_visible or busbw or cuda_kernels"
    code, out, err, verdict = validate(tmp_path, env, gpu_cell_image, "-k", select)
    assert code == 0, (code, err[-3000:])
    assert verdict["result"] == "incomplete", verdict
    assert "INCOMPLETE" in err and "cannot release" in err
    results = {t["id"]: t for t in verdict["tests"]}
    for test in GPU_TESTS:
        assert results[test]["result"] == "skipped" and results[test]["skip_code"] == "no-gpu-on-runner", \
            results[test]
        assert NVML_MISMATCH in results[test]["skip_reason"] and results[test]["gpu"] is True
    for test in ("framework_version", "nvidia_runtime_variables", "allreduce_busbw_measured_as_nccl_tests"):
        assert next(t for i, t in results.items() if i.endswith(test))["result"] == "passed", test
    # What the gate needs: the selection, every defined test, the GPU tests and the runner's GPUs.
    assert verdict["selection"]["expression"] == select
    deselected = set(verdict["selection"]["deselected"])
    assert deselected and not deselected & set(results)
    assert set(verdict["defined_tests"]) == deselected | set(results)
    assert set(verdict["gpu_tests"]) >= GPU_TESTS   # and any other GPU test the groups define:
    for test in verdict["gpu_tests"]:
        assert test in deselected or results[test]["skip_code"] == "no-gpu-on-runner", test
    assert any("GPU test(s)" in r and NVML_MISMATCH in r for r in verdict["incomplete"]), verdict["incomplete"]
    assert any("deselected by -k" in r for r in verdict["incomplete"]), verdict["incomplete"]
    runner = verdict["runner"]
    assert runner["gpus"] == [] and runner["gpus_usable"] is False and NVML_MISMATCH in runner["gpu_problem"]
    assert verdict["framework_version"] == "2.13.0+cpu"
    # The verdict file validate wrote says the same.
    written = json.loads(next((tmp_path / "reports").rglob("verdict.json")).read_text())
    assert written["result"] == "incomplete" and written["schema"] == SCHEMA


def test_engine_that_drops_the_gpus_fails_the_visibility_check(gpu_cell_image, tmp_path):
    env = runner_env(tmp_path, FakeGpus(count=2), engine="drop")
    code, out, err, verdict = validate(tmp_path, env, gpu_cell_image, "-k", "gpus_visible")
    assert code == 1, (code, err[-2000:])
    (test,) = [t for t in verdict["tests"] if t["id"].endswith("test_gpus_visible")]
    print(test["message"].splitlines()[0])
    assert test["result"] == "failed" and "the runner has 2 GPUs but pytorch in the image sees 0" in test["message"]
    assert verdict["result"] == "failed" and len(verdict["runner"]["gpus"]) == 2
    assert verdict["runner"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert verdict["runner"]["cuda_driver"] == "13.0"


def test_require_gpu_on_a_runner_without_gpus_exits_1(gpu_cell_image, tmp_path):
    env = runner_env(tmp_path, None)  # no nvidia-smi at all
    code, _, err, _ = validate(tmp_path, env, gpu_cell_image, "--require-gpu")
    assert code == 1 and "declared a GPU runner" in err and "nvidia-smi not found" in err, err[-2000:]
    code, _, err, _ = validate(tmp_path, {**env, "DL_IMAGES_REQUIRE_GPU": "1"}, gpu_cell_image)
    assert code == 1 and "declared a GPU runner" in err, err[-2000:]
    assert not list((tmp_path / "reports").rglob("verdict.json"))


def test_cpu_cell_on_a_gpu_runner_is_not_given_gpus(tmp_path):
    """A CPU cell on a runner whose engine would refuse --gpus: never started with GPUs, so it runs."""
    env = runner_env(tmp_path, FakeGpus(), engine="refuse")
    code, _, err, verdict = validate(tmp_path, env, fixture_images.ensure("pytorch"), "-k", "framework_version",
                                     "--require-gpu")
    assert code == 0, err[-2000:]
    assert verdict["result"] == "incomplete" and verdict["runner"]["gpus_usable"] is None
    assert len(verdict["runner"]["gpus"]) == 8 and verdict["runner"]["gpu_runner"] is True
    assert not any(f.startswith("--gpus") for f in verdict["run_flags"])
