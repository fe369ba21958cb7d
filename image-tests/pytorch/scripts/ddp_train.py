"""A short DDP training run, launched by torchrun (one process per GPU with NCCL, or two
processes with gloo on CPU). Every process prints `DDP_RANK <json>` (its global and local rank: the
verifier learns from them which node holds rank 0) and rank 0 prints `DDP_RESULT <json>`:
the loss at the start and the end, whether every rank holds identical parameters
(a hash of each rank's parameters, gathered with all_gather_object), and on GPUs the
all-reduce bus bandwidth measured as nccl-tests measures it (`busbw`).

Bus bandwidth (DDP_BUSBW=1, or by default on GPUs): for each size in BUSBW_SIZES (byte counts,
comma-separated, as the image tests write them with the host's one size grammar; default 8 MiB to
1 GiB, powers of two), BUSBW_WARMUP (5) untimed all-reduces, then BUSBW_ITERS (20) timed ones,
each started together after a barrier and timed on every rank to completion; an iteration takes
as long as its slowest rank (an all-reduce MAX of the per-rank times after the loop). The time
per size is the mean over iterations; algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests'
all-reduce factor). The result is the per-size table and its peak. The same code runs with gloo
on CPU (small sizes), so CI exercises it.

Under the image-tests harness ($IMAGETEST_OUT set) every rank also writes rank-<N>.json
(ok, or the first line of its error and where it was raised), rank 0 writes result.json, and
rank 0 saves and reloads a checkpoint in the working directory, as a user's training does.
Self-contained (the Kubernetes launcher ships this one file).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("DDP_STEPS", "40"))
DEFAULT_BUSBW_SIZES = [(8 << 20) << i for i in range(8)]   # 8 MiB .. 1 GiB
OUT = os.environ.get("IMAGETEST_OUT", "")


def write(name: str, data: dict) -> None:
    """A JSON file into the harness's folder (nothing without the harness)."""
    if OUT:
        path = os.path.join(OUT, name)
        with open(path + ".tmp", "w") as fh:
            json.dump(data, fh)
        os.replace(path + ".tmp", path)


def error_line(exc: BaseException) -> str:
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def checkpoint(model: torch.nn.Module) -> dict[str, object]:
    """Save and reload the model in the working directory, as training does."""
    path = os.path.join(os.getcwd(), f"imgtest-checkpoint-{os.environ.get('IMAGETEST_STEP', os.getpid())}.pt")
    try:
        torch.save(model.state_dict(), path)
        loaded = torch.load(path, map_location="cpu")
        same = all(torch.equal(loaded[k].cpu(), v.detach().cpu()) for k, v in model.state_dict().items())
        os.remove(path)
        return {"path": path, "ok": same, "error": "" if same else "the reloaded checkpoint differs"}
    except Exception as exc:  # noqa: BLE001 - reported: the test names the path and the error
        return {"path": path, "ok": False, "error": error_line(exc)}


def param_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def parse_sizes(text: str) -> list[int]:
    """`65536,131072` -> [65536, 131072]: byte counts only (the host converts sizes written as 8M
    with its size grammar); anything else stops the run naming it."""
    sizes = []
    for part in text.split(","):
        if not re.fullmatch(r"[1-9][0-9]*", part):
            raise SystemExit(f"BUSBW_SIZES: {part!r} is not a byte count (BUSBW_SIZES={text!r}; "
                             "write whole numbers of bytes separated by commas, e.g. 65536,131072)")
        sizes.append(int(part))
    return sizes


def _sig(value: float) -> float:
    return float(f"{value:.5g}")  # five significant digits: GB/s on GPUs and on CPU alike


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def busbw(device: torch.device, world: int, sizes: list[int], warmup: int = 5, iters: int = 20,
          slow_rank: tuple[int, float] | None = None) -> dict[str, object]:
    """The all-reduce bus bandwidth table (see the module docstring). `slow_rank` (rank, seconds)
    delays one rank inside each timed iteration: the toolkit's tests use it to show the slowest
    rank decides the figure."""
    rank = dist.get_rank()
    rows = []
    for nbytes in sizes:
        tensor = torch.ones(max(nbytes // 4, 1), dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(tensor)
        _sync(device)
        times = torch.zeros(iters, dtype=torch.float64)
        for i in range(iters):
            dist.barrier()
            _sync(device)
            start = time.perf_counter()
            dist.all_reduce(tensor)
            _sync(device)
            if slow_rank is not None and slow_rank[0] == rank:
                time.sleep(slow_rank[1])
            times[i] = time.perf_counter() - start
        slowest = times.to(device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # per iteration, the slowest rank's time
        seconds = float(slowest.mean().item())
        size = tensor.numel() * tensor.element_size()
        algbw = size / seconds / 1e9
        rows.append({"bytes": size, "time_us": _sig(seconds * 1e6), "algbw_GBps": _sig(algbw),
                     "busbw_GBps": _sig(algbw * 2 * (world - 1) / world)})
        del tensor
    peak = max(rows, key=lambda r: r["busbw_GBps"])
    return {"backend": dist.get_backend(), "ranks": world, "warmup": warmup, "iters": iters,
            "peak_GBps": peak["busbw_GBps"], "peak_bytes": peak["bytes"], "sizes": rows}


def _busbw_wanted(cuda: bool) -> bool:
    wanted = os.environ.get("DDP_BUSBW", "auto").lower()
    return cuda if wanted == "auto" else wanted in ("1", "true", "yes", "on")


def _slow_rank() -> tuple[int, float] | None:
    value = os.environ.get("BUSBW_SLOW_RANK", "")
    if not value:
        return None
    rank, _, seconds = value.partition(":")
    return int(rank), float(seconds)


def say_rank(rank: int, local_rank: int) -> None:
    """`DDP_RANK {json}`: which global rank this process of the node is. torchrun decides which node holds rank 0
    (not always the rendezvous host), so the verifier on each node learns from these lines whether its node owes
    rank 0's DDP_RESULT. One write, so that the node's processes never glue their lines together."""
    mark = {"rank": rank, "local_rank": local_rank,
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
    sys.stdout.write("DDP_RANK " + json.dumps(mark) + "\n")
    sys.stdout.flush()


def main() -> int:
    # DDP_DEVICE=cpu: two nodes sharing one GPU would trip NCCL's duplicate-GPU check.
    cuda = torch.cuda.is_available() and os.environ.get("DDP_DEVICE") != "cpu"
    backend = "nccl" if cuda else "gloo"
    timeout = datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT_S", "120")))
    if cuda and OUT and os.environ.get("NCCL_DEBUG") and not os.environ.get("NCCL_DEBUG_FILE"):
        # NCCL's own log (which transport joins which ranks) beside this rank's record, not in the output tail.
        os.environ["NCCL_DEBUG_FILE"] = os.path.join(OUT, f"nccl-{os.environ.get('RANK', 'x')}.%p.log")
    dist.init_process_group(backend=backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    say_rank(rank, local_rank)
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
    if _busbw_wanted(cuda):
        sizes = parse_sizes(os.environ["BUSBW_SIZES"]) if "BUSBW_SIZES" in os.environ else DEFAULT_BUSBW_SIZES
        result["busbw"] = busbw(device, world, sizes, int(os.environ.get("BUSBW_WARMUP", "5")),
                                int(os.environ.get("BUSBW_ITERS", "20")), _slow_rank())
    if rank == 0 and OUT:
        result["checkpoint"] = checkpoint(model)
    dist.barrier()
    if rank == 0:
        write("result.json", result)
        print("DDP_RESULT " + json.dumps(result), flush=True)
    dist.barrier()  # nobody tears down while a peer still talks to it
    dist.destroy_process_group()
    return 0


def guarded() -> int:
    """main(), with this rank's outcome written down: the first error line, not a traceback's last frames."""
    rank = os.environ.get("RANK", "?")
    write(f"rank-{rank}.start.json", {"rank": rank, "pid": os.getpid(), "host": os.uname()[1]})
    if OUT:  # a fatal signal (SIGSEGV, SIGBUS, SIGABRT...) leaves its name in rank-N.fault
        import faulthandler

        faulthandler.enable(file=open(os.path.join(OUT, f"rank-{rank}.fault"), "w"))  # noqa: SIM115 - kept open
    try:
        code = main()
    except BaseException as exc:  # noqa: BLE001 - recorded, then re-raised for torchrun
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        write(f"rank-{rank}.json", {"rank": rank, "ok": False, "error": error_line(exc), "where": where})
        raise
    write(f"rank-{rank}.json", {"rank": rank, "ok": True})
    return code


def leave(code: int) -> None:
    """os._exit(CODE) without losing output: Python's buffers and C stdio's, where NCCL writes its log when
    NCCL_DEBUG_FILE is unset (to a pipe stdout is block-buffered, and os._exit skips the C library's flush)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)   # fflush(NULL): every C stdio stream of the process
    except (OSError, AttributeError):    # no C library to ask (not Linux): nothing of NCCL's to lose either
        pass
    os._exit(code)


if __name__ == "__main__":
    # Skip interpreter teardown: gloo's background threads intermittently abort there
    # ("terminate called without an active exception") after all work is done and checked.
    leave(guarded())
