"""git as CI and other users' machines leave it: a clone owned by another user (git's safe.directory refusal), a
shallow clone (what CI checkouts fetch by default), a release machine with core.autocrlf. Each answer is one line
naming what to do, never a misleading cause or a silent wrong answer. Real git in tmp folders."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from buildtool.common.errors import UserError
from buildtool.release import ancestry, testcode

DUBIOUS = "GIT_TEST_ASSUME_DIFFERENT_OWNER"    # git's own switch: every repository reads as another user's


@pytest.fixture(autouse=True)
def _own_git_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No machine's own git config (a global safe.directory=*, core.autocrlf) takes part."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


def repository(root: Path, commits: int = 3) -> list[str]:
    """A repository with image-tests/ and a matrix, `commits` commits; their shas, the oldest first."""
    root.mkdir()
    git(root, "init", "-q")
    git(root, "config", "user.email", "t@example.com")
    git(root, "config", "user.name", "t")
    (root / "image-tests").mkdir()
    (root / "image-tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    shas = []
    for n in range(commits):
        (root / "matrix.yaml").write_text(f"n: {n}\n")
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", f"commit {n}")
        shas.append(git(root, "rev-parse", "HEAD"))
    return shas


def test_a_clone_git_refuses_as_another_users_is_named_with_safe_directory_not_as_no_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "repo"
    shas = repository(root)
    monkeypatch.setenv(DUBIOUS, "1")
    fix = f"git config --global --add safe.directory {root}"
    why = ancestry.revision_problem(root, shas[0])
    assert why == (f"git refuses to read {root}: it is owned by another user (detected dubious ownership); run as "
                   f"its owner, or trust it: {fix}")
    with pytest.raises(UserError) as caught:
        testcode.CodeBook(root)
    assert str(caught.value) == why
    assert "\n" not in why


def test_a_clone_git_refuses_is_named_by_the_revision_readers_not_taken_for_a_revision_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from buildtool.matrix.plan import full_revision, git_revision, resolve_revision

    root = tmp_path / "repo"
    shas = repository(root)
    branch = git(root, "symbolic-ref", "--short", "HEAD")
    assert resolve_revision(root, branch, git_revision) == shas[-1][:12]
    monkeypatch.setenv(DUBIOUS, "1")
    why = (f"git refuses to read {root}: it is owned by another user (detected dubious ownership); run as its owner, "
           f"or trust it: git config --global --add safe.directory {root}")
    for read in (lambda: git_revision(root), lambda: resolve_revision(root, branch, git_revision, option="--from"),
                 lambda: full_revision(root, shas[0][:12])):
        with pytest.raises(UserError) as caught:
            read()
        assert str(caught.value) == why


def shallow_clone(tmp_path: Path) -> tuple[Path, list[str]]:
    """A clone of the newest commit only (`git clone --depth 1`, what CI checkouts make), and the origin's shas."""
    shas = repository(tmp_path / "origin")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{tmp_path / 'origin'}", str(clone)], check=True,
                   capture_output=True, timeout=60)
    return clone, shas


def test_an_older_revision_in_a_shallow_clone_says_fetch_the_history(tmp_path: Path) -> None:
    clone, shas = shallow_clone(tmp_path)
    fix = f"({clone} is a shallow clone, which holds only the newest commits; fetch the history: git fetch --unshallow)"
    assert ancestry.revision_problem(clone, shas[0]) == (
        f"the provenance's revision {shas[0]} is not a commit git knows in {clone}; fetch it, or release from the "
        f"clone that holds it {fix}")
    known = testcode.known_code(clone, [("the image's revision", shas[0])])
    assert known.looked_at == [f"the image's revision {shas[0]}: not a commit of this clone {fix}"]


def test_a_commit_fetched_alone_into_a_shallow_clone_is_not_called_no_ancestor(tmp_path: Path) -> None:
    """`git fetch --depth 1 origin <sha>` (how CI fetches one revision) makes the commit known, its history not:
    merge-base --is-ancestor says no, which is no answer there; an ancestor is never called 'neither'."""
    clone, shas = shallow_clone(tmp_path)
    git(clone, "fetch", "-q", "--depth", "1", "origin", shas[0])
    why = ancestry.revision_problem(clone, shas[0])
    assert why == (f"whether the provenance's revision {shas[0][:12]} is an ancestor of the release commit "
                   f"{shas[-1][:12]} cannot be told ({clone} is a shallow clone, which holds only the newest "
                   "commits; fetch the history: git fetch --unshallow)")
    git(clone, "fetch", "-q", "--unshallow")
    assert ancestry.revision_problem(clone, shas[0]) == ""


def test_the_release_machines_core_autocrlf_does_not_change_the_image_tests_hash(tmp_path: Path) -> None:
    """validate hashes image-tests as a runner's checkout holds them (LF, as committed); release hashes them from
    git. A release machine with core.autocrlf=true (git's default on Windows) made `git archive` write CRLF: every
    verdict's test code was 'neither image-tests at the image's revision nor at the release commit'."""
    from buildtool.validate.collect import image_tests_hash

    root = tmp_path / "repo"
    repository(root)
    ran = image_tests_hash(root / "image-tests")
    git(root, "config", "core.autocrlf", "true")
    known = testcode.known_code(root, [("the release commit", "HEAD")])
    assert list(known.codes) == [ran]
