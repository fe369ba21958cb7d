"""bench/bench_push.py on a stand-in docker client: what an arm puts into the engine, it takes out however its push
ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def bench_push(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setattr(sys, "path", list(sys.path))   # the bench puts the repository on sys.path
    from bench import bench_push as module

    return module


def test_a_failed_engine_push_still_removes_its_tag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     bench_push: ModuleType) -> None:
    """The engine arm tags the image for the throwaway registry and removed the tag only after a push that
    succeeded: a failed `docker push` left 127.0.0.1:5055/bench/push:engine-1 in the engine."""
    calls = tmp_path / "calls"
    docker = tmp_path / "docker"
    docker.write_text(f'#!/bin/bash\necho "$*" >> {calls}\n[[ $1 == push ]] && exit 1\nexit 0\n')
    docker.chmod(0o755)
    monkeypatch.setenv("DOCKER_CLIENT", str(docker))
    with pytest.raises(subprocess.CalledProcessError):
        bench_push.push("engine", "img:1", "bench/push", "engine-1")
    assert calls.read_text().splitlines() == ["tag img:1 127.0.0.1:5055/bench/push:engine-1",
                                              "push 127.0.0.1:5055/bench/push:engine-1",
                                              "rmi 127.0.0.1:5055/bench/push:engine-1"]
