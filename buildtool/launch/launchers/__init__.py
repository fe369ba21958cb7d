"""Launchers: how a framework's multi-node check starts on every node (its framework.yaml's
`multinode.launcher`).

A launcher kind is one module here, named after it, whose `LAUNCHER` is a `Launcher`, and one entry of
buildtool/contracts/frameworks.py's LAUNCHERS (its name and what it runs), the one registration: the
table a framework's row is checked against when it loads (contracts come before launch and cannot
import it), and the one `get` finds the module by. Nothing else names a launcher: the multi-node job
(launch/multinode.py), the Kubernetes manifests (launch/k8s.py) and the sbatch script (launch/slurm.py)
ask the launcher. tests/test_launchers.py keeps the table and the modules in step.

What a node command may carry for the verifier (launch/verify_ddp.py) to resolve on the
node itself, inside the container: PROCESS_ID (this node's process id), IS_HOST (whether this node hosts
the rendezvous store), LOCAL_ADDR (this node's address) and NODE_RANK (the rank a scheduler gave the node:
Kubeflow's training operator's RANK). The generators read them off the command and give the verifier what it
needs to resolve them (JOB_COMPLETION_INDEX on Kubernetes, which is why a launcher whose command needs a
process id runs in the indexed Job only; DDP_NODES and DDP_NODE_ADDRS on SLURM; the operator sets RANK).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from buildtool.contracts.frameworks import LAUNCHERS

if TYPE_CHECKING:
    from buildtool.launch.multinode import MultiNodeJob

PROCESS_ID = "{process_id}"      # the verifier puts this node's process id there
IS_HOST = "{is_host}"            # in torchrun's --rdzv-conf: the verifier says whether this node hosts the store
LOCAL_ADDR = "--local-addr={local_addr}"   # torchrun: this node's address from DDP_NODE_ADDRS, or dropped
NODE_RANK = "--node-rank={node_rank}"      # torchrun's static rendezvous: the training operator's RANK (Master 0)


class Launcher:
    """One launcher kind: what every node runs, how many processes that makes, and what the generators
    must give it. Subclassed once per module of this package."""

    name: str = ""
    processes: str = ""          # how a message names its processes per node ("one process per node")
    first_node_hosts: str = ""   # what the first node of a job hosts ("c10d rendezvous")
    # The Kubernetes shapes it runs in (launch.k8s.VARIANTS), its default first.
    k8s_variants: tuple[str, ...] = ()

    def procs_per_node(self, gpus_per_node: int) -> int:
        """Processes each node runs (the world size the verifier expects is nodes x this)."""
        raise NotImplementedError

    def node_command(self, job: MultiNodeJob, endpoint: str, rdzv_id: str, script: str) -> list[str]:
        """What every node runs (inside the verifier) to run SCRIPT: ENDPOINT is the first node's address
        and port, RDZV_ID names the job's rendezvous."""
        raise NotImplementedError

    def ranked_command(self, job: MultiNodeJob, endpoint: str, rdzv_id: str, script: str) -> list[str]:
        """What every node runs where the scheduler ranks the nodes (Kubeflow's PyTorchJob: RANK, the Master 0)
        and reports the outcome of node 0 alone: node 0, whose address and port are ENDPOINT, must run rank 0."""
        raise NotImplementedError(f"the {self.name} launcher has no command for nodes ranked by their scheduler")

    def env(self, job: MultiNodeJob) -> dict[str, str]:
        """What the check's script reads from its environment (beyond what the verifier expects)."""
        return {}


def module_name(name: str) -> str:
    return f"{__name__}.{name.replace('-', '_')}"


def get(name: str) -> Launcher:
    """The launcher registered as NAME (a key of contracts.frameworks.LAUNCHERS); ValueError naming the
    known ones for any other, and for a registered name whose module is missing or names another."""
    if name not in LAUNCHERS:
        raise ValueError(f"unknown launcher {name!r}; one of {', '.join(LAUNCHERS)}")
    try:
        module = importlib.import_module(module_name(name))
    except ModuleNotFoundError as exc:
        if exc.name != module_name(name):
            raise
        raise ValueError(f"launcher {name!r} is registered in contracts.frameworks.LAUNCHERS but has no module "
                         f"{module_name(name)}") from None
    launcher = getattr(module, "LAUNCHER", None)
    if not isinstance(launcher, Launcher) or launcher.name != name:
        raise ValueError(f"{module_name(name)} must define LAUNCHER, a Launcher named {name!r}")
    return launcher
