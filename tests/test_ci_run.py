""".ci/run, CI's entry point, in a copy of the repository with a stand-in scripts/setup-tests.sh and `make` first on
PATH: a step that fails is CI's failure (its exit status, no "ci: done")."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_ci(tmp_path: Path, setup_exit: int, make_exit: int, setup_body: str = "",
           stand_ins: dict[str, str] | None = None) -> tuple[int, str, list[str]]:
    """SETUP_BODY: run by the stand-in set-up before it exits; STAND_INS: more commands first on PATH (bodies)."""
    root, stubs, calls = tmp_path / "repo", tmp_path / "bin", tmp_path / "calls"
    (root / ".ci").mkdir(parents=True)
    (root / "scripts").mkdir()
    stubs.mkdir()
    shutil.copy(REPO / ".ci/run", root / ".ci/run")
    (root / "scripts/setup-tests.sh").write_text(f'echo "setup-tests" >> {calls}\n{setup_body}\nexit {setup_exit}\n')
    for name, body in {"make": f'echo "make $*" >> {calls}\nexit {make_exit}', **(stand_ins or {})}.items():
        (stubs / name).write_text(f"#!/bin/bash\n{body}\n")
        (stubs / name).chmod(0o755)
    log = tmp_path / "log"
    with log.open("w") as output:   # a file, not a pipe: the disk sampler's `sleep` may outlive the script briefly
        proc = subprocess.run(["bash", str(root / ".ci/run")], stdout=output, stderr=subprocess.STDOUT, timeout=60,
                              env={**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"})
    return proc.returncode, log.read_text(), calls.read_text().splitlines() if calls.exists() else []


def test_a_failed_set_up_fails_ci_and_runs_no_tests(tmp_path: Path) -> None:
    """`set -e` does not stop at a failed command before `&&`: a failed scripts/setup-tests.sh went on to
    "ci: done" and exit 0, so CI passed without running a test."""
    code, log, calls = run_ci(tmp_path, setup_exit=3, make_exit=0)
    assert code == 3 and "ci: done" not in log, log
    assert "ci: scripts/setup-tests.sh failed (exit 3)" in log and calls == ["setup-tests"]


@pytest.mark.parametrize(("make_exit", "expected"), [(0, 0), (2, 2)])
def test_after_the_set_up_ci_is_the_tests_exit_status(tmp_path: Path, make_exit: int, expected: int) -> None:
    code, log, calls = run_ci(tmp_path, setup_exit=0, make_exit=make_exit)
    assert code == expected and calls == ["setup-tests", "make check lint test"], log
    assert ("ci: done" in log) == (expected == 0), log



def _disk_falling_after(tmp_path: Path, setup: str) -> tuple[int, str]:
    """CI with 50 GB free at the start; the set-up runs SETUP, then the disk falls to 40 GB for a second (the
    sampler samples every 0.05 s)."""
    free, sleep = tmp_path / "free-mb", shutil.which("sleep")
    free.write_text(f"{50 * 1024}\n")
    body = f"{setup}\necho {40 * 1024} > {free}\n{sleep} 1\necho {45 * 1024} > {free}\n{sleep} 0.5"
    code, log, _ = run_ci(tmp_path, setup_exit=0, make_exit=0, setup_body=body,
                          stand_ins={"df": f"echo Avail; cat {free}", "sleep": f"exec {sleep} 0.05"})
    [line] = [line for line in log.splitlines() if line.startswith("ci: disk:")]
    return code, line


def test_a_disk_sampler_that_cannot_write_goes_on_and_the_report_says_so(tmp_path: Path) -> None:
    """The sampler ran under `set -e` and wrote its lowest figure only when it fell: a failed write (ENOSPC, what it
    is there for) left .state/disk-free-lowest stale (a failed mv ended the sampler), and the report printed the
    stale figure as the lowest without a word."""
    code, line = _disk_falling_after(tmp_path, "ln -s /dev/full .state/disk-free-lowest.new")   # writes: ENOSPC
    assert code == 0 and line == ("ci: disk: 50 GB free at the start, 50 GB at the lowest (sampling failed: could "
                                  "not write .state/disk-free-lowest, a full disk?; it may have been lower)"), line


def test_a_figure_the_sampler_could_not_write_is_written_once_the_disk_has_room(tmp_path: Path) -> None:
    sleep = shutil.which("sleep")
    full_for_a_while = f"ln -s /dev/full .state/disk-free-lowest.new\n({sleep} 1.2; rm .state/disk-free-lowest.new) &"
    code, line = _disk_falling_after(tmp_path, full_for_a_while)
    assert code == 0 and line == "ci: disk: 50 GB free at the start, 40 GB at the lowest", line
