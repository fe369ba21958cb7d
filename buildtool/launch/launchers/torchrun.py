"""`torchrun`: one torchrun per node, the same command on every node; c10d's rendezvous on the first
node assigns the ranks. `--nproc-per-node` is the node's GPUs (1 on CPU). The c10d store's read
timeout follows the join timeout (contracts.rendezvous.rdzv_conf); the verifier tells each node
whether it hosts the store (IS_HOST, from its index: torch would match its hostname through DNS) and
gives its agent this node's address (LOCAL_ADDR; torch's default, the node's name, may not resolve
in the containers). The script reads its steps and timeout from DDP_STEPS and DDP_TIMEOUT_S.

Kubernetes: Kubeflow's PyTorchJob (the training operator runs torchrun) by default, or the indexed Job. The
operator reports the Master's outcome alone (Succeeded once the Master exits 0; Workers restart in place), so
there the Master must run global rank 0 and judge its result: `ranked_command`, torchrun's static rendezvous with
the node rank the operator gives each pod (RANK: the Master 0). c10d's rendezvous ignores --node-rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from buildtool.contracts.rendezvous import rdzv_conf
from buildtool.launch.launchers import IS_HOST, LOCAL_ADDR, NODE_RANK, Launcher

if TYPE_CHECKING:
    from buildtool.launch.multinode import MultiNodeJob


class Torchrun(Launcher):
    name = "torchrun"
    processes = "torchrun's processes per node, ranked by c10d"
    first_node_hosts = "c10d rendezvous"
    k8s_variants = ("pytorchjob", "job")

    def procs_per_node(self, gpus_per_node: int) -> int:
        return gpus_per_node or 1

    def node_command(self, job: MultiNodeJob, endpoint: str, rdzv_id: str, script: str) -> list[str]:
        """torchrun running SCRIPT, the same on every node (c10d assigns ranks). The rendezvous configuration
        ends `,is_host={is_host}` and LOCAL_ADDR follows it, which the verifier resolves on the node."""
        return [
            "torchrun", f"--nnodes={job.nodes}", f"--nproc-per-node={job.procs_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
            f"--rdzv-conf={rdzv_conf(job.join_timeout_s)},is_host={IS_HOST}", LOCAL_ADDR,
            f"--max-restarts={job.max_restarts}", script,
        ]

    def ranked_command(self, job: MultiNodeJob, endpoint: str, rdzv_id: str, script: str) -> list[str]:
        """torchrun running SCRIPT with the static rendezvous: NODE_RANK (resolved by the verifier from RANK) is
        this node's group rank, node 0's agent hosts the store at ENDPOINT, and torch's agent gives each node the
        global ranks after those of the nodes ranked before it, so node 0 runs ranks 0 to G-1. The store's
        timeout (its connect and reads) is the join timeout."""
        return [
            "torchrun", f"--nnodes={job.nodes}", f"--nproc-per-node={job.procs_per_node}",
            "--rdzv-backend=static", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
            f"--rdzv-conf=timeout={int(job.join_timeout_s)}", NODE_RANK,
            f"--max-restarts={job.max_restarts}", script,
        ]

    def env(self, job: MultiNodeJob) -> dict[str, str]:
        # The process group may wait as long as the rendezvous did for the slowest node.
        return {"DDP_STEPS": str(job.steps), "DDP_TIMEOUT_S": str(job.join_timeout_s)}


LAUNCHER = Torchrun()
