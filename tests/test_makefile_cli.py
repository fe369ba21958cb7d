"""The Makefile's targets that call the CLI: bad input reaches the user as the CLI's one line and its exit code,
not as a traceback of a later step of the recipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _make(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_SMOKE_", "FRAMEWORK", "REGISTRY"))}
    return subprocess.run(["make", "-s", *args, f"PYTHON={sys.executable}"], cwd=REPO, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


def _own_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("make")]


def test_gpu_smoke_whose_plan_fails_says_the_plans_one_line() -> None:
    """gpu-smoke asks `plan --json` for the dev image: a plan that fails (a bad REGISTRY) stops it with the plan's
    one line and exit 2; its empty output went on to `json.load`, whose traceback followed."""
    proc = _make("gpu-smoke", REGISTRY="not a registry")
    lines = _own_lines(proc.stderr)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: REGISTRY="), proc.stderr
