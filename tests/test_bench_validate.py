"""bench/bench_validate.py's by-hand baseline (one `docker run` per check), on a stand-in docker client: a check
that fails is no figure to compare validate with."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def bench_validate(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The bench module; the folders it puts on sys.path (image-tests, tests/integration) are taken off again."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    from bench import bench_validate as module

    return module


def _client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    calls = tmp_path / "calls"
    docker = tmp_path / "docker"
    docker.write_text(f'#!/bin/bash\necho "$*" >> {calls}\n{body}\n')
    docker.chmod(0o755)
    monkeypatch.setenv("DOCKER_CLIENT", str(docker))
    return calls


def test_a_by_hand_check_that_fails_stops_the_bench_instead_of_timing_its_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bench_validate: ModuleType) -> None:
    """Each `docker run` of the baseline ran with check=False and nothing read its exit status: an image the
    engine does not have, or a probe that failed at once, made a baseline of a few milliseconds, printed beside
    validate's time as "the same probes, one docker run each"."""
    calls = _client(tmp_path, monkeypatch, 'echo "Unable to find image \'img:1\' locally" >&2\nexit 125')
    with pytest.raises(SystemExit) as stopped:
        bench_validate.manual_baseline("img:1", "pytorch", [])
    assert str(stopped.value).startswith("bench: the by-hand contents check failed in img:1 (exit 125) after "), \
        stopped.value
    assert str(stopped.value).endswith(": Unable to find image 'img:1' locally; no baseline is printed")
    assert len(calls.read_text().splitlines()) == 1


def test_by_hand_checks_that_pass_are_each_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 bench_validate: ModuleType) -> None:
    calls = _client(tmp_path, monkeypatch, "exit 0")
    total, split = bench_validate.manual_baseline("img:1", "tensorflow", ["--shm-size=1g"])
    assert list(split) == ["contents", "shm", "tensorboard"] and total == pytest.approx(sum(split.values()))
    assert all(line.startswith("run --rm --network host --shm-size=1g -v ") for line in calls.read_text().splitlines())
