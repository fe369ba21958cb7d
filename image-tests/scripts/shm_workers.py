"""Pass batches larger than Docker's 64 MB /dev/shm default through shared memory between
worker processes, the way a DataLoader does.

`python3 shm_workers.py KIND` runs the function `<KIND>_mode`, KIND a framework's `shm_workers` (a key of
buildtool/contracts/frameworks.py's SHM_WORKERS, which the load checks; a new kind is its entry there and
its function here): `torch` uses torch.utils.data.DataLoader with worker processes; `python` uses
multiprocessing.shared_memory (for images without torch). Writes result.json: {"ok", "moved",
"error", "workers": [{"worker", "pid", "alive", "exitcode"}], "timed_out" (no batch for the
loader's whole timeout), "waiting_for": the worker that owed the next batch then, "timeout_s",
"shm": {"size", "free"}}; a worker whose batch could not be put into /dev/shm writes
worker-<N>.json itself (its error and /dev/shm's room at that moment). So the test can say
which worker hung, died (and with which signal) or failed, and blame /dev/shm only for a
SIGBUS or a batch that did not fit.
"""

from __future__ import annotations

import os
import sys
import time

from probe_io import error_line, result, write

BATCH_BYTES = 96 << 20  # above 64 MB on purpose
BATCHES = 4
WORKERS = 2


def worker_timeout_s() -> float:
    """$SHM_WORKER_TIMEOUT_S (30 when unset; the image's ENV may set it): the loader's timeout, so a value that is no
    bound (text, 0 or inf: torch waits for ever, negative: torch's error) is refused by name before any worker."""
    text = os.environ.get("SHM_WORKER_TIMEOUT_S", "30")
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 3600:   # nan too
        print(f"{os.path.basename(__file__)}: SHM_WORKER_TIMEOUT_S={text!r} is not a number of seconds above 0 and at "
              "most 3600 (unset it for the default, 30)", file=sys.stderr)
        sys.exit(2)
    return value


WORKER_TIMEOUT_S = worker_timeout_s()


def shm() -> dict:
    try:
        st = os.statvfs("/dev/shm")
        return {"size": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}
    except OSError as exc:
        return {"error": error_line(exc)}


def _workers(procs) -> list:
    """`procs`: (worker id, process) pairs."""
    out = []
    for worker, proc in procs:
        try:
            alive = proc.is_alive()  # reaps a dead worker, so its exit code is known
        except (AssertionError, ValueError, OSError):
            alive = False
        out.append({"worker": worker, "pid": proc.pid, "alive": alive, "exitcode": proc.exitcode})
    return out


def _recording_context(made: list):
    """This interpreter's default multiprocessing context, recording each process it makes in `made`
    as (worker id, process). The DataLoader's own list of workers does not exist yet when a worker
    dies at once (its SIGCHLD handler raises inside iter()), and a started Process forgets its args,
    so the workers are recorded where they are made."""
    import multiprocessing

    base = multiprocessing.get_context()

    class Recording(type(base)):  # type: ignore[misc]
        def Process(self, *args, **kwargs):  # noqa: N802 - multiprocessing's name
            proc = base.Process(*args, **kwargs)
            worker_args = kwargs.get("args") or ()
            worker = worker_args[10] if len(worker_args) > 10 and isinstance(worker_args[10], int) else len(made)
            made.append((worker, proc))  # _worker_loop's 11th argument is the worker id
            return proc

    return Recording()


def _collate(batch):
    """default_collate (which puts the batch into /dev/shm inside the worker), with its failure written
    down by the worker itself: which worker, the error, and /dev/shm's room at that moment."""
    import torch
    from torch.utils.data import default_collate, get_worker_info

    try:
        return default_collate(batch)
    except Exception as exc:
        info = get_worker_info()
        worker = info.id if info is not None else -1
        nbytes = sum(t.numel() * t.element_size() for t in batch if isinstance(t, torch.Tensor))
        write(f"worker-{worker}.json", {"worker": worker, "pid": os.getpid(), "error": error_line(exc),
                                        "bytes": nbytes, "shm": shm()})
        raise


def torch_mode() -> dict:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Big(Dataset):
        def __len__(self) -> int:
            return BATCHES

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.full((BATCH_BYTES // 4,), float(i), dtype=torch.float32)

    total = 0
    made: list = []
    loader = DataLoader(Big(), batch_size=1, num_workers=WORKERS, timeout=WORKER_TIMEOUT_S, collate_fn=_collate,
                        multiprocessing_context=_recording_context(made))
    it = None
    last = time.monotonic()
    try:
        it = iter(loader)  # workers start here: one that dies at once is reported from here
        for batch in it:
            if batch.numel() * 4 != BATCH_BYTES:
                return {"ok": False, "moved": total,
                        "error": f"a batch arrived with {batch.numel() * 4} bytes, not {BATCH_BYTES}"}
            total += batch.numel() * 4
            last = time.monotonic()
    except Exception as exc:  # noqa: BLE001 - diagnosed below
        task = getattr(it, "_task_info", {}).get(getattr(it, "_rcvd_idx", -1))
        waited = time.monotonic() - last
        return {"ok": False, "moved": total, "error": error_line(exc), "errno": getattr(exc, "errno", None),
                "workers": _workers(made), "waited_s": round(waited, 1),
                "timed_out": waited >= WORKER_TIMEOUT_S - 0.5,  # no batch for the loader's whole timeout
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
            states = _workers(list(enumerate(procs)))
            bad = [s for s in states if s["alive"] or s["exitcode"] != 0]
            if bad:
                for p in procs:
                    if p.is_alive():
                        p.kill()
                first = bad[0]
                return {"ok": False, "moved": total, "workers": states, "waiting_for": first["worker"],
                        "timed_out": bool(first["alive"]),
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
        mode = globals().get(f"{sys.argv[1]}_mode")
        if mode is None:
            raise ValueError(f"no mode {sys.argv[1]!r} here: a kind is a function <kind>_mode of shm_workers.py")
        found = mode()
    except Exception as exc:  # noqa: BLE001 - the test names it
        found = {"ok": False, "moved": 0, "error": error_line(exc), "errno": getattr(exc, "errno", None)}
    found.update(shm=shm(), timeout_s=WORKER_TIMEOUT_S, mode=sys.argv[1])
    result(found)
    sys.stdout.flush()
    os._exit(0)  # hung workers are the supervisor's to kill; no waiting on them in teardown
