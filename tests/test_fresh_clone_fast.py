"""`make test-fast` is hermetic: in a fresh clone of this checkout (HEAD, with the work tree's uncommitted changes
and new files committed on top), with a virtual environment holding only the toolkit and its `dev` extra (no
torch), it passes, and it leaves nothing behind: no new file in the clone (pytest's and Python's caches aside),
nothing in HOME, nothing in TMPDIR outside pytest's own folder.

It needs the package index (the venv install, with `-c requirements.lock`, through this host's pip settings and
pip's own cache), so it is marked `index`: `make test-fast` does not run it. `make test` runs test-fast's tests
only here (its own pytest selects the marked tests), so CI runs each test once, and the summary of this run is
printed at the end of `make test` (tests/conftest.py). It takes about as long as `make test-fast` plus a minute for
the install (with pip's cache warm)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SUMMARY_FILE

pytestmark = pytest.mark.index

# Where this user's pip reads its settings and keeps its cache (tests/conftest.py points XDG_CONFIG_HOME and
# XDG_CACHE_HOME at the session's own folders once the session starts; this module is imported before that).
_USER_XDG = {name: os.environ.get(name) for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME")}
# What pytest, xdist and make running this test put in the environment, which the clone's run must not inherit.
_INHERITED = re.compile(r"^(PYTEST_|PYTHONPATH$|VIRTUAL_ENV$|MAKEFLAGS$|MFLAGS$|MAKELEVEL$|COV_CORE_)")
# What a run may leave in the clone: what git ignores as caches.
_CACHES = re.compile(r"^(.*/)?(__pycache__|\.pytest_cache|[^/]+\.egg-info)/$")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not _INHERITED.match(k) and k not in _USER_XDG}
    env.update({k: v for k, v in _USER_XDG.items() if v is not None})
    env.update(extra)
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=120).stdout


def _commit_work_tree(clone: Path) -> None:
    """The checkout's uncommitted work (tracked changes, new files git does not ignore), committed in the clone:
    `make test` runs test-fast's tests only here, so they must see what is on disk, not only HEAD."""
    patch = subprocess.run(["git", "diff", "--binary", "HEAD"], cwd=REPO, capture_output=True, check=True,
                           timeout=120).stdout
    if patch:
        subprocess.run(["git", "apply", "--whitespace=nowarn"], input=patch, cwd=clone, capture_output=True,
                       check=True, timeout=120)
    for name in filter(None, _git("ls-files", "-z", "--others", "--exclude-standard", cwd=REPO).split("\0")):
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    if _git("status", "--porcelain", cwd=clone):
        _git("add", "-A", cwd=clone)
        _git("-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-qm", "uncommitted work", cwd=clone)


def test_make_test_fast_passes_in_a_fresh_clone_and_writes_nothing_outside_its_temp(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    clone, venv, home, tmp = tmp_path / "clone", tmp_path / "venv", tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    head = _git("rev-parse", "HEAD", cwd=REPO).strip()
    _git("clone", "-q", "--no-checkout", str(REPO), str(clone), cwd=tmp_path)
    _git("checkout", "-q", head, cwd=clone)
    _commit_work_tree(clone)
    before = _git("status", "--porcelain", "--ignored", cwd=clone)
    assert before == "", before

    made = _run([sys.executable, "-m", "venv", str(venv)], tmp_path, _env(), 300)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = _run([str(python), "-m", "pip", "install", "-q", "-c", "requirements.lock", "-e", ".[dev]"],
                     clone, _env(), 900)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    no_torch = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"
    torch = _run([str(python), "-c", no_torch], clone, _env(), 60)
    assert torch.returncode == 0, "torch is importable in a venv with only the dev extra: the run would not show " \
                                  "a test that needs host torch without its host_torch marker"

    # The Makefile's own target, so its marker list is what runs; HOME and TMPDIR fresh, to see what is left there.
    ran = _run(["make", "test-fast", f"PYTHON={python}"], clone, _env(HOME=str(home), TMPDIR=str(tmp)), 1500)
    summary = ran.stdout.strip().splitlines()[-1] if ran.stdout.strip() else ""
    assert ran.returncode == 0, ran.stdout[-6000:] + ran.stderr[-3000:]
    passed = re.search(r"\b(\d+) passed\b", summary)
    assert passed and int(passed.group(1)) > 0, summary
    assert not re.search(r"\b\d+ (failed|errors?)\b", summary), summary
    # The run's own figures, for tests/conftest.py to print at the end of `make test` (its tests ran only here).
    (tmp_path_factory.getbasetemp() / SUMMARY_FILE).write_text(f"make test-fast in a fresh copy: {summary}\n")

    left = _git("status", "--porcelain", "--ignored", cwd=clone).splitlines()
    written = [line for line in left if not (line.startswith("!! ") and _CACHES.match(line[3:]))]
    assert written == [], "make test-fast wrote into the clone:\n" + "\n".join(written)
    assert sorted(p.name for p in home.iterdir()) == [], "make test-fast wrote into HOME"
    assert [p.name for p in tmp.iterdir() if not p.name.startswith("pytest-of-")] == [], \
        "make test-fast left files in TMPDIR outside pytest's own folder"
