"""Pass batches larger than Docker's 64 MB /dev/shm default through shared memory between
worker processes, the way a DataLoader does.

`torch` mode uses torch.utils.data.DataLoader with worker processes; `python` mode uses
multiprocessing.shared_memory (for images without torch). Writes result.json: {"ok", "moved",
"error", "workers": [{"worker", "pid", "alive", "exitcode"}], "waiting_for": the worker that
owed the next batch when the loader gave up, "timeout_s", "shm": {"size", "free"}}, so the test
can say which worker hung or died and with which signal, and blame /dev/shm only for SIGBUS.
"""

from __future__ import annotations

import os
import sys

from probe_io import error_line, result

BATCH_BYTES = 96 << 20  # above 64 MB on purpose
BATCHES = 4
WORKERS = 2
WORKER_TIMEOUT_S = float(os.environ.get("SHM_WORKER_TIMEOUT_S", "30"))


def shm() -> dict:
    try:
        st = os.statvfs("/dev/shm")
        return {"size": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}
    except OSError as exc:
        return {"error": error_line(exc)}


def _workers(procs) -> list:
    out = []
    for i, proc in enumerate(procs):
        try:
            alive = proc.is_alive()  # reaps a dead worker, so its exit code is known
        except (AssertionError, ValueError, OSError):
            alive = False
        out.append({"worker": i, "pid": proc.pid, "alive": alive, "exitcode": proc.exitcode})
    return out


def torch_mode() -> dict:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Big(Dataset):
        def __len__(self) -> int:
            return BATCHES

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.full((BATCH_BYTES // 4,), float(i), dtype=torch.float32)

    total = 0
    loader = DataLoader(Big(), batch_size=1, num_workers=WORKERS, timeout=WORKER_TIMEOUT_S)
    it = iter(loader)
    try:
        for batch in it:
            if batch.numel() * 4 != BATCH_BYTES:
                return {"ok": False, "moved": total,
                        "error": f"a batch arrived with {batch.numel() * 4} bytes, not {BATCH_BYTES}"}
            total += batch.numel() * 4
    except Exception as exc:  # noqa: BLE001 - diagnosed below
        task = getattr(it, "_task_info", {}).get(getattr(it, "_rcvd_idx", -1))
        return {"ok": False, "moved": total, "error": error_line(exc), "errno": getattr(exc, "errno", None),
                "workers": _workers(getattr(it, "_workers", [])),
                "waiting_for": task[0] if isinstance(task, tuple) and len(task) == 1 else None}
    return {"ok": True, "moved": total}


def _child(name: str, value: int) -> None:
    from multiprocessing import shared_memory

    block = shared_memory.SharedMemory(name=name)
    block.buf[:] = bytes([value]) * BATCH_BYTES  # touches every page: SIGBUS when /dev/shm is too small
    block.close()


def python_mode() -> dict:
    import multiprocessing as mp
    from multiprocessing import shared_memory

    total = 0
    for i in range(BATCHES // WORKERS):
        blocks = [shared_memory.SharedMemory(create=True, size=BATCH_BYTES) for _ in range(WORKERS)]
        try:
            procs = [mp.Process(target=_child, args=(b.name, i + 1)) for b in blocks]
            for p in procs:
                p.start()
            for p in procs:
                p.join(WORKER_TIMEOUT_S)
            states = _workers(procs)
            bad = [s for s in states if s["alive"] or s["exitcode"] != 0]
            if bad:
                for p in procs:
                    if p.is_alive():
                        p.kill()
                first = bad[0]
                return {"ok": False, "moved": total, "workers": states, "waiting_for": first["worker"],
                        "error": f"worker {first['worker']} "
                                 + ("hung" if first["alive"] else f"exited with {first['exitcode']}")}
            for b in blocks:
                if b.buf[BATCH_BYTES - 1] != i + 1:
                    return {"ok": False, "moved": total, "error": "a worker's batch arrived corrupted"}
                total += BATCH_BYTES
        finally:
            for b in blocks:
                b.close()
                b.unlink()
    return {"ok": True, "moved": total}


if __name__ == "__main__":
    try:
        found = torch_mode() if sys.argv[1] == "torch" else python_mode()
    except Exception as exc:  # noqa: BLE001 - the test names it
        found = {"ok": False, "moved": 0, "error": error_line(exc), "errno": getattr(exc, "errno", None)}
    found.update(shm=shm(), timeout_s=WORKER_TIMEOUT_S, mode=sys.argv[1])
    result(found)
    sys.stdout.flush()
    os._exit(0)  # hung workers are the supervisor's to kill; no waiting on them in teardown
