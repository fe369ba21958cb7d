"""Which image-tests code a verdict may have run is computed from git (issue 20, hole 6)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from buildtool.common.errors import UserError
from buildtool.release.testcode import known_code
from buildtool.validate.collect import image_tests_hash


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.email=t@e", "-c", "user.name=t", *args], check=True,
                          capture_output=True, text=True, timeout=30).stdout.strip()


def two_commits(root: Path) -> tuple[Path, str, str, str, str]:
    """image-tests/ committed twice (test_a, then test_b added): (folder, first commit, its hash, HEAD, its hash)."""
    git(root, "init", "-q")
    tests = root / "image-tests"
    (tests / "common").mkdir(parents=True)
    (tests / "common/test_a.py").write_text("def test_a():\n    pass\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "one")
    first, one = git(root, "rev-parse", "HEAD"), image_tests_hash(tests)
    (tests / "common/test_b.py").write_text("def test_b():\n    pass\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "two")
    return tests, first, one, git(root, "rev-parse", "HEAD"), image_tests_hash(tests)


def test_hashes_are_image_tests_as_committed_at_each_revision(tmp_path: Path) -> None:
    tests, full, one, _, two = two_commits(tmp_path)
    first = full[:12]
    (tests / "common/test_a.py").write_text("def test_a():\n    assert True  # not committed\n")
    edited = image_tests_hash(tests)
    (tests / "common/__pycache__").mkdir()
    known = known_code(tmp_path, [("the image's revision", first), ("the release commit", "HEAD"),
                                  ("a name", "nightly-42")])
    assert set(known.codes) == {one, two} and edited not in known.codes
    assert known.codes[one][0] == f"image-tests at the image's revision {first}"
    assert image_tests_hash(known.codes[two][1]) == two              # collected from what was hashed
    assert "a name nightly-42: not a commit of this clone" in known.describe()
    dirty = known_code(tmp_path, [("the image's revision", f"{first}-dirty.0a1b2c3d")])
    assert set(dirty.codes) == {one}                                   # the commit part of a dirty revision


def test_a_folder_that_is_not_a_git_checkout_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is not a git checkout"):
        known_code(tmp_path, [("the release commit", "HEAD")])


def test_the_code_book_reads_each_revision_once_and_names_the_signed_one(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """One rule for release and verify (testcode.CodeBook): image-tests at the revision an image's signed provenance
    names, or at the release commit (HEAD); each revision read from git once however many images ask, from any
    thread; an image with no valid provenance is judged by the release commit alone, which the refusal says."""
    from concurrent.futures import ThreadPoolExecutor

    from buildtool.release import testcode

    _, first, one, head, two = two_commits(tmp_path)
    reads: list[str] = []
    real = testcode._read_revision
    monkeypatch.setattr(testcode, "_read_revision", lambda root, workdir, known, label, revision, *rest: (
        reads.append(revision), real(root, workdir, known, label, revision, *rest))[1])
    book = testcode.CodeBook(tmp_path)
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(book.at, [first] * 20))
    assert sorted(reads) == sorted([first, "HEAD"])                       # once each, for 20 images
    assert all(set(a.codes) == {one, two} for a in answers)
    assert answers[0].codes[one][0] == f"image-tests at the image's revision {first[:12]}"
    assert answers[0].describe() == f"the image's revision {first[:12]}: {one}; the release commit {head[:12]}: {two}"
    unsigned = book.at(None)
    assert set(unsigned.codes) == {two} and reads.count("HEAD") == 1
    assert unsigned.describe() == (f"the image's revision: none (no valid provenance names one); the release commit "
                                   f"{head[:12]}: {two}")
