""".ci/run, CI's entry point, in a copy of the repository with a stand-in scripts/setup-tests.sh and `make` first on
PATH: a step that fails is CI's failure (its exit status, no "ci: done")."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_ci(tmp_path: Path, setup_exit: int, make_exit: int) -> tuple[int, str, list[str]]:
    root, stubs, calls = tmp_path / "repo", tmp_path / "bin", tmp_path / "calls"
    (root / ".ci").mkdir(parents=True)
    (root / "scripts").mkdir()
    stubs.mkdir()
    shutil.copy(REPO / ".ci/run", root / ".ci/run")
    (root / "scripts/setup-tests.sh").write_text(f'echo "setup-tests" >> {calls}\nexit {setup_exit}\n')
    (stubs / "make").write_text(f'#!/bin/bash\necho "make $*" >> {calls}\nexit {make_exit}\n')
    (stubs / "make").chmod(0o755)
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
