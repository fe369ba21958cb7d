"""One validation at a time per reports folder (reports/<cell>/<digest12>/, the same for every run of a digest and
cell): two runs at once (two `buildtool validate`, a nightly and a manual run on one runner) would remove and
overwrite each other's results, defined tests and JUnit XML, and a verdict be made from the other run's.

The folder's `.validate.lock` is flock'd for the run: the kernel releases it when the process ends however it ends,
so a run that was killed leaves no lock that refuses the next one. The file says who holds it (for the refusal's
message) and is removed when the run ends.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from buildtool.common.errors import UserError

LOCK_NAME = ".validate.lock"


@contextlib.contextmanager
def hold(folder: Path, what: str) -> Iterator[None]:
    """Hold `folder`'s lock while the block runs (`what`: the run, as another run's refusal names it); a folder
    another run holds is exit 2 naming the folder and that run."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fd = _take(path, folder)
    try:
        since = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.write(fd, f"{what}, pid {os.getpid()} on {socket.gethostname()}, since {since}".encode())
        yield
    finally:
        # Removed while still held: a run that opened this file meanwhile sees it is gone once it has the lock.
        path.unlink(missing_ok=True)
        os.close(fd)


def _take(path: Path, folder: Path) -> int:
    """The lock file's descriptor, flock'd; UserError when another run holds it."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UserError(f"cannot lock the reports folder {folder} ({exc.strerror}): make it writable, or give "
                            "another --reports folder") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 1000).decode(errors="replace").replace("\n", " ").strip()
            os.close(fd)
            raise UserError(f"{folder} is in use by another validation of this image and cell "
                            f"({holder or 'one that is starting'}); wait for it to end, or give this run another "
                            "--reports folder") from None
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fd
        os.close(fd)   # the run that held it ended and removed it between our open and our flock: take the new one
