"""bench/bench_uv_build.py's clean-up of the shared engine's cache mounts, on a stand-in docker client: it
prunes only the mounts it can tell the run made."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest


@pytest.fixture
def bench_uv_build(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setattr(sys, "path", list(sys.path))   # the bench puts the repository on sys.path
    from bench import bench_uv_build as module

    return module


def _client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    docker = tmp_path / "docker"
    docker.write_text(f"#!/bin/bash\n{body}\n")
    docker.chmod(0o755)
    monkeypatch.setenv("DOCKER_CLIENT", str(docker))


@pytest.mark.parametrize("body", ['echo "Error response from daemon: a disk usage operation is already running" >&2'
                                  "; exit 1", "echo 'WARNING: not json'", "exit 0"])
def test_an_unreadable_build_cache_listing_stops_the_bench(body: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           bench_uv_build: ModuleType) -> None:
    """`docker system df` failing, or printing no JSON, read as "no cache mounts": taken before the run, every uv
    cache mount of the shared engine (the builds' own dl-images-uv) was then "made by this run" and pruned at its
    end. It now stops the bench naming the listing."""
    _client(tmp_path, monkeypatch, body)
    with pytest.raises(SystemExit, match=r"^bench: `docker system df -v` gave no list of the build cache \(exit "):
        bench_uv_build.cache_mounts()


def test_the_build_cache_listing_names_the_cache_mounts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         bench_uv_build: ModuleType) -> None:
    listing = ('[{"ID": "a1", "CacheType": "exec.cachemount", "Description": "cached mount /run/uv/cache"},'
               ' {"ID": "b2", "CacheType": "regular", "Description": "RUN x"}]')
    _client(tmp_path, monkeypatch, f"echo '{listing}'")
    assert bench_uv_build.cache_mounts() == {"a1": "cached mount /run/uv/cache"}
    _client(tmp_path, monkeypatch, "echo null")
    assert bench_uv_build.cache_mounts() == {}


def test_a_failed_build_never_shows_or_writes_the_index_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              bench_uv_build: ModuleType,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The bench built without the builder's log_secrets: a build whose output held the host's index token (pip's
    or uv's error naming the URL) wrote it into the log and its BuildFailed message. Now both are masked."""
    from tests import leaky_build

    context, out = tmp_path / "ctx", tmp_path / "out"
    context.mkdir()
    out.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    monkeypatch.setattr("buildtool.imagebuild.pipconfig.HostPip.from_host",
                        classmethod(lambda cls, python=None: leaky_build.host()))
    bench = bench_uv_build.Bench(SimpleNamespace(base="debian:bookworm"), leaky_build.client(tmp_path), {}, out, "t")
    with pytest.raises(bench_uv_build.engine.BuildFailed) as caught:
        bench.build(context, "uv", "e1")
    assert "****" in str(caught.value) and leaky_build.TOKEN not in str(caught.value)
    written = [p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()]
    assert any("****" in text for text in written)
    assert not any(leaky_build.TOKEN in text for text in written)
    printed = capsys.readouterr()
    assert leaky_build.TOKEN not in printed.out + printed.err
