"""A short DDP training run, launched by torchrun (one process per GPU with NCCL, or two
processes with gloo on CPU). Rank 0 prints `DDP_RESULT <json>`:
the loss at the start and the end, whether every rank holds identical parameters
(a hash of each rank's parameters, gathered with all_gather_object), and on GPUs the
all-reduce bus bandwidth of a large tensor (busbw = algbw * 2(n-1)/n, as nccl-tests).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("DDP_STEPS", "40"))


def param_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def busbw(device: torch.device, world: int) -> dict[str, float]:
    tensor = torch.ones(64 << 20, dtype=torch.float32, device=device)  # 256 MiB
    for _ in range(3):
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    iters = 10
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / iters
    algbw = tensor.numel() * tensor.element_size() / seconds / 1e9
    return {"allreduce_bytes": tensor.numel() * tensor.element_size(), "algbw_GBps": round(algbw, 2),
            "busbw_GBps": round(algbw * 2 * (world - 1) / world, 2)}


def main() -> int:
    # DDP_DEVICE=cpu: two nodes sharing one GPU would trip NCCL's duplicate-GPU check.
    cuda = torch.cuda.is_available() and os.environ.get("DDP_DEVICE") != "cpu"
    backend = "nccl" if cuda else "gloo"
    timeout = datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT_S", "120")))
    dist.init_process_group(backend=backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)  # same initial weights everywhere; DDP broadcasts rank 0's anyway
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
    ddp = DDP(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank sees different data
    true_w = torch.arange(16, dtype=torch.float32).unsqueeze(1) / 16
    losses = []
    for _ in range(STEPS):
        x = torch.randn(64, 16, generator=gen)
        y = x @ true_w
        loss = torch.nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())

    hashes: list[str | None] = [None] * world
    dist.all_gather_object(hashes, param_hash(model))
    result: dict[str, object] = {
        "backend": backend, "world_size": world, "nnodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        "first_loss": sum(losses[:3]) / 3, "last_loss": sum(losses[-3:]) / 3,
        "param_hashes": hashes, "identical": len(set(hashes)) == 1,
    }
    if cuda:
        result["figures"] = busbw(device, world)
    dist.barrier()
    if rank == 0:
        print("DDP_RESULT " + json.dumps(result), flush=True)
    dist.barrier()  # nobody tears down while a peer still talks to it
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: gloo's background threads intermittently abort there
    # ("terminate called without an active exception") after all work is done and checked.
    os._exit(code)
