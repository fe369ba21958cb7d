"""Run one probe inside the image under test, and cut it only when it has hung or the image's
deadline is spent; record how it ended.

harness.py starts it as `python3 -I -S /imagetests/supervise.py DIR BOUND QUIET STEP -- ARGV...`:
-I -S means no site, no sitecustomize, no PYTHON* variables, so nothing an image adds to
Python's start-up (a banner, a hook that sleeps) can delay or change the supervision itself.
Standard library only, and Python 3.8 syntax (images bring their own Python).

Slow is not hung. A cold page cache makes the first `import tensorflow` read a gigabyte from disk
for most of a minute; a fixed timeout cannot tell that from a deadlock. So the probe is watched:
every POLL_S the CPU time, major faults and I/O counters of every process it started are read
from /proc. While any of them grows, the probe is making progress and may go on until BOUND
(what is left of the image's deadline). When none has grown for QUIET seconds it is hung, and it
is killed then, long before the deadline. QUIET is sized by the caller to the longest time the
probe may legitimately wait on something else (a peer, a timeout of its own).

`--watch DIR BOUND QUIET` watches every other process of the container instead (a container
started with the user's own command, where we run nothing ourselves) and only records when
they went quiet; the host then stops that container.

Writes into DIR (a host folder mounted into the container; the host reads it afterwards):
  supervisor.json  {"pid"} first thing, so the host can kill us if even this hangs
  stdout, stderr   the command's output: shown to people, never parsed
  exit.json        {"rc", "signal", "stalled", "timed_out", "quiet_s", "bound_s", "seconds",
                    "cpu_s", "read_bytes", "rchar", "idle_s", "io_visible", "not_found", "error",
                    "leftovers"}: `stalled` when it was killed for making no progress,
                    `timed_out` when the deadline ran out while it still made progress
The command finds DIR in $IMAGETEST_OUT and writes its own structured result there. Every
process it starts carries IMAGETEST_STEP=<step id> in its environment: when the command ends
or is killed, whatever it left running (a TensorBoard, a stray worker) is found by that mark
and killed too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

GRACE_S = 5.0
POLL_S = 0.5
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _write(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def _pids() -> list:
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != os.getpid()]


def marked_pids(mark: str) -> list:
    """Processes (of any user we may read) whose environment carries `mark`, except us."""
    found = []
    needle = mark.encode()
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


def _stat(pid: int) -> list:
    """Fields of /proc/PID/stat after the command name: state, ppid, pgrp, ... (field N of
    proc(5) is index N-3)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def group_members(pgid: int) -> list:
    """Live processes of process group `pgid`."""
    found = []
    for pid in _pids():
        fields = _stat(pid)
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            found.append(pid)
    return found


def _io(pid) -> dict:
    """/proc/PID/io as numbers ({} where the kernel does not let us read it)."""
    try:
        with open(f"/proc/{pid}/io") as fh:
            return {k.strip(): int(v) for k, v in (line.split(":", 1) for line in fh if ":" in line)}
    except (OSError, ValueError):
        return {}


# -- progress ------------------------------------------------------------------------------------


class Progress:
    """Whether a set of processes still does anything: CPU time (their own and their reaped
    children's), major page faults (a file read through mmap, as a library load is) and I/O
    (bytes read and written, through the page cache or from the disk). Counters only grow, so
    any growth, or a new process that has used any, is progress."""

    def __init__(self, now: float) -> None:
        self.seen = {}           # (pid, start time) -> last counters
        self.last_progress = now
        self.io_visible = False

    @staticmethod
    def counters(pid: int):
        fields = _stat(pid)
        if len(fields) < 20:
            return None
        cpu = sum(int(fields[i]) for i in (11, 12, 13, 14))        # utime stime cutime cstime
        faults = int(fields[9]) + int(fields[10])                   # majflt cmajflt
        io = _io(pid)
        return (fields[19], (cpu, faults, io.get("rchar", 0), io.get("wchar", 0), io.get("read_bytes", 0),
                             io.get("write_bytes", 0)), bool(io))

    def update(self, pids, now: float) -> bool:
        """Sample `pids`; True (and the clock reset) when anything grew since the last sample."""
        grew = False
        for pid in pids:
            sample = self.counters(pid)
            if sample is None:
                continue
            start, values, io_visible = sample
            self.io_visible = self.io_visible or io_visible
            before = self.seen.get((pid, start))
            if (before is None and any(values)) or (before is not None and values != before):
                grew = True
            self.seen[(pid, start)] = values
        if grew:
            self.last_progress = now
        return grew

    def idle_for(self, now: float) -> float:
        return now - self.last_progress


def own_io() -> dict:
    """Our own /proc/self/io: it includes every reaped descendant's I/O, so its growth across a
    probe is what the probe's processes read (os.times() does the same for CPU)."""
    return _io("self")


def totals(io_before: dict, times_before) -> dict:
    after, times = own_io(), os.times()
    return {"cpu_s": round((times.children_user - times_before.children_user)
                           + (times.children_system - times_before.children_system), 2),
            "read_bytes": after.get("read_bytes", 0) - io_before.get("read_bytes", 0),
            "rchar": after.get("rchar", 0) - io_before.get("rchar", 0)}


# -- killing -------------------------------------------------------------------------------------


def kill_all(mark: str, proc: subprocess.Popen) -> int:
    """SIGTERM the command's process group and everything marked, then SIGKILL what is left.
    Returns how many processes had to be killed besides the command itself."""
    pids = set(marked_pids(mark)) | set(group_members(proc.pid))
    pids.discard(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        if sig == signal.SIGTERM:
            end = time.monotonic() + GRACE_S
            while time.monotonic() < end and (proc.poll() is None or any(_alive(p) for p in pids)):
                time.sleep(0.1)
        left = {p for p in pids if _alive(p)} | set(marked_pids(mark)) | set(group_members(proc.pid))
        left.discard(proc.pid)
        if not left and proc.poll() is not None:
            break
    return len(pids)


# -- the two modes -------------------------------------------------------------------------------


def supervise(out_dir: str, bound: float, quiet: float, step: str, command: list) -> int:
    mark = "IMAGETEST_STEP=" + step
    env = dict(os.environ, IMAGETEST_OUT=out_dir, IMAGETEST_STEP=step)
    record = {"rc": None, "signal": None, "stalled": False, "timed_out": False, "quiet_s": quiet, "bound_s": bound,
              "seconds": 0.0, "cpu_s": 0.0, "read_bytes": 0, "rchar": 0, "idle_s": 0.0, "io_visible": False,
              "not_found": False, "error": "", "leftovers": 0}
    stopping = []

    def _stop(signum, frame):  # the host gave up on us: take the command down with us
        stopping.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    io_before, times_before = own_io(), os.times()
    started = time.monotonic()
    progress = Progress(started)
    with open(os.path.join(out_dir, "stdout"), "wb") as out, open(os.path.join(out_dir, "stderr"), "wb") as err:
        try:
            proc = subprocess.Popen(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, close_fds=True)
        except FileNotFoundError:
            path = os.environ.get("PATH", "")
            record.update(rc=127, not_found=True, error=f"{command[0]}: not found in the image (PATH={path})")
            _write(os.path.join(out_dir, "exit.json"), record)
            return 0
        except OSError as exc:
            record.update(rc=126, error=f"{command[0]} cannot be run: {type(exc).__name__}: {exc}")
            _write(os.path.join(out_dir, "exit.json"), record)
            return 0
        rc = None
        try:
            while rc is None:
                try:
                    rc = proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                progress.update({proc.pid, *group_members(proc.pid), *marked_pids(mark)}, now)
                if progress.idle_for(now) >= quiet:
                    record["stalled"] = True
                elif now - started >= bound:
                    record["timed_out"] = True
                else:
                    continue
                record["idle_s"] = round(progress.idle_for(now), 1)
                record["leftovers"] = kill_all(mark, proc)
                rc = proc.wait()
        except KeyboardInterrupt:
            record["error"] = "stopped by the host" if stopping else "interrupted"
            record["leftovers"] = kill_all(mark, proc)
            rc = proc.wait()
        else:
            if not (record["stalled"] or record["timed_out"]):
                leftover = marked_pids(mark) or group_members(proc.pid)
                record["leftovers"] = kill_all(mark, proc) if leftover else 0
    record.update(totals(io_before, times_before), seconds=round(time.monotonic() - started, 2), rc=rc,
                  signal=-rc if rc < 0 else None, io_visible=progress.io_visible)
    _write(os.path.join(out_dir, "exit.json"), record)
    return 0


def watch(out_dir: str, bound: float, quiet: float) -> int:
    """Watch the container's other processes; write exit.json once they have been quiet for
    `quiet` seconds (stalled) or `bound` has passed (timed_out). The host ends us otherwise."""
    _write(os.path.join(out_dir, "watcher.json"), {"pid": os.getpid()})
    started = time.monotonic()
    progress = Progress(started)
    while True:
        time.sleep(POLL_S)
        now = time.monotonic()
        others = [pid for pid in _pids() if _stat(pid)[1:2] != [str(os.getpid())]]
        progress.update(others, now)
        stalled, timed_out = progress.idle_for(now) >= quiet, now - started >= bound
        if stalled or timed_out:
            _write(os.path.join(out_dir, "exit.json"), {
                "stalled": stalled, "timed_out": timed_out and not stalled, "quiet_s": quiet, "bound_s": bound,
                "seconds": round(now - started, 2), "idle_s": round(progress.idle_for(now), 1),
                "io_visible": progress.io_visible})
            return 0


def main(argv: list) -> int:
    if argv[1] == "--watch":
        return watch(argv[2], float(argv[3]), float(argv[4]))
    out_dir, bound, quiet, step = argv[1], float(argv[2]), float(argv[3]), argv[4]
    _write(os.path.join(out_dir, "supervisor.json"), {"pid": os.getpid()})
    return supervise(out_dir, bound, quiet, step, argv[argv.index("--") + 1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
