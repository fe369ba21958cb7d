"""Scaling benchmark of one strategy: the same training at 1, 2, 4, ... processes (one per GPU, or per core), or
nodes. DDP's worker is bench/ddp_epochs.py; the other strategies' (FSDP, DeepSpeed ZeRO-2, JAX data parallel) are
in their framework's image-tests folder (contracts.strategies); strategy_runs.py runs several side by side.

Each count is one torchrun launch of the strategy's worker (JAX: the worker starting its processes), either
inside an image (docker run with the cell's run profile, host network), with a Python that has the framework, or
as a SLURM job over that many nodes (`SlurmLauncher`: the sbatch script of `buildtool slurm` with this
workload, any of its runtimes; submitted, waited for with a bound, its output parsed). Time per epoch is the median
over the epochs after the first (which pays for warm-up). Results go to a metrics folder as JSON
and CSV, with two plots: absolute time per epoch (log-log) and speed-up against the smallest run
next to the ideal linear line.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import math
import os
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from buildtool.common import docker_cli
from buildtool.common.documents import plural
from buildtool.common.errors import FailedError, UserError
from buildtool.common.files import write_atomic
from buildtool.contracts.rendezvous import RDZV_PORT
from buildtool.launch import verify_ddp

WORKER = "bench/ddp_epochs.py"
RESULT_PREFIX = "SCALING_RESULT "
# A worker that cannot run its strategy here (DeepSpeed without its package or a supported accelerator) prints
# this with the reason and exits 0: the strategy is reported as not run on this runner, never as a pass.
NOT_RUN_PREFIX = "SCALING_NOT_RUN "
CONTAINER_BENCH = "/opt/dl-images-bench"


@dataclass(frozen=True)
class Launcher:
    """Where torchrun runs: `docker` (in `image`, with the client DOCKER_CLIENT chooses) or `host`
    (with `python`)."""

    kind: str
    image: str = ""
    python: str = "python3"
    docker_flags: tuple[str, ...] = ("--shm-size=1g",)
    entry: str = "torchrun"   # torchrun starts the ranks, or `spawn`: the worker starts its own (`--spawn N`)

    def world_size(self, count: int) -> int:
        return count

    def command(self, nprocs: int, worker: Path, env: dict[str, str], name: str) -> list[str]:
        torchrun = ["--standalone", f"--nproc-per-node={nprocs}"]
        spawn = ["--spawn", str(nprocs)]
        if self.kind == "host":
            if self.entry == "spawn":
                return [self.python, str(worker), *spawn]
            return [self.python, "-m", "torch.distributed.run", *torchrun, str(worker)]
        if self.kind != "docker":
            raise UserError(f"launcher must be docker or host, not {self.kind!r}")
        env_flags = [f"--env={k}={v}" for k, v in sorted(env.items())]
        inside = f"{CONTAINER_BENCH}/{worker.name}"
        run = ["python3", inside, *spawn] if self.entry == "spawn" else ["torchrun", *torchrun, inside]
        return docker_cli.argv("run", "--rm", f"--name={name}", "--network=host", *self.docker_flags, *env_flags,
                               f"--volume={worker.parent.resolve()}:{CONTAINER_BENCH}:ro", self.image, *run)

    def run(self, count: int, worker: Path, env: dict[str, str], timeout_s: float) -> tuple[int, str]:
        """COUNT processes of WORKER, here or in the image: (exit code, output)."""
        name = f"t-scaling-{uuid.uuid4().hex[:10]}"
        cmd = self.command(count, worker, env, name)
        full_env = {**os.environ, **env}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=full_env, check=False)
        except subprocess.TimeoutExpired:
            raise FailedError(f"scaling run with {plural(count, 'process', 'processes')} took over {timeout_s:.0f} s"
                              ) from None
        except FileNotFoundError as exc:
            raise UserError(f"cannot start {cmd[0]} ({exc}); install it or choose another --launcher") from None
        finally:
            if self.kind == "docker":  # interrupted or timed out: the container must not outlive us
                docker_cli.remove(name, timeout=60)
        if self.kind == "docker":
            docker_cli.check_reached(proc)
        return proc.returncode, proc.stdout + proc.stderr


@dataclass(frozen=True)
class RunResult:
    count: int
    backend: str
    epoch_times_s: list[float]
    losses: list[float]
    identical: bool
    time_per_epoch_s: float = 0.0
    speedup: float = 0.0
    efficiency: float = 0.0
    wall_clock_s: float = 0.0      # the whole launch: start, rendezvous, every epoch, teardown
    samples_per_s: float = 0.0     # the subset over the steady time per epoch
    peak_memory_mb: list[float] = field(default_factory=list)   # per rank: resident (CPU) or CUDA allocated
    matches_reference: bool | None = None   # FSDP, ZeRO, JAX: the unsharded replay agrees (None: not checked)
    max_abs_diff: float | None = None


class NotRunHere(Exception):
    """The strategy cannot run on this runner; the message says why."""


@dataclass
class ScalingResult:
    unit: str
    samples: int
    epochs: int
    launcher: dict[str, Any]
    runs: list[RunResult] = field(default_factory=list)
    strategy: str = "ddp"
    title: str = "DDP"
    batch: int = 0
    status: str = "ran"            # or "not run" or "failed" (strategy_runs): `reason` says why (never a pass)
    reason: str = ""
    min_efficiency: float = 0.0    # the declared fraction of ideal speed-up at the largest count
    flagged: bool = False          # its efficiency at the largest count is below min_efficiency


PLOTS = ("time_per_epoch.png", "speedup.png")   # a folder's plots: one strategy's, or the strategies side by side

GPU_COUNTS = "gpus"   # --counts gpus: 1, 2, 4, ... up to the runner's GPU count (and the count itself)


def counts_for_gpus(gpus: int) -> list[int]:
    """1, 2, 4, ... up to `gpus`, and `gpus` itself when it is not a power of two."""
    if gpus < 1:
        raise FailedError("--counts gpus: this runner has no usable GPU (nvidia-smi lists none)")
    counts = [2**power for power in range(gpus.bit_length())]
    return counts if counts[-1] == gpus else [*counts, gpus]


def check_counts_fit(counts: list[int], gpus: int) -> None:
    """One process per GPU: a count above the runner's GPUs cannot run (NCCL refuses shared GPUs)."""
    too_many = [c for c in counts if c > gpus]
    if too_many:
        raise UserError(f"--counts {','.join(map(str, counts))}: this runner has {gpus} GPU(s), so "
                        f"{', '.join(map(str, too_many))} cannot run one process per GPU; use --counts gpus")


def parse_counts(text: str) -> list[int]:
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise UserError(f"--counts {text!r} must be a comma list of whole numbers like 1,2,4") from None
    if not counts or counts[0] < 1:
        raise UserError(f"--counts {text!r} must name at least one count, all 1 or more")
    return counts


def shipped_with(worker: Path) -> dict[str, str]:
    """The worker and the modules beside it that it imports, and theirs (fsdp_epochs.py: torch_epochs.py), by file
    name: what a SLURM job writes into its folder. The docker launcher mounts the worker's whole folder instead."""
    files: dict[str, str] = {}
    todo = [worker]
    while todo:
        path = todo.pop()
        if path.name in files:
            continue
        text = path.read_text(encoding="utf-8")
        files[path.name] = text
        for node in ast.walk(ast.parse(text, filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            todo += [worker.parent / f"{name}.py" for name in names if (worker.parent / f"{name}.py").is_file()]
    return files


@dataclass(frozen=True)
class SlurmLauncher:
    """Each count is a number of nodes: one sbatch job of `buildtool slurm`'s script running the benchmark."""

    runtime: str                         # apptainer, pyxis or oci
    image: str                           # image reference, .sif, or (oci) the bundle folder
    workdir: Path                        # where the scripts go and the jobs run from (their output files)
    gpus_per_node: int = 0
    shm_size: str = "8g"
    partition: str = ""
    account: str = ""
    time_limit: str = "00:30:00"
    join_timeout_s: int = 300
    rdzv_port: int = RDZV_PORT
    env: dict[str, str] | None = None    # sbatch's environment (None: this process's)
    kind: str = "slurm"
    strategy: str = "ddp"                # names the jobs: <strategy>-scaling-<N>n

    def world_size(self, count: int) -> int:
        return count * (self.gpus_per_node or 1)

    def run(self, count: int, worker: Path, env: dict[str, str], timeout_s: float) -> tuple[int, str]:
        from buildtool.launch.multinode import VERIFY_FILES, VERIFY_SCRIPT, MultiNodeJob
        from buildtool.launch.slurm import SlurmOptions, Workload, render
        from buildtool.launch.slurmjobs import run_job

        job = MultiNodeJob(image=self.image, nodes=count, gpus_per_node=self.gpus_per_node,
                           name=f"{self.strategy}-scaling-{count}n", shm_size=self.shm_size,
                           join_timeout_s=self.join_timeout_s, rdzv_port=self.rdzv_port)
        opts = SlurmOptions(runtime=self.runtime, partition=self.partition, account=self.account,
                            time_limit=self.time_limit)
        # torchrun through the DDP check's verifier: on a cluster whose node names do not resolve in the
        # containers it tells each node whether it hosts the store (is_host) and gives its agent the node's
        # address (--local-addr); the scaling worker prints no DDP_RESULT (OWN_WORKLOAD_ENV: none is owed; run_one
        # reads its SCALING_RESULT), so it checks nothing else.
        command = ["python3", f"$jobdir/{VERIFY_SCRIPT}",
                   *job.launcher.node_command(job, "$endpoint", "$SLURM_JOB_ID", f"$jobdir/{worker.name}")]
        work = Workload(label=f"{self.strategy.upper()} scaling run", command=command,
                        env={**env, **job.expect_env, verify_ddp.OWN_WORKLOAD_ENV: "1"},
                        embedded={**shipped_with(worker), **VERIFY_FILES},
                        first_node_hosts=job.launcher.first_node_hosts)
        self.workdir.mkdir(parents=True, exist_ok=True)
        script = self.workdir / f"{job.name}.sbatch"
        write_atomic(script, render(job, opts, work))   # a full disk leaves no half script anyone could submit
        end = run_job(script, cwd=self.workdir, timeout_s=timeout_s, env=self.env)
        return (0 if end.state == "COMPLETED" else 1), f"{end.output}\n[job {end.job_id}: {end.state} {end.exit_code}]"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# What run_one reads from a worker's result: each field's test (None: absent) and its words in a message.
RESULT_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{name: verify_ddp.RESULT_FIELDS[name] for name in ("backend", "world_size", "identical")},
    # finite: an Infinity (json reads it) made the speed-ups 0 or NaN, and a NaN efficiency is below no threshold
    "epoch_times_s": (lambda v: isinstance(v, list) and bool(v) and all(_number(t) and 0 < t < math.inf for t in v),
                      "a non-empty list of seconds above 0"),
    "losses": (lambda v: isinstance(v, list) and all(_number(x) for x in v), "a list of numbers"),
    "matches_reference": (lambda v: v is None or isinstance(v, bool), "true, false or absent"),
    "max_abs_diff": (lambda v: v is None or _number(v), "a number or absent"),
}


def read_result(line: str, what: str) -> dict[str, Any]:
    """A worker's `SCALING_RESULT <json>` line; FailedError naming what is wrong with it (the worker broke its
    contract)."""
    text = line[len(RESULT_PREFIX):]
    its, shown = f"scaling run with {what} failed: its SCALING_RESULT line", text.strip()[:120]
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise FailedError(f"{its} is not JSON ({exc}): {shown}") from None
    if not isinstance(data, dict):
        raise FailedError(f"{its} is not a JSON object: {shown}")
    wrong = [f"{name} ({words})" for name, (test, words) in RESULT_FIELDS.items() if not test(data.get(name))]
    if wrong:
        raise FailedError(f"{its} has no valid {', '.join(wrong)}: {shown}")
    return data


# Several nodes' torchrun output interleaves: enough lines that the failing rank's traceback is in view.
FAILURE_TAIL_LINES = 40


def run_one(launcher: Launcher | SlurmLauncher, count: int, worker: Path, samples: int, epochs: int, batch: int,
            timeout_s: float) -> RunResult:
    env = {"SCALING_SAMPLES": str(samples), "SCALING_EPOCHS": str(epochs), "SCALING_BATCH": str(batch)}
    what = plural(count, "node") if isinstance(launcher, SlurmLauncher) else plural(count, "process", "processes")
    started = time.monotonic()
    code, output = launcher.run(count, worker, env, timeout_s)
    wall_clock = time.monotonic() - started
    lines = [line for line in output.splitlines() if line.startswith(RESULT_PREFIX)]
    not_run = [line[len(NOT_RUN_PREFIX):].strip() for line in output.splitlines() if line.startswith(NOT_RUN_PREFIX)]
    if code == 0 and not_run and not lines:
        raise NotRunHere(not_run[-1] or "the worker gave no reason")
    if code != 0 or not lines:
        tail = "\n".join(output.splitlines()[-FAILURE_TAIL_LINES:])
        raise FailedError(f"scaling run with {what} failed (exit {code}):\n{tail}")
    data = read_result(lines[-1], what)
    expected = launcher.world_size(count)
    if data["world_size"] != expected:
        raise FailedError(f"asked for {what} ({expected} processes), the run had {data['world_size']}")
    if not data["identical"]:
        raise FailedError(f"run with {what} ended with different parameters on different ranks")
    if data.get("matches_reference") is False:
        raise FailedError(f"run with {what}: the parameters differ from the same training replayed unsharded in one "
                          f"process (max difference {data.get('max_abs_diff')}): the gradients were not averaged "
                          f"across ranks")
    peaks = data.get("peak_memory_mb")
    if not isinstance(peaks, list) or len(peaks) != expected or not all(_number(p) for p in peaks):
        raise FailedError(f"run with {what} reported no peak memory for each of its {expected} ranks: {peaks!r}")
    times = data["epoch_times_s"]
    per_epoch = statistics.median(times[1:] or times)   # the epochs after the first, which pays for warm-up
    return RunResult(count=count, backend=data["backend"], epoch_times_s=times,
                     losses=data["losses"], identical=True, time_per_epoch_s=per_epoch,
                     wall_clock_s=round(wall_clock, 6), samples_per_s=round(samples / per_epoch, 3),
                     peak_memory_mb=[float(p) for p in peaks], matches_reference=data.get("matches_reference"),
                     max_abs_diff=data.get("max_abs_diff"))


def with_speedups(runs: list[RunResult]) -> list[RunResult]:
    """Speed-up and parallel efficiency against the smallest count."""
    base = min(runs, key=lambda r: r.count)
    out = []
    for r in sorted(runs, key=lambda r: r.count):
        speedup = base.time_per_epoch_s / r.time_per_epoch_s
        out.append(replace(r, speedup=speedup, efficiency=speedup / (r.count / base.count)))
    return out


def write_metrics(result: ScalingResult, folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"json": folder / "scaling.json", "csv": folder / "scaling.csv"}
    # Atomically: the report reads scaling.json, and a file cut short would block it until someone deleted it.
    write_atomic(paths["json"], json.dumps(asdict(result), indent=1) + "\n")
    table = io.StringIO()
    writer = csv.writer(table)
    writer.writerow([result.unit, "time_per_epoch_s", "speedup", "efficiency", "backend", "samples_per_s",
                     "peak_memory_mb_max"])
    for r in result.runs:
        writer.writerow([r.count, f"{r.time_per_epoch_s:.6f}", f"{r.speedup:.4f}", f"{r.efficiency:.4f}",
                         r.backend, f"{r.samples_per_s:.1f}", f"{max(r.peak_memory_mb, default=0):.1f}"])
    write_atomic(paths["csv"], table.getvalue())
    if not result.runs:   # a result without runs (not run, failed) has no plots: an earlier run's would pass for its
        for name in PLOTS:
            (folder / name).unlink(missing_ok=True)
    return paths


def plot_pair(lines: list[tuple[str, str, list[RunResult]]], paths: tuple[Path, Path], xlabel: str,
              titles: tuple[str, str], width: float) -> None:
    """The two scaling plots of LINES (label on the time plot, label on the speed-up plot, runs): time per epoch
    (log-log, minor grid lines too) and speed-up next to the ideal linear line, at every count of the runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r.count for _, _, runs in lines for r in runs})
    for path, ylabel, title, log in ((paths[0], "time per epoch (s)", titles[0], True),
                                     (paths[1], f"speed-up vs {counts[0]}", titles[1], False)):
        fig, ax = plt.subplots(figsize=(width, 4.5))
        if log:
            for label, _, runs in lines:
                ax.loglog([r.count for r in runs], [r.time_per_epoch_s for r in runs], "o-", base=2, label=label)
        else:
            ax.plot(counts, [c / counts[0] for c in counts], "--", color="grey", label="ideal (linear)")
            for _, label, runs in lines:
                ax.plot([r.count for r in runs], [r.speedup for r in runs], "o-", label=label)
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both" if log else "major", alpha=.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def plot(result: ScalingResult, folder: Path) -> dict[str, Path]:
    paths = {"time": folder / PLOTS[0], "speedup": folder / PLOTS[1]}
    plot_pair([("measured", "measured", result.runs)], (paths["time"], paths["speedup"]),
              f"{result.unit} ({result.runs[0].backend})",
              (f"{result.title} time per epoch (absolute wall-clock), {result.samples} samples",
               f"{result.title} speed-up (relative wall-clock)"), 6)
    return paths


def check_subset(launcher: Launcher | SlurmLauncher, counts: list[int], samples: int, batch: int) -> None:
    ranks = launcher.world_size(max(counts))
    if samples < ranks * batch:
        raise UserError(f"--samples {samples} is too small: every one of {ranks} ranks needs a full batch "
                        f"of {batch}; use at least {ranks * batch}")


def gpus_asked(launcher: Launcher | SlurmLauncher, unit: str) -> str:
    """Why the runs are GPU runs, one process per GPU ("" when they are not): the counts are GPUs, the SLURM jobs ask
    for GPUs per node, or the container is given GPUs."""
    if unit == "gpus":
        return "the counts are GPUs"
    if isinstance(launcher, SlurmLauncher):
        return f"--gpus-per-node {launcher.gpus_per_node}" if launcher.gpus_per_node > 0 else ""
    gpus = [f for f in launcher.docker_flags if f.startswith("--gpus")] if launcher.kind == "docker" else []
    return f"the container is started with {gpus[0]}" if gpus else ""


def on_gpus_or_fail(run: RunResult, on_gpus: str, launcher: Launcher | SlurmLauncher) -> RunResult:
    """A GPU run that trained with anything but NCCL ran on CPU: its figures are no GPU figures (FailedError)."""
    if not on_gpus or run.backend == "nccl":
        return run
    slurm = isinstance(launcher, SlurmLauncher)
    what = plural(run.count, "node") if slurm else plural(run.count, "process", "processes")
    cpu = "--gpus-per-node 0" if slurm else "--unit processes, without --gpus"
    raise FailedError(f"scaling run with {what} was asked on GPUs ({on_gpus}), but trained with {run.backend}, not "
                      "nccl: its processes saw no usable GPU, so its figures are CPU figures, not GPU ones; give the "
                      f"processes their GPUs, or count processes on CPU ({cpu})")


@dataclass(frozen=True)
class RunSettings:
    """What every run of a benchmark is given, wherever it runs: the training subset and its batches, the unit the
    counts are in, each run's time limit, and the efficiency below which a strategy is flagged."""

    samples: int = 4096
    epochs: int = 3
    batch: int = 64
    unit: str = "processes"
    timeout_s: float = 600.0
    min_efficiency: float = 0.0


def launcher_info(launcher: Launcher | SlurmLauncher) -> dict[str, Any]:
    """What scaling.json records of where the runs ran."""
    info: dict[str, Any] = {"kind": launcher.kind, "image": launcher.image}
    if isinstance(launcher, SlurmLauncher):
        info.update(runtime=launcher.runtime, gpus_per_node=launcher.gpus_per_node, partition=launcher.partition)
    else:
        info["python"] = launcher.python if launcher.kind == "host" else ""
    return info


def run_scaling(launcher: Launcher | SlurmLauncher, counts: list[int], worker: Path, out: Path,
                settings: RunSettings = RunSettings(), strategy: str = "ddp",
                title: str = "DDP") -> tuple[ScalingResult, dict[str, Path]]:
    """One strategy at every count into `out` (scaling.json, scaling.csv and its two plots); a strategy that
    cannot run here writes scaling.json with status "not run" and its reason, and no plots."""
    if not worker.is_file():
        raise UserError(f"{worker} not found; run from the project checkout")
    samples, epochs, batch = settings.samples, settings.epochs, settings.batch
    check_subset(launcher, counts, samples, batch)
    result = ScalingResult(unit=settings.unit, samples=samples, epochs=epochs, launcher=launcher_info(launcher),
                           strategy=strategy, title=title, batch=batch, min_efficiency=settings.min_efficiency)
    on_gpus = gpus_asked(launcher, settings.unit)
    try:
        runs = [on_gpus_or_fail(run_one(launcher, count, worker, samples, epochs, batch, settings.timeout_s), on_gpus,
                                launcher)
                for count in counts]
    except NotRunHere as exc:
        result.status, result.reason = "not run", f"not run on this runner: {exc}"
        return result, write_metrics(result, out)
    result.runs = with_speedups(runs)
    result.flagged = len(result.runs) > 1 and result.runs[-1].efficiency < settings.min_efficiency
    paths = write_metrics(result, out)
    paths.update(plot(result, out))
    return result, paths


def host_has_module(python: str, module: str = "torch") -> bool:
    try:
        return subprocess.run([python, "-c", f"import {module}"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
