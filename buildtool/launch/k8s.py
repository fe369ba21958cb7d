"""Kubernetes manifests for the multi-node check of the image's framework (launch/multinode.py).

Two shapes (VARIANTS): a Kubeflow PyTorchJob (the training operator runs torchrun) and an indexed Job
behind a headless Service (pod `<job>-0.<service>` hosts the rendezvous or the coordinator; each pod's
process id is its JOB_COMPLETION_INDEX, resolved by the verifier). Which of them a check runs in, and
which is its default, is its launcher's to say (launch/launchers/: `k8s_variants`). Both mount the
check's scripts (the framework's script and the verifier) from a ConfigMap (the image under test is
never changed), give /dev/shm a memory-backed emptyDir sized from the cell's run profile (the container
default is 64 MB, far too small for DataLoader workers and NCCL), wait long for late nodes (the join
timeout), and bound restarts. GPU pods get NCCL's settings (NCCL_DEBUG=INFO on INIT,NET unless told; the interface
and HCAs only when named), IPC_LOCK (NCCL and RDMA pin memory), RDMA device resources when asked
(--rdma-resource), and GKE's driver folder on LD_LIBRARY_PATH.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from buildtool.common import argcheck, yamlout
from buildtool.common.errors import UserError
from buildtool.common.sizes import parse_size
from buildtool.contracts.frameworks import MultiNodeCheck
from buildtool.contracts.rendezvous import ACTIVE_DEADLINE_S, GPU_RESOURCE
from buildtool.launch.multinode import (
    LIBRARY_PATH_ENV,
    MOUNT_DIR,
    RDZV_HOST_ENV,
    VERIFY_FILES,
    MultiNodeJob,
    k8s_quantity,
)

# The Kubernetes shapes, and what each runs (a refusal quotes it).
VARIANTS = {"pytorchjob": "runs torchrun under Kubeflow's training operator",
            "job": "runs the check's command in an indexed Job behind a headless Service"}
LABEL_APP = "app.kubernetes.io/name"
LABEL_PART = "app.kubernetes.io/part-of"
# GKE's NVIDIA driver installer mounts the driver's libraries here; CUDA images do not look there by themselves.
GKE_DRIVER_LIBS = "/usr/local/nvidia/lib64"
MAX_CONFIGMAP_BYTES = 1 << 20    # the API server's limit on a ConfigMap's data (core.MaxSecretSize)
# An extended resource: `<DNS subdomain>/<name>` (Kubernetes' qualified name), outside kubernetes.io.
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_RESOURCE = re.compile(rf"(?P<prefix>{_DNS_SUBDOMAIN})/(?P<name>[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?)")


# A Kubernetes quantity as --memory takes it (contracts.arguments QUANTITY): a number and a decimal or binary suffix.
_QUANTITY = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<suffix>m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_SUFFIX = {"": 1, "m": 1e-3, **{s: 1000 ** (i + 1) for i, s in enumerate("kMGTPE")},
           **{f"{s}i": 1024 ** (i + 1) for i, s in enumerate("KMGTPE")}}


def check_memory(job: MultiNodeJob, opts: PodOptions) -> None:
    """UserError unless the pod's memory limit (--memory) is above its /dev/shm: a memory-backed emptyDir holds at
    most the pod's memory limit (the API's EmptyDirVolumeSource.sizeLimit), so a smaller limit gave the check less
    /dev/shm than the run profile asks, with nothing left for the processes."""
    if not opts.memory:
        return
    match = _QUANTITY.fullmatch(opts.memory)
    if match is None:
        raise UserError(f"--memory {opts.memory!r} is not a Kubernetes quantity (e.g. 64Gi)")
    limit = float(match["number"]) * _SUFFIX[match["suffix"] or ""]
    shm = k8s_quantity(job.shm_size)
    if limit <= parse_size(job.shm_size).bytes:
        raise UserError(f"--memory {opts.memory} is not above the pod's /dev/shm of {shm} (--shm-size, else the cell's "
                        f"run profile): the memory limit caps the memory-backed /dev/shm and the processes need "
                        f"memory beside it; give --memory above {shm}, or a smaller --shm-size")


def check_resource_name(option: str, name: str) -> str:
    """NAME if it is an extended resource name (e.g. rdma/rdma_shared_device_a); UserError naming it."""
    match = _RESOURCE.fullmatch(name)
    if not match or len(match["prefix"]) > 253:
        raise UserError(f"{option} {name!r} is not a resource name like vendor.example/device (a DNS prefix, a "
                        "slash, a name of letters, digits, -, _ or .)")
    if match["prefix"] == "kubernetes.io" or match["prefix"].endswith(".kubernetes.io"):
        raise UserError(f"{option} {name!r}: kubernetes.io names no extended resource")
    return name


@dataclass(frozen=True)
class PodOptions:
    """Scheduling and resources, all optional; GPUs come from the job."""

    namespace: str = ""
    cpu: str = ""
    memory: str = ""
    node_selector: dict[str, str] = field(default_factory=dict)   # with the platform's (launch.arch.node_selector)
    tolerations: tuple[dict[str, str], ...] = ()
    gpu_resource: str = GPU_RESOURCE
    active_deadline_s: int = ACTIVE_DEADLINE_S
    # e.g. (("rdma/rdma_shared_device_a", 1),) or (("vpc.amazonaws.com/efa", 32),): GPU pods only
    rdma_resources: tuple[tuple[str, int], ...] = ()
    ipc_lock: bool = True          # GPU pods: IPC_LOCK, so NCCL/RDMA can pin memory

    def __post_init__(self) -> None:
        # A GPU is an extended resource as an RDMA device is: `gpu` or `cpu` made a limit the API server refuses, or
        # 8 CPUs for a job that asked for GPUs.
        check_resource_name("--gpu-resource", self.gpu_resource)
        # One limit per name: a second one replaced the first (the GPUs' 8 by an RDMA count of 1).
        seen = {self.gpu_resource: "--gpu-resource"}
        for name, _ in self.rdma_resources:
            if name in seen:
                raise UserError(f"--rdma-resource {name} is named twice (also by {seen[name]}): a pod has one limit "
                                "per resource; name it once")
            seen[name] = "--rdma-resource"

    @staticmethod
    def parse_rdma(items: list[str], option: str = "--rdma-resource") -> tuple[tuple[str, int], ...]:
        """`NAME[=COUNT]` (e.g. rdma/rdma_shared_device_a, rdma/ib=2, vpc.amazonaws.com/efa=32) -> (name, count)
        pairs: RDMA or EFA device resources of a GPU pod."""
        out = []
        for item in items:
            name, sep, count = item.partition("=")
            check_resource_name(option, name)
            if sep and not (count.isdigit() and int(count) > 0):
                raise UserError(f"{option} {item!r}: COUNT must be a positive whole number")
            out.append((name, int(count) if sep else 1))
        return tuple(out)

    @staticmethod
    def parse_tolerations(items: list[str]) -> tuple[dict[str, str], ...]:
        """`KEY[=VALUE]:EFFECT` (e.g. nvidia.com/gpu:NoSchedule) -> Kubernetes tolerations."""
        effects = ("NoSchedule", "PreferNoSchedule", "NoExecute")
        out = []
        for item in items:
            key_value, sep, effect = item.rpartition(":")
            if not sep or not key_value or effect not in effects:
                raise UserError(f"--toleration {item!r} is not KEY[=VALUE]:EFFECT, EFFECT one of {', '.join(effects)}")
            key, eq, value = key_value.partition("=")
            # Kubernetes refuses these only when the manifest is applied: a key is a label key (an empty one
            # tolerates every taint, and only with Exists, which this form cannot say), a value a label value.
            argcheck.label_key("--toleration", key)
            argcheck.label_value("--toleration", value)
            out.append({"key": key, "operator": "Equal", "value": value, "effect": effect} if eq
                       else {"key": key, "operator": "Exists", "effect": effect})
        return tuple(out)


def _object(job: MultiNodeJob, opts: PodOptions, api_version: str, kind: str, name: str = "") -> dict[str, Any]:
    """An object's apiVersion, kind and metadata: NAME (default: the job's), the job's labels, the namespace."""
    meta: dict[str, Any] = {"name": name or job.name, "labels": {LABEL_APP: job.name, LABEL_PART: "dl-images"}}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


def _check(job: MultiNodeJob) -> MultiNodeCheck:
    if job.check is None:
        raise ValueError("Kubernetes manifests need a job with a framework's check")
    return job.check


def config_map(job: MultiNodeJob, opts: PodOptions, source: str) -> dict[str, Any]:
    """The framework's check script (SOURCE), the verifier and the contracts it imports (VERIFY_FILES)."""
    script = _check(job).script
    data = {script: source, **VERIFY_FILES}
    size = sum(len(value.encode()) for value in data.values())    # what the API server sums (not the keys)
    if size > MAX_CONFIGMAP_BYTES:
        raise UserError(f"the Kubernetes ConfigMap with {script} and the verifier's files would hold {size} bytes, "
                        f"over the {MAX_CONFIGMAP_BYTES} Kubernetes allows; make {script} smaller")
    return {**_object(job, opts, "v1", "ConfigMap", f"{job.name}-scripts"), "data": data}


def _container(job: MultiNodeJob, opts: PodOptions, name: str, command: list[str], port_name: str,
               extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    env = {**job.env, **(extra_env or {})}
    if job.gpus_per_node:
        limits[opts.gpu_resource] = job.gpus_per_node
        limits.update(opts.rdma_resources)
        # Appended by the verifier after the image's own LD_LIBRARY_PATH (a pod's env cannot extend the image's).
        env[LIBRARY_PATH_ENV] = GKE_DRIVER_LIBS
    elif opts.rdma_resources:
        raise UserError("--rdma-resource is for GPU jobs (NCCL over RDMA); --gpus-per-node is 0")
    if opts.cpu:
        requests["cpu"] = opts.cpu
    if opts.memory:
        # The memory-backed /dev/shm counts against this limit: size it above shm_size.
        requests["memory"] = limits["memory"] = opts.memory
    container: dict[str, Any] = {
        "name": name,
        "image": job.image,
        # A tag may have moved (a cell's {version} and latest follow its newest release) since a node pulled it: it
        # is resolved at every start; a digest names one image, which a node's cache holds as it is.
        "imagePullPolicy": "IfNotPresent" if argcheck.reference("IMAGE", job.image).digest else "Always",
        # `args`, never `command`: the image's ENTRYPOINT runs first, with the check as its arguments, as it does
        # under validate. NGC's entrypoint sets up CUDA's forward-compatibility libraries (the older drivers
        # contracts.driver_rules admits need them); `command` would replace it (issue 39).
        "args": command,
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "ports": [{"name": port_name, "containerPort": job.rdzv_port, "protocol": "TCP"}],
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "scripts", "mountPath": MOUNT_DIR, "readOnly": True}],
    }
    if limits or requests:
        container["resources"] = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
    if job.gpus_per_node and opts.ipc_lock:
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    return container


def _pod_spec(job: MultiNodeJob, opts: PodOptions, container: dict[str, Any], restart: str) -> dict[str, Any]:
    optional = (("nodeSelector", dict(sorted(opts.node_selector.items()))),
                ("tolerations", [dict(t) for t in opts.tolerations]))
    return {
        "restartPolicy": restart,
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": k8s_quantity(job.shm_size)}},
            {"name": "scripts", "configMap": {"name": f"{job.name}-scripts"}},
        ],
        **{key: value for key, value in optional if value},
    }


def pytorch_job(job: MultiNodeJob, opts: PodOptions) -> dict[str, Any]:
    """A kubeflow.org/v1 PyTorchJob: one Master and nodes-1 Workers.

    The operator sets MASTER_ADDR and MASTER_PORT (from the port named `pytorchjob-port`) and RANK (the Master 0,
    Worker i i+1) in every pod, and marks the job Succeeded once the Master succeeds (its UpdateJobStatus; a
    Worker restarts in place). So the Master must run global rank 0 and judge its result: torchrun's static
    rendezvous with node rank RANK (the launcher's ranked_command), the store on the Master on the rendezvous port.
    """
    command = job.command("$(MASTER_ADDR):$(MASTER_PORT)", job.name, ranked=True)
    # The operator requires the container to be called `pytorch`.
    container = _container(job, opts, "pytorch", command, "pytorchjob-port")
    # The replica's restartPolicy is what the operator applies; the pod's says the same.
    template = {"metadata": {"labels": {LABEL_APP: job.name}}, "spec": _pod_spec(job, opts, container, "OnFailure")}
    replicas = {role: {"replicas": count, "restartPolicy": "OnFailure", "template": template}
                for role, count in (("Master", 1), ("Worker", job.nodes - 1)) if count}
    return {
        **_object(job, opts, "kubeflow.org/v1", "PyTorchJob"),
        "spec": {
            "runPolicy": {"backoffLimit": job.backoff_limit, "cleanPodPolicy": "None",
                          "activeDeadlineSeconds": opts.active_deadline_s},
            "pytorchReplicaSpecs": replicas,
        },
    }


def headless_service(job: MultiNodeJob, opts: PodOptions) -> dict[str, Any]:
    return {
        **_object(job, opts, "v1", "Service"),
        "spec": {
            "clusterIP": "None",
            # Pods must resolve each other before they are ready: the rendezvous is how they get ready.
            "publishNotReadyAddresses": True,
            "selector": {LABEL_APP: job.name},
            "ports": [{"name": "rdzv", "port": job.rdzv_port, "targetPort": job.rdzv_port, "protocol": "TCP"}],
        },
    }


def indexed_job(job: MultiNodeJob, opts: PodOptions) -> dict[str, Any]:
    """A batch/v1 indexed Job: pod `<name>-0` (DNS `<name>-0.<name>`) hosts the c10d store or the
    coordinator; a pod's JOB_COMPLETION_INDEX is its process id, and says whether it hosts the store
    (index 0; not its hostname matched through DNS, whose record may not be there yet). Every pod waits,
    up to the join timeout, for `<name>-0.<name>` to resolve before it starts."""
    host = f"{job.name}-0.{job.name}"
    endpoint = f"{host}:{job.rdzv_port}"
    container = _container(job, opts, "ddp-check", job.command(endpoint, job.name), "rdzv",
                           {RDZV_HOST_ENV: host, "DDP_RESOLVE_TIMEOUT_S": str(job.join_timeout_s)})
    spec = _pod_spec(job, opts, container, "Never")
    spec["subdomain"] = job.name
    return {
        **_object(job, opts, "batch/v1", "Job"),
        "spec": {
            "completionMode": "Indexed",
            "completions": job.nodes,
            "parallelism": job.nodes,
            "backoffLimit": job.backoff_limit,
            "activeDeadlineSeconds": opts.active_deadline_s,
            "template": {"metadata": {"labels": {LABEL_APP: job.name}}, "spec": spec},
        },
    }


def default_variant(job: MultiNodeJob) -> str:
    """The first shape the check's launcher runs in: pytorchjob for a torchrun check, job for a coordinator one."""
    return job.launcher.k8s_variants[0]


def check_names(job: MultiNodeJob, variant: str) -> None:
    """UserError unless the cluster takes the names the job's objects make of --name: the indexed Job's Service
    and a PyTorchJob (the training operator's webhook) are DNS-1035 labels (a letter first), and so is each name
    made from it, which must stay within 63 characters: pod hostname `<name>-<index>` (the Job controller's),
    Service `<name>-worker-<index>` (the operator's). A longer one is refused only once the pods are made."""
    if not job.name[:1].isalpha():
        what = "the Service's" if variant == "job" else "a PyTorchJob's"
        raise UserError(f"--name {job.name!r}: {what} name must start with a letter (a DNS-1035 label); "
                        "name the job e.g. ddp-check")
    made = (f"{job.name}-{job.nodes - 1}" if variant == "job"
            else f"{job.name}-{'worker' if job.nodes > 1 else 'master'}-{max(job.nodes - 2, 0)}")
    if len(made) > 63:
        what = "pod hostname" if variant == "job" else "pod and Service"
        raise UserError(f"--name {job.name!r} is too long for {job.nodes} node(s): the {what} {made!r} is "
                        f"{len(made)} characters, and Kubernetes takes at most 63; use a name of at most "
                        f"{len(job.name) - (len(made) - 63)} characters")


def manifests(job: MultiNodeJob, opts: PodOptions, source: str, variant: str) -> list[dict[str, Any]]:
    """The objects to apply; SOURCE is the framework's check script."""
    if variant not in VARIANTS:
        raise UserError(f"--variant must be one of {', '.join(VARIANTS)}, not {variant!r}")
    check = _check(job)
    launcher = job.launcher
    if variant not in launcher.k8s_variants:
        raise UserError(f"--variant {variant} {VARIANTS[variant]}, and {check.framework}'s multi-node check is a "
                        f"{check.launcher} check ({check.script}, {launcher.processes}): use --variant "
                        f"{' or '.join(launcher.k8s_variants)}")
    check_names(job, variant)
    check_memory(job, opts)
    docs = [config_map(job, opts, source)]
    if variant == "pytorchjob":
        docs.append(pytorch_job(job, opts))
    else:
        docs += [headless_service(job, opts), indexed_job(job, opts)]
    return docs


def to_yaml(docs: list[dict[str, Any]]) -> str:
    header = "# Generated by `buildtool k8s`: the multi-node DDP check of dl-images.\n"
    return header + yamlout.dump_all(docs)
