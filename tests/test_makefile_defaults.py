"""The Makefile's settings as a user leaves them: unset, or set to an empty string (as `make X NIGHTLY_OUT=` or a
workflow's empty variable does), which must mean the default, not a path at the file system's root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NIGHTLY_STEPS = ("nightly-validate", "nightly-scaling", "nightly-report")


def _dry_run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`make -n ARGS`: what the recipes would run, without running them."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTLY_", "FRAMEWORK", "REGISTRY"))}
    return subprocess.run(["make", "-n", "--no-print-directory", *args, f"PYTHON={sys.executable}"], cwd=REPO,
                          env={**base, **(env or {})}, capture_output=True, text=True, timeout=60)


def test_an_empty_nightly_out_or_history_is_the_default_folder_not_the_root() -> None:
    """NIGHTLY_OUT= made "$(NIGHTLY_OUT)/scaling" "/scaling": the nightly removed and wrote /scaling, /verdicts and
    /history at the file system's root."""
    default = _dry_run(*NIGHTLY_STEPS)
    assert default.returncode == 0 and '"reports/nightly/scaling"' in default.stdout, default.stderr
    for empty in (["NIGHTLY_OUT=", "NIGHTLY_HISTORY="], ["NIGHTLY_OUT="]):
        assert _dry_run(*NIGHTLY_STEPS, *empty).stdout == default.stdout, empty
    from_env = _dry_run(*NIGHTLY_STEPS, env={"NIGHTLY_OUT": "", "NIGHTLY_HISTORY": ""})
    assert from_env.stdout == default.stdout
    assert '"/scaling"' not in from_env.stdout and 'history="/history"' not in from_env.stdout


def test_a_set_nightly_out_and_history_are_still_used() -> None:
    run = _dry_run(*NIGHTLY_STEPS, "NIGHTLY_OUT=/tmp/out", "NIGHTLY_HISTORY=/tmp/nights").stdout
    assert '--reports "/tmp/out/validate"' in run and '"/tmp/out/scaling"' in run and 'history="/tmp/nights"' in run
    assert '"/tmp/out/history"' not in run and 'if [ -d "/tmp/nights" ]' in run


def test_lint_runs_the_hadolint_of_a_python_found_on_path() -> None:
    """Without .venv, PYTHON is a name found on PATH (python3; the pull-request workflow's lint job, whose toolkit
    is pip-installed into the runner's Python): `$(dir python3)hadolint` was ./hadolint, which is not there, so
    `make lint` failed after ruff and mypy passed. It is the hadolint beside that Python's scripts now."""
    import sysconfig

    python = Path(sys.executable)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    run = subprocess.run(["make", "-n", "--no-print-directory", "lint", f"PYTHON={python.name}"], cwd=REPO,
                         env={**env, "PATH": f"{python.parent}:{env['PATH']}"}, capture_output=True, text=True,
                         timeout=60)
    [line] = [ln for ln in run.stdout.splitlines() if "--config .hadolint.yaml" in ln]
    assert f" {Path(sysconfig.get_path('scripts')) / 'hadolint'} --config" in line, line


def _report_night(tmp_path: Path, *settings: str):
    """`make nightly-report` in a folder of its own (the Makefile alone, as the nightly workflow's report step runs
    it), tonight's verdicts from the stand-in fetch."""
    import shutil

    from tests.nightly_fake import run_make
    from tests.test_report import last_night, write

    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    tonight = tmp_path / "tonight"
    if not tonight.exists():
        write(tonight, last_night())
    return run_make("nightly-report", tmp_path, tonight, "NIGHTLY_JAX_SCALING_CELL=", *settings, cwd=tmp_path)


def test_nightly_keep_of_no_whole_number_of_nights_is_refused_before_the_report(tmp_path: Path) -> None:
    """NIGHTLY_KEEP=0 made `head -n -0` list every night: tonight's was deleted with the rest, and the step still
    said "tonight's verdicts kept in ..."; a word or an empty value was head's error, and the history grew without
    bound. Now empty is the default (7), anything but a whole number >= 1 is refused before anything is written."""
    history = tmp_path / "reports" / "nightly" / "history"
    for keep in ("0", "seven", "-1"):
        night = _report_night(tmp_path, f"NIGHTLY_KEEP={keep}")
        assert night.code == 2 and night.calls == [], night.stderr
        assert f"error: NIGHTLY_KEEP={keep} is not a number of nights (1 or more)" in night.stderr
        assert not history.exists()
    for n in range(3):
        night = _report_night(tmp_path, "NIGHTLY_KEEP=", f"NIGHTLY_RUN_ID=run{n}")
        assert night.code == 0, night.stderr
    assert len(list(history.iterdir())) == 3
    night = _report_night(tmp_path, "NIGHTLY_KEEP=1", "NIGHTLY_RUN_ID=run9")
    assert night.code == 0 and [p.name.endswith("-run9") for p in history.iterdir()] == [True], night.stderr
