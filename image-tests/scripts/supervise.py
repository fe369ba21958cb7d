"""Run one probe inside the image under test, bounded in time, and record how it ended.

harness.py starts it as `python3 -I -S /imagetests/supervise.py DIR TIMEOUT STEP -- ARGV...`:
-I -S means no site, no sitecustomize, no PYTHON* variables, so nothing an image adds to
Python's start-up (a banner, a hook that sleeps) can delay or change the supervision itself.
Standard library only, and Python 3.8 syntax (images bring their own Python).

Writes into DIR (a host folder mounted into the container; the host reads it afterwards):
  supervisor.json  {"pid"} first thing, so the host can kill us if even this hangs
  stdout, stderr   the command's output: shown to people, never parsed
  exit.json        {"rc", "signal", "timed_out", "seconds", "not_found", "error", "leftovers"}
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


def _write(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def marked_pids(mark: str) -> list:
    """Processes (of any user we may read) whose environment carries `mark`, except us."""
    found = []
    needle = mark.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


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


def _stat(pid: int) -> list:
    """Fields of /proc/PID/stat after the command name: state, ppid, pgrp, ..."""
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
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            fields = _stat(int(entry))
            if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                found.append(int(entry))
    return found


def main(argv: list) -> int:
    out_dir, timeout, step = argv[1], float(argv[2]), argv[3]
    command = argv[argv.index("--") + 1:]
    _write(os.path.join(out_dir, "supervisor.json"), {"pid": os.getpid()})
    mark = "IMAGETEST_STEP=" + step
    env = dict(os.environ, IMAGETEST_OUT=out_dir, IMAGETEST_STEP=step)
    record = {"rc": None, "signal": None, "timed_out": False, "seconds": 0.0, "not_found": False,
              "error": "", "leftovers": 0}
    started = time.monotonic()
    stopping = []

    def _stop(signum, frame):  # the host gave up on us: take the command down with us
        stopping.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
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
        try:
            rc = proc.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            record["timed_out"] = not stopping
            record["error"] = "stopped by the host" if stopping else ""
            record["leftovers"] = kill_all(mark, proc)
            rc = proc.wait()
        else:
            leftover = marked_pids(mark) or group_members(proc.pid)
            record["leftovers"] = kill_all(mark, proc) if leftover else 0
    record["seconds"] = round(time.monotonic() - started, 2)
    record["rc"] = rc
    record["signal"] = -rc if rc < 0 else None
    _write(os.path.join(out_dir, "exit.json"), record)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
