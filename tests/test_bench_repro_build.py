"""bench/repro_build.py's push of its two builds, on stand-ins for the engine and the registry: the tag it gives
each build for the push leaves the engine, and what it pushed leaves the registry, however the bench ends."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from buildtool.imagebuild import engine as _engine
from tests.tag_registry import TagRegistry

LOCAL = "127.0.0.1:5000"
REAL_BUILD = _engine.build    # before the stand-ins replace it


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




@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch, repro_build: ModuleType) -> TagRegistry:
    """Every engine call of main() up to its pushes; the pushes write the first build's tags, then fail."""
    registry = TagRegistry()
    monkeypatch.setattr(repro_build, "fill_bases", lambda *args, **kwargs: None)
    monkeypatch.setattr(repro_build, "cache_mounts", lambda: {})
    monkeypatch.setattr(repro_build.engine, "resolve_build_client", lambda: object())
    monkeypatch.setattr(repro_build, "pip_secrets", lambda: contextlib.nullcontext(SimpleNamespace(files={})))
    monkeypatch.setattr(repro_build.engine, "build", lambda client, request: None)
    monkeypatch.setattr(repro_build, "probe", lambda root, ref: {"python_packages": [], "apt_packages": []})
    monkeypatch.setattr(repro_build.engine, "image_attrs", lambda ref: {"RootFS": {"Layers": ["sha256:l"]}, "Id": "i"})
    monkeypatch.setattr(repro_build.docker_cli, "docker", lambda *args, **kwargs: None)
    monkeypatch.setattr(repro_build, "compare_layers", lambda first, second: [{"entries": 1, "differences": {}}])
    monkeypatch.setattr(repro_build, "saved_config", lambda saved: {})
    monkeypatch.setattr(repro_build, "RegistryClient", lambda host: registry)

    def push_both(refs: list[str], logs: list[Path]) -> dict[str, object]:
        repo, _, tag = refs[0].partition(":")
        registry.held[repo] = {tag: "sha256:" + "a" * 64, f"{tag}__cache": "sha256:" + "b" * 64}
        raise SystemExit(f"push of {LOCAL}/{refs[1]} failed")

    monkeypatch.setattr(repro_build, "push_both", push_both)
    return registry



def test_the_pushed_images_leave_the_registry_however_the_bench_ends(monkeypatch: pytest.MonkeyPatch,
                                                                      repro_build: ModuleType,
                                                                      stand_ins: TagRegistry) -> None:
    """Both pushes (and their cache tags) stayed in the shared local registry's repro-<hex>/<image> after every run,
    passed or failed; nothing read them after the bench, which prints their digests."""
    monkeypatch.setattr(sys, "argv", ["repro_build.py", "--cell", "pytorch-cpu:2.13"])
    with pytest.raises(SystemExit, match=r"push of 127\.0\.0\.1:5000/repro-[0-9a-f]{6}/pytorch-cpu:2 failed"):
        repro_build.main()
    [repo] = stand_ins.held
    assert repo.startswith("repro-") and repo.endswith("/pytorch-cpu")
    assert sorted(stand_ins.deleted) == [f"DELETE {repo}/manifests/sha256:{c * 64}" for c in "ab"]


def test_keep_leaves_the_pushed_images_to_inspect(monkeypatch: pytest.MonkeyPatch, repro_build: ModuleType,
                                                  stand_ins: TagRegistry, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["repro_build.py", "--keep"])
    with pytest.raises(SystemExit, match="failed"):
        repro_build.main()
    [repo] = stand_ins.held
    assert stand_ins.deleted == []
    assert f"kept {LOCAL}/{repo} (--keep): delete its tags when done" in capsys.readouterr().err


def test_a_failed_build_never_shows_or_writes_the_index_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                              repro_build: ModuleType, stand_ins: TagRegistry,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The bench built without the builder's log_secrets: a build whose output held the host's index token (pip's
    or uv's error naming the URL) wrote it into the log and its BuildFailed message, which ends the bench. Now both
    are masked."""
    from buildtool.imagebuild import engine
    from tests import leaky_build

    monkeypatch.setattr("buildtool.imagebuild.pipconfig.HostPip.from_host",
                        classmethod(lambda cls, python=None: leaky_build.host()))
    monkeypatch.setattr(repro_build.engine, "resolve_build_client", lambda: leaky_build.client(tmp_path))
    logs: list[str] = []

    def build(client: engine.BuildClient, request: engine.BuildRequest) -> str:
        try:
            return REAL_BUILD(client, request)
        finally:
            logs.append(request.log_path.read_text(errors="replace"))

    monkeypatch.setattr(repro_build.engine, "build", build)
    monkeypatch.setattr(sys, "argv", ["repro_build.py", "--cell", "pytorch-cpu:2.13"])
    with pytest.raises(engine.BuildFailed) as caught:
        repro_build.main()
    assert "****" in str(caught.value) and leaky_build.TOKEN not in str(caught.value)
    assert logs and all("****" in log and leaky_build.TOKEN not in log for log in logs)
    printed = capsys.readouterr()
    assert leaky_build.TOKEN not in printed.out + printed.err
