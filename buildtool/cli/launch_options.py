"""Options the launch commands (k8s, slurm, bundle, scaling) share, declared once, and the checks that
turn them into settings.

Only options that are the same everywhere they appear live here (flag, type, help): an option whose
help says something particular to one command (`--nodes` is pods for k8s, nodes for slurm, a comma
list for scaling) is declared beside that command. A leaf of the CLI, like buildtool.cli.options.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildtool.cli.console import out
from buildtool.common.errors import UserError

if TYPE_CHECKING:
    from buildtool.launch.multinode import NcclSettings

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
OutFileOption = Annotated[Path | None, typer.Option("--out", help="Write here instead of stdout.")]


def write_or_print(text: str, target: Path | None) -> None:
    """TEXT to the --out file (saying so), or to stdout without one."""
    if target is None:
        sys.stdout.write(text)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    out.print(f"wrote {target}")


def nccl_settings(debug: str, ifname: str, hca: str, env: list[str] | None) -> NcclSettings:
    """The --nccl-* options as the job's NCCL settings (a bad --nccl-env is refused here)."""
    from buildtool.launch.multinode import NcclSettings

    return NcclSettings(debug=debug, socket_ifname=ifname, ib_hca=hca, extra=NcclSettings.parse_env(env or []))


def check_steps(steps: int) -> None:
    if steps < 3:
        raise UserError(f"--steps must be at least 3 (the check compares the first and last three), not {steps}")
