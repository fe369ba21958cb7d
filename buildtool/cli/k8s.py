"""`buildtool k8s IMAGE`: manifests that run the multi-node check of the image's framework on Kubernetes."""

from __future__ import annotations

from pathlib import Path
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
    platform_for,
    shm_for,
    write_or_print,
)
from buildtool.cli.options import MatrixOption
from buildtool.common.errors import UserError
from buildtool.contracts.arguments import check_arguments
from buildtool.contracts.rendezvous import (
    ACTIVE_DEADLINE_S,
    BACKOFF_LIMIT,
    GPU_RESOURCE,
    JOIN_TIMEOUT_S,
    MAX_RESTARTS,
    RDZV_PORT,
)

ImageArgument = Annotated[str, typer.Argument(help="The image to check (a dev or release reference).")]
NodesOption = Annotated[int, typer.Option(help="Pods (nodes) taking part.")]
GpusPerNodeOption = Annotated[int, typer.Option(help="GPUs per pod; 0 runs one CPU process with gloo.")]
VariantOption = Annotated[str, typer.Option(help="pytorchjob (Kubeflow training operator; torchrun checks; its "
                                                 "status is the Master's alone, which runs rank 0) or job (indexed "
                                                 "Job + headless Service: every pod must pass). Default: pytorchjob "
                                                 "for a torchrun check, job for a coordinator check.")]
NameOption = Annotated[str, typer.Option(help="Name of the job and its objects.")]
NamespaceOption = Annotated[str, typer.Option(help="Namespace (default: the kubectl context's).")]
ShmSizeOption = Annotated[str | None, typer.Option(help="/dev/shm size (default: the cell's run profile).")]
BackoffLimitOption = Annotated[int, typer.Option(
    help="Failed pods retried before the job counts as failed (backoffLimit).")]
CpuOption = Annotated[str, typer.Option(help="CPU request per pod, e.g. 16.")]
MemoryOption = Annotated[str, typer.Option(help="Memory request and limit per pod (include /dev/shm).")]
NodeSelectorOption = Annotated[list[str] | None, typer.Option(help="KEY=VALUE, repeatable.")]
TolerationOption = Annotated[list[str] | None, typer.Option(help="KEY[=VALUE]:EFFECT, repeatable "
                                                                 "(e.g. nvidia.com/gpu:NoSchedule).")]
GpuResourceOption = Annotated[str, typer.Option(help="Extended resource name of a GPU.")]
DeadlineOption = Annotated[int, typer.Option(help="activeDeadlineSeconds of the job.")]
RdmaResourceOption = Annotated[list[str] | None, typer.Option(
    help="An RDMA device resource for each GPU pod, NAME[=COUNT] (repeatable; e.g. rdma/rdma_shared_device_a).")]
EfaResourceOption = Annotated[str | None, typer.Option(
    help="The EFA device resource of each GPU pod, NAME=COUNT (e.g. vpc.amazonaws.com/efa=32): asks for AWS EFA "
         "(NCCL through aws-ofi-nccl) and says how many EFA devices a node has.")]
IpcLockOption = Annotated[bool, typer.Option(help="Add the IPC_LOCK capability to GPU pods (NCCL and RDMA pin "
                                                  "memory).")]
PlatformOption = Annotated[str | None, typer.Option(
    help="The platform the pods run (os/arch, e.g. linux/arm64): its nodes by the kubernetes.io/arch and "
         "kubernetes.io/os labels. Default: the cell's only platform; a multi-platform cell's must be named.")]


def k8s(
    image: ImageArgument,
    nodes: NodesOption = 2,
    gpus_per_node: GpusPerNodeOption = 8,
    variant: VariantOption = "",
    name: NameOption = "ddp-check",
    namespace: NamespaceOption = "",
    shm_size: ShmSizeOption = None,
    join_timeout: JoinTimeoutOption = JOIN_TIMEOUT_S,
    rdzv_port: RdzvPortOption = RDZV_PORT,
    backoff_limit: BackoffLimitOption = BACKOFF_LIMIT,
    max_restarts: MaxRestartsOption = MAX_RESTARTS,
    cpu: CpuOption = "",
    memory: MemoryOption = "",
    node_selector: NodeSelectorOption = None,
    toleration: TolerationOption = None,
    gpu_resource: GpuResourceOption = GPU_RESOURCE,
    deadline: DeadlineOption = ACTIVE_DEADLINE_S,
    steps: StepsOption = 40,
    rdma_resource: RdmaResourceOption = None,
    efa_resource: EfaResourceOption = None,
    ipc_lock: IpcLockOption = True,
    nccl_debug: NcclDebugOption = "",
    nccl_socket_ifname: NcclIfnameOption = "",
    nccl_ib_hca: NcclHcaOption = "",
    nccl_env: NcclEnvOption = None,
    fabric_rate: FabricRateOption = "",
    fabric_nics: FabricNicsOption = 0,
    require_gdr: RequireGdrOption = False,
    framework: CheckFrameworkOption = None,
    platform: PlatformOption = None,
    out_file: OutFileOption = None,
    matrix: MatrixOption = None,
) -> None:
    """Manifests that run the multi-node check of the image's framework on Kubernetes."""
    check_arguments("k8s", locals())   # every argument first (issue 37)
    from buildtool.common.argcheck import node_selectors
    from buildtool.launch.arch import node_selector as arch_selector
    from buildtool.launch.k8s import PodOptions, default_variant, manifests, to_yaml
    from buildtool.launch.multinode import MultiNodeJob, check_of, read_check_script

    shm = _shm_size(image, shm_size, matrix)
    row = framework_for(image, framework, matrix)
    chosen = platform_for(image, platform, matrix)
    efa = PodOptions.parse_rdma([efa_resource], "--efa-resource") if efa_resource else ()
    job = MultiNodeJob(image=image, nodes=nodes, gpus_per_node=gpus_per_node, check=check_of(row), name=name,
                       shm_size=shm, join_timeout_s=join_timeout, max_restarts=max_restarts,
                       backoff_limit=backoff_limit, rdzv_port=rdzv_port, steps=steps,
                       nccl=nccl_settings(nccl_debug, nccl_socket_ifname, nccl_ib_hca, nccl_env),
                       rdma=bool(rdma_resource), efa_devices=efa[0][1] if efa else 0, fabric_rate=fabric_rate,
                       fabric_nics=fabric_nics, require_gdr=require_gdr)
    opts = PodOptions(namespace=namespace, cpu=cpu, memory=memory, gpu_resource=gpu_resource,
                      node_selector=arch_selector(chosen, node_selectors("--node-selector", node_selector or [])),
                      active_deadline_s=deadline,
                      tolerations=PodOptions.parse_tolerations(toleration or []), ipc_lock=ipc_lock,
                      rdma_resources=PodOptions.parse_rdma(rdma_resource or []) + efa)
    docs = manifests(job, opts, read_check_script(row), variant or default_variant(job))
    write_or_print(to_yaml(docs), out_file)


def _shm_size(image: str, shm_size: str | None, matrix: Path | None) -> str:
    """--shm-size, else the cell's run profile's, as a Kubernetes quantity can say it."""
    from buildtool.launch.multinode import k8s_quantity

    shm = shm_for(image, shm_size, matrix)
    try:
        k8s_quantity(shm)
    except ValueError as exc:   # SizeError: the one size grammar's message names the text
        raise UserError(f"--shm-size: {exc}") from None
    return shm
