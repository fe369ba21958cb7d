"""/dev/shm: mounted and as large as the run profile promises (testinfra's `host`), and worker processes can
pass batches larger than Docker's 64 MB default through it (scripts/shm_workers.py, a program). A failure
names the worker that hung or died and the signal; only a SIGBUS (or a full /dev/shm) is blamed on shared
memory."""

from __future__ import annotations

import pytest
from harness import human, signal_name

from buildtool.contracts.frameworks import SHM_WORKERS
from buildtool.contracts.runprofile import MIN_SHM_BYTES, MIN_SHM_SIZE

pytestmark = pytest.mark.shared(why="its worker container's own /dev/shm; the batch timeout finds hangs, times nothing")

# The loader waits up to 30 s (scripts/shm_workers.py) for a worker's batch, idle, before it names the
# worker that hung; the supervisor calls the probe hung only after that had its chance.
WORKERS_QUIET_S = 60


def test_shm_size_matches_run_profile(target, host):
    shm = host.mount_point("/dev/shm")
    assert shm.exists, "/dev/shm is not mounted in the container"
    blocks, block_size = host.check_output("stat -f -c %s /dev/shm", "%b %S").split()
    size, promised = int(blocks) * int(block_size), int(target["shm_expected_bytes"])   # what statvfs says
    fix = target.get("shm_fix") or "run.shm_size in matrix.yaml"
    if promised < MIN_SHM_BYTES:
        raise AssertionError(
            f"the run profile promises only {target['shm_promised']} of /dev/shm, below the {MIN_SHM_SIZE} "
            f"DataLoader workers and NCCL need: raise {fix} to at least {MIN_SHM_SIZE}")
    assert size >= promised, (
        f"/dev/shm is {human(size)} but the run profile promises {target['shm_promised']} ({fix}): the container "
        f"did not get the profile's shared memory (a later --shm-size or the engine overrode it; mounted "
        f"{shm.filesystem} {','.join(shm.options)})")


def worker_failure(found: dict, what: str, fix: str, raised: dict | None = None) -> str:
    """One line: which worker hung, died or failed and how; /dev/shm only when it is to blame
    (a SIGBUS, or a batch larger than the room /dev/shm had)."""
    shm = found.get("shm") or {}
    room = f"/dev/shm {human(int(shm['size']))}, {human(int(shm['free']))} free" if "size" in shm else "/dev/shm ?"
    workers = found.get("workers") or []
    dead = [w for w in workers if not w.get("alive") and w.get("exitcode") not in (0, None)]
    if dead:
        w = dead[0]
        code = w["exitcode"]
        how = f"died with {signal_name(-code)}" if code < 0 else f"exited with code {code}"
        line = f"{what}: worker {w['worker']} (pid {w['pid']}) {how}"
        if code == -7:  # SIGBUS: a page of /dev/shm could not be had
            line += f": out of shared memory ({room}); raise {fix}"
        return f"{line} [{found.get('error', '')}]"
    for entry in sorted((raised or {}).values(), key=lambda e: e.get("worker", 0)):
        at = entry.get("shm") or {}
        line = f"{what}: worker {entry['worker']} (pid {entry['pid']}) could not put a {human(int(entry['bytes']))} " \
               f"batch into shared memory: {entry['error']}"
        if "free" in at and int(at["free"]) < int(entry["bytes"]):
            line += (f": out of shared memory (/dev/shm {human(int(at['size']))}, {human(int(at['free']))} free); "
                     f"raise {fix}")
        return line
    waiting = found.get("waiting_for")
    hung = [w for w in workers if w.get("alive") and (waiting is None or w["worker"] == waiting)]
    if found.get("timed_out") and hung:
        w = hung[0]
        return (f"{what}: worker {w['worker']} (pid {w['pid']}) hung: no batch within {found.get('timeout_s', 0):.0f}s "
                f"({room}) [{found.get('error', '')}]")
    if found.get("errno") == 28:  # ENOSPC
        return f"{what}: out of shared memory ({room}): {found['error']}; raise {fix}"
    return f"{what}: {found.get('error') or 'failed'} ({room})"


def test_workers_pass_large_batches_through_shm(main, target):
    mode = target["framework_info"]["shm_workers"]
    what = SHM_WORKERS[mode]   # the framework's kind, as the table says it: "a DataLoader with 2 workers"
    probe = main.python("shm_workers.py", mode, step=f"{what} passing 96 MiB batches through /dev/shm",
                        quiet=WORKERS_QUIET_S)
    found = probe.result
    assert isinstance(found, dict), probe.cause()
    assert found.get("ok"), worker_failure(found, what, target.get("shm_fix") or "run.shm_size in matrix.yaml",
                                           probe.jsons("worker-*.json"))
