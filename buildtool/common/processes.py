"""Whether a process of this machine still runs: the owners of locks and networks are named host:pid."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while `pid` exists, also when it belongs to another user (signal 0 is then refused, not unknown); False
    for a pid past what the system's pid type holds (read from a lock or label: no process has it)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True
