#!/usr/bin/env python3
"""`make gpu-smoke`: the GPU paths of the image tests in one short run, written to one JSON file.

Checks (each bounded; together they stay under --deadline, 450 s by default):
- nccl_ddp: torchrun, one process per GPU, NCCL; the loss falls and every rank ends identical;
- busbw: the all-reduce bus bandwidth of that run, measured as nccl-tests does (8 MiB..1 GiB,
  5 warm-up + 20 timed iterations, slowest rank, peak and per-size table); needs two GPUs; judged as
  validate judges it (issue 39): the floor of contracts.busbw for the GPUs' exact model and the
  interconnect `nvidia-smi topo -m` shows, and a broken NVLink or an unreadable topology fails by name;
- profiler_kernel_view: torch.profiler with CUDA activity, read back through TensorBoard's
  pytorch_profiler plugin (torch-tb-profiler): the run lists the Kernel view and a GPU device;
- shm: /dev/shm's size, and DataLoader workers passing 96 MiB batches through it;
- fsdp, deepspeed_zero2 (issue 42): the scaling benchmark's FSDP (fully_shard) and DeepSpeed ZeRO-2 workloads,
  one process per GPU with NCCL: every rank gathers the same parameters, and they equal the same steps trained
  unsharded in one process. DeepSpeed where the image has no DeepSpeed is "not run" with the reason (the
  worker says so), never a pass.
Each check runs the in-image probe scripts the image tests run (image-tests/scripts and
image-tests/pytorch/scripts) and reads what they write, as the image tests do: result.json (and
rank-<N>.json) in $IMAGETEST_OUT (probe_io.py); printed output is only quoted, never parsed.

Where it runs:
- `--image IMAGE` (a GPU runner with a container engine): first the steps `pull` (the image is
  pulled when its reference names a registry, bounded by --pull-timeout, outside --deadline) and
  `run_flags` (the image's matrix cell's run profile, probed as `buildtool validate` probes it:
  limits the engine cannot grant are dropped and recorded, `--gpus` only where nvidia-smi lists
  GPUs; this step needs the toolkit's Python, as validate does), then every check in the image;
- `--python PY` (a GPU machine without a container engine): a Python with CUDA PyTorch. Only the
  profiler check needs TensorBoard (and torch-tb-profiler, carried in as a wheel: `make
  gpu-smoke-wheels`; every wheel of --wheels is installed with --no-index into a temporary target
  put on PYTHONPATH, never into that Python); without them that check fails saying so, the others run.

Outcomes are never guessed: without a GPU (nvidia-smi lists none) nothing runs and every check is
"not run"; a check that could not run says "not run" and why (busbw with one GPU); a GPU that torch
cannot use makes the GPU checks fail with that cause. The JSON is always written: a step that runs
past its bound is failed with `timed_out`, and when the whole run is stopped (its own deadline,
SIGTERM from an outer `timeout`, Ctrl-C) the JSON names the step it was in (`stopped`) and every
check that did not run says "not run". Exit 0 only when every check passed; 1 otherwise; 2 for bad
input. The driver needs only the standard library (Python 3.9+) except for `run_flags`; the docker
client is the one DOCKER_CLIENT chooses (buildtool/common/docker_cli.py), unless --docker names another.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # a GPU runner's Python need not have the toolkit installed
    sys.path.insert(0, str(ROOT))
from buildtool.common import docker_cli  # noqa: E402  (standard library only)
from buildtool.contracts import busbw as floors  # noqa: E402  (standard library only: validate's floors)
from buildtool.contracts import nvidia_smi  # noqa: E402  (standard library only: validate's reading of the GPUs)
from buildtool.contracts.runprofile import MIN_SHM_BYTES, MIN_SHM_SIZE  # noqa: E402  (constants only)

# What image-tests mounts at /imagetests for a PyTorch image: the common scripts and PyTorch's own.
SCRIPT_FOLDERS = (ROOT / "image-tests" / "scripts", ROOT / "image-tests" / "pytorch" / "scripts")
IN_IMAGE = "/imagetests"
OUT_IN = "/imagetests-out"          # where a probe's $IMAGETEST_OUT lives in the container (harness.py's too)
CHECKS = ("nccl_ddp", "busbw", "profiler_kernel_view", "shm", "fsdp", "deepspeed_zero2")
PREP_STEPS = ("pull", "run_flags", "python")   # before the checks: the image's or the host Python's
MIN_STEP_S = 10.0                   # a check with less time left than this is not started
GRACE_S = 20.0                      # the script's own alarm beyond pull + deadline (probing, clean-up)
DDP_S, TORCH_PROFILE_S, TB_QUERY_S, SHM_S = 240.0, 120.0, 150.0, 150.0
STRATEGY_S = 150.0                  # each of FSDP and DeepSpeed ZeRO-2 (one epoch of warm-up, one timed, the replay)
STRATEGY_ENV = {"SCALING_SAMPLES": "2048", "SCALING_EPOCHS": "2", "SCALING_BATCH": "64", "SCALING_VERIFY": "1"}
TB_START_S = 120                    # tb_query's own bound for TensorBoard and the run to appear
RUN = "run1"


class Stopped(BaseException):
    """The whole run is stopped (its own deadline, SIGTERM, SIGINT): unwinds to where the JSON is written."""


def gpus_on_host() -> tuple[list[dict[str, str]], str, str]:
    """(GPUs, driver, why none) from nvidia-smi, read as validate reads them (contracts.nvidia_smi): a GPU whose
    fields NVML cannot read, a line that is no GPU's among the rows, a failing nvidia-smi leave no usable GPU."""
    gpus, why = nvidia_smi.gpus()
    return gpus, (gpus[0]["driver"] if gpus else ""), why


def busbw_floor(gpus: list[dict[str, str]]) -> floors.Floor:
    """Validate's floor for these GPUs (contracts.busbw.floor_for, from `nvidia-smi topo -m`), or its fault."""
    names = [gpu["name"] for gpu in gpus]
    if len(gpus) < 2:
        return floors.runner_floor(names, "", "one GPU: no link between GPUs")
    try:
        proc = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            said = (proc.stdout + proc.stderr).strip().splitlines()
            raise ValueError(f"nvidia-smi topo -m failed (exit {proc.returncode}): {said[0] if said else 'no output'}")
        link, seen = floors.read_topology(proc.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        return floors.runner_floor(names, "", str(exc))
    return floors.runner_floor(names, link, "", seen)


def judge_busbw(table: dict[str, Any], floor: floors.Floor | None) -> dict[str, Any]:
    """The busbw check of a measured table, as validate's test_ddp_nccl_allreduce_busbw judges it (no trend:
    the smoke keeps no nights)."""
    sizes = [row["bytes"] for row in table["sizes"]]
    # A peak of NaN or Infinity is no table fault: floors.problems names it.
    if not (sizes[0] == 8 << 20 and sizes[-1] == 1 << 30) or table["peak_GBps"] <= 0:
        return {"status": "failed", "reason": f"unexpected table {sizes}", "figures": table}
    figures = {**table, **(floor.as_target() if floor is not None else {})}
    if floor is None:
        return {"status": "failed", "reason": "no floor was looked up for these GPUs", "figures": figures}
    problems = floors.problems(float(table["peak_GBps"]), floor.floor_GBps, floor.model or floor.gpu_name, {},
                               floor.fault)
    return {"status": "failed" if problems else "passed", "reason": "; ".join(problems),
            "note": floor.note, "figures": figures}


def stage_scripts(into: Path) -> Path:
    """The scripts of SCRIPT_FOLDERS copied into one folder, as image-tests stages them."""
    into.mkdir(parents=True)
    for folder in SCRIPT_FOLDERS:
        for path in sorted(folder.glob("*.py")):
            shutil.copyfile(path, into / path.name)
            (into / path.name).chmod(0o644)
    into.chmod(0o755)
    return into


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class Ran:
    """One probe: how it ended and what it wrote into its $IMAGETEST_OUT (probe_io.py's contract)."""

    rc: int
    timed_out: bool
    bound: float
    output: str      # stdout and stderr: quoted for people, never parsed
    folder: Path

    @property
    def result(self) -> Any:
        return _json(self.folder / "result.json")

    def files(self, pattern: str) -> dict[str, Any]:
        return {p.name: _json(p) for p in sorted(self.folder.glob(pattern))}

    def tail(self, lines: int = 8) -> str:
        text = self.output.strip()
        return " | ".join(text.splitlines()[-lines:]) if text else "no output"

    def cause(self, what: str) -> str:
        """Why it gave no usable result, in one line."""
        if self.timed_out:
            return f"{what} timed out after {self.bound:.0f} s"
        found = self.result
        if isinstance(found, dict) and found.get("error"):
            return f"{what}: {found['error']}"
        return f"{what} exited with {self.rc} and wrote no result: {self.tail()}"


class Runner:
    """Runs a probe of the smoke in the image (docker run) or with the host Python."""

    def __init__(self, image: str, python: str, workdir: Path) -> None:
        self.image, self.python, self.workdir = image, python, workdir
        self.docker = ""
        self.flags: list[str] = []
        self.env_extra: dict[str, str] = {}
        self.names: list[str] = []
        self.scripts = stage_scripts(workdir / "scripts")
        self.out = workdir / "out"
        self.out.mkdir()
        self.out.chmod(0o1777)  # whatever user the image runs as writes here

    def script(self, name: str) -> str:
        return f"{IN_IMAGE}/{name}" if self.image else str(self.scripts / name)

    def inside(self, host: Path) -> str:
        """`host` (under self.out) as the probe sees it."""
        return f"{OUT_IN}/{host.relative_to(self.out)}" if self.image else str(host)

    def shared(self, name: str) -> Path:
        """A folder every later probe sees (the profiler's trace)."""
        path = self.out / name
        path.mkdir()
        path.chmod(0o1777)
        return path

    def py(self) -> list[str]:
        return ["python3"] if self.image else [self.python]

    def probe(self, step: str, argv: list[str], timeout: float, env: dict[str, str] | None = None) -> Ran:
        folder = self.out / f"{step}-{uuid.uuid4().hex[:6]}"
        folder.mkdir()
        folder.chmod(0o1777)
        env = {**(env or {}), "IMAGETEST_OUT": self.inside(folder), "PYTHONUNBUFFERED": "1"}
        name = ""
        if self.image:
            name = f"t-gpu-smoke-{uuid.uuid4().hex[:8]}"
            self.names.append(name)
            network = [] if any(f.startswith("--network") for f in self.flags) else ["--network", "host"]
            cmd = [self.docker, "run", "--rm", "--init", "--name", name, *network, *self.flags,
                   "-v", f"{self.scripts}:{IN_IMAGE}:ro", "-v", f"{self.out}:{OUT_IN}",
                   *[x for k, v in env.items() for x in ("-e", f"{k}={v}")], self.image, *argv]
            full_env = None
        else:
            cmd, full_env = argv, {**os.environ, **self.env_extra, **env}
        # Its own session: a timeout or a stop kills torchrun's workers too, not only torchrun.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
                                cwd=self.workdir, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
            return Ran(proc.returncode, False, timeout, out, folder)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return Ran(124, True, timeout, out, folder)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            if name:
                self.remove(name)

    def remove(self, name: str) -> None:
        """`docker rm -f NAME`, best effort: a removal that fails (an engine that no longer answers, what a stopped
        run often meets) must not hide why the run ended, nor keep the rest of the clean-up from running."""
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run([self.docker, "rm", "-f", name], capture_output=True, timeout=60)

    def cleanup(self) -> None:
        for name in self.names:
            self.remove(name)


# -- the checks: each reads its probes' result files ----------------------------------------------


def torchrun_failure(ran: Ran, what: str) -> str:
    """Why a torchrun probe gave no result: its cause, and each rank's own error line (rank-N.json)."""
    ranks = [f"{name}: {r.get('error')}" for name, r in ran.files("rank-*.json").items()
             if isinstance(r, dict) and r.get("error")]
    return ran.cause(what) + (f" ({'; '.join(ranks)})" if ranks else "")


def check_ddp(runner: Runner, gpus: int, timeout: float,
              floor: floors.Floor | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """NCCL DDP over every GPU, with the busbw table where there are two or more; (nccl_ddp, busbw)."""
    argv = [*runner.py(), "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
            runner.script("ddp_train.py")]
    # One GPU: an all-reduce moves nothing between GPUs, so no table is asked for (auto = on CUDA only).
    env = {"DDP_TIMEOUT_S": "120", **({"DDP_BUSBW": "0"} if gpus < 2 else {})}
    ran = runner.probe("nccl_ddp", argv, timeout, env)
    one_gpu = {"status": "not run", "reason": "one GPU: the bus bandwidth needs two or more GPUs"}
    found = ran.result
    if not isinstance(found, dict) or ran.timed_out:
        reason = torchrun_failure(ran, "torchrun")
        failed = {"status": "failed", "reason": reason, "timed_out": ran.timed_out}
        return failed, one_gpu if gpus < 2 else {"status": "failed", "reason": f"the DDP run failed: {reason}"}
    problems = []
    if found.get("backend") != "nccl":
        problems.append(f"backend {found.get('backend')}, not nccl: torch sees no CUDA device, so NCCL did not run")
    if found.get("world_size") != gpus:
        problems.append(f"world size {found.get('world_size')}, not {gpus}")
    if not found.get("identical"):
        problems.append("ranks ended with different parameters")
    if not found.get("last_loss", 1) < 0.5 * found.get("first_loss", 0):
        problems.append(f"loss did not fall ({found.get('first_loss')} -> {found.get('last_loss')})")
    ddp = {"status": "failed" if problems else "passed", "reason": "; ".join(problems),
           "figures": {k: found.get(k) for k in ("backend", "world_size", "first_loss", "last_loss")}}
    if gpus < 2:
        return ddp, one_gpu
    table = found.get("busbw")
    if found.get("backend") != "nccl":
        busbw = {"status": "failed", "reason": f"no NCCL all-reduce ran: {problems[0]}"}
    elif not table:
        busbw = {"status": "failed", "reason": "the DDP result has no bus-bandwidth table"}
    else:
        busbw = judge_busbw(table, floor)
    return ddp, busbw


def check_strategy(runner: Runner, gpus: int, timeout: float, script: str, what: str) -> dict[str, Any]:
    """A sharded strategy's workload (fsdp_epochs.py, deepspeed_epochs.py) over every GPU with NCCL."""
    argv = [*runner.py(), "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
            runner.script(script)]
    ran = runner.probe(script.removesuffix(".py"), argv, timeout, STRATEGY_ENV)
    found = ran.result
    if isinstance(found, dict) and found.get("not_run"):
        return {"status": "not run", "reason": f"{what}: {found['not_run']}"}
    if not isinstance(found, dict) or ran.timed_out:
        return {"status": "failed", "timed_out": ran.timed_out, "reason": torchrun_failure(ran, what)}
    problems = []
    if found.get("backend") != "nccl":
        problems.append(f"backend {found.get('backend')}, not nccl: torch sees no CUDA device")
    if found.get("world_size") != gpus:
        problems.append(f"world size {found.get('world_size')}, not {gpus}")
    if not found.get("identical"):
        problems.append("ranks gathered different parameters")
    if not found.get("matches_reference"):
        problems.append(f"parameters differ from the same steps trained unsharded by {found.get('max_abs_diff')}")
    figures = {k: found.get(k) for k in ("backend", "world_size", "epoch_times_s", "peak_memory_mb",
                                         "max_abs_diff")}
    return {"status": "failed" if problems else "passed", "reason": f"{what}: " + "; ".join(problems) if problems
            else "", "figures": figures}


def check_profiler(runner: Runner, timeout: Callable[[float], float]) -> dict[str, Any]:
    """torch_profile.py writes the trace into a folder the next probe sees; tb_query.py serves it."""
    logdir = runner.shared("trace")
    made = runner.probe("torch_profile", [*runner.py(), runner.script("torch_profile.py"), runner.inside(logdir),
                                          RUN], timeout(TORCH_PROFILE_S))
    trace = made.result
    if not isinstance(trace, dict) or not trace.get("ok"):
        return {"status": "failed", "reason": made.cause("torch.profiler writing the trace"),
                "timed_out": made.timed_out}
    served = runner.probe("tb_query", [*runner.py(), runner.script("tb_query.py"), "--logdir", runner.inside(logdir),
                                       "--mode", "profiler", "--run", RUN, "--timeout", str(TB_START_S),
                                       "--expect-plugin", "pytorch_profiler", "--plugin-dist", "torch-tb-profiler"],
                          timeout(TB_QUERY_S))
    found = served.result
    if not isinstance(found, dict) or not found.get("started"):
        return {"status": "failed", "reason": served.cause("TensorBoard serving the trace"),
                "timed_out": served.timed_out}
    if "pytorch_profiler" not in (found.get("plugins") or {}):
        return {"status": "failed", "reason": "TensorBoard did not load the pytorch_profiler plugin: "
                f"{found.get('plugin_missing') or 'reason unknown'}"}
    status, views = found.get("views") or [found.get("runs", {}).get("status", 0), []]
    envs = {e.get("title"): e.get("value") for e in found.get("environments") or []}
    figures = {"views": views, "environments": envs, "cuda": trace.get("cuda")}
    if not trace.get("cuda"):
        return {"status": "failed", "figures": figures,
                "reason": f"torch sees no CUDA device, so the profile has no CUDA activity (the trace and "
                          f"TensorBoard's profiler view worked: views {views})"}
    problems = []
    if status != 200 or "Kernel" not in (views or []):
        problems.append(f"no Kernel view: {status} {views}")
    if envs.get("Device Type") != "GPU":
        problems.append(f"the profile shows no GPU device: {envs}")
    return {"status": "failed" if problems else "passed", "reason": "; ".join(problems), "figures": figures}


def check_shm(runner: Runner, timeout: float) -> dict[str, Any]:
    ran = runner.probe("shm", [*runner.py(), runner.script("shm_workers.py"), "torch"], timeout)
    found = ran.result
    if not isinstance(found, dict) or ran.timed_out:
        return {"status": "failed", "reason": ran.cause("DataLoader workers through /dev/shm"),
                "timed_out": ran.timed_out}
    shm = found.get("shm") or {}
    problems = []
    if "size" not in shm:
        problems.append(f"cannot read /dev/shm's size: {shm.get('error', 'not reported')}")
    elif int(shm["size"]) < MIN_SHM_BYTES:
        problems.append(f"/dev/shm is {shm['size']} bytes, under {MIN_SHM_SIZE}")
    if not found.get("ok"):
        dead = [w for w in found.get("workers") or [] if w.get("exitcode") not in (0, None)]
        who = f"; worker {dead[0]['worker']} exited with {dead[0]['exitcode']}" if dead else ""
        problems.append(f"DataLoader workers could not pass 96 MiB batches: {found.get('error')}{who} "
                        f"(/dev/shm {shm.get('size')} bytes, {shm.get('free')} free)")
    return {"status": "failed" if problems else "passed", "reason": "; ".join(problems),
            "figures": {"shm_bytes": shm.get("size"), "moved_bytes": found.get("moved")}}


# -- preparation: the image (pull, run flags) or the host Python --------------------------------


def pull(image: str, timeout: float) -> tuple[dict[str, Any], dict[str, str]]:
    """The image into the engine: pulled when its reference names a registry, else already there.
    Returns (the step, the image's labels)."""
    from buildtool.common.refs import has_registry

    t0 = time.monotonic()
    step: dict[str, Any] = {"status": "passed", "reason": ""}
    if has_registry(image):
        try:
            proc = docker_cli.docker("pull", image, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"status": "failed", "timed_out": True,
                    "reason": f"pulling {image} did not finish within {timeout:.0f} s (--pull-timeout)"}, {}
        if proc.returncode != 0:
            said = (proc.stderr or proc.stdout).strip().splitlines()
            return {"status": "failed", "reason": f"cannot pull {image}: {said[-1] if said else proc.returncode}"}, {}
        step["reason"] = "pulled"
    proc = docker_cli.docker("image", "inspect", image, timeout=60)  # as validate reads it (engine.py)
    if proc.returncode != 0:
        return {"status": "failed", "reason": f"image {image} is not in the engine and its reference names no "
                                              "registry to pull it from; build it or name its registry"}, {}
    try:
        labels = (json.loads(proc.stdout)[0].get("Config") or {}).get("Labels") or {}
    except (ValueError, IndexError, AttributeError) as exc:
        return {"status": "failed", "reason": f"cannot read the labels of {image} from `docker image inspect`: "
                                              f"{exc}"}, {}
    step["reason"] = step["reason"] or "present in the engine (no registry named: not pulled)"
    step["seconds"] = round(time.monotonic() - t0, 1)
    return step, labels


def probed_flags(image: str, labels: dict[str, str], cell_key: str, gpus: list[dict[str, str]],
                 log: Callable[[str], None]) -> tuple[list[str], dict[str, Any]]:
    """The image's cell's run profile as docker flags, probed as `buildtool validate` probes them."""
    try:
        from buildtool.common.errors import UserError
        from buildtool.contracts import driver_rules, platforms
        from buildtool.contracts.versions import ngc_release
        from buildtool.matrix.loader import load_matrix
        from buildtool.validate.probe import probe_flags, run_flags
        from buildtool.validate.targets import find_cell
    except ImportError as exc:
        return [], {"status": "failed", "reason": f"the run flags come from the matrix, which needs the toolkit's "
                                                  f"Python (make setup; the Makefile's PYTHON): {exc}"}
    try:
        cell = find_cell(load_matrix(ROOT / "matrix.yaml"), labels, cell_key or None, image)
        # The host driver must be admitted for the cell's CUDA (natively or by NGC's forward-compatibility
        # rule) as validate admits it; the sentence naming the rule goes into the report either way.
        # This host's own architecture: a GH200 runner's driver is judged by the SBSA floors, as validate does.
        decision = driver_rules.decide(cell.cuda, gpus[0]["driver"], "", [g["name"] for g in gpus],
                                       ngc_release(cell.base), platforms.host().architecture) \
            if cell.cuda and gpus else None
        if decision is not None and not decision.admitted:
            return [], {"status": "failed", "reason": f"cannot run {cell.key} here: {decision.rule}",
                        "driver_rule": decision.rule}
        flags, dropped = probe_flags(image, run_flags(cell, labels, gpus, log), log, cell.cuda)
    except (UserError, platforms.UnknownPlatform) as exc:  # FailedError is a UserError: an engine without GPUs
        return [], {"status": "failed", "reason": str(exc)}
    return flags, {"status": "passed", "reason": f"cell {cell.key}", "figures": {"flags": flags,
                                                                                 "not_granted": dropped},
                   "driver_rule": decision.rule if decision is not None else ""}


def host_python(python: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the host Python has: (the step, {"torch", "cuda", "tensorboard"})."""
    code = ("import importlib.util, json\nout = {'tensorboard': bool(importlib.util.find_spec('tensorboard'))}\n"
            "import torch\nout.update(torch=torch.__version__, cuda=torch.cuda.is_available())\nprint(json.dumps(out))")
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"status": "failed", "reason": f"cannot run {python}: {exc}"}, {}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        last = said[-1] if said else proc.returncode
        return {"status": "failed", "reason": f"{python} cannot import torch: {last}"}, {}
    has = json.loads(lines[-1])
    return {"status": "passed", "reason": "", "figures": has}, has


def install_wheels(python: str, wheels: Path, target: Path) -> str:
    """Every wheel of `wheels` into `target` (--no-index, --no-deps); '' or why it failed."""
    files = sorted(str(p) for p in wheels.glob("*.whl")) if wheels.is_dir() else []
    if not any("torch_tb_profiler" in Path(f).name for f in files):
        return f"no torch_tb_profiler wheel in {wheels} (make gpu-smoke-wheels downloads it)"
    proc = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target",
                           str(target), *files], capture_output=True, text=True, timeout=300)
    return "" if proc.returncode == 0 else f"pip install --no-index failed: {proc.stderr.strip()[-300:]}"


def prepare_host(runner: Runner, python: str, wheels: Path, work: Path) -> tuple[dict[str, Any], str]:
    """The host Python's step, and why the profiler check cannot run ('' when it can)."""
    step, has = host_python(python)
    if step["status"] != "passed":
        return step, ""
    if not has.get("tensorboard"):
        return step, f"tensorboard is not installed in {python}: the profiler view needs it (the other checks ran)"
    target = work / "site"
    why = install_wheels(python, wheels, target)
    bindir = work / "bin"
    bindir.mkdir()
    # tb_query.py starts `tensorboard`: this Python's, with the carried-in plugin on its path.
    (bindir / "tensorboard").write_text(f"#!/bin/sh\nexec {python} -m tensorboard.main \"$@\"\n")
    (bindir / "tensorboard").chmod(0o755)
    runner.env_extra = {"PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]),
                        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    step["wheels"] = why or "installed"
    return step, why


# -- the run --------------------------------------------------------------------------------------


class Smoke:
    """The report as it fills, and the step running now (named when the run is stopped)."""

    def __init__(self, args: argparse.Namespace, gpus: list[dict[str, str]], driver: str) -> None:
        self.args, self.gpus = args, gpus
        self.clock = time.monotonic()
        self.checks_started = 0.0
        self.current = ""
        self.spent_by = ""
        self.report: dict[str, Any] = {
            "schema": 2, "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),  # noqa: UP017
            "host": os.uname().nodename, "mode": "container" if args.image else "host", "image": args.image,
            "python": args.python, "gpus": gpus, "driver": driver, "deadline_s": args.deadline,
            "steps": {}, "checks": {},
        }

    @property
    def checks(self) -> dict[str, dict[str, Any]]:
        return self.report["checks"]

    def start_clock(self) -> None:
        """--deadline starts now (after the pull): the preparation that follows and the checks share it."""
        self.checks_started = time.monotonic()
        signal.alarm(int(self.args.deadline + GRACE_S))

    def left(self) -> float:
        return self.args.deadline - (time.monotonic() - self.checks_started)

    def bound(self, cap: float) -> float:
        return min(cap, self.left())

    def run_check(self, name: str, body: Callable[[], Any]) -> None:
        if self.left() < MIN_STEP_S:
            by = f" ({self.spent_by} ran past its bound)" if self.spent_by else ""
            self.checks[name] = {"status": "not run", "reason": f"the deadline of {self.args.deadline:.0f} s "
                                                                f"(--deadline) was spent{by}"}
            return
        self.current, t0 = name, time.monotonic()
        body()
        self.current = ""
        self.checks[name]["seconds"] = round(time.monotonic() - t0, 1)
        if self.checks[name].get("timed_out"):
            self.spent_by = self.spent_by or name

    def finish(self, blocker: str, stopped: str) -> str:
        """Every check without an outcome gets one; the overall result."""
        if stopped:
            where = self.current or "preparation"
            self.report["stopped"] = {"step": where, "why": stopped}
            if self.current in PREP_STEPS:
                self.report["steps"][self.current] = {"status": "failed", "timed_out": True,
                                                      "reason": f"stopped during this step: {stopped}"}
            elif self.current:
                self.checks[self.current] = {"status": "failed", "timed_out": True,
                                             "reason": f"stopped during this check: {stopped}"}
            blocker = f"not run: the run was stopped during {where} ({stopped})"
        for name in CHECKS:
            self.checks.setdefault(name, {"status": "not run", "reason": blocker or "not run"})
        statuses = {c["status"] for c in [*self.checks.values(), *self.report["steps"].values()]}
        if statuses == {"not run"}:
            return "not run"
        return "passed" if statuses == {"passed"} else "failed" if "failed" in statuses else "incomplete"

    def write(self) -> None:
        out = self.args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(self.report, indent=1) + "\n")
        tmp.replace(out)


def prepare(smoke: Smoke, runner: Runner, work: Path) -> tuple[str, str]:
    """The steps before the checks; (why every check cannot run, why the profiler cannot)."""
    args, steps = smoke.args, smoke.report["steps"]
    if args.image:
        smoke.current = "pull"
        steps["pull"], labels = pull(args.image, args.pull_timeout)
        if steps["pull"]["status"] != "passed":
            return "not run: the image is not there (steps.pull)", ""
        smoke.start_clock()
        smoke.current = "run_flags"
        runner.flags, steps["run_flags"] = probed_flags(args.image, labels, args.cell, smoke.gpus,
                                                        lambda line: print(f"gpu-smoke: {line}", file=sys.stderr))
        if steps["run_flags"]["status"] != "passed" and steps["run_flags"].get("driver_rule"):
            return f"failed: {steps['run_flags']['reason']}", ""   # the driver, not the engine, is at fault
        if steps["run_flags"]["status"] != "passed":
            return f"failed: no container could be started ({steps['run_flags']['reason']})", ""
        return "", ""
    smoke.start_clock()
    smoke.current = "python"
    steps["python"], no_profiler = prepare_host(runner, args.python, args.wheels, work)
    if steps["python"]["status"] != "passed":
        return f"failed: {steps['python']['reason']}", ""
    return "", no_profiler


def run(smoke: Smoke) -> str:
    """Everything up to the result; returns why the checks that did not run did not ('' when all ran)."""
    args = smoke.args
    work = Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    try:   # staging the scripts can fail (a full disk): the folder goes with it
        work.chmod(0o755)
        runner = Runner(args.image, args.python, work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    try:
        if args.image:
            runner.docker = docker_cli.client()
        blocker, no_profiler = prepare(smoke, runner, work)
        smoke.current = ""
        if blocker:
            status, why = blocker.split(": ", 1)
            for name in CHECKS:
                smoke.checks[name] = {"status": status, "reason": why}
            return ""

        def ddp() -> None:
            smoke.checks["nccl_ddp"], smoke.checks["busbw"] = check_ddp(runner, len(smoke.gpus), smoke.bound(DDP_S),
                                                                        busbw_floor(smoke.gpus))

        def profiler() -> None:
            smoke.checks["profiler_kernel_view"] = (
                {"status": "failed", "reason": no_profiler} if no_profiler else check_profiler(runner, smoke.bound))

        def shm() -> None:
            smoke.checks["shm"] = check_shm(runner, smoke.bound(SHM_S))

        smoke.run_check("nccl_ddp", ddp)
        smoke.run_check("profiler_kernel_view", profiler)
        smoke.run_check("shm", shm)
        for name, script, what in (("fsdp", "fsdp_epochs.py", "FSDP"),
                                   ("deepspeed_zero2", "deepspeed_epochs.py", "DeepSpeed ZeRO-2")):
            def strategy(name: str = name, script: str = script, what: str = what) -> None:
                smoke.checks[name] = check_strategy(runner, len(smoke.gpus), smoke.bound(STRATEGY_S), script, what)

            smoke.run_check(name, strategy)
        return ""
    finally:
        try:
            if args.image and runner.docker:
                runner.cleanup()
        finally:   # the folder goes even when the clean-up is stopped (a second signal, the backstop alarm)
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--image", default="", help="run in this image with a container engine (--gpus all)")
    where.add_argument("--python", default="", help="run with this host Python (CUDA torch)")
    ap.add_argument("--wheels", type=Path, default=ROOT / "bench" / "wheels",
                    help="wheels installed for --python (torch-tb-profiler)")
    ap.add_argument("--docker", default="",
                    help="the docker client for --image (default: the one DOCKER_CLIENT chooses: buildx, classic "
                         "or a path)")
    ap.add_argument("--cell", default="", help="the matrix cell NAME:VERSION of --image (default: its cell label)")
    ap.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    ap.add_argument("--deadline", type=float, default=450.0, help="seconds for the checks (after the pull)")
    ap.add_argument("--pull-timeout", type=float, default=900.0, help="seconds for pulling --image")
    args = ap.parse_args(argv)
    if args.python:  # the probes run in a folder of their own: a relative path would name nothing there
        args.python = os.path.abspath(args.python) if os.sep in args.python else shutil.which(args.python) or \
            args.python
    if args.docker:
        os.environ[docker_cli.SETTING] = args.docker  # one client for the probe of the flags and the checks
    gpus, driver, no_gpu = gpus_on_host()
    try:
        docker_cli.check_retired()
        if args.image and gpus:  # asked for only when something runs in the image: no GPU, no client needed
            docker_cli.client()
    except docker_cli.DockerError as exc:
        print(f"gpu-smoke: {exc}", file=sys.stderr)
        return 2

    smoke = Smoke(args, gpus, driver)
    stopped = ""

    def stop(signum: int, frame: object) -> None:
        raise Stopped("the script's own deadline ran out" if signum == signal.SIGALRM
                      else f"{signal.Signals(signum).name} (an outer timeout or an interrupt)")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):
        signal.signal(sig, stop)
    # The backstop for what cannot be bounded from here (the flag probe's engine calls, a hung clean-up):
    # the pull's bound plus a grace, then (Smoke.start_clock) the deadline's plus a grace. The Makefile's
    # outer timeout is above both, and its SIGTERM is caught too.
    signal.alarm(int(args.pull_timeout + GRACE_S) if args.image else int(args.deadline + GRACE_S))
    try:
        if not gpus:
            for name in CHECKS:
                smoke.checks[name] = {"status": "not run", "reason": f"no GPU: not run ({no_gpu})"}
        else:
            run(smoke)
    except Stopped as exc:
        stopped = str(exc)
    except docker_cli.DockerError as exc:  # the engine lost or a docker command past its bound
        print(f"gpu-smoke: {exc}", file=sys.stderr)
        stopped = f"the docker client failed: {exc}"
    except Exception as exc:  # noqa: BLE001 - a bug here still leaves a JSON that names it
        traceback.print_exc()
        stopped = f"gpu_smoke.py itself failed: {type(exc).__name__}: {exc}"
    finally:
        signal.alarm(0)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # the JSON is written even if a second signal comes
        smoke.report["result"] = smoke.finish("", stopped)
        smoke.report["duration_s"] = round(time.monotonic() - smoke.clock, 1)
        smoke.write()
    for name, entry in [*smoke.report["steps"].items(), *smoke.checks.items()]:
        print(f"{name:22} {entry['status']:8} {entry.get('reason', '')}".rstrip())
    print(f"gpu-smoke: {smoke.report['result']} in {smoke.report['duration_s']} s -> {args.out}")
    return 0 if smoke.report["result"] == "passed" else 1


if __name__ == "__main__":
    sys.exit(main())
