#!/usr/bin/env python3
"""`make gpu-smoke`: the GPU paths of the image tests in one short run, written to one JSON file.

Checks (each bounded; the whole run stays under --deadline, 450 s by default):
- nccl_ddp: torchrun, one process per GPU, NCCL; the loss falls and every rank ends identical;
- busbw: the all-reduce bus bandwidth of that run, measured as nccl-tests does (8 MiB..1 GiB,
  5 warm-up + 20 timed iterations, slowest rank, peak and per-size table);
- profiler_kernel_view: torch.profiler with CUDA activity, read back through TensorBoard's
  pytorch_profiler plugin (torch-tb-profiler): the run lists the Kernel view and a GPU device;
- shm: /dev/shm size, and DataLoader workers passing 96 MiB batches through it.

Where it runs:
- `--image IMAGE` (a GPU runner with a container engine): every check in the image (pytorch-cuda
  by default in the Makefile), started as validate starts it (`--gpus all`, the run profile's shm
  and ulimits), image-tests/scripts and image-tests/pytorch/scripts mounted read-only;
- `--python PY` (a GPU machine without a container engine): a Python that has CUDA PyTorch and
  TensorBoard. torch-tb-profiler is carried in as a wheel (`make gpu-smoke-wheels` runs
  `pip download` into bench/wheels); every wheel of --wheels is installed with --no-index into a
  temporary target that is put on PYTHONPATH, never into that Python itself.

Without a GPU (nvidia-smi lists none) nothing is run: every check says "no GPU: not run" and the
result is "not run", exit 1. GPUs that the Python or the engine cannot use are failures. Exit 0
only when every check passed; 1 otherwise; 2 for bad input (argparse).
Only the standard library is used, so any Python 3.9+ can drive it; the docker client is the one
DOCKER_CLIENT chooses (buildtool/common/docker_cli.py, standard library too, imported from this
checkout), unless --docker names another.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # a GPU runner's Python need not have the toolkit installed
    sys.path.insert(0, str(ROOT))
from buildtool.common import docker_cli  # noqa: E402  (standard library only)

# What image-tests mounts at /imagetests for a PyTorch image: the common scripts and PyTorch's own
# (the DDP check and the profiler trace live in PyTorch's framework folder).
SCRIPT_FOLDERS = (ROOT / "image-tests" / "scripts", ROOT / "image-tests" / "pytorch" / "scripts")
IN_IMAGE = "/imagetests"
CHECKS = ("nccl_ddp", "busbw", "profiler_kernel_view", "shm")
RUN_FLAGS = ["--gpus", "all", "--shm-size=8g", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
             "--network", "host"]
MIN_SHM = 1 << 30


def gpus_on_host() -> tuple[list[dict[str, str]], str, str]:
    """(GPUs, driver, why none) from nvidia-smi."""
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return [], "", "nvidia-smi not found"
    except subprocess.TimeoutExpired:
        return [], "", "nvidia-smi did not answer within 30s"
    if proc.returncode != 0:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        return [], "", f"nvidia-smi failed: {said[0] if said else proc.returncode}"
    gpus = []
    for line in proc.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            gpus.append({"index": parts[0], "name": parts[1], "driver": parts[2],
                         "memory_mib": parts[3] if len(parts) > 3 else ""})
    return gpus, (gpus[0]["driver"] if gpus else ""), ("" if gpus else "nvidia-smi lists no GPU")


def stage_scripts(into: Path) -> Path:
    """The scripts of SCRIPT_FOLDERS copied into one folder, as image-tests stages them."""
    into.mkdir(parents=True)
    for folder in SCRIPT_FOLDERS:
        for path in sorted(folder.glob("*.py")):
            shutil.copyfile(path, into / path.name)
    return into


class Runner:
    """Runs a command of the smoke in the image (docker run) or with the host Python."""

    def __init__(self, image: str, python: str, docker: str, env_extra: dict[str, str], workdir: Path) -> None:
        self.image, self.python, self.docker = image, python, docker
        self.env_extra, self.workdir = env_extra, workdir
        self.names: list[str] = []
        self.scripts = stage_scripts(workdir / "scripts")

    @property
    def mode(self) -> str:
        return "container" if self.image else "host"

    def script(self, name: str) -> str:
        return f"{IN_IMAGE}/{name}" if self.image else str(self.scripts / name)

    def py(self) -> list[str]:
        return ["python3"] if self.image else [self.python]

    def run(self, argv: list[str], timeout: float,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        env = {**(env or {})}
        if self.image:
            name = f"t-gpu-smoke-{uuid.uuid4().hex[:8]}"
            self.names.append(name)
            flags = [x for k, v in env.items() for x in ("-e", f"{k}={v}")]
            cmd = [self.docker, "run", "--rm", "--init", "--name", name, *RUN_FLAGS,
                   "-v", f"{self.scripts}:{IN_IMAGE}:ro", "-e", "PYTHONUNBUFFERED=1", *flags, self.image, *argv]
            full_env = None
        else:
            cmd, full_env = argv, {**os.environ, **self.env_extra, **env, "PYTHONUNBUFFERED": "1"}
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                                  cwd=self.workdir)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return subprocess.CompletedProcess(cmd, 124, out, f"killed after {timeout:.0f}s")
        finally:
            if self.image:
                subprocess.run([self.docker, "rm", "-f", name], capture_output=True, timeout=60)

    def cleanup(self) -> None:
        for name in self.names:
            subprocess.run([self.docker, "rm", "-f", name], capture_output=True, timeout=60)


def payload(out: str, marker: str) -> Any:
    found = None
    for line in out.splitlines():
        if line.startswith(marker + " "):
            found = line[len(marker) + 1:]
    return json.loads(found) if found is not None else None


def tail(proc: subprocess.CompletedProcess[str], lines: int = 12) -> str:
    return "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-lines:])


def check_ddp(runner: Runner, gpus: int, timeout: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """NCCL DDP over every GPU, with the busbw table; returns (nccl_ddp, busbw) results."""
    argv = [*runner.py(), "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
            runner.script("ddp_train.py")]
    proc = runner.run(argv, timeout, {"DDP_BUSBW": "1", "DDP_TIMEOUT_S": "120"})
    found = payload(proc.stdout, "DDP_RESULT")
    if proc.returncode != 0 or not found:
        failed = {"status": "failed", "reason": f"torchrun exit {proc.returncode}: {tail(proc)}"}
        return failed, {"status": "failed", "reason": "the DDP run failed, so nothing was measured"}
    problems = []
    if found["backend"] != "nccl":
        problems.append(f"backend {found['backend']}, not nccl")
    if found["world_size"] != gpus:
        problems.append(f"world size {found['world_size']}, not {gpus}")
    if not found["identical"]:
        problems.append("ranks ended with different parameters")
    if not found["last_loss"] < 0.5 * found["first_loss"]:
        problems.append(f"loss did not fall ({found['first_loss']:.4f} -> {found['last_loss']:.4f})")
    ddp = {"status": "failed" if problems else "passed", "reason": "; ".join(problems),
           "figures": {k: found[k] for k in ("backend", "world_size", "first_loss", "last_loss")}}
    table = found.get("busbw")
    if gpus < 2:
        busbw = {"status": "not run", "reason": "one GPU: an all-reduce moves no data between GPUs",
                 "figures": table or {}}
    elif not table or table.get("backend") != "nccl":
        busbw = {"status": "failed", "reason": f"no NCCL bus-bandwidth table in the DDP result: {table}"}
    else:
        sizes = [row["bytes"] for row in table["sizes"]]
        ok = sizes[0] == 8 << 20 and sizes[-1] == 1 << 30 and table["peak_GBps"] > 0
        busbw = {"status": "passed" if ok else "failed", "reason": "" if ok else f"unexpected table {sizes}",
                 "figures": table}
    return ddp, busbw


def check_profiler(runner: Runner, timeout: float) -> dict[str, Any]:
    if runner.image:
        # The trace lives in the container: profile and serve it in one run there.
        logdir = "/tmp/gpu-smoke-profile"
        inner = (f"python3 {IN_IMAGE}/torch_profile.py {logdir} run1 || exit 3; "
                 f"python3 {IN_IMAGE}/tb_query.py --logdir {logdir} --mode profiler --run run1 --timeout 120")
        proc = runner.run(["bash", "-c", inner], timeout)
    else:
        logdir = str(runner.workdir / "profile")
        proc = runner.run([runner.python, runner.script("torch_profile.py"), logdir, "run1"], timeout / 2)
        if proc.returncode == 0 and "PROFILE_OK" in proc.stdout:
            proc = runner.run([runner.python, runner.script("tb_query.py"), "--logdir", logdir, "--mode", "profiler",
                               "--run", "run1", "--timeout", "120"], timeout)
    if "PROFILE_OK" not in proc.stdout and "TB_RESULT" not in proc.stdout:
        return {"status": "failed", "reason": f"torch.profiler run failed: {tail(proc)}"}
    found = payload(proc.stdout, "TB_RESULT")
    if not found or not found.get("started"):
        why = (found or {}).get("log_tail") or tail(proc)
        return {"status": "failed", "reason": f"TensorBoard did not start: {why}"}
    if "pytorch_profiler" not in (found.get("plugins") or {}):
        plugins = sorted(found.get("plugins") or {})
        return {"status": "failed", "reason": f"no pytorch_profiler plugin (torch-tb-profiler); plugins {plugins}"}
    status, views = found.get("views") or [0, []]
    envs = {e.get("title"): e.get("value") for e in found.get("environments") or []}
    problems = []
    if status != 200 or "Kernel" not in (views or []):
        problems.append(f"no Kernel view: {status} {views}")
    if envs.get("Device Type") != "GPU":
        problems.append(f"the profile shows no GPU device: {envs}")
    return {"status": "failed" if problems else "passed", "reason": "; ".join(problems),
            "figures": {"views": views, "environments": envs}}


def check_shm(runner: Runner, timeout: float) -> dict[str, Any]:
    size = runner.run(["df", "-B1", "--output=size", "/dev/shm"], 60)
    try:
        shm_bytes = int(size.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"status": "failed", "reason": f"cannot read /dev/shm's size: {tail(size)}"}
    proc = runner.run([*runner.py(), runner.script("shm_workers.py"), "torch"], timeout)
    problems = []
    if shm_bytes < MIN_SHM:
        problems.append(f"/dev/shm is {shm_bytes} bytes, under 1 GiB")
    if proc.returncode != 0 or "SHM_OK" not in proc.stdout:
        problems.append(f"DataLoader workers could not pass 96 MiB batches: {tail(proc, 6)}")
    return {"status": "failed" if problems else "passed", "reason": "; ".join(problems),
            "figures": {"shm_bytes": shm_bytes}}


def install_wheels(python: str, wheels: Path, target: Path) -> str:
    """Every wheel of `wheels` into `target` (--no-index, --no-deps); '' or why it failed."""
    files = sorted(str(p) for p in wheels.glob("*.whl")) if wheels.is_dir() else []
    if not any("torch_tb_profiler" in Path(f).name for f in files):
        return f"no torch_tb_profiler wheel in {wheels} (make gpu-smoke-wheels downloads it)"
    proc = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target",
                           str(target), *files], capture_output=True, text=True, timeout=300)
    return "" if proc.returncode == 0 else f"pip install --no-index failed: {tail(proc, 5)}"


def host_problem(python: str) -> str:
    try:
        proc = subprocess.run([python, "-c", "import torch, tensorboard; print(torch.cuda.is_available())"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {python}: {exc}"
    if proc.returncode != 0:
        return f"{python} lacks torch or tensorboard: {tail(proc, 2)}"
    return "" if proc.stdout.strip().endswith("True") else f"torch in {python} sees no CUDA device"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--image", default="", help="run in this image with a container engine (--gpus all)")
    where.add_argument("--python", default="", help="run with this host Python (CUDA torch and TensorBoard)")
    ap.add_argument("--wheels", type=Path, default=ROOT / "bench" / "wheels",
                    help="wheels installed for --python (torch-tb-profiler)")
    ap.add_argument("--docker", default="",
                    help="the docker client for --image (default: the one DOCKER_CLIENT chooses: buildx, classic "
                         "or a path)")
    ap.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    ap.add_argument("--deadline", type=float, default=450.0, help="seconds for the whole run")
    args = ap.parse_args(argv)
    try:
        docker_cli.check_retired()
    except docker_cli.DockerError as exc:
        print(f"gpu-smoke: {exc}", file=sys.stderr)
        return 2

    started, clock = dt.datetime.now(dt.timezone.utc), time.monotonic()  # noqa: UP017 - runs on Python 3.9+
    gpus, driver, no_gpu = gpus_on_host()
    report: dict[str, Any] = {
        "schema": 1, "started": started.isoformat(timespec="seconds"), "host": os.uname().nodename,
        "mode": "container" if args.image else "host", "image": args.image, "python": args.python,
        "gpus": gpus, "driver": driver, "checks": {},
    }
    checks: dict[str, dict[str, Any]] = report["checks"]
    work = Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    runner = Runner(args.image, args.python, args.docker, {}, work)
    try:
        blocker = f"no GPU: not run ({no_gpu})" if not gpus else ""
        if not blocker and args.image and not runner.docker:
            try:  # asked for only when something runs in the image: no GPU, no client needed
                runner.docker = docker_cli.client()
            except docker_cli.DockerError as exc:
                print(f"gpu-smoke: {exc}", file=sys.stderr)
                return 2
        if not blocker and not args.image:
            blocker = host_problem(args.python)
            if not blocker:
                target = work / "site"
                why = install_wheels(args.python, args.wheels, target)
                bindir = work / "bin"
                bindir.mkdir()
                # tb_query.py starts `tensorboard`: this Python's, with the carried-in plugin on its path.
                (bindir / "tensorboard").write_text(f"#!/bin/sh\nexec {args.python} -m tensorboard.main \"$@\"\n")
                (bindir / "tensorboard").chmod(0o755)
                runner.env_extra = {"PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]),
                                    "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
                report["wheels"] = why or "installed"
        if blocker:
            # No GPU: nothing ran. GPUs but a Python that cannot use them: that is a failure.
            for name in CHECKS:
                checks[name] = {"status": "failed" if gpus else "not run", "reason": blocker}
        else:
            def left() -> float:
                return max(30.0, args.deadline - (time.monotonic() - clock))

            for name in CHECKS:
                t0 = time.monotonic()
                if name == "nccl_ddp":
                    checks["nccl_ddp"], checks["busbw"] = check_ddp(runner, len(gpus), min(240.0, left()))
                elif name == "profiler_kernel_view":
                    if report.get("wheels", "installed") != "installed":
                        checks[name] = {"status": "failed", "reason": report["wheels"]}
                    else:
                        checks[name] = check_profiler(runner, min(200.0, left()))
                elif name == "shm":
                    checks[name] = check_shm(runner, min(150.0, left()))
                if name != "busbw":
                    checks[name]["seconds"] = round(time.monotonic() - t0, 1)
    finally:
        runner.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    statuses = {c["status"] for c in checks.values()}
    report["result"] = ("not run" if statuses == {"not run"} else
                        "passed" if statuses == {"passed"} else "failed" if "failed" in statuses else "incomplete")
    report["duration_s"] = round(time.monotonic() - clock, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    tmp.replace(args.out)
    for name, check in checks.items():
        print(f"{name:22} {check['status']:8} {check.get('reason', '')}".rstrip())
    print(f"gpu-smoke: {report['result']} in {report['duration_s']} s -> {args.out}")
    return 0 if report["result"] == "passed" else 1


if __name__ == "__main__":
    sys.exit(main())
