"""Running the checks at scale: multi-node DDP on Kubernetes and SLURM, the scaling benchmark."""
