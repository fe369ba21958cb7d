"""bench/bench_matrix.py's timing of whole processes, on stand-in processes: a run that ends otherwise than the
case expects is no figure."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def bench_matrix(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setattr(sys, "path", list(sys.path))
    from bench import bench_matrix as module

    return module


def test_a_previous_loader_that_fails_stops_the_bench(tmp_path: Path, bench_matrix: ModuleType) -> None:
    """The previous loader's exit code was read only as "stopped or not": one that failed at once (no PyYAML, a
    file it could not read) was timed as a parse, and its few milliseconds printed as the ratio's baseline."""
    failing = [sys.executable, "-c", "import sys; sys.exit('ModuleNotFoundError: No module named yaml')"]
    with pytest.raises(SystemExit, match=r"ended with exit 1 \(expected exit 0 or stopped\): ModuleNotFoundError: "
                                         r"No module named yaml; no figure is printed"):
        bench_matrix.median_run(failing, 2, 30.0, tmp_path, (0, None))


def test_one_failed_run_among_several_stops_the_bench(tmp_path: Path, bench_matrix: ModuleType) -> None:
    """Only the last run's exit code was compared with the expected one: a first run that crashed (exit 1, a
    traceback) went into the median unflagged when the last one answered as expected."""
    marker = tmp_path / "ran-once"
    flaky = [sys.executable, "-c", f"import pathlib, sys\np = pathlib.Path({str(marker)!r})\n"
                                   "first = not p.exists()\np.touch()\nsys.exit('Traceback' if first else 2)"]
    with pytest.raises(SystemExit, match=r"ended with exit 1 \(expected exit 2\): Traceback"):
        bench_matrix.median_run(flaky, 3, 30.0, tmp_path, (2,))


def test_runs_that_end_as_expected_are_timed(tmp_path: Path, bench_matrix: ModuleType) -> None:
    wall, cpu, code = bench_matrix.median_run([sys.executable, "-c", "raise SystemExit(2)"], 2, 30.0, tmp_path, (2,))
    assert code == 2 and wall > 0 and cpu >= 0
