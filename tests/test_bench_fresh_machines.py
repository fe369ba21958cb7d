"""bench/bench_fresh_machines.py's "before" recipe (debootstrap, tar | docker import, docker push) on stand-in
tools: a step that fails is no figure."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest


@pytest.fixture
def bench_fresh_machines(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setattr(sys, "path", list(sys.path))   # the bench puts the repository on sys.path
    from bench import bench_fresh_machines as module

    return module


def _tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tar_exit: int) -> Path:
    calls = tmp_path / "calls"
    tools = tmp_path / "bin"
    tools.mkdir()
    scripts = {"debootstrap": 'mkdir -p "$3"',
               "tar": f"printf 'part of a root file system'\necho 'tar: ./usr: Cannot open' >&2\nexit {tar_exit}",
               "docker": '[[ $1 == import ]] && cat > /dev/null\nexit 0'}
    for name, body in scripts.items():
        (tools / name).write_text(f'#!/bin/bash\necho "{name} $*" >> {calls}\n{body}\n')
        (tools / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.setenv("DOCKER_CLIENT", str(tools / "docker"))
    return calls


def _machine() -> SimpleNamespace:
    return SimpleNamespace(name="a", registry="127.0.0.1:1", env=lambda: dict(os.environ),
                           manifest_digest=lambda repo, ref: "sha256:" + "0" * 64)


def test_a_tar_that_fails_stops_the_before_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  bench_fresh_machines: ModuleType) -> None:
    """tar's exit status was never read: a tar that failed half-way still streamed a partial root into
    `docker import`, and the push of that partial base was timed as the before recipe."""
    calls = _tools(tmp_path, monkeypatch, tar_exit=2)
    with pytest.raises(SystemExit, match=r"^machine a: tar of the debootstrap root failed \(exit 2\); the before "):
        bench_fresh_machines.before_recipe(_machine())
    assert not any(line.startswith("docker push") for line in calls.read_text().splitlines())


def test_the_before_recipe_is_timed_when_every_step_succeeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             bench_fresh_machines: ModuleType) -> None:
    calls = _tools(tmp_path, monkeypatch, tar_exit=0)
    seconds, digest = bench_fresh_machines.before_recipe(_machine())
    assert seconds >= 0 and digest == "sha256:" + "0" * 64
    ran = [" ".join(line.split()[:2]) for line in calls.read_text().splitlines()]
    # tar and docker import run at once (a pipe): which logs first is the scheduler's
    assert ran[0] == "debootstrap --variant=minbase" and ran[-1] == "docker push", ran
    assert sorted(ran[1:3]) == ["docker import", "tar --numeric-owner"], ran
