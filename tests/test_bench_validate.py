"""bench/bench_validate.py's by-hand baseline (one `docker run` per check) on a stand-in docker client, and its
whole `buildtool validate` processes on a stand-in process: a check that fails, or a validate that gives no
verdict, is no figure."""

from __future__ import annotations

import subprocess
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


def test_a_validate_process_with_no_verdict_stops_the_bench(monkeypatch: pytest.MonkeyPatch,
                                                            bench_validate: ModuleType) -> None:
    """`--jobs` and `--images` timed every `buildtool validate` process: one that gave no verdict (an image the
    registry does not hold, exit 2 in a second) went into the medians and the ratio, its result only shown as
    "exit 2: [...]" on its own line."""
    def validate(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 2, "", "error: img:1: no such image in the registry\n")

    monkeypatch.setattr(bench_validate.subprocess, "run", validate)
    with pytest.raises(SystemExit, match=r"^bench: buildtool validate img:1 --jobs 2 gave no verdict \(exit 2\) "
                                         r"after .* s: error: img:1: no such image in the registry; no figure"):
        bench_validate.validate_process("img:1", 2, "/nonexistent")


def test_a_validate_process_with_a_verdict_is_timed(monkeypatch: pytest.MonkeyPatch,
                                                    bench_validate: ModuleType) -> None:
    def validate(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, '[{"result": "failed"}]', "")

    monkeypatch.setattr(bench_validate.subprocess, "run", validate)
    seconds, result = bench_validate.validate_process("img:1", 1, "/nonexistent")
    assert result == "failed" and seconds >= 0
