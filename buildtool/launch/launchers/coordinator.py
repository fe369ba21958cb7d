"""`coordinator`: one process per node, using all its GPUs, told the coordinator (the first node,
process 0's), the number of processes and its own process id, as JAX's `jax.distributed` wants it:
`python3 SCRIPT --coordinator HOST:PORT --num-processes N --process-id I --steps S --init-timeout SECONDS`.
I is PROCESS_ID, resolved by the verifier on the node: JOB_COMPLETION_INDEX on Kubernetes (an indexed
Job), the place of the container's hostname in DDP_NODES on SLURM (docs/multinode.md says why not
SLURM_PROCID). Its steps and timeout are on its command line.

Kubernetes: the indexed Job only (Kubeflow's PyTorchJob runs torchrun).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from buildtool.launch.launchers import PROCESS_ID, Launcher

if TYPE_CHECKING:
    from buildtool.launch.multinode import MultiNodeJob


class Coordinator(Launcher):
    name = "coordinator"
    processes = "one process per node"
    first_node_hosts = "coordinator (process 0)"
    k8s_variants = ("job",)

    def procs_per_node(self, gpus_per_node: int) -> int:
        return 1

    def node_command(self, job: MultiNodeJob, endpoint: str, rdzv_id: str, script: str) -> list[str]:
        return ["python3", script, "--coordinator", endpoint, "--num-processes", str(job.nodes),
                "--process-id", PROCESS_ID, "--steps", str(job.steps), "--init-timeout", str(job.join_timeout_s)]


LAUNCHER = Coordinator()
