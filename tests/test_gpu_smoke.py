"""`make gpu-smoke` without a GPU: simulated runners (tests/gpu_sim.py's fake nvidia-smi, a fake docker
client, a fake or the toolkit's CPU Python). What ran and worked says passed, what could not run says
"not run" and why, what a GPU would need fails naming the cause; the JSON is written whatever happens."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from buildtool.contracts import label_keys
from tests.gpu_sim import FakeGpus, runner_env

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "scripts" / "gpu_smoke.py"
CHECKS = {"nccl_ddp", "busbw", "profiler_kernel_view", "shm", "fsdp", "deepspeed_zero2"}
OLD_MARKERS = ("PROFILE_OK", "TB_RESULT", "SHM_OK")


def smoke(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, dict, str]:
    out = tmp_path / "smoke.json"
    proc = subprocess.run([sys.executable, str(SMOKE), *args, "--out", str(out)], capture_output=True, text=True,
                          timeout=300, env=env)
    return proc.returncode, json.loads(out.read_text()), proc.stdout + proc.stderr


def load_smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SMOKE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_smoke"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def fake_docker(folder: Path, body: str = "") -> tuple[Path, Path]:
    """A docker client that logs its calls, runs `body` first, holds a pytorch-cuda image (labels) and
    starts every container (exit 0, writing nothing)."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "calls.log"
    inspect = json.dumps([{"Id": "sha256:feed", "Config": {"Labels": {label_keys.CELL: "pytorch-cuda:2.13"}}}])
    path = folder / "docker"
    path.write_text(f"""#!/bin/bash
printf '%s\\n' "$*" >> {log}
{body}
case "$1 $2" in
  "image inspect") echo '{inspect}'; exit 0 ;;
  "version --format") echo 20.10.24; exit 0 ;;
esac
exit 0
""")
    path.chmod(0o755)
    return path, log


def fake_python(folder: Path) -> Path:
    """A host Python that says it has CUDA torch and TensorBoard, and whose torchrun hangs (touching
    `started` first, so a test knows the DDP check is running)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "python"
    path.write_text(f"""#!/bin/bash
case "$*" in
  *importlib.util*) echo '{{"tensorboard": true, "torch": "2.9.0+cu130", "cuda": true}}' ;;
  *torch.distributed.run*) touch {folder}/started; exec sleep 300 ;;
  *) echo "fake python: $*" >&2; exit 3 ;;
esac
""")
    path.chmod(0o755)
    return path


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


@pytest.mark.host_torch  # runs the in-image torch scripts with this Python
def test_the_probes_write_results_not_the_old_markers(tmp_path, monkeypatch):
    """The in-image scripts, run for real on CPU with this Python, print none of the markers the smoke
    used to wait for; the smoke reads their result files: /dev/shm passes, and the profiler's trace is
    written (what fails is TensorBoard, absent from this Python, and it is named)."""
    scripts = REPO / "image-tests" / "scripts"
    for argv in ([scripts / "shm_workers.py", "torch"], [REPO / "image-tests/pytorch/scripts/torch_profile.py",
                                                         tmp_path / "trace", "run1"]):
        out = tmp_path / Path(argv[0]).stem
        out.mkdir()
        ran = subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "IMAGETEST_OUT": str(out), "PYTHONPATH": str(scripts)})
        assert ran.returncode == 0 and json.loads((out / "result.json").read_text())["ok"], ran.stderr
        assert not any(marker in ran.stdout + ran.stderr for marker in OLD_MARKERS), ran.stdout
    gpu_smoke = load_smoke()
    runner = gpu_smoke.Runner("", sys.executable, tmp_path / "work")
    shm = gpu_smoke.check_shm(runner, 120)
    assert shm["status"] == "passed" and shm["figures"]["moved_bytes"] == 4 * (96 << 20), shm
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no tensorboard command
    profiled = gpu_smoke.check_profiler(runner, lambda cap: cap)
    assert profiled["status"] == "failed", profiled
    assert profiled["reason"].startswith("TensorBoard serving the trace: no `tensorboard` command on PATH"), profiled
    traces = list((runner.out / "trace" / gpu_smoke.RUN).glob("*.pt.trace.json"))
    assert traces, list((runner.out / "trace").rglob("*"))


@pytest.mark.host_torch  # the host Python is this CPU torch (the `scaling` extra's)
def test_host_python_without_tensorboard_or_cuda(tmp_path):
    """nvidia-smi lists two GPUs; the host Python is this CPU torch without TensorBoard. Each check
    says its own truth: DDP ran on gloo (no CUDA device), so no NCCL bus bandwidth; the profiler needs
    TensorBoard; /dev/shm works."""
    env = runner_env(tmp_path, FakeGpus(count=2))
    code, report, printed = smoke(tmp_path, env, "--python", sys.executable)
    checks = report["checks"]
    assert code == 1 and report["result"] == "failed", report
    assert "tensorboard is not installed" in checks["profiler_kernel_view"]["reason"], checks
    assert checks["shm"]["status"] == "passed", checks["shm"]
    assert checks["nccl_ddp"]["status"] == "failed" and checks["nccl_ddp"]["figures"]["backend"] == "gloo"
    assert "torch sees no CUDA device" in checks["nccl_ddp"]["reason"], checks["nccl_ddp"]
    assert checks["nccl_ddp"]["figures"]["world_size"] == 2
    assert checks["busbw"]["status"] == "failed" and "no NCCL all-reduce ran" in checks["busbw"]["reason"]
    assert report["steps"]["python"]["figures"] == {"tensorboard": False, "torch": "2.13.0+cpu", "cuda": False}
    # FSDP ran (gloo, the same parameters as the unsharded replay) but not on GPUs; DeepSpeed is not here at all.
    assert checks["fsdp"]["status"] == "failed" and checks["fsdp"]["reason"] == (
        "FSDP: backend gloo, not nccl: torch sees no CUDA device"), checks["fsdp"]
    assert {k: checks["deepspeed_zero2"][k] for k in ("status", "reason")} == {
        "status": "not run", "reason": "DeepSpeed ZeRO-2: DeepSpeed is not installed in this image "
                                       "(ModuleNotFoundError: No module named 'deepspeed')"}


def test_a_failed_pull_is_its_own_step(tmp_path):
    client, log = fake_docker(tmp_path / "client", '[ "$1" = pull ] && { echo "Error response from daemon: '
                              'manifest unknown" >&2; exit 1; }')
    env = {**runner_env(tmp_path, FakeGpus(count=1)), "DOCKER_CLIENT": str(client)}
    code, report, _ = smoke(tmp_path, env, "--image", "127.0.0.1:5000/pytorch-cuda-dev:x-2.13")
    pull = report["steps"]["pull"]
    assert pull["status"] == "failed" and pull["reason"] == (
        "cannot pull 127.0.0.1:5000/pytorch-cuda-dev:x-2.13: Error response from daemon: manifest unknown"), pull
    assert code == 1 and report["result"] == "failed"
    for check in report["checks"].values():
        assert check == {"status": "not run", "reason": "the image is not there (steps.pull)"}, check
    assert not any(c.startswith("run ") for c in log.read_text().splitlines())


def test_a_slow_pull_has_its_own_bound(tmp_path):
    client, _ = fake_docker(tmp_path / "client", '[ "$1" = pull ] && exec sleep 60')
    env = {**runner_env(tmp_path, FakeGpus(count=1)), "DOCKER_CLIENT": str(client)}
    _, report, _ = smoke(tmp_path, env, "--image", "127.0.0.1:5000/pytorch-cuda-dev:x-2.13", "--pull-timeout", "1")
    pull = report["steps"]["pull"]
    assert pull["timed_out"] and "did not finish within 1 s (--pull-timeout)" in pull["reason"], pull
    assert {c["status"] for c in report["checks"].values()} == {"not run"}


def test_run_flags_are_probed_as_validate_probes_them(tmp_path):
    """An engine that cannot grant memlock=-1: the flag is dropped and recorded, as validate does, and
    the checks' containers start with the rest of the cell's run profile and --gpus."""
    refuse = ('[[ "$*" == *"--entrypoint true"*"--ulimit=memlock"* ]] && { echo "docker: Error response from '
              'daemon: failed to create shim: setrlimit RLIMIT_MEMLOCK: operation not permitted" >&2; exit 125; }')
    client, log = fake_docker(tmp_path / "client", refuse)
    env = {**runner_env(tmp_path, FakeGpus(count=1)), "DOCKER_CLIENT": str(client)}
    _, report, _ = smoke(tmp_path, env, "--image", "127.0.0.1:5000/pytorch-cuda-dev:x-2.13", "--deadline", "60")
    flags = report["steps"]["run_flags"]
    assert flags["status"] == "passed" and flags["figures"]["not_granted"] == ["memlock"], flags
    started = [c for c in log.read_text().splitlines() if c.startswith("run --rm --init --name t-gpu-smoke-")]
    assert started, log.read_text()
    for call in started:
        assert "memlock" not in call and "--ulimit=stack=67108864" in call and "--gpus=all" in call, call
        assert "--shm-size=8g" in call


def test_sigterm_writes_the_json_naming_the_step(tmp_path):
    """What the Makefile's outer timeout sends: the JSON is written, naming the check it stopped and
    every check that did not run."""
    python = fake_python(tmp_path / "py")
    out = tmp_path / "smoke.json"
    proc = subprocess.Popen([sys.executable, str(SMOKE), "--python", str(python), "--wheels", str(tmp_path / "none"),
                             "--out", str(out)], env=runner_env(tmp_path, FakeGpus(count=2)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for _ in range(600):   # until the DDP check runs (a poll, not a time assertion)
        if (tmp_path / "py" / "started").exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    printed, _ = proc.communicate(timeout=60)
    report = json.loads(out.read_text())
    assert proc.returncode == 1 and report["result"] == "failed", printed
    assert report["stopped"] == {"step": "nccl_ddp", "why": "SIGTERM (an outer timeout or an interrupt)"}
    assert report["checks"]["nccl_ddp"]["timed_out"]
    for name in ("busbw", "profiler_kernel_view", "shm"):
        assert report["checks"][name]["status"] == "not run", report["checks"][name]
        assert "stopped during nccl_ddp" in report["checks"][name]["reason"]


def test_an_engine_that_refuses_gpus_fails_the_checks(tmp_path):
    """The engine shim is DOCKER_CLIENT (no --docker): its refusal of --gpus, met when the run flags are
    probed, is what fails the run; no check passes."""
    client, _ = fake_docker(tmp_path / "client")
    env = runner_env(tmp_path, FakeGpus(count=2), engine="refuse")
    env = runner_env(tmp_path, FakeGpus(count=2), engine="refuse", base={**env, "DOCKER_CLIENT": str(client)})
    code, report, _ = smoke(tmp_path, env, "--image", "t-none:1", "--deadline", "60")
    assert code == 1 and report["result"] == "failed", report
    flags = report["steps"]["run_flags"]
    assert flags["status"] == "failed" and "could not select device driver" in flags["reason"], flags
    assert "cannot be started with them" in flags["reason"]
    assert not any(c["status"] == "passed" for c in report["checks"].values())


def test_make_gpu_smoke_writes_the_json(tmp_path):
    env = {**runner_env(tmp_path, None), "PYTHONPATH": str(REPO)}
    out = tmp_path / "make.json"
    proc = subprocess.run(["make", "-s", "gpu-smoke", f"GPU_SMOKE_OUT={out}", f"PYTHON={sys.executable}",
                           "GPU_SMOKE_IMAGE=127.0.0.1:5000/pytorch-cuda-dev:x-2.13"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and json.loads(out.read_text())["result"] == "not run", proc.stdout + proc.stderr
    assert os.path.getsize(out) > 0


def test_make_gpu_smoke_stops_itself_before_the_outer_timeout(tmp_path):
    """A check that hangs: the script's own bounds end it and the JSON says so; the outer timeout
    (pull + deadline + 90 s) never has to act."""
    python = fake_python(tmp_path / "py")
    env = {**runner_env(tmp_path, FakeGpus(count=1)), "PYTHONPATH": str(REPO)}
    out = tmp_path / "make.json"
    proc = subprocess.run(["make", "-s", "gpu-smoke", f"GPU_SMOKE_OUT={out}", f"PYTHON={sys.executable}",
                           f"GPU_SMOKE_PYTHON={python}", f"GPU_SMOKE_WHEELS={tmp_path / 'none'}",
                           "GPU_SMOKE_DEADLINE_S=11", "GPU_SMOKE_PULL_S=1"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    report = json.loads(out.read_text())
    assert proc.returncode == 2 and "Terminated" not in proc.stderr and "stopped" not in report, proc.stderr
    ddp = report["checks"]["nccl_ddp"]
    assert ddp["status"] == "failed" and ddp["timed_out"] and ddp["reason"].startswith("torchrun timed out after"), ddp
    assert report["checks"]["busbw"]["status"] == "not run"
    for name in ("profiler_kernel_view", "shm"):
        check = report["checks"][name]
        assert check["status"] == "not run" and "(nccl_ddp ran past its bound)" in check["reason"], check


def _listing(folder: Path, rows: list[str]) -> Path:
    """A fake nvidia-smi in `folder` that answers --query-gpu with `rows`, as a broken runner's does."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rows").write_text("".join(f"{row}\n" for row in rows))
    script = folder / "nvidia-smi"
    script.write_text(f'#!/bin/bash\ncase "$*" in\n  *--query-gpu*) cat {folder / "rows"} ;;\n  *) exit 3 ;;\nesac\n')
    script.chmod(0o755)
    return folder


@pytest.mark.parametrize(("rows", "why"), [
    (["0, NVIDIA H100 80GB HBM3, 570.86.15, [GPU requires reset]"],
     "nvidia-smi lists GPU 0 (NVIDIA H100 80GB HBM3) but reads its memory.total as '[GPU requires reset]'"),
    (["0, NVIDIA H100 80GB HBM3, 570.86.15, 81559", "Unable to determine the device handle for GPU0000:65:00.0: "
      "Unknown Error, and, more"],
     "nvidia-smi --query-gpu printed 'Unable to determine the device handle for GPU0000:65:00.0: Unknown Error"),
])
def test_a_gpu_validate_refuses_is_no_gpu_to_the_smoke_either(tmp_path, rows, why):
    """Before: gpu_smoke took any line with 3 commas for a GPU, so a GPU that needs a reset (or a lost GPU's error
    line) was a GPU and the checks ran on it; now it reads nvidia-smi as validate does (contracts.nvidia_smi): no
    usable GPU, every check "not run" naming why."""
    env = runner_env(tmp_path, None)
    env["PATH"] = f"{_listing(tmp_path / 'smi', rows)}{os.pathsep}{env['PATH']}"
    code, report, _ = smoke(tmp_path, env, "--python", "/bin/false", "--deadline", "30")
    assert code == 1 and report["result"] == "not run" and report["gpus"] == [], report
    for name, check in report["checks"].items():
        assert check["status"] == "not run" and check["reason"].startswith(f"no GPU: not run ({why}"), (name, check)


def test_the_inventory_module_runs_on_the_gpu_runners_python():
    """gpu_smoke imports contracts.nvidia_smi with any Python 3.9+: standard library only, 3.9 syntax."""
    import ast

    tree = ast.parse((REPO / "buildtool" / "contracts" / "nvidia_smi.py").read_text(), feature_version=(3, 9))
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m.split(".")[0] for m in imported} <= set(sys.stdlib_module_names) | {"__future__"}


def test_gpus_in_mig_mode_are_no_gpu_to_the_smoke(tmp_path):
    """Before: a runner whose GPUs are in MIG mode listed them whole and the checks ran where CUDA sees only MIG
    instances; now, as validate, it has no usable GPU: every check "not run" naming MIG and how to turn it off."""
    env = runner_env(tmp_path, FakeGpus(count=2, mig="Enabled"))
    code, report, _ = smoke(tmp_path, env, "--python", "/bin/false", "--deadline", "30")
    assert code == 1 and report["result"] == "not run" and report["gpus"] == [], report
    for name, check in report["checks"].items():
        assert check["reason"].startswith("no GPU: not run (MIG mode is on for GPU 0 ("), (name, check)
        assert check["status"] == "not run" and "nvidia-smi -i 0,1 -mig 0" in check["reason"], (name, check)


def test_a_failure_while_staging_the_scripts_leaves_no_work_folder(tmp_path, monkeypatch):
    """run() made its gpu-smoke-* folder, then built the Runner (which stages the probe scripts into it) before the
    `try` whose `finally` removes it: a failure while staging (a full disk) left the folder behind."""
    import argparse
    import errno
    import tempfile

    gpu_smoke = load_smoke()

    def full(into: Path) -> Path:
        into.mkdir(parents=True)
        raise OSError(errno.ENOSPC, "No space left on device", str(into / "probe_io.py"))

    monkeypatch.setattr(gpu_smoke, "stage_scripts", full)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    args = argparse.Namespace(image="", python=sys.executable, deadline=60.0)
    with pytest.raises(OSError, match="No space left"):
        gpu_smoke.run(gpu_smoke.Smoke(args, [], ""))
    assert list(tmp_path.iterdir()) == []


def test_the_smokes_cell_that_its_images_label_contradicts_is_a_failed_step_naming_both(tmp_path, monkeypatch):
    """gpu_smoke reads the cell with validate's find_cell: a --cell the image's cell label contradicts is the run
    flags step failing with validate's one line (both cells named), not a run as the other cell."""
    docker, log = fake_docker(tmp_path)
    monkeypatch.setenv("DOCKER_CLIENT", str(docker))
    gpu_smoke = load_smoke()
    flags, step = gpu_smoke.probed_flags("img", {label_keys.CELL: "pytorch-cuda:2.13"}, "pytorch-cpu:2.13", [], print)
    assert flags == [] and step["status"] == "failed", step
    assert not log.exists(), log.read_text()   # refused before any container is started
    assert step["reason"].startswith("image img is labelled cell 'pytorch-cuda:2.13' "), step
    assert "not 'pytorch-cpu:2.13': --cell is for an image without a cell label" in step["reason"], step


def test_a_container_removal_that_times_out_still_removes_the_work_folder_and_keeps_the_cause(tmp_path, monkeypatch):
    """run()'s clean-up removed its containers (`docker rm -f`, 60 s each) and then the gpu-smoke-* folder: an engine
    that no longer answered (what a stopped run often meets) raised TimeoutExpired out of the clean-up, so the folder
    was left and the report named that timeout, not why the run was stopped. Both now happen whatever the removal
    does, and the run's own cause goes on."""
    import argparse
    import tempfile
    import types

    docker, _log = fake_docker(tmp_path / "bin")
    monkeypatch.setenv("DOCKER_CLIENT", str(docker))
    gpu_smoke = load_smoke()

    def run(cmd, *args, **kwargs):  # type: ignore[no-untyped-def]
        if cmd[1:3] == ["rm", "-f"]:
            raise subprocess.TimeoutExpired(cmd, kwargs.get("timeout", 60))
        return subprocess.run(cmd, *args, **kwargs)

    def prepare(smoke, runner, work):  # type: ignore[no-untyped-def]
        runner.names.append("t-gpu-smoke-started")
        raise gpu_smoke.Stopped("SIGTERM (an outer timeout or an interrupt)")

    monkeypatch.setattr(gpu_smoke, "subprocess", types.SimpleNamespace(**{**vars(subprocess), "run": run}))
    monkeypatch.setattr(gpu_smoke, "prepare", prepare)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    args = argparse.Namespace(image="img", python="", deadline=60.0)
    with pytest.raises(gpu_smoke.Stopped, match="SIGTERM"):
        gpu_smoke.run(gpu_smoke.Smoke(args, [], ""))
    assert list((tmp_path / "tmp").iterdir()) == []
