"""Which image tests may run at the same time, and the lock that keeps the rest apart.

`buildtool validate --jobs N` (default 2) runs the image tests on N pytest-xdist workers, one test
file per worker at a time (`--dist loadscope`: a module's fixtures, a DDP run, a TensorBoard, run once),
each worker with its own container of the image. Every test declares what it needs (pytest.ini):

- `shared`: light probes (contents, labels, pip check, ulimits, a container of its own, TensorBoard
  queries, a rendezvous that never starts a rank): they may run beside each other.
- `devices`: DDP, collectives, bus bandwidth: alone while the run has GPUs (never two DDP or NCCL
  runs on the same GPUs, and bus bandwidth is a timing check); on a CPU run they hold no device and
  check no time, so they are shared.
- `exclusive`: always alone (a timing check must never run beside a load).
- unmarked: exclusive. A new test is safe before it is fast. A test's own mark overrides its module's.
And the test that starts the first container runs alone until that container is warm: its warm-up is
the verdict's cold start, a figure that another probe beside it would change (then it holds the lock as
it declares). One worker claims it (`claim_cold_start`); the other
workers' warm-ups find the image in the page cache, are not measured, and run as their test declares.

The guarantee is one lock file, taken by every worker around a test's whole run (setup, call and
teardown, so module fixtures and container removal are inside it): flock LOCK_SH for shared tests,
LOCK_EX for the others. A turnstile file, taken briefly before it, makes a waiting exclusive test hold
off new shared ones, so it runs as soon as those already running end. Waiting is bounded: a test holds
the lock only while it runs, every probe is cut at the image's deadline, and pytest is stopped there.
With --jobs 1 there is one process: the lock is taken and given back around each test, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

SHARED, EXCLUSIVE = "shared", "exclusive"
MARKERS = ("shared", "devices", "exclusive")


def claim_cold_start(folder: Path) -> bool:
    """True for the one process of a run that measures the cold start (the first to ask)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        (folder / "cold-start").open("x").close()
    except FileExistsError:
        return False
    return True


COLD_START = "the first container starts: the image's cold start is measured alone"


def access(item: pytest.Item, target: dict[str, Any]) -> tuple[str, str]:
    """(SHARED or EXCLUSIVE, why): what the test declares."""
    # The closest declaration wins: a test's own over its module's (pytestmark).
    mark = next((m for m in item.iter_markers() if m.name in MARKERS), None)
    if mark is None:
        return EXCLUSIVE, "not marked shared, devices or exclusive"
    why = str(mark.kwargs.get("why", ""))
    if mark.name == "devices":
        if target.get("runner_gpus"):
            return EXCLUSIVE, f"uses the run's GPUs: {why}"
        return SHARED, f"no GPUs in this run: {why}"
    return (SHARED if mark.name == "shared" else EXCLUSIVE), why


class Held:
    """The tests' lock as one test holds it."""

    def __init__(self, gate: IO[str], lock: IO[str]) -> None:
        self.gate, self.lock, self.mode = gate, lock, ""

    def take(self, mode: str) -> None:
        """Hold it in `mode` (SHARED: with other shared tests; EXCLUSIVE: alone)."""
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX if mode == EXCLUSIVE else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self.gate, fcntl.LOCK_UN)
        self.mode = mode

    def share(self) -> None:
        """From EXCLUSIVE to SHARED: flock gives the lock back and takes it shared (a test waiting for it
        alone may run in between). Not through the turnstile: that test may hold it while it waits for us."""
        fcntl.flock(self.lock, fcntl.LOCK_SH)
        self.mode = SHARED


@contextlib.contextmanager
def hold(folder: Path, mode: str) -> Iterator[Held]:
    """Hold the tests' lock in `mode` until the block ends."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "turnstile").open("a") as gate, (folder / "tests").open("a") as lock:
        held = Held(gate, lock)
        held.take(mode)
        try:
            yield held
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def overlaps(schedule: list[dict[str, Any]]) -> list[str]:
    """Pairs of tests that ran at the same time though one of them needed to run alone (from the
    start and end each test recorded); [] when the schedule kept every rule."""
    found = []
    ordered = sorted(schedule, key=lambda s: s["started"])
    for i, one in enumerate(ordered):
        for other in ordered[i + 1:]:
            if other["started"] >= one["ended"]:
                break
            if EXCLUSIVE in (one["access"], other["access"]):
                found.append(f"{one['id']} ({one['access']}, {one['lane']}) overlapped {other['id']} "
                             f"({other['access']}, {other['lane']})")
    return found
