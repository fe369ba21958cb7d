"""bench/bench_release.py writes images into the shared registry under a t-bench-* prefix of its own: what it made
is untagged however the run ends (no registry here: the writes and the clean-up are stand-ins)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def bench_release(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setattr(sys, "path", list(sys.path))
    from bench import bench_release as module

    return module


def test_a_run_that_fails_still_cleans_up_what_it_pushed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         bench_release: ModuleType) -> None:
    """cleanup() ran only after every round had passed: a command that failed (SystemExit), an image that failed
    half-way or a Ctrl-C left the bench's repositories in the registry. The repository is counted before its first
    write now, and the clean-up runs on every way out."""
    def project(work: Path, keys: str) -> Path:
        folder = work / "project"
        folder.mkdir()
        (folder / "f").write_text("x")
        commit = ["-c", "user.email=b@e", "-c", "user.name=b", "commit", "-qm", "b"]
        for args in (["init", "-q"], ["add", "-A"], commit):
            subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)
        return folder

    def half_made_image(client: object, cell: object, repo: str, *rest: object) -> str:
        raise SystemExit(f"pushing {repo} failed half-way")

    cleaned: list[str] = []
    monkeypatch.setattr(bench_release, "make_project", project)
    monkeypatch.setattr(bench_release, "image_tests_hash", lambda folder: "sha256:" + "0" * 64)
    monkeypatch.setattr(bench_release, "make_image", half_made_image)
    monkeypatch.setattr(bench_release, "cleanup", lambda client, repos: cleaned.extend(repos))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))   # main() sets it for the commands it runs
    monkeypatch.setattr(sys, "argv", ["bench_release.py", "--registry", "127.0.0.1:9"])
    with pytest.raises(SystemExit, match="pushing t-bench-[0-9a-f]{8}/.* failed half-way") as stopped:
        bench_release.main()
    repo = str(stopped.value).split()[1]
    assert cleaned == [repo], cleaned
