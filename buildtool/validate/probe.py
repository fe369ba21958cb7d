"""What this runner can run a cell with: its GPUs (nvidia-smi), the cell's run profile as docker flags,
what the engine grants of them (a throwaway container), and the bus bandwidth earlier verdicts of
the same GPUs measured.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildtool.common import docker_cli
from buildtool.common.errors import FailedError, UserError
from buildtool.contracts import busbw, driver_rules, gpu, label_keys, nvidia_smi, platforms
from buildtool.contracts.verdict import READ_SCHEMAS, Gpu, VerdictError, parse_verdict, split_size, verdict_paths, when
from buildtool.contracts.versions import ngc_release
from buildtool.matrix.schema import Cell
from buildtool.validate.containers import Log, remove_run_containers


@dataclass(frozen=True)
class Inventory:
    """The runner's GPUs as nvidia-smi on the host reports them."""

    gpus: list[Gpu]
    driver: str = ""
    cuda_driver: str = ""
    problem: str = ""     # why nvidia-smi gave no GPUs (missing, failing), "" when it listed some
    interconnect: str = ""          # busbw.NVLINK or busbw.PCIE from `nvidia-smi topo -m`; "" when unknown
    interconnect_problem: str = ""  # why it is unknown
    interconnect_seen: str = ""     # what topo -m showed (busbw.read_topology: the pairs joined through PCIe)
    driver_rule: str = ""           # which rule admitted this driver for the cell (driver_rules.decide)


START_TIMEOUT_S = 120.0       # a throwaway container started with the cell's run profile (probe_flags)
GPU_START_TIMEOUT_S = 300.0   # a throwaway container started with the cell's GPUs (probe_flags)
_CUDA_VERSION_RE = re.compile(r"CUDA Version\s*:\s*([0-9]+\.[0-9]+)")


def gpu_inventory() -> Inventory:
    """Model, count, driver and the driver's CUDA version of this host's GPUs (nvidia-smi first on PATH)."""
    rows, problem = nvidia_smi.gpus()   # read as gpu_smoke reads them
    if not rows:
        return Inventory([], problem=problem)
    gpus = [Gpu(index=r["index"], name=r["name"], driver=r["driver"],
                memory_mib=int(r["memory_mib"]) if r["memory_mib"].isdigit() else None) for r in rows]
    try:
        match = _CUDA_VERSION_RE.search(nvidia_smi.run().stdout)
    except (OSError, subprocess.TimeoutExpired):
        match = None
    link, link_problem, seen = _interconnect(len(gpus))
    return Inventory(gpus, driver=gpus[0].driver, cuda_driver=match.group(1) if match else "", interconnect=link,
                     interconnect_problem=link_problem, interconnect_seen=seen)


def _interconnect(count: int) -> tuple[str, str, str]:
    """NVLink or PCIe between this host's GPUs (`nvidia-smi topo -m`) and what it showed, or "", why not, ""."""
    if count < 2:
        return "", "one GPU: no link between GPUs", ""
    try:
        proc = nvidia_smi.run("topo", "-m")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"nvidia-smi topo -m failed: {exc}", ""
    if proc.returncode != 0:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        return "", f"nvidia-smi topo -m failed (exit {proc.returncode}): {said[0] if said else 'no output'}", ""
    try:
        link, seen = busbw.read_topology(proc.stdout)
    except ValueError as exc:
        return "", str(exc), ""
    return link, "", seen


def require_gpus(inventory: Inventory) -> None:
    """A declared GPU runner that cannot see its GPUs fails at once (exit 1), before any test."""
    if not inventory.gpus:
        # MIG on, or a GPU NVML cannot read: the problem names its own fix, which is not the driver's.
        fix = "" if nvidia_smi.names_its_fix(inventory.problem) else (
            "; fix the NVIDIA driver (nvidia-smi must list the GPUs; after a kernel or driver update, reboot or "
            "reload the nvidia modules)")
        raise FailedError(f"this runner is declared a GPU runner (--require-gpu or {gpu.REQUIRE_GPU_ENV}) but has "
                          f"no usable GPU: {inventory.problem}{fix}")


def run_flags(cell: Cell, labels: dict[str, str], gpus: list[dict[str, str]], log: Log) -> list[str]:
    """The cell's run profile as docker flags; `--gpus` only where this runner has GPUs."""
    label = labels.get(label_keys.RUN_PROFILE)
    if label:
        try:
            built = json.loads(label)
        except ValueError:
            log(f"note: label {label_keys.RUN_PROFILE} is not JSON; ignored")
        else:
            if not isinstance(built, dict):
                log(f"note: label {label_keys.RUN_PROFILE} is a JSON {type(built).__name__}, not the run profile's "
                    "object; ignored")
            elif built.get("shm_size") not in (None, cell.run.shm_size):
                shown = " ".join(str(built.get("shm_size")).split())[:40]   # the label is anyone's who may push
                log(f"note: the image was built with run profile shm_size={shown}, "
                    f"the matrix now says {cell.run.shm_size}; testing the matrix's")
    flags = [f for f in cell.run.docker_flags() if not f.startswith("--gpus")]
    if gpus and cell.run.gpus != "none":
        flags.append(f"--gpus={cell.run.gpus}")
    return flags


def gpu_start_problem(stderr: str, cuda: str | None) -> str:
    """What a refused `docker run --gpus` means, with the fix."""
    said = docker_cli.engine_error(stderr)  # the cause, not the client's closing usage hint
    lower = stderr.lower()
    if any(marker in lower for marker in gpu.NO_RUNTIME_MARKERS):
        return f"the Docker engine has no NVIDIA runtime for --gpus ({said}): {gpu.TOOLKIT_FIX}"
    if any(marker in lower for marker in gpu.DRIVER_TOO_OLD_MARKERS):
        need = f"NVIDIA driver {gpu.min_driver(cuda)} or newer (CUDA {cuda})" if cuda else "a newer NVIDIA driver"
        return f"the host's NVIDIA driver is too old for this image ({said}): install {need}"
    return f"containers cannot be started with their GPUs ({said}); check the NVIDIA driver and Container Toolkit"


def probe_flags(image: str, flags: list[str], log: Log, cuda: str | None = None) -> tuple[list[str], list[str]]:
    """Start a throwaway container with `flags`; drop ulimits the engine cannot grant.

    Some engines (rootless, nested, locked-down hosts) cannot raise a hard limit such as
    memlock=-1. The run then goes on with the engine's default for that limit, and the
    deviation is recorded so the ulimit test reports it as skipped, never as passed.
    GPU flags are probed on their own afterwards: an engine that cannot give containers their
    GPUs is a failure of this runner (FailedError, exit 1) that names the fix.
    """
    # `--entrypoint true`: only the engine's answer to the flags matters here, and an image whose
    # entrypoint ignores its command or hangs must not stall validation (the tests report it).
    # Exit 125 is the engine refusing to start the container; any other code means it started.
    # Labelled: a start that hangs (a stuck engine; for --gpus the NVIDIA hook stuck on a hung driver or a GPU that
    # fell off the bus) leaves its container with the engine when the client is stopped; it is removed by this label,
    # however the client was stopped: its timeout, Ctrl-C or CI's cancel (SIGTERM, raised by the CLI).
    def start(*args: str, name: str = "probe", timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        run = f"{name}-{uuid.uuid4().hex[:12]}"
        try:
            return docker_cli.docker("run", "--rm", "--network", "none", "--entrypoint", "true", "--label",
                                     f"{label_keys.IMAGETEST_RUN}={run}", *args, image, timeout=timeout)
        except BaseException as exc:
            if not isinstance(exc, (docker_cli.ClientNotFound, docker_cli.EngineUnreachable)):   # those started none
                remove_run_containers(run, log)
            raise

    gpu_flags = [f for f in flags if f.startswith("--gpus")]
    plain = [f for f in flags if not f.startswith("--gpus")]
    proc = start(*plain)
    kept, dropped = list(plain), []
    if proc.returncode == 125:
        if "rlimit" not in proc.stderr:
            raise UserError(f"cannot start {image} with its run profile ({' '.join(plain)}): "
                            f"{docker_cli.engine_error(proc.stderr)}")
        kept = []
        for flag in plain:
            if flag.startswith("--ulimit") and start(flag).returncode == 125:
                dropped.append(flag.split("=", 1)[1].split("=")[0])
                log(f"note: this engine cannot grant {flag}; running with its default and reporting the check "
                    "as skipped")
            else:
                kept.append(flag)
    if gpu_flags:
        try:
            proc = start(*kept, *gpu_flags, name="gpu-probe", timeout=GPU_START_TIMEOUT_S)
        except docker_cli.DockerTimeout:
            raise FailedError(f"this runner lists GPUs but {image} did not start with them within "
                              f"{GPU_START_TIMEOUT_S:g} s (it started without them): the NVIDIA driver or Container "
                              "Toolkit hangs; check the GPUs (nvidia-smi, Xid errors in dmesg), reset them or reboot "
                              "the runner") from None
        if proc.returncode == 125:
            raise FailedError(f"this runner lists GPUs but {image} cannot be started with them: "
                              + gpu_start_problem(proc.stderr, cuda))
    return kept + gpu_flags, dropped


def check_cell_gpus(cell: Cell, inventory: Inventory) -> str:
    """A GPU cell on a runner that lists GPUs: its driver must be admitted for the cell's CUDA, natively
    or by NGC's forward-compatibility rule (exit 1 if not). Returns the sentence naming the rule."""
    if not (cell.needs_gpu and inventory.gpus and cell.cuda):
        return ""
    decision = driver_rules.decide(cell.cuda, inventory.driver, inventory.cuda_driver,
                                   [g.name for g in inventory.gpus], ngc_release(cell.base),
                                   platforms.host().architecture)
    if not decision.admitted:
        raise FailedError(f"cannot validate {cell.key} here: {decision.rule}")
    return decision.rule


def busbw_baseline(folders: list[Path], cell: str, inventory: Inventory,
                   window: int = busbw.DEFAULT_WINDOW) -> dict[str, Any]:
    """The median peak of the last `window` nights of earlier verdicts of `cell` on the same GPU model,
    count and interconnect whose bus-bandwidth check passed ({} when there is none)."""
    if not inventory.gpus:
        return {}
    model, count = inventory.gpus[0].name, len(inventory.gpus)
    names = sorted(g.name for g in inventory.gpus)
    paths: dict[Path, Path] = {}     # each file once (by where it resolves), as first found
    for folder in (f for f in folders if f.is_dir()):
        for path in verdict_paths(folder):
            paths.setdefault(path.resolve(), path)
    history: list[tuple[dt.datetime, float, str]] = []
    left_out: list[str] = []
    for path in paths.values():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:   # RecursionError: too deep
            left_out.append(f"{path}: cannot read verdict ({exc})")   # as the report names it
            continue
        try:   # the size `buildtool report --fetch` adds, by the report's rule: a file it refuses is no night here
            data, _ = split_size(data, str(path))
        except VerdictError as exc:
            left_out.append(str(exc))
            continue
        try:
            earlier = parse_verdict(data, str(path))
        except VerdictError as exc:            # not a verdict (a missing record, another schema): no baseline;
            if isinstance(data, dict) and type(data.get("schema")) is int and data["schema"] in READ_SCHEMAS:
                left_out.append(str(exc))      # a verdict of a schema read here that does not parse: named
            continue
        if earlier.cell != cell:
            continue
        gpus = earlier.runner.gpus
        peak = gpu.busbw_peak(earlier.figures)
        checked = any(t.gpu and "busbw" in t.id and t.result == "passed" for t in earlier.tests)
        if peak is None or not checked or sorted(g.name for g in gpus) != names:   # the same models, each GPU
            continue
        link = (earlier.figures.get(gpu.BUSBW_FIGURE) or {}).get("interconnect")
        broken = (busbw.model_of(model), inventory.interconnect) in busbw.FAULTS
        if link and inventory.interconnect and link != inventory.interconnect and not broken:
            continue                           # the same GPUs over another interconnect: not comparable
        # (an SXM board read as PCIe is not another interconnect: NVLink is down, its nights compare)
        started = when(earlier.started)       # as release and the report parse it: a time that does not is no night
        if started is None:
            left_out.append(f"{path}: `started` {earlier.started[:40]!r} is not an ISO 8601 time, so the verdict "
                            "cannot be placed in a night")
            continue
        history.append((started, peak, f"{path} ({earlier.started})"))
    found = busbw.window_baseline(history, window)
    if left_out:
        found["left_out"] = left_out
    return {**found, "gpu_model": model, "gpus": count} if found else {}
