"""bench/bench_fresh_runner.py writes the previous image and the fresh arm's pushes into the shared local registry:
they are untagged however the bench ends (no engine or registry here: stand-ins)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.tag_registry import TagRegistry


@pytest.fixture
def bench_fresh_runner(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setattr(sys, "path", list(sys.path))   # the bench puts the repository on sys.path
    from bench import bench_fresh_runner as module

    return module




def test_a_run_that_fails_still_untags_what_it_wrote_to_the_registry(monkeypatch: pytest.MonkeyPatch,
                                                                     bench_fresh_runner: ModuleType) -> None:
    """The previous image (pushed with its provenance and cache) and every push of the fresh arm stayed in the
    local registry under bench-fresh-runner/, which other work shares, whether the bench passed or failed."""
    dev, pushes = bench_fresh_runner.registry_repos()
    registry = TagRegistry({dev: {"2.13-abc": "sha256:" + "a" * 64, "sha256-" + "a" * 64: "sha256:" + "b" * 64},
                          pushes: {"engine-1": "sha256:" + "c" * 64}})
    for name in ("stop_engine", "remove_bridge", "empty_engine"):
        monkeypatch.setattr(bench_fresh_runner, name, lambda: None)
    monkeypatch.setattr(bench_fresh_runner, "clone", lambda dest: Path(dest).mkdir())
    monkeypatch.setattr(bench_fresh_runner, "bump_lock", lambda checkout: "0123456789ab")
    monkeypatch.setattr(bench_fresh_runner, "RegistryClient", lambda host: registry)
    monkeypatch.setattr(bench_fresh_runner.os, "geteuid", lambda: 0)

    def build(checkout: Path, *extra: str) -> object:
        raise SystemExit("build --framework pytorch-cpu --json --push --force failed")

    monkeypatch.setattr(bench_fresh_runner, "build", build)
    monkeypatch.setattr(sys, "argv", ["bench_fresh_runner.py", "--runs", "1"])
    with pytest.raises(SystemExit, match="failed"):
        bench_fresh_runner.main()
    assert dev == "bench-fresh-runner/pytorch-cpu-dev" and pushes == "bench-fresh-runner/push-bench"
    assert sorted(registry.deleted) == sorted(f"DELETE {repo}/manifests/sha256:{c * 64}"
                                              for repo, c in ((dev, "a"), (dev, "b"), (pushes, "c")))
