"""FSDP training (torch.distributed.fsdp.fully_shard, FSDP2) over the scaling benchmark's synthetic data set,
timing every epoch; launched by torchrun (gloo on CPU, NCCL on GPUs). The scaling benchmark's FSDP worker
(`buildtool scaling --strategy fsdp`) and the image's FSDP check (test_fsdp.py) both run this file.

The same model, data and sampler as bench/ddp_epochs.py (strong scaling: each rank gets 1/world of the subset;
every epoch bracketed by barriers, so its time is the slowest rank's). Each Linear layer is its own FSDP unit
and the root another: parameters are sharded across ranks, gathered for each forward and backward, and the
gradients reduce-scattered back to their shards. At the end:
- the full state dict is gathered from the shards on every rank and hashed (`identical`: every rank gathered
  the same parameters, FSDP's equivalent of DDP's identical replicas);
- with SCALING_VERIFY=1 (default), rank 0 replays the same training unsharded in one process on the union of
  every rank's batches, step for step, and compares: `matches_reference` holds only when FSDP's gradient
  reduction averaged every rank's gradients (a reduction that drops or misweighs a rank's gradient leaves the
  sharded model elsewhere, while its loss may still fall).
Rank 0 prints `SCALING_RESULT <json>`: backend, world_size, epoch_times_s, losses, identical, matches_reference,
max_abs_diff, peak_memory_mb (every rank's peak resident memory, or CUDA memory allocated, in MiB).

Environment: SCALING_SAMPLES (subset size), SCALING_EPOCHS, SCALING_BATCH (per rank), SCALING_THREADS,
SCALING_VERIFY. Under the image-tests harness ($IMAGETEST_OUT set) rank 0 also writes result.json and every
rank rank-<N>.json (ok, or its first error line). What it shares with deepspeed_epochs.py is torch_epochs.py beside
it (a SLURM job embeds both).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch_epochs as epochs


def main() -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    run = epochs.Run()
    dist.init_process_group(backend=run.backend)
    run.start()
    model = epochs.model_for(run.device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=epochs.LR)

    def step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    epoch_times, losses = run.train(step)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
    return run.finish({"strategy": "fsdp"}, {k: v.detach().cpu() for k, v in full.items()}, epoch_times, losses)


if __name__ == "__main__":
    epochs.exit_after(main)
