"""Pass batches larger than Docker's 64 MB /dev/shm default through shared memory between
worker processes, the way a DataLoader does. Prints `SHM_OK <bytes>` when every batch arrived.

`torch` mode uses torch.utils.data.DataLoader with worker processes; `python` mode uses
multiprocessing.shared_memory (for images without torch).
"""

from __future__ import annotations

import sys

BATCH_BYTES = 96 << 20  # above 64 MB on purpose
BATCHES = 4
WORKERS = 2


def torch_mode() -> int:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Big(Dataset):
        def __len__(self) -> int:
            return BATCHES

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.full((BATCH_BYTES // 4,), float(i), dtype=torch.float32)

    total = 0
    loader = DataLoader(Big(), batch_size=1, num_workers=WORKERS, timeout=120)
    for batch in loader:
        assert batch.numel() * 4 == BATCH_BYTES
        total += batch.numel() * 4
    return total


def _child(name: str, value: int) -> None:
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(name=name)
    shm.buf[:] = bytes([value]) * BATCH_BYTES  # touches every page: SIGBUS when /dev/shm is too small
    shm.close()


def python_mode() -> int:
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
                p.join(120)
                if p.exitcode != 0:
                    raise SystemExit(f"shared memory worker died with exit code {p.exitcode} "
                                     f"(signal {-p.exitcode if p.exitcode and p.exitcode < 0 else 'none'}): "
                                     "out of shared memory (/dev/shm too small?)")
            for b in blocks:
                assert b.buf[BATCH_BYTES - 1] == i + 1
                total += BATCH_BYTES
        finally:
            for b in blocks:
                b.close()
                b.unlink()
    return total


if __name__ == "__main__":
    moved = torch_mode() if sys.argv[1] == "torch" else python_mode()
    print(f"SHM_OK {moved}", flush=True)
