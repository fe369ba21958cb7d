"""The multi-node DDP check's rendezvous defaults, shared by validate, Kubernetes and SLURM."""

from __future__ import annotations

RDZV_PORT = 29400
# Slow image pulls on big clusters: nodes may join up to 15 minutes apart.
JOIN_TIMEOUT_S = 900
MAX_RESTARTS = 0             # torchrun restarts per node; the job-level bound is the scheduler's
BACKOFF_LIMIT = 2            # Kubernetes: restarts of the job before it counts as failed
# Kubernetes launch defaults (declared here, not in launch.k8s, so the CLI can show them without
# importing the launcher and its YAML writer).
GPU_RESOURCE = "nvidia.com/gpu"
ACTIVE_DEADLINE_S = 3600


def rdzv_conf(join_timeout_s: float, *, is_host: bool | None = None) -> str:
    """torchrun's `--rdzv-conf` for a c10d rendezvous that waits `join_timeout_s` for late nodes.

    read_timeout follows the join timeout: it bounds every read of the c10d store (default 60 s
    in torch), so without it a node that joins more than about a minute after the first (still
    pulling a large image) kills the waiting nodes with RendezvousConnectionError long before
    the join timeout."""
    seconds = int(join_timeout_s)
    conf = f"join_timeout={seconds},read_timeout={seconds}"
    if is_host is not None:
        conf += f",is_host={'true' if is_host else 'false'}"
    return conf
