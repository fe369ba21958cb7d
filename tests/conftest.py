"""Shared fixtures for the toolkit's own tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.cli import main

REPO = Path(__file__).resolve().parent.parent

# Tools the dev extra installs (shellcheck, check-jsonschema, hadolint) live beside the interpreter
# running the tests; `make test` runs `.venv/bin/python -m pytest` without activating the venv.
_BIN = str(Path(sys.executable).parent)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")


@pytest.fixture(scope="session", autouse=True)
def _private_config(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keys and caches the toolkit keeps per user (the local dev signing key, the collected-tests
    cache) go to this session's own folders: tests never touch the user's ~/.config or ~/.cache.
    Subprocesses inherit them."""
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("xdg-config"))
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    os.environ.pop("DL_IMAGES_SIGNING_KEY", None)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root (outside .git), to prove a failed command wrote nothing."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.parts}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the real project's matrix, templates, image tests and generated files, in a git repo."""
    root = tmp_path / "project"
    root.mkdir()
    for name in ("matrix.yaml", ".hadolint.yaml"):
        shutil.copy2(REPO / name, root / name)
    for folder in ("templates", "dockerfiles", "docs", ".github"):
        shutil.copytree(REPO / folder, root / folder)
    # Every test group a cell names must be a folder beside the matrix (checked when it loads).
    shutil.copytree(REPO / "image-tests", root / "image-tests", ignore=shutil.ignore_patterns("__pycache__"))
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-qm", "fixture"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, timeout=30)
    return root


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]):
    """Run `buildtool ARGS` in-process; returns (exit code, stdout, stderr)."""

    def _run(*args: str) -> tuple[int, str, str]:
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run
