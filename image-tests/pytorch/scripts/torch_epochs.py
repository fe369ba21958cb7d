"""What the PyTorch scaling workers that shard (fsdp_epochs.py, deepspeed_epochs.py) share: the scaling benchmark's
synthetic data set, model and SGD (as bench/ddp_epochs.py), the epochs timed between barriers, the end (every rank's
parameters hashed, its peak memory, the unsharded replay on rank 0, `SCALING_RESULT <json>`) and the rank files
written under the image-tests harness. Shipped beside its workers: image-tests mounts this folder, the scaling
benchmark's docker launcher mounts it, and a SLURM job embeds it with the worker (scaling.shipped_with).

Environment: SCALING_SAMPLES (subset size), SCALING_EPOCHS, SCALING_BATCH (per rank), SCALING_THREADS,
SCALING_VERIFY. Under the image-tests harness ($IMAGETEST_OUT set) rank 0 also writes result.json and every rank
rank-<N>.json (ok, or its first error line).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

OUT = os.environ.get("IMAGETEST_OUT", "")
LR = 0.01
# Float sums in a different order (reduce-scatter vs one process) differ in the last bits; a reduction that
# loses a rank's gradient is off by orders of magnitude more (measured with FSDP: see test_fsdp.py).
REFERENCE_TOLERANCE = 1e-3


def write(name: str, data: dict) -> None:
    if OUT:
        path = os.path.join(OUT, name)
        with open(path + ".tmp", "w") as fh:
            json.dump(data, fh)
        os.replace(path + ".tmp", path)


def model_for(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                               torch.nn.ReLU(), torch.nn.Linear(512, 1)).to(device)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def reference(data: TensorDataset, world: int, batch: int, epochs: int) -> dict[str, torch.Tensor]:
    """The same steps in one process, unsharded: step k trains on every rank's k-th batch together (equal
    batch sizes, so the mean over the union is the mean of the ranks' means, what FSDP's and ZeRO's gradient
    reduction gives)."""
    model = model_for(torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for epoch in range(epochs):
        orders = []
        for rank in range(world):
            sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
            sampler.set_epoch(epoch)
            orders.append(list(sampler))
        for start in range(0, len(orders[0]), batch):
            index = [i for order in orders for i in order[start:start + batch]]
            x, y = data.tensors[0][index], data.tensors[1][index]
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


@dataclass
class Run:
    """One rank's run: the settings from the environment, then (start) its place in the process group and data."""

    samples: int = field(default_factory=lambda: int(os.environ.get("SCALING_SAMPLES", "4096")))
    epochs: int = field(default_factory=lambda: int(os.environ.get("SCALING_EPOCHS", "3")))
    batch: int = field(default_factory=lambda: int(os.environ.get("SCALING_BATCH", "64")))
    verify: bool = field(default_factory=lambda: os.environ.get("SCALING_VERIFY", "1") == "1")
    cuda: bool = field(default_factory=torch.cuda.is_available)
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def backend(self) -> str:
        return "nccl" if self.cuda else "gloo"

    def start(self) -> None:
        """After the process group is up: this rank, its device (one core per rank on CPU), its share of the data."""
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.cuda:
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.device)
        else:
            torch.set_num_threads(int(os.environ.get("SCALING_THREADS", "1")))  # one core per rank
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(self.samples, 256, generator=gen)
        self.data = TensorDataset(x, (x[:, :10] * 2.0).sum(dim=1, keepdim=True))
        self.sampler = DistributedSampler(self.data, num_replicas=self.world, rank=self.rank, shuffle=True, seed=0)
        self.loader = DataLoader(self.data, batch_size=self.batch, sampler=self.sampler)

    def train(self, step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> tuple[list[float], list[float]]:
        """Every epoch between barriers (its time is the slowest rank's); `step` trains on a batch, returns its loss."""
        epoch_times, losses = [], []
        for epoch in range(self.epochs):
            self.sampler.set_epoch(epoch)
            dist.barrier()
            start = time.perf_counter()
            total = 0.0
            for xb, yb in self.loader:
                total += step(xb.to(self.device), yb.to(self.device)).item()
            if self.cuda:
                torch.cuda.synchronize()
            dist.barrier()
            epoch_times.append(time.perf_counter() - start)
            losses.append(total / max(1, len(self.loader)))
        return epoch_times, losses

    def finish(self, head: dict, full: dict[str, torch.Tensor], epoch_times: list[float],
               losses: list[float]) -> dict:
        """`full` (every parameter, on the CPU) hashed and gathered with every rank's peak memory; rank 0 replays
        the training unsharded, writes result.json and prints SCALING_RESULT; `head` leads the result."""
        digest = hashlib.sha256()
        for key in sorted(full):
            digest.update(full[key].contiguous().numpy().tobytes())
        gathered: list[object] = [None] * self.world
        dist.all_gather_object(gathered, {"hash": digest.hexdigest(), "peak_mb": round(peak_memory_mb(self.device), 1)})
        result = {**head, "backend": dist.get_backend(), "world_size": self.world, "samples": self.samples,
                  "batch": self.batch, "epoch_times_s": epoch_times, "losses": losses,
                  "param_hashes": [g["hash"] for g in gathered],  # type: ignore[index]
                  "identical": len({g["hash"] for g in gathered}) == 1,  # type: ignore[index]
                  "peak_memory_mb": [g["peak_mb"] for g in gathered]}  # type: ignore[index]
        if self.verify and self.rank == 0:
            ref = reference(self.data, self.world, self.batch, self.epochs)
            diff = max(float((full[k] - ref[k]).abs().max()) for k in ref)
            result.update(max_abs_diff=diff, matches_reference=diff <= REFERENCE_TOLERANCE)
        if self.rank == 0:
            write("result.json", result)
            print("SCALING_RESULT " + json.dumps(result), flush=True)
        dist.barrier()  # no rank tears down gloo while another still talks to it
        dist.destroy_process_group()
        return result


def guarded(main: Callable[[], dict]) -> int:
    rank = int(os.environ.get("RANK", "0"))
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - every failure is written down, then re-raised
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        write(f"rank-{rank}.json", {"rank": rank, "ok": False, "error": f"{type(exc).__name__}: {first}",
                                    "where": f"{where.filename}:{where.lineno}" if where else ""})
        raise
    write(f"rank-{rank}.json", {"rank": rank, "ok": True})
    return 0


def exit_after(main: Callable[[], dict]) -> None:
    code = guarded(main)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as ddp_epochs.py: gloo's threads may abort in interpreter teardown after the work is done
