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
