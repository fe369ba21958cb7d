"""DeepSpeed ZeRO stage 2 training over the scaling benchmark's synthetic data set, timing every epoch; launched by
torchrun (`buildtool scaling --strategy deepspeed`; the GPU smoke runs it on GPUs). The same model, data, sampler
and SGD as bench/ddp_epochs.py and fsdp_epochs.py; optimizer states and gradients partitioned across ranks
(ZeRO-2), parameters replicated.

Where DeepSpeed cannot run, the worker prints `SCALING_NOT_RUN <reason>` and exits 0, so the strategy is
reported as not run on this runner, never as a pass: DeepSpeed not installed in the image, or no accelerator
DeepSpeed supports. On CPU (DS_ACCELERATOR=cpu) DeepSpeed 0.19 JIT-compiles its shared-memory collective op
(shm_comm) at init, which needs a C++ compiler; without one this worker turns that op off and DeepSpeed's
collectives go through torch.distributed's gloo (recorded as `shm_comm`).

At the end every rank hashes its parameters (`identical`), and with SCALING_VERIFY=1 (default) rank 0 replays the
training unsharded in one process on the union of every rank's batches (`matches_reference`, `max_abs_diff`).
Rank 0 prints `SCALING_RESULT <json>` as the other workers do. Self-contained (a SLURM job embeds this one file).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import sys
import time
import traceback

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
    batch sizes, so the mean over the union is the mean of the ranks' means, what ZeRO's gradient reduction gives)."""
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


def not_run(reason: str) -> dict:
    if int(os.environ.get("RANK", "0")) == 0:
        print("SCALING_NOT_RUN " + reason, flush=True)
    write("result.json", {"not_run": reason})
    return {"not_run": reason}


def main() -> dict:
    samples = int(os.environ.get("SCALING_SAMPLES", "4096"))
    epochs = int(os.environ.get("SCALING_EPOCHS", "3"))
    batch = int(os.environ.get("SCALING_BATCH", "64"))
    verify = os.environ.get("SCALING_VERIFY", "1") == "1"
    cuda = torch.cuda.is_available()
    try:
        import deepspeed
    except ImportError as exc:
        return not_run(f"DeepSpeed is not installed in this image ({type(exc).__name__}: {exc})")
    shm_comm = "built"
    if not cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        if shutil.which(os.environ.get("CXX", "c++")) is None:
            import deepspeed.ops

            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # its JIT build needs a compiler
            shm_comm = "off: no C++ compiler to JIT-build it; collectives through gloo"
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(int(os.environ.get("SCALING_THREADS", "1")))  # one core per rank

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 256, generator=gen)
    data = TensorDataset(x, (x[:, :10] * 2.0).sum(dim=1, keepdim=True))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=batch, sampler=sampler)
    model = model_for(device)
    # No gradient clipping (DeepSpeed 0.19 clips at 1.0 unless told): the same SGD as the other strategies.
    config = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
                                           config=config)
    epoch_times, losses = [], []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        dist.barrier()
        start = time.perf_counter()
        total = 0.0
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(engine(xb.to(device)), yb.to(device))
            engine.backward(loss)
            engine.step()
            total += loss.item()
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        epoch_times.append(time.perf_counter() - start)
        losses.append(total / max(1, len(loader)))

    full = {k: v.detach().cpu().float() for k, v in engine.module.state_dict().items()}  # ZeRO-2: replicated
    digest = hashlib.sha256()
    for key in sorted(full):
        digest.update(full[key].contiguous().numpy().tobytes())
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, {"hash": digest.hexdigest(), "peak_mb": round(peak_memory_mb(device), 1)})
    result = {"strategy": "deepspeed", "zero_stage": 2, "shm_comm": shm_comm,
              "deepspeed_version": deepspeed.__version__, "backend": dist.get_backend(), "world_size": world,
              "samples": samples, "batch": batch, "epoch_times_s": epoch_times, "losses": losses,
              "param_hashes": [g["hash"] for g in gathered],  # type: ignore[index]
              "identical": len({g["hash"] for g in gathered}) == 1,  # type: ignore[index]
              "peak_memory_mb": [g["peak_mb"] for g in gathered]}  # type: ignore[index]
    if verify and rank == 0:
        ref = reference(data, world, batch, epochs)
        diff = max(float((full[k] - ref[k]).abs().max()) for k in ref)
        result.update(max_abs_diff=diff, matches_reference=diff <= REFERENCE_TOLERANCE)
    if rank == 0:
        write("result.json", result)
        print("SCALING_RESULT " + json.dumps(result), flush=True)
    dist.barrier()  # no rank tears down gloo while another still talks to it
    dist.destroy_process_group()
    return result


def guarded() -> int:
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


if __name__ == "__main__":
    code = guarded()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as ddp_epochs.py: gloo's threads may abort in interpreter teardown after the work is done
