"""The debootstrap base ships what keeps the layers built on it reproducible (no engine, no registry)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from buildtool.common.errors import FailedError
from buildtool.contracts import label_keys
from buildtool.imagebuild import bases, builder, rootfs_seal
from buildtool.imagebuild.builder import BaseInfo, Builder, BuildOptions
from tests.conftest import fixture_matrix
from tests.memregistry import MemRegistry

RELEASE_DATE = "Sat, 11 Jul 2026 10:16:37 UTC"
EPOCH = 1783764997  # RELEASE_DATE as Unix time
LIST = "var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_Release"


def fake_tree(rootfs: Path, release: str | None = f"Origin: Debian\nDate: {RELEASE_DATE}\n") -> None:
    """What debootstrap leaves: files written now, the build host's resolv.conf and hostname, no hosts."""
    for name in ("etc/passwd", "usr/bin/true", "var/lib/apt/lists/partial/x"):
        (rootfs / name).parent.mkdir(parents=True, exist_ok=True)
        (rootfs / name).write_text("x\n")
    (rootfs / "etc/resolv.conf").write_text("nameserver 10.255.255.53\n")
    (rootfs / "etc/hostname").write_text("buildhost\n")
    (rootfs / "etc/resolv.conf").chmod(0o755)
    (rootfs / "etc/localtime").symlink_to("/usr/share/zoneinfo/Etc/UTC")
    if release is not None:
        (rootfs / LIST).write_text(release)


@pytest.fixture
def debootstrap_here(monkeypatch, tmp_path):
    """_debootstrap with a fake debootstrap; returns what import_rootfs was handed (tree copied out)."""
    seen: dict[str, object] = {}

    def run(argv, **_):
        fake_tree(Path(argv[-1]))
        return subprocess.CompletedProcess(argv, 0)

    def import_rootfs(rootfs, ref, changes):
        seen["changes"] = changes
        seen["tree"] = {str(p.relative_to(rootfs)): p.lstat() for p in [rootfs, *rootfs.rglob("*")]}
        seen["text"] = {n: (rootfs / n).read_text() for n in rootfs_seal.RUNTIME_FILES if (rootfs / n).exists()}
        return "sha256:x"

    monkeypatch.setattr(bases.shutil, "which", lambda name: "/usr/sbin/debootstrap")
    monkeypatch.setattr(bases.subprocess, "run", run)
    monkeypatch.setattr(bases.engine, "import_rootfs", import_rootfs)
    return lambda: (bases._debootstrap("bookworm", True, "r:5000/library/debian:bookworm-slim", print,
                                       tmp_path / "log"), seen)[1]


def test_base_ships_runtime_files_with_the_release_time(debootstrap_here):
    seen = debootstrap_here()
    tree = seen["tree"]
    for name in ("etc/hosts", "etc/resolv.conf", "etc/hostname"):
        assert name in tree, f"{name} missing: every RUN would create it and move /etc's mtime"
        assert (tree[name].st_mtime, tree[name].st_mode & 0o7777, tree[name].st_uid) == (EPOCH, 0o644, 0), name
        assert seen["text"][name] == "", f"{name} carries the build host's copy"
    assert tree["etc"].st_mtime == EPOCH
    newer = sorted(name for name, st in tree.items() if st.st_mtime > EPOCH)
    assert newer == [], f"mtimes after the suite's Release date: {newer}"
    assert f'LABEL {label_keys.BASE_SOURCE}="debootstrap --variant=minbase bookworm, recipe 2"' in seen["changes"]


def test_release_date_missing_or_bad_is_an_error(tmp_path):
    fake_tree(tmp_path, release=None)
    with pytest.raises(FailedError, match="0 Release files for bookworm"):
        rootfs_seal.release_epoch(tmp_path, "bookworm")
    (tmp_path / LIST).write_text("Origin: Debian\n")
    with pytest.raises(FailedError, match="no Date field"):
        rootfs_seal.release_epoch(tmp_path, "bookworm")
    (tmp_path / LIST).write_text("Date: yesterday\n")
    with pytest.raises(FailedError, match="unparseable 'Date: yesterday'"):
        rootfs_seal.release_epoch(tmp_path, "bookworm")
    (tmp_path / LIST).write_text(f"Date: {RELEASE_DATE}\n")
    assert rootfs_seal.release_epoch(tmp_path, "bookworm") == EPOCH


def test_seal_leaves_older_mtimes_and_symlink_targets_alone(tmp_path):
    fake_tree(tmp_path)
    os.utime(tmp_path / "usr/bin/true", (1000, 1000))
    rootfs_seal.seal(tmp_path, EPOCH)
    assert (tmp_path / "usr/bin/true").stat().st_mtime == 1000
    assert (tmp_path / "etc/localtime").lstat().st_mtime == EPOCH
    assert (tmp_path / "etc/hosts").read_bytes() == b""


@pytest.mark.parametrize(("found", "kept"), [
    ("debootstrap --variant=minbase bookworm, recipe 2", True),
    ("debootstrap --variant=minbase bookworm", False),      # made before the runtime files were shipped
    (None, True),                                           # not made here (a mirror of the upstream): kept
])
def test_base_of_an_older_recipe_is_made_again(monkeypatch, found, kept):
    monkeypatch.setattr(bases, "registry_base_source", lambda ref: found)
    logged: list[str] = []
    assert bases._made_by_recipe("r:5000/library/debian:bookworm-slim", "bookworm", logged.append) is kept
    assert bool(logged) is not kept and all("making it again" in line for line in logged)


def _repro_bench():
    spec = importlib.util.spec_from_file_location("repro_build", Path(__file__).parents[1] / "bench/repro_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_says_why_image_digests_differ():
    bench = _repro_bench()
    one = {"created": "t1", "history": [{"created": "t1", "created_by": "RUN a"}], "config": {"Env": ["A=1"]}}
    engine_only = {**one, "created": "t2", "history": [{"created": "t2", "created_by": "RUN a"}]}
    assert bench.config_differences(one, engine_only) == ["created", "history[].created"]
    assert bench.image_verdict(bench.config_differences(one, engine_only))["reason"] == bench.ENGINE_REASON
    ours = {**engine_only, "config": {"Env": ["A=2"]}}
    verdict = bench.image_verdict(bench.config_differences(one, ours))
    assert verdict["differing_fields"] == ["config.Env[]", "created", "history[].created"]
    assert "a cause in this project" in verdict["reason"]
    assert bench.image_verdict([]) == {"identical": True, "reason": "configs equal"}


def test_build_remakes_a_base_of_an_older_recipe_and_keeps_a_mirrored_one(monkeypatch):
    cells = {c.key: c for c in fixture_matrix().cells}
    sources = {"pytorch-cpu:2.13": "debootstrap --variant=minbase bookworm",          # older recipe
               "tensorflow-cpu:2.21": "debootstrap --variant=minbase bookworm, recipe 2",
               "pytorch-ngc:25.10": None}                                             # a mirror's copy
    plans = [SimpleNamespace(cell=cells[key], base=f"127.0.0.1:5000/{key}") for key in sources]
    by_base = {p.base: sources[p.cell.key] for p in plans}
    registry = MemRegistry("127.0.0.1:5000")
    for plan in plans:     # each base tag: an image whose BASE_SOURCE label says which recipe made it
        repo, _, tag = plan.base.split("/", 1)[1].partition(":")
        source = by_base[plan.base]
        registry.push_image(repo, tag, payload=plan.base.encode(),
                            labels=None if source is None else {label_keys.BASE_SOURCE: source})
    monkeypatch.setattr(bases, "RegistryClient", lambda host, **_: registry)
    filled: list[str] = []
    monkeypatch.setattr(builder, "resolve_base", lambda plan: BaseInfo(
        ref=plan.base, digest="sha256:" + "a" * 64,
        labels={} if by_base[plan.base] is None else {label_keys.BASE_SOURCE: by_base[plan.base]}))
    monkeypatch.setattr(builder, "fill_bases", lambda cells, *a, **k: filled.extend(c.key for c in cells))
    run = object.__new__(Builder)
    run.settings, run.options, run.log = builder.Settings(base_mirror="127.0.0.1:5000"), BuildOptions(), print
    run.root = Path(__file__).resolve().parents[1]
    infos, missing = run.resolve_bases(plans)  # type: ignore[arg-type]
    assert filled == ["pytorch-cpu:2.13"] and missing == {} and len(infos) == 3
