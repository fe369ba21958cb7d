"""What a build run tells the person watching it: per cell, its state, elapsed time and the
BuildKit step it is on. The builder reports to a `Progress`; the CLI decides how to show it
(a live table on a terminal, one line per change in a CI log)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

# BuildKit's plain progress: `#7 [stage 3/8] RUN apt-get update ...` or `#7 [3/8] RUN ...`.
_STEP_RE = re.compile(r"^#\d+ \[(?:[^\]]*?\s)?(\d+/\d+)\] (.+)$")


class Progress(Protocol):
    def update(self, cell: str, state: str, step: str = "") -> None:
        """`state`: queued, checking, building, pushing, or the final result (built, failed, ...)."""


def latest_step(log_path: Path, tail_bytes: int = 65536) -> str:
    """The last BuildKit step a build log shows, as `3/8 RUN apt-get ...`; '' when none yet."""
    try:
        with log_path.open("rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - tail_bytes))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    steps = [match for line in text.splitlines() if (match := _STEP_RE.match(line.strip()))]
    return f"{steps[-1].group(1)} {steps[-1].group(2)}" if steps else ""


class LogProgress:
    """One line per change of state or step, for logs and pipes (stderr)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self._last: dict[str, tuple[str, str]] = {}
        self._started: dict[str, float] = {}
        self._lock = threading.Lock()

    def update(self, cell: str, state: str, step: str = "") -> None:
        with self._lock:
            self._started.setdefault(cell, time.monotonic())
            if self._last.get(cell) == (state, step):
                return
            self._last[cell] = (state, step)
            elapsed = time.monotonic() - self._started[cell]
        self.log(f"[{cell}] {elapsed:5.0f}s {state}" + (f": {step[:150]}" if step else ""))


class StepWatcher:
    """Reads the logs of running builds every `every` seconds and reports each new step."""

    def __init__(self, progress: Progress, every: float = 1.0,
                 scrub: Callable[[str], str] = lambda line: line) -> None:
        self.progress, self.every, self.scrub = progress, every, scrub
        self._watched: dict[str, Path] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def watch(self, cell: str, log_path: Path) -> None:
        with self._lock:
            self._watched[cell] = log_path

    def unwatch(self, cell: str) -> None:
        with self._lock:
            self._watched.pop(cell, None)

    def __enter__(self) -> StepWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            with self._lock:
                watched = list(self._watched.items())
            for cell, path in watched:
                step = latest_step(path)
                if step:
                    self.progress.update(cell, "building", self.scrub(step))
