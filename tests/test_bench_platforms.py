"""bench/bench_platforms.py on stand-ins for `buildtool validate` and `docker build`: the reports it asks for and
the images its builds tag are not left behind."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest


@pytest.fixture
def bench_platforms(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setattr(sys, "path", list(sys.path))   # the bench puts the repository on sys.path
    from bench import bench_platforms as module

    return module


@pytest.mark.parametrize("code", [0, 1])
def test_the_validation_reports_folder_is_removed(code: int, monkeypatch: pytest.MonkeyPatch,
                                                  bench_platforms: ModuleType) -> None:
    """Each `buildtool validate` of the bench wrote its JUnit and verdict under /tmp/bench-platforms-<pid>, which
    nothing removed, whether the validation passed or failed."""
    folders: list[Path] = []

    def validate(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        folder = Path(argv[argv.index("--reports") + 1])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "junit.xml").write_text("<testsuites/>\n")   # what validate writes there
        folders.append(folder)
        return subprocess.CompletedProcess(argv, code, "", "failed\n" if code else "")

    monkeypatch.setattr(bench_platforms.subprocess, "run", validate)
    try:
        if code:
            with pytest.raises(SystemExit, match="failed"):
                bench_platforms.validate("img:1", "linux/arm64")
        else:
            assert bench_platforms.validate("img:1", "linux/arm64") >= 0
        left = [folder for folder in folders if folder.exists()]
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    assert len(folders) == 1 and left == [], folders


def test_the_images_the_builds_tagged_leave_the_engine_however_the_bench_ends(monkeypatch: pytest.MonkeyPatch,
                                                                              bench_platforms: ModuleType) -> None:
    """Every build was tagged bench-platforms:<arch> in the engine and nothing removed the tags: each run left one
    image per platform behind, and a build that failed left those made before it."""
    native = bench_platforms.platforms.host().name
    other = "linux/arm64" if native != "linux/arm64" else "linux/amd64"
    cell = SimpleNamespace(key="jax-cpu:0.10", name="jax-cpu", platforms=(native, other), emulation_factor=4,
                           dockerfile="dockerfiles/jax/jax-cpu/0.10/Dockerfile")
    monkeypatch.setattr(bench_platforms, "load_matrix", lambda path: SimpleNamespace(cells=[cell]))
    monkeypatch.setattr(bench_platforms, "git_revision", lambda root: "0123456789ab")
    monkeypatch.setattr(bench_platforms, "plan_cell", lambda c, settings, revision: SimpleNamespace(dev_ref="r:1"))
    monkeypatch.setattr(bench_platforms, "resolve_base", lambda plan, p: SimpleNamespace(pinned=f"base@{p}"))
    builds: list[str] = []

    def docker_build(dockerfile: Path, base: str, platform: str, tag: str, no_cache: bool, build_base: str,
                     context: Path | None = None) -> float:
        builds.append(tag)
        if platform == other:
            raise SystemExit(f"docker build --platform {platform} failed:\n...")
        return 1.0

    untagged: list[str] = []
    monkeypatch.setattr(bench_platforms, "docker_build", docker_build)
    monkeypatch.setattr(bench_platforms.engine, "untag", untagged.append)
    monkeypatch.setattr(sys, "argv", ["bench_platforms.py", "--runs", "1", "--skip-validate"])
    with pytest.raises(SystemExit, match="failed"):
        bench_platforms.main()
    arch = {p: p.split("/")[1] for p in (native, other)}
    assert builds == [f"bench-platforms:{arch[native]}", f"bench-platforms:{arch[other]}"]
    assert untagged == builds
