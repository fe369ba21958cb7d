"""`buildtool slurm IMAGE`: an sbatch script that runs the multi-node check of the image's framework."""

from __future__ import annotations

import re
from typing import Annotated

import typer

from buildtool.cli.launch_options import (
    CheckFrameworkOption,
    FabricNicsOption,
    FabricRateOption,
    JoinTimeoutOption,
    MaxRestartsOption,
    NcclDebugOption,
    NcclEnvOption,
    NcclHcaOption,
    NcclIfnameOption,
    OutFileOption,
    RdzvPortOption,
    RequireGdrOption,
    StepsOption,
    framework_for,
    nccl_settings,
    shm_for,
    write_or_print,
)
from buildtool.cli.options import MatrixOption
from buildtool.common.errors import UserError
from buildtool.contracts.arguments import check_arguments
from buildtool.contracts.rendezvous import JOIN_TIMEOUT_S, MAX_RESTARTS, RDZV_PORT

ImageArgument = Annotated[str, typer.Argument(help="The image to check (registry reference, or a .sif file).")]
NodesOption = Annotated[int, typer.Option(help="Nodes taking part.")]
GpusPerNodeOption = Annotated[int, typer.Option(help="GPUs per node; 0 runs one CPU process with gloo.")]
RuntimeOption = Annotated[str, typer.Option(help="apptainer, pyxis (enroot) or oci (SLURM's own containers: "
                                                 "IMAGE is the bundle folder made by `buildtool bundle`).")]
NameOption = Annotated[str, typer.Option(help="Job name.")]
PartitionOption = Annotated[str, typer.Option(help="SLURM partition.")]
AccountOption = Annotated[str, typer.Option(help="SLURM account.")]
ConstraintOption = Annotated[str, typer.Option(
    help="Node features the job needs (sbatch --constraint), e.g. the site's feature of its Grace Hopper "
         "nodes for an arm64 image.")]
TimeOption = Annotated[str, typer.Option("--time", help="Wall-clock limit.")]
CpusPerTaskOption = Annotated[int | None, typer.Option(
    help="CPUs of the one task per node, which runs all its ranks (default: 4 per GPU, 1 for a CPU job; "
         "0: the partition's default).")]
ShmSizeOption = Annotated[str | None, typer.Option(help="/dev/shm size required on every node "
                                                        "(default: the cell's run profile).")]
ScriptsDirOption = Annotated[str, typer.Option(
    help="Where image-tests/<framework>/scripts (the framework's check) is on the cluster "
         "(default: in the submit folder).")]


def slurm(
    image: ImageArgument,
    nodes: NodesOption = 2,
    gpus_per_node: GpusPerNodeOption = 8,
    runtime: RuntimeOption = "apptainer",
    name: NameOption = "ddp-check",
    partition: PartitionOption = "",
    account: AccountOption = "",
    constraint: ConstraintOption = "",
    time_limit: TimeOption = "01:00:00",
    cpus_per_task: CpusPerTaskOption = None,
    shm_size: ShmSizeOption = None,
    join_timeout: JoinTimeoutOption = JOIN_TIMEOUT_S,
    rdzv_port: RdzvPortOption = RDZV_PORT,
    max_restarts: MaxRestartsOption = MAX_RESTARTS,
    scripts_dir: ScriptsDirOption = "",
    steps: StepsOption = 40,
    nccl_debug: NcclDebugOption = "",
    nccl_socket_ifname: NcclIfnameOption = "",
    nccl_ib_hca: NcclHcaOption = "",
    nccl_env: NcclEnvOption = None,
    fabric_rate: FabricRateOption = "",
    fabric_nics: FabricNicsOption = 0,
    require_gdr: RequireGdrOption = False,
    framework: CheckFrameworkOption = None,
    out_file: OutFileOption = None,
    matrix: MatrixOption = None,
) -> None:
    """An sbatch script that runs the multi-node check of the image's framework under srun."""
    check_arguments("slurm", locals())   # every argument first (issue 37)
    from buildtool.launch.multinode import MultiNodeJob, check_of
    from buildtool.launch.slurm import SlurmOptions, check_image, sbatch_script

    check_image(image, runtime)
    shm = shm_for(image, shm_size, matrix, runtime)   # given, else the bundle's (--runtime oci) or the cell's
    if not re.fullmatch(r"[0-9]+[kmgKMG]?", shm):   # as sbatch can say it
        raise UserError(f"--shm-size {shm!r} must be a size like 8g or 512m")
    check = check_of(framework_for(image, framework, matrix))
    job = MultiNodeJob(image=image, nodes=nodes, gpus_per_node=gpus_per_node, check=check, name=name,
                       shm_size=shm, join_timeout_s=join_timeout, max_restarts=max_restarts, rdzv_port=rdzv_port,
                       steps=steps, nccl=nccl_settings(nccl_debug, nccl_socket_ifname, nccl_ib_hca, nccl_env),
                       fabric_rate=fabric_rate, fabric_nics=fabric_nics, require_gdr=require_gdr)
    opts = SlurmOptions(runtime=runtime, partition=partition, account=account, time_limit=time_limit,
                        cpus_per_task=cpus_per_task, scripts_dir=scripts_dir, constraint=constraint)
    write_or_print(sbatch_script(job, opts), out_file)
    if out_file is not None:
        out_file.chmod(0o755)
