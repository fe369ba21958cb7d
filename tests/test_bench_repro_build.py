"""bench/repro_build.py's push of its two builds, on stand-ins for the engine and the registry: the tag it gives
each build for the push leaves the engine however the push ends."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def repro_build(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setattr(sys, "path", list(sys.path))   # the bench puts the repository and bench/ on sys.path
    from bench import repro_build as module

    return module


def test_a_failed_push_still_removes_the_push_tag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  repro_build: ModuleType) -> None:
    """Each build is tagged 127.0.0.1:5000/<ref> for the push and the tag was removed only after a push that
    succeeded; the clean-up's `rmi -f <ref>` removes the other tag alone, so a failed push left the image in the
    engine under the registry's name."""
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(repro_build.engine, "tag", lambda ref, target: calls.append(("tag", ref, target)))
    monkeypatch.setattr(repro_build.engine, "untag", lambda ref: calls.append(("untag", ref)))
    monkeypatch.setattr(repro_build, "git_full_revision", lambda root: "a" * 40)
    monkeypatch.setattr(repro_build.repro_config, "commit_time", lambda root, revision: 1700000000)

    def push_verified(ref: str, log: object, via: str) -> str:
        raise SystemExit(f"push of {ref} failed")

    monkeypatch.setattr(repro_build, "push_verified", push_verified)
    log = tmp_path / "1.log"
    log.write_text("#1 DONE 0.1s\n")
    with pytest.raises(SystemExit, match="push of 127.0.0.1:5000/repro-1/x:1 failed"):
        repro_build.push_both(["repro-1/x:1", "repro-1/x:2"], [log, log])
    assert calls == [("tag", "repro-1/x:1", "127.0.0.1:5000/repro-1/x:1"), ("untag", "127.0.0.1:5000/repro-1/x:1")]
