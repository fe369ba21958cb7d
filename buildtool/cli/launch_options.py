"""Options the launch commands (k8s, slurm, bundle, scaling) share, declared once, and the checks that
turn them into settings.

Only options that are the same everywhere they appear live here (flag, type, help): an option whose
help says something particular to one command (`--nodes` is pods for k8s, nodes for slurm, a comma
list for scaling) is declared beside that command. A leaf of the CLI, like buildtool.cli.options.

What they take from the matrix, or a bundle's record, about the image they launch (its /dev/shm size,
its platform, its framework) is here too: an option given on the command line wins; an image the
matrix does not know must have it given, never a default.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildtool.cli.console import find_project, project_or_none, say, writing
from buildtool.cli.options import path_of
from buildtool.common.errors import UserError

if TYPE_CHECKING:
    from buildtool.contracts import platforms as contracts_platforms
    from buildtool.contracts.frameworks import Framework
    from buildtool.launch.multinode import NcclSettings
    from buildtool.matrix.schema import Cell, Matrix

# Not FrameworkOption (--framework/-f selects cells of the matrix, from $FRAMEWORK too): this one names the
# framework of an image the matrix does not know, and only on the command line.
CheckFrameworkOption = Annotated[
    str | None,
    typer.Option("--framework", help="The image's framework (a folder image-tests/<name>/), whose multi-node check "
                                     "runs: needed for an image the matrix does not know (a foreign image, a .sif, a "
                                     "bundle folder); an image of the matrix has its cell's."),
]

# The multi-node check's rendezvous and training (defaults: buildtool.contracts.rendezvous, and 40 steps).
JoinTimeoutOption = Annotated[int, typer.Option(help="c10d rendezvous join timeout, seconds.")]
RdzvPortOption = Annotated[int, typer.Option(help="Port of the c10d rendezvous store.")]
MaxRestartsOption = Annotated[int, typer.Option(help="torchrun restarts per node.")]
StepsOption = Annotated[int, typer.Option(help="Training steps of the check.")]

# NCCL of a GPU job (see nccl_settings).
NcclDebugOption = Annotated[str, typer.Option(help="NCCL_DEBUG of a GPU job: VERSION, WARN, INFO or TRACE "
                                                   "(default INFO, NCCL_DEBUG_SUBSYS=INIT,NET: the check reports "
                                                   "the network NCCL chose).")]
NcclIfnameOption = Annotated[str, typer.Option(help="NCCL_SOCKET_IFNAME of a GPU job, e.g. eth0 or ^lo,docker "
                                                    "(default: unset, NCCL's choice).")]
NcclHcaOption = Annotated[str, typer.Option(help="NCCL_IB_HCA of a GPU job, e.g. mlx5_0:1,mlx5_1:1 "
                                                 "(default: unset, NCCL's choice).")]
NcclEnvOption = Annotated[list[str] | None, typer.Option(help="Another NCCL_* variable of a GPU job, NAME=VALUE "
                                                              "(repeatable; e.g. NCCL_IB_GID_INDEX=3).")]

# The fabric of a GPU job across nodes (launch.multinode.MultiNodeJob; documented rates: contracts.busbw).
FabricRateOption = Annotated[str, typer.Option(
    help="The fabric's documented rate, which the job must run on: HDR or NDR (InfiniBand, per NIC), or an EFA "
         "instance type (p4d.24xlarge, p5.48xlarge, p5en.48xlarge). It asks NCCL for that family (IB or EFA), "
         "fails a port NCCL reports slower, and sets the cross-node bus-bandwidth floor (default: the slowest "
         "documented rate of the family NCCL used).")]
FabricNicsOption = Annotated[int, typer.Option(
    help="NICs per node NCCL must use, one per GPU at most (default: the --nccl-ib-hca list's count, else the "
         "devices NCCL lists); fewer in NCCL's channels fails the job, and the floor counts them.")]
RequireGdrOption = Annotated[bool, typer.Option(
    help="Fail unless every NET channel NCCL opens between nodes is GPUDirect RDMA (`via NET/.../GDRDMA`).")]

# Where a generated job (manifests, an sbatch script) goes.
OutFileOption = Annotated[Path | None, typer.Option("--out", parser=path_of("--out"),
    help="Write here instead of stdout.")]


def write_or_print(text: str, target: Path | None) -> None:
    """TEXT to the --out file (saying so), or to stdout without one."""
    if target is None:
        sys.stdout.write(text)
        return
    from buildtool.common.files import write_atomic

    # A folder that cannot be made, no permission: one line, not a traceback. Atomic: a full disk or Ctrl-C half-way
    # left half a job (an sbatch script cut in the middle of a line) where --out names it.
    with writing("--out", target):
        write_atomic(target, text)
    say(f"wrote {target}")   # verbatim: rich read a `[/]` in the path as markup (a traceback) and `:ok:` as an emoji


def nccl_settings(debug: str, ifname: str, hca: str, env: list[str] | None) -> NcclSettings:
    """The --nccl-* options as the job's NCCL settings (a bad --nccl-env is refused here)."""
    from buildtool.launch.multinode import NcclSettings

    return NcclSettings(debug=debug, socket_ifname=ifname, ib_hca=hca, extra=NcclSettings.parse_env(env or []))


def shm_for(image: str, shm_size: str | None, matrix: Path | None, runtime: str = "") -> str:
    """The /dev/shm size to launch IMAGE with, unless given: the one its bundle was made with (its record; slurm's
    --runtime oci, where IMAGE is the bundle folder), else its cell's run profile's."""
    if shm_size:
        return shm_size
    if runtime == "oci":
        from buildtool.launch.bundle import META_FILE, read_meta

        meta = read_meta(Path(image))
        if meta is None or not isinstance(meta.get("shm_size"), str):
            raise UserError(f"no bundle record ({META_FILE}) in {image} on this machine, so the bundle's /dev/shm size "
                            "is unknown; pass --shm-size (the size it was made with)")
        if not re.fullmatch(r"[0-9]+[kmgKMG]?", meta["shm_size"]):   # not --shm-size's fault (slurm's grammar)
            raise UserError(f"the bundle record ({META_FILE}) in {image} gives shm_size {meta['shm_size']!r}, not a "
                            "size like 8g or 512m; pass --shm-size (the size it was made with)")
        return str(meta["shm_size"])
    from buildtool.launch.multinode import cell_for_image

    if image.startswith("/"):
        raise UserError(f"{image} is a file, not a registry image: the matrix has no run profile for it; "
                        "pass --shm-size")
    loaded = find_project(matrix).load()
    cell = cell_for_image(loaded, image)
    if cell is None:
        raise UserError(f"{image} is no image of the matrix ({', '.join(loaded.image_names)}), so it has no run "
                        "profile to take /dev/shm from; pass --shm-size")
    return cell.run.shm_size


def _matrix_cell(loaded: Matrix | None, image: str, given: str | None) -> Cell | None:
    """IMAGE's cell of the matrix: None without a matrix, for a file, or for an image the matrix does not know. A
    matrix image whose tag names no cell is refused (never its default cell's) unless the option the cell would
    answer is GIVEN, as --shm-size does for its /dev/shm."""
    from buildtool.launch.multinode import cell_for_image

    if loaded is None or image.startswith("/"):
        return None
    try:
        return cell_for_image(loaded, image)
    except UserError:
        if given is None:
            raise
        return None


def platform_for(image: str, platform: str | None, matrix: Path | None) -> contracts_platforms.Platform:
    """The platform to launch IMAGE on: --platform, else its matrix cell's only one (launch.arch)."""
    from buildtool.launch.arch import choose_platform, image_platforms

    project = project_or_none(matrix)    # outside a checkout: nothing knows the image's platforms
    loaded = project.load() if project is not None and not image.startswith("/") else None
    cell = _matrix_cell(loaded, image, platform)
    return choose_platform(image, platform, cell, None if platform else image_platforms(image))


def framework_for(image: str, framework: str | None, matrix: Path | None) -> Framework:
    """The framework whose multi-node check runs in IMAGE: its matrix cell's, else --framework; never a default."""
    from buildtool.contracts import frameworks

    # Outside a checkout only with --framework (this checkout's framework table).
    project = find_project(matrix) if framework is None else project_or_none(matrix)
    # Loading the matrix also makes its image-tests folders the framework table.
    cell = _matrix_cell(project.load() if project is not None else None, image, framework)
    if cell is not None:
        if framework is not None and framework != cell.framework:
            raise UserError(f"--framework {framework}, but {image} is an image of {cell.framework} (the matrix cell "
                            f"{cell.key}); leave --framework out")
        name = cell.framework
    elif framework is None:
        what = "a file, not a registry image" if image.startswith("/") else "no image of the matrix"
        raise UserError(f"{image} is {what}, so its framework is unknown; pass --framework NAME "
                        f"({', '.join(frameworks.names())}) to say whose multi-node check runs in it")
    else:
        name = framework
    try:
        return frameworks.get(name)
    except KeyError:
        raise UserError(f"--framework {name!r} is no framework; one of {', '.join(frameworks.names())} (a framework "
                        "is a folder image-tests/<name>/ with its framework.yaml)") from None
