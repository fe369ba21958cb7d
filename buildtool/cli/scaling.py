"""`buildtool scaling`: the scaling benchmark of one or several distributed strategies (DDP, FSDP, DeepSpeed
ZeRO-2, JAX data parallel: --strategy), time per epoch at each count of processes (here, in docker or on the host)
or of SLURM nodes (one sbatch job per count), and its speed-up plots, side by side."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildtool.cli.launch_options import shm_for
from buildtool.cli.options import MatrixOption, Project, RevisionOption, err, find_project, out, path_of
from buildtool.common.errors import FailedError, UserError
from buildtool.contracts.arguments import check_arguments
from buildtool.contracts.rendezvous import RDZV_PORT
from buildtool.contracts.strategies import (
    DEFAULT_MIN_EFFICIENCY,
    Strategy,
    check_framework,
    one_framework,
    parse_strategies,
)

if TYPE_CHECKING:
    from buildtool.launch.scaling import Launcher, RunSettings, ScalingResult, SlurmLauncher
    from buildtool.matrix.schema import Cell

CountsOption = Annotated[str, typer.Option(help="Comma list of process (GPU) counts, or `gpus`: 1, 2, 4, ... "
                                                "up to this runner's GPU count.")]
ImageOption = Annotated[str, typer.Option(help="Run inside this image (docker run, host network); with --launcher "
                                               "slurm the image, .sif or (--runtime oci) bundle folder.")]
CellOption = Annotated[str, typer.Option(help="Run inside this cell's dev image of the current commit.")]
LauncherOption = Annotated[str, typer.Option(help="docker, host, slurm (one job per node count) or auto (docker "
                                                  "when an image is given).")]
PythonOption = Annotated[str, typer.Option(help="Host Python with torch, for --launcher host.")]
SamplesOption = Annotated[int, typer.Option("--samples", "--subset-size", help="Data subset size (samples per epoch).")]
EpochsOption = Annotated[int, typer.Option(help="Epochs per run (the first is warm-up).")]
BatchOption = Annotated[int, typer.Option(help="Batch size per rank.")]
UnitOption = Annotated[str, typer.Option(help="What the counts are, for the plots: processes, gpus.")]
TimeoutOption = Annotated[int, typer.Option(help="Seconds per run (SLURM: per job, queueing included) before it is "
                                                 "stopped.")]
# --launcher slurm only.
NodesOption = Annotated[str, typer.Option(help="--launcher slurm: comma list of node counts.")]
RuntimeOption = Annotated[str, typer.Option(help="--launcher slurm: apptainer, pyxis or oci.")]
GpusPerNodeOption = Annotated[int, typer.Option(help="--launcher slurm: GPUs per node (0: one CPU process).")]
PartitionOption = Annotated[str, typer.Option(help="--launcher slurm: partition.")]
AccountOption = Annotated[str, typer.Option(help="--launcher slurm: account.")]
TimeOption = Annotated[str, typer.Option("--time", help="--launcher slurm: each job's time limit.")]
ShmSizeOption = Annotated[str | None, typer.Option(help="--launcher slurm: /dev/shm each node needs (default: the "
                                                        "bundle's or the cell's run profile).")]
RdzvPortOption = Annotated[int, typer.Option(help="--launcher slurm: port of the c10d store.")]
OutDirOption = Annotated[Path, typer.Option("--out", "--metrics-dir", parser=path_of("--out"),
    help="Metrics folder (JSON, CSV, plots).")]
StrategyOption = Annotated[str, typer.Option(help="Comma list of strategies, side by side: ddp, fsdp, deepspeed "
                                                  "(PyTorch images), jax-dp (JAX images).")]
MinEfficiencyOption = Annotated[float, typer.Option(help="Flag a strategy whose speed-up at the largest count is "
                                                         "below this fraction of ideal (linear) scaling.")]


def scaling(
    counts: CountsOption = "1,2",
    image: ImageOption = "",
    cell: CellOption = "",
    launcher: LauncherOption = "auto",
    python: PythonOption = sys.executable,
    samples: SamplesOption = 4096,
    epochs: EpochsOption = 3,
    batch: BatchOption = 64,
    unit: UnitOption = "processes",
    timeout: TimeoutOption = 600,
    nodes: NodesOption = "1,2",
    runtime: RuntimeOption = "oci",
    gpus_per_node: GpusPerNodeOption = 0,
    partition: PartitionOption = "",
    account: AccountOption = "",
    time_limit: TimeOption = "00:30:00",
    shm_size: ShmSizeOption = None,
    rdzv_port: RdzvPortOption = RDZV_PORT,
    out_dir: OutDirOption = Path("reports/scaling"),
    strategy: StrategyOption = "ddp",
    min_efficiency: MinEfficiencyOption = DEFAULT_MIN_EFFICIENCY,
    revision: RevisionOption = None,
    matrix: MatrixOption = None,
) -> None:
    """Scaling benchmark per strategy: time per epoch at each count (processes, or SLURM nodes), speed-up plots."""
    check_arguments("scaling", locals())   # every argument first (issue 37)
    from buildtool.launch.scaling import GPU_COUNTS, RunSettings, SlurmLauncher, parse_counts

    project = find_project(matrix)
    strategies = parse_strategies(strategy)
    settings = RunSettings(samples=samples, epochs=epochs, batch=batch, timeout_s=timeout,
                           min_efficiency=min_efficiency)
    if launcher == "slurm":
        asked = SlurmLauncher(runtime=runtime, image=image, workdir=out_dir.absolute() / "jobs",
                              gpus_per_node=gpus_per_node, shm_size=shm_size or "", partition=partition,
                              account=account, time_limit=time_limit, rdzv_port=rdzv_port)
        slurm, node_counts = _slurm_launcher(project, asked, cell, nodes, revision, strategy)
        _run(project, slurm, node_counts, strategies, out_dir, replace(settings, unit="nodes"))
        return
    docker_flags: tuple[str, ...] = ("--shm-size=1g",)
    framework = one_framework(strategies)
    if cell:
        chosen = _one_cell(project, cell)
        check_framework(strategies, chosen.framework, f"cell {cell}")
        dev_ref = _dev_ref(project, chosen, revision)
        image = image or dev_ref
        docker_flags = tuple(chosen.run.docker_flags())
        unit = "gpus" if chosen.needs_gpu and unit == "processes" else unit
    here = _local_launcher(launcher, image, python, docker_flags, framework, counts == GPU_COUNTS)
    # One process per GPU where the cell runs on GPUs (or --counts gpus): the counts must fit the runner.
    on_gpus = counts == GPU_COUNTS or (here.kind == "docker" and any(f.startswith("--gpus") for f in here.docker_flags))
    wanted = _gpu_counts(counts) if on_gpus else parse_counts(counts)
    unit = "gpus" if on_gpus and unit == "processes" else unit
    if here.kind == "docker" and cell:
        here = _with_probed_flags(here)
    _run(project, here, wanted, strategies, out_dir, replace(settings, unit=unit))


def _one_cell(project: Project, cell: str) -> Cell:
    chosen = project.load().select(cell)
    if len(chosen) != 1:
        raise UserError(f"--cell {cell!r} names {len(chosen)} cells; name one, like pytorch-cpu:2.13")
    return chosen[0]


def _dev_ref(project: Project, cell: Cell, revision: str | None) -> str:
    """The cell's dev image of the revision (default: the current commit)."""
    from buildtool.matrix.plan import Settings, plan_cell

    return plan_cell(cell, Settings.from_env(), project.revision(revision)).dev_ref


def _local_launcher(launcher: str, image: str, python: str, docker_flags: tuple[str, ...],
                    framework: str, per_gpu: bool) -> Launcher:
    """--launcher docker, host or auto (docker when there is an image), checked before anything runs. With one
    process per GPU asked (`per_gpu`), a container nothing gave GPUs (an --image, or a CPU cell) gets them: without,
    every run trained with gloo on its CPU."""
    from buildtool.launch.scaling import Launcher, host_has_module

    kind = launcher if launcher != "auto" else ("docker" if image else "host")
    if kind == "docker" and per_gpu and not any(f.startswith("--gpus") for f in docker_flags):
        docker_flags = (*docker_flags, "--gpus=all")
    if kind == "docker" and not image:
        raise UserError("--launcher docker needs --image or --cell")
    module = "jax" if framework == "jax" else "torch"
    if kind == "host" and not host_has_module(python, module):
        raise UserError(f"{python} cannot import {module}; `pip install '.[scaling]'` or pass --image")
    return Launcher(kind=kind, image=image, python=python, docker_flags=docker_flags)


def _gpu_counts(counts: str) -> list[int]:
    """--counts on this runner's GPUs (`gpus`: 1, 2, 4, ... up to how many it has): each must fit."""
    from buildtool.launch.scaling import GPU_COUNTS, check_counts_fit, counts_for_gpus, parse_counts
    from buildtool.validate.probe import gpu_inventory

    inventory = gpu_inventory()
    if not inventory.gpus:
        raise FailedError(f"the scaling run needs GPUs and this runner has none usable ({inventory.problem})")
    wanted = counts_for_gpus(len(inventory.gpus)) if counts == GPU_COUNTS else parse_counts(counts)
    check_counts_fit(wanted, len(inventory.gpus))
    return wanted


def _with_probed_flags(launcher: Launcher) -> Launcher:
    """As validate does: an engine that cannot grant a ulimit runs with its default, and says so."""
    from buildtool.validate.probe import probe_flags

    kept, _ = probe_flags(launcher.image, list(launcher.docker_flags), lambda line: err.print(line, markup=False))
    return replace(launcher, docker_flags=tuple(kept))


def _slurm_launcher(project: Project, asked: SlurmLauncher, cell: str, nodes: str, revision: str | None,
                    strategy: str) -> tuple[SlurmLauncher, list[int]]:
    """`buildtool scaling --launcher slurm`: one sbatch job per node count, submitted from METRICS_DIR/jobs;
    the launcher as asked (its image and /dev/shm size as given, maybe none) made whole, and the node counts,
    every option checked before anything is submitted."""
    from buildtool.launch.scaling import parse_counts
    from buildtool.launch.slurm import SlurmOptions, check_image

    SlurmOptions(runtime=asked.runtime, time_limit=asked.time_limit)  # refuses a bad runtime or time limit up front
    if one_framework(parse_strategies(strategy)) != "pytorch":
        raise UserError(f"--strategy {strategy} cannot run over --launcher slurm: its jobs start torchrun (DDP, "
                        "FSDP, DeepSpeed); run JAX data parallelism with --launcher docker or host")
    image = asked.image
    if cell and not image:
        if asked.runtime == "oci":
            raise UserError("--runtime oci needs --image BUNDLE (the folder `buildtool bundle` made), not --cell")
        image = _dev_ref(project, _one_cell(project, cell), revision)
    if not image:
        raise UserError("--launcher slurm needs --image (an image, a .sif or, with --runtime oci, a bundle folder)")
    check_image(image, asked.runtime)
    shm = shm_for(image, asked.shm_size, project.matrix_path, asked.runtime)
    return replace(asked, image=image, shm_size=shm), parse_counts(nodes)   # a list of counts (check_arguments)


def _run(project: Project, launcher: Launcher | SlurmLauncher, counts: list[int], strategies: list[Strategy],
         out_dir: Path, settings: RunSettings) -> None:
    from buildtool.launch.scaling import SlurmLauncher, check_subset
    from buildtool.launch.strategy_runs import run_strategies

    def launcher_for(strategy: Strategy) -> Launcher | SlurmLauncher:
        if isinstance(launcher, SlurmLauncher):
            return replace(launcher, strategy=strategy.name)
        return replace(launcher, entry=strategy.launch)

    check_subset(launcher, counts, settings.samples, settings.batch)   # before any strategy runs
    results, paths = run_strategies(launcher_for, strategies, counts, project.root, out_dir, settings)
    for result in results:
        _print_scaling(result)
    out.print("wrote " + ", ".join(str(p) for p in paths.values()))
    if failed := [r.strategy for r in results if r.status == "failed"]:   # recorded in the comparison, still a failure
        raise FailedError(f"the scaling run of {', '.join(failed)} failed (see above); {out_dir / 'comparison.json'} "
                          "records it as failed beside the strategies that ran")


def _print_scaling(result: ScalingResult) -> None:
    if not result.runs:
        out.print(f"{result.strategy}: {result.reason}", markup=False)
        return
    base = result.runs[0]
    for r in result.runs:
        out.print(f"{result.strategy} {r.count:>3} {result.unit}: {r.time_per_epoch_s:.3f} s/epoch, "
                  f"{r.samples_per_s:.0f} samples/s, speed-up {r.speedup:.2f}x (ideal {r.count / base.count:.0f}x), "
                  f"efficiency {r.efficiency:.0%}, peak memory {max(r.peak_memory_mb, default=0):.0f} MiB/rank, "
                  f"wall-clock {r.wall_clock_s:.1f} s", markup=False)
    if result.flagged:
        out.print(f"{result.strategy}: FLAGGED: speed-up at {result.runs[-1].count} {result.unit} is "
                  f"{result.runs[-1].efficiency:.0%} of ideal, below {result.min_efficiency:.0%}", markup=False)
