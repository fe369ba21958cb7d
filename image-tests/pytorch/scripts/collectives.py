"""Collectives give the known result: launched by torchrun (gloo on CPU, NCCL with one GPU per rank).

Each rank fills tensors from its rank number, runs all_reduce (SUM and MAX), broadcast from the
last rank, all_gather and a barrier, and compares what it got with what arithmetic says.
Every rank writes rank-<N>.json: {"ok": ran without error, "backend", "world_size", "checks":
{name: {"ok", "got", "want"}}}, or the first line of its error; rank-<N>.fault names a fatal
signal. A collective that silently does nothing (or the wrong thing) fails here, where DDP's
own loss check may not notice.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import sys
import traceback

from probe_io import error_line, out_dir, write

N = 8


def run(backend: str, device) -> dict:
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    checks = {}

    def check(name: str, got, want) -> None:
        got_l = [round(float(x), 4) for x in got.flatten().cpu().tolist()]
        want_l = [round(float(x), 4) for x in want]
        checks[name] = {"ok": got_l == want_l, "got": got_l[:N], "want": want_l[:N]}

    t = torch.full((N,), float(rank + 1), device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    check("all_reduce(SUM)", t, [world * (world + 1) / 2] * N)

    t = torch.full((N,), float(rank + 1), device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check("all_reduce(MAX)", t, [float(world)] * N)

    src = world - 1
    t = torch.arange(N, dtype=torch.float32, device=device) * (rank + 1)
    dist.broadcast(t, src=src)
    check(f"broadcast(src={src})", t, [i * (src + 1) for i in range(N)])

    parts = [torch.zeros(N, device=device) for _ in range(world)]
    dist.all_gather(parts, torch.full((N,), float(rank), device=device))
    check("all_gather", torch.cat(parts), [float(r) for r in range(world) for _ in range(N)])

    dist.barrier()
    return {"backend": backend, "world_size": world, "checks": checks}


def main() -> int:
    rank = os.environ.get("RANK", "?")
    write(f"rank-{rank}.start.json", {"rank": rank, "pid": os.getpid()})
    faulthandler.enable(file=open(os.path.join(out_dir(), f"rank-{rank}.fault"), "w"))  # noqa: SIM115
    try:
        import torch
        import torch.distributed as dist

        cuda = torch.cuda.is_available() and os.environ.get("DDP_DEVICE") != "cpu"
        backend = "nccl" if cuda else "gloo"
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        timeout = datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT_S", "60")))
        dist.init_process_group(backend=backend, timeout=timeout)
        found = run(backend, device)
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - recorded, then re-raised for torchrun
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        write(f"rank-{rank}.json", {"rank": rank, "ok": False, "error": error_line(exc), "where": where})
        raise
    write(f"rank-{rank}.json", dict(found, rank=rank, ok=True))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # gloo's threads may abort in interpreter teardown after the work is done
