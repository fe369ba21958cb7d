"""validate interrupted while pytest runs (Ctrl-C, CI cancelling the job): pytest, in its own session, is stopped
and never left running on its own with the run's containers, however many interrupts come."""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from buildtool.validate import pytest_run


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_second_interrupt_while_pytest_tears_down_still_stops_it(tmp_path: Path) -> None:
    """CI's cancel sends SIGINT, then SIGTERM seconds later (validate turns it into the same interrupt); before, the
    second one, arriving while validate waited up to 120 s for pytest's teardown, ended validate at once and left
    pytest running (never killed), free to start containers after validate removed the run's."""
    pid_file = tmp_path / "pid"
    # A pytest whose teardown hangs: it ignores SIGTERM.
    script = (f"import os, signal, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
              "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)")

    def log(line: str) -> None:
        if line == "ready":
            threading.Timer(0.5, _thread.interrupt_main).start()   # the second interrupt, during the teardown wait
            raise KeyboardInterrupt("signal 2")

    pid = 0
    try:
        with pytest.raises(KeyboardInterrupt):
            pytest_run._run_pytest([sys.executable, "-c", script], tmp_path, tmp_path / "log", 60, log)
        pid = int(pid_file.read_text())
        for _ in range(50):
            if not _alive(pid):
                break
            time.sleep(0.1)
        assert not _alive(pid), "pytest was left running after validate ended"
    finally:
        if pid and _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
