"""The helpers that `make test`'s fresh-clone run rests on, tested on their own: tests/test_fresh_clone_fast.py's
`_commit_work_tree` (the checkout's uncommitted work, committed in a clone) and tests/conftest.py's
`pytest_terminal_summary` (which prints that run's summary at the end of `make test`). That run itself needs the
package index and takes many minutes; these need only git."""

from __future__ import annotations

import subprocess
import types
from pathlib import Path

import pytest

import tests.test_fresh_clone_fast as fresh
from tests.conftest import SUMMARY_FILE, pytest_terminal_summary


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.email=t@example.org", "-c", "user.name=t", *args], cwd=cwd,
                          capture_output=True, text=True, check=True, timeout=60).stdout


def test_commit_work_tree_makes_the_clone_what_the_work_tree_holds(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """_commit_work_tree had no test of its own: an edit, a new file or a deletion it dropped would have made
    `make test` test HEAD instead of what is on disk, and nothing would have said so."""
    work, clone = tmp_path / "work", tmp_path / "clone"
    work.mkdir()
    _git("init", "-q", cwd=work)
    (work / ".gitignore").write_text("*.log\n")
    for name in ("kept.txt", "edited.txt", "gone.txt"):
        (work / name).write_text(f"{name}\n")
    _git("add", "-A", cwd=work)
    _git("commit", "-qm", "first", cwd=work)
    (work / "edited.txt").write_text("edited.txt, changed\n")
    (work / "sub").mkdir()
    (work / "sub" / "new.txt").write_text("new\n")
    (work / "gone.txt").unlink()
    (work / "debug.log").write_text("ignored\n")
    _git("clone", "-q", str(work), str(clone), cwd=tmp_path)
    monkeypatch.setattr(fresh, "REPO", work)

    fresh._commit_work_tree(clone)

    assert _git("status", "--porcelain", "--untracked-files=all", cwd=clone) == ""
    # The clone's HEAD against the checkout's files: the same, tracked and new alike.
    assert _git(f"--git-dir={clone / '.git'}", f"--work-tree={work}", "diff", "--stat", "HEAD", cwd=tmp_path) == ""
    assert _git(f"--git-dir={clone / '.git'}", f"--work-tree={work}", "status", "--porcelain", cwd=tmp_path) == ""
    assert (clone / "sub" / "new.txt").read_text() == "new\n"
    assert (clone / "edited.txt").read_text() == "edited.txt, changed\n"
    assert not (clone / "gone.txt").exists() and not (clone / "debug.log").exists()


class _Terminal:
    def __init__(self) -> None:
        self.written: list[str] = []

    def write_line(self, line: str, **_: object) -> None:
        self.written.append(line + "\n")

    def write(self, text: str, **_: object) -> None:
        self.written.append(text)


def _config(base: Path) -> object:
    return types.SimpleNamespace(_tmp_path_factory=types.SimpleNamespace(getbasetemp=lambda: base))


@pytest.mark.parametrize("where", [".", "popen-gw3"], ids=["this-process", "an-xdist-worker"])
def test_the_terminal_summary_prints_the_fresh_clone_summary_when_there_is_one(tmp_path: Path, where: str) -> None:
    """pytest_terminal_summary had no test of its own: a summary it missed (in the session's base temp folder, or in
    an xdist worker's below it) would have dropped the fresh-clone run's figures from the end of `make test`."""
    # A base two folders below tmp_path: this session's own hook looks one folder below its base temp folder (which
    # holds tmp_path), and must not print this test's made-up summary at the end of the run.
    base = tmp_path / "session" / "base"
    (base / where).mkdir(parents=True)
    terminal = _Terminal()
    pytest_terminal_summary(terminal, _config(base))  # type: ignore[arg-type]
    assert terminal.written == []          # no summary file: nothing printed

    (base / where / SUMMARY_FILE).write_text("make test-fast in a fresh copy: 1234 passed in 5.00s\n")
    pytest_terminal_summary(terminal, _config(base))  # type: ignore[arg-type]
    assert terminal.written == ["make test-fast in a fresh copy: 1234 passed in 5.00s\n"]
