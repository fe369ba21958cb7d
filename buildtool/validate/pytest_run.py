"""Running the image tests: pytest in its own process group, streamed to a log, stopped at the image's
deadline as a backstop (SIGTERM, then SIGKILL), the probes' folder, and what a run that did not end
by itself means.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from buildtool.contracts.verdict import PROBES_DIR
from buildtool.validate.containers import Log

# The tests' probes stop this long before the image's deadline: removing containers and writing
# results fit in it, so a validation that hangs still ends by its deadline. pytest is stopped at
# the deadline itself (SIGTERM, as Ctrl-C), and killed if it still runs TEARDOWN_GRACE_S later.
RESERVE_S = 30
TEARDOWN_GRACE_S = 60


def _kill(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _stop_group(pgid: int, fired: list[bool] | None = None) -> None:
    """SIGTERM a process group (pytest tears its containers down on it); SIGKILL if it lingers."""
    if fired is not None:
        fired.append(True)
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    later = threading.Timer(TEARDOWN_GRACE_S, _kill, args=(pgid,))
    later.daemon = True
    later.start()


def _run_pytest(argv: list[str], cwd: Path, log_path: Path, timeout: float, log: Log,
                fired: list[bool] | None = None) -> int:
    """Run pytest, streaming its output to the log; stopped (whole group) after `timeout`."""
    with log_path.open("w") as sink:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        timer = threading.Timer(timeout, _stop_group, args=(proc.pid, fired))
        timer.daemon = True
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sink.write(line)
                log(line.rstrip("\n"))
            return proc.wait()
        except BaseException:
            # Ctrl-C reaches only us (pytest runs in its own session): let pytest tear down.
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            except BaseException:
                # A second interrupt while pytest tears down (CI's cancel sends SIGINT, then SIGTERM): pytest is
                # killed, never left running on its own to start containers after validate removed the run's.
                _kill(proc.pid)
                raise
            raise
        finally:
            timer.cancel()


def probes_dir(out_dir: Path, run_id: str) -> Path:
    """A fresh folder for this run's probe files; earlier runs' are dropped where we may (containers
    running as another user may have left files we cannot remove: those stay)."""
    root = out_dir / PROBES_DIR   # never read for verdicts (contracts.verdict.verdict_paths)
    if root.is_dir():
        for old in root.iterdir():
            if old.is_symlink() or not old.is_dir():
                old.unlink(missing_ok=True)
            else:
                shutil.rmtree(old, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    return root / run_id


def read_results(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The results file the image-tests plugin wrote, and "" (None and "" when it is missing or does not parse: the
    run wrote none); None and what is wrong, naming the file, when its JSON is not an object with a list of tests."""
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, ""
    if not isinstance(results, dict):
        return None, f"image-tests wrote {path}, a JSON {type(results).__name__}, not an object"
    tests = results.get("tests", [])
    if not isinstance(tests, list) or not all(isinstance(t, dict) for t in tests):
        return None, f"image-tests wrote {path} whose `tests` is not a list of objects"
    return results, ""


def deadline_problem(deadline_s: float, fired: bool, results: dict[str, Any] | None, rc: int) -> str:
    """What to say when the run did not end by itself ('' when it did)."""
    if fired:
        running = [t["id"] for t in (results or {}).get("tests", [])
                   if t.get("message", "").startswith("interrupted while running")]  # image-tests/conftest.py
        during = f" while {', '.join(running)} ran" if running else ""
        return (f"the image's validation deadline of {deadline_s:.0f}s ran out{during}; the tests were stopped "
                f"(raise validate.deadline_s in matrix.yaml only if the image is healthy but slow)")
    if results is None:
        return f"image-tests wrote no results (pytest exit {rc})"
    if results.get("interrupted"):
        return f"image-tests were interrupted ({results['interrupted']})"
    return ""
