"""Locks name the file: a local build on a find-links folder (`torch-2.13.0+cpu`) cannot take the place of
the locked wheel. Locks are made by buildtool's own resolution (real uv) and installed through the build's
own step (the rendered Dockerfile's lines that map the lock's local file URLs to the loopback server, then
`uv pip install -r pylock.<layer>.toml`) on tiny wheels made here; no network."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from buildtool.contracts import locks
from buildtool.imagebuild import lock
from buildtool.imagebuild.pipconfig import HostPip, pip_secrets
from buildtool.matrix.loader import load_matrix
from buildtool.render.dockerfiles import render_cell_dockerfile
from tests.conftest import REPO, fixture_matrix
from tests.fakewheels import fake_wheel
from tests.pylocks import one_wheel, pylock


@pytest.fixture
def sources(tmp_path: Path) -> tuple[HostPip, dict[str, str]]:
    """An index with the plain wheel (as PyPI serves torch 2.13.0, hashes in its links) and a find-links
    folder with local builds of the same version (as /opt/wheels holds torch 2.13.0+cpu); pip, which a pip
    cell's tools lock holds."""
    (tmp_path / "files").mkdir()
    hashes = {}
    for name, version in (("fakepkg", "1.0"), ("pip", "26.3")):
        (tmp_path / "simple" / name).mkdir(parents=True)
        file, hashes[version] = fake_wheel(tmp_path / "files", name, version)
        (tmp_path / "simple" / name / "index.html").write_text(
            f'<html><body><a href="../../files/{file}#sha256={hashes[version]}">{file}</a></body></html>')
    (tmp_path / "links").mkdir()
    for local in ("1.0+cpu", "1.0+cu130"):
        hashes[local] = fake_wheel(tmp_path / "links", "fakepkg", local)[1]
    host = HostPip(extra_index_urls=(f"file://{tmp_path / 'simple'}",), find_links=(str(tmp_path / "links"),))
    return host, hashes


def _cell(key: str):
    return next(c for c in fixture_matrix().cells if c.key == key)


def _lock(host: HostPip, requirement: str) -> str:
    """The framework lock `make lock` writes for a pip cell whose framework requirement is `requirement`."""
    cell = replace(_cell("pytorch-cpu:2.13"), framework_requirements=(requirement,), packages=(),
                   extra_index_urls=(), index_url=None)
    return lock.compile_cell(cell, host, lock.Pins(), base=None, log=print,
                             reachable=lambda url: True)[locks.FRAMEWORK_LOCK]


def _mapping_step() -> str:
    """The rendered Dockerfile's lines that write the lock as the build sees it (parts/uv.j2 `as_built`)."""
    text = render_cell_dockerfile(fixture_matrix(), _cell("pytorch-cpu:2.13"), REPO / "templates")
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if "sed -f /run/secrets/lock-urls" in line)
    return " && ".join(line.strip().removeprefix("&& ").removesuffix(" \\") for line in lines[first:first + 2])


def _install(host: HostPip, lock_text: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """What the Dockerfile's RUN step does with a lock, with the secrets a build gets: its own lines map the
    local folders' file URLs to the loopback server, then uv installs the lock (every file's sha256 checked)."""
    run = tmp_path / "run"
    (run / "lock").mkdir(parents=True)
    (run / "secrets").mkdir()
    (run / "lock" / locks.FRAMEWORK_LOCK).write_text(lock_text)
    target = tmp_path / "site"
    with pip_secrets(host) as secrets:
        shutil.copy(secrets.files["lock-urls"], run / "secrets" / "lock-urls")
        mapped = subprocess.run(["bash", "-c", _mapping_step().replace("/run/", f"{run}/")], capture_output=True,
                                text=True, timeout=30)
        if mapped.returncode != 0:
            return mapped, target
        env = {**os.environ, "UV_CACHE_DIR": str(tmp_path / "cache"), "UV_PYTHON_DOWNLOADS": "never",
               "UV_NO_CONFIG": "1"}
        done = subprocess.run([lock.uv_binary(), "pip", "install", "--no-progress", "--preview-features", "pylock",
                               "--target", str(target), "--require-hashes", "-r", str(run / locks.FRAMEWORK_LOCK)],
                              env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    return done, target


def test_a_loose_pin_takes_the_local_build_and_fails_the_hash_check(sources, tmp_path: Path):
    """Why the locks are pylock.toml: the bug a runner met with uv's requirements output (`==1.0` and its
    hash, installed through the `uv.toml` secret) is satisfied by the find-links folder's local builds, which uv
    prefers (a local version sorts above the plain one); the plain wheel's hash then refuses it."""
    host, hashes = sources
    (tmp_path / "the.lock").write_text(f"fakepkg==1.0 \\\n    --hash=sha256:{hashes['1.0']}\n")
    with pip_secrets(host) as secrets:
        env = {**os.environ, "UV_CONFIG_FILE": str(secrets.files["uv.toml"]), "UV_CACHE_DIR": str(tmp_path / "cache"),
               "UV_PYTHON_DOWNLOADS": "never"}
        env.pop("UV_NO_CONFIG", None)
        run = subprocess.run([lock.uv_binary(), "pip", "install", "--no-progress", "--target", str(tmp_path / "site"),
                              "--require-hashes", "--no-deps", "-r", str(tmp_path / "the.lock")],
                             env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert run.returncode != 0
    assert re.search(r"Failed to download `fakepkg==1\.0\+(cpu|cu130)`", run.stderr), run.stderr
    assert "Hash-checking is enabled" in run.stderr


def test_the_lock_names_the_locked_wheel_and_installs_it(sources, tmp_path: Path):
    host, hashes = sources
    text = _lock(host, "fakepkg===1.0")
    [wheel] = locks.parse_lock(text).entries["fakepkg"].wheels
    assert (wheel.name, wheel.sha256) == ("fakepkg-1.0-py3-none-any.whl", hashes["1.0"])
    assert wheel.url == f"file://{tmp_path}/files/fakepkg-1.0-py3-none-any.whl"   # where uv found it, here
    run, target = _install(host, text, tmp_path)
    assert run.returncode == 0, run.stderr
    assert [p.name for p in target.glob("fakepkg-*.dist-info")] == ["fakepkg-1.0.dist-info"]


def test_a_local_version_pin_takes_that_build_and_no_other(sources, tmp_path: Path):
    """`==1.0+cu130` (a local version is compared whole): the +cpu beside it is not a candidate. Its file is in
    the find-links folder, which the build reaches only through the loopback server."""
    host, hashes = sources
    text = _lock(host, "fakepkg==1.0+cu130")
    [wheel] = locks.parse_lock(text).entries["fakepkg"].wheels
    assert wheel.sha256 == hashes["1.0+cu130"] and wheel.url.startswith(f"file://{tmp_path}/links/")
    run, target = _install(host, text, tmp_path)
    assert run.returncode == 0, run.stderr
    assert [p.name for p in target.glob("fakepkg-*.dist-info")] == ["fakepkg-1.0+cu130.dist-info"]


def test_a_wheel_changed_in_its_folder_or_a_hash_changed_in_the_lock_is_refused(sources, tmp_path: Path):
    """The sha256 in the lock decides: one byte changed in the served wheel (still a valid wheel), or one hex
    digit of the lock's hash, and uv refuses the file naming both hashes."""
    host, hashes = sources
    text = _lock(host, "fakepkg==1.0+cu130")
    served = tmp_path / "links" / "fakepkg-1.0+cu130-py3-none-any.whl"
    original = served.read_bytes()
    members = {info: zipfile.ZipFile(served).read(info) for info in zipfile.ZipFile(served).infolist()}
    with zipfile.ZipFile(served, "w") as archive:
        for info, data in members.items():
            archive.writestr(info, data.replace(b"__version__", b"__versioN__"))
    run, _ = _install(host, text, tmp_path / "changed-wheel")
    assert run.returncode != 0 and "Hash mismatch for `fakepkg==1.0+cu130`" in run.stderr, run.stderr
    assert hashes["1.0+cu130"] in run.stderr
    served.write_bytes(original)
    edited = text.replace(hashes["1.0+cu130"], hashes["1.0+cu130"][:-1] + ("0" if hashes["1.0+cu130"][-1] != "0"
                                                                          else "1"))
    run, _ = _install(host, edited, tmp_path / "changed-hash")
    assert run.returncode != 0 and "Hash mismatch for `fakepkg==1.0+cu130`" in run.stderr, run.stderr
    run, target = _install(host, text, tmp_path / "as-locked")
    assert run.returncode == 0, run.stderr


def test_a_local_file_no_folder_of_the_pip_settings_serves_stops_the_step(sources, tmp_path: Path):
    """A lock made on a machine with other wheel folders names files this build cannot reach: the step stops,
    naming the lock and the URL, before uv runs."""
    host, _ = sources
    text = _lock(host, "fakepkg==1.0+cu130").replace(f"file://{tmp_path}/links/", "file:///elsewhere/wheels/")
    run, _ = _install(host, text, tmp_path)
    assert run.returncode == 1
    assert "file:///elsewhere/wheels/fakepkg-1.0+cu130-py3-none-any.whl" in run.stderr
    assert "ERROR: pylock.framework.toml names a file on the build machine (above) that no folder of this " \
           "machine's pip settings serves; run make lock FRAMEWORK=pytorch-cpu:2.13" in run.stderr


# -- what `buildtool lock` writes and `buildtool check` refuses -----------------------------------

def _write(root: Path, cell, framework: dict[str, str]) -> None:
    """A cell's two locks."""
    folder = (root / cell.dockerfile).parent
    folder.mkdir(parents=True)
    tools = {name: version for name, version in (*cell.packages, ("pip", "26.3"))}
    for part, entries in ((locks.FRAMEWORK_LOCK, framework), (locks.TOOLS_LOCK, tools)):
        (folder / part).write_text(pylock(one_wheel(entries), {
            "inputs": lock.fingerprint(cell, part), "platform": lock.cell_platform(cell, None).wheel_platform}))


CUDA_FW = {"torch": "2.13.0", "nvidia-cuda-runtime": "13.0.96", "sympy": "1.14.0"}


def test_check_accepts_pypis_cuda_wheel_pinned_exactly(tmp_path: Path):
    cell = _cell("pytorch-cuda:2.13")
    _write(tmp_path, cell, CUDA_FW)
    assert lock.check_cell(tmp_path, cell) == []


@pytest.mark.parametrize("key, framework, message", [
    ("pytorch-cuda:2.13", {**CUDA_FW, "torch": "2.13.0+cpu"},
     "the lock has torch 2.13.0+cpu, not the cell's +cu130 (the CUDA 13.0 build)"),
    ("pytorch-cuda:2.13", {"torch": "2.13.0", "sympy": "1.14.0"},
     "the lock has torch 2.13.0 without a local version where the matrix promises +cu130 (the CUDA 13.0 build), "
     "and it has no CUDA runtime wheel to tell which build it is"),
    ("pytorch-cuda:2.13", {**CUDA_FW, "nvidia-cuda-runtime": "12.8.90"},
     "the lock has torch 2.13.0 without a local version where the matrix promises +cu130 (the CUDA 13.0 build), "
     "and its CUDA runtime wheel is CUDA 12.8"),
    ("pytorch-cpu:2.13", {"torch": "2.13.0", "sympy": "1.14.0"},
     "the lock has torch 2.13.0 without a local version where the matrix promises +cpu (as claimed)"),
])
def test_check_flags_a_framework_build_other_than_the_matrix_promises(tmp_path: Path, key, framework, message):
    cell = _cell(key)
    _write(tmp_path, cell, framework)
    problems = lock.check_cell(tmp_path, cell)
    assert any(message in p for p in problems), problems


def test_compile_pins_versions_exactly_and_hands_uv_the_previous_pins_as_preferences(monkeypatch):
    """The resolution's versions go to the framework and tools passes as `===V` (`==V` is also met by a
    find-links folder's `V+cpu`; a local version stays `==`). The previous lock goes back to uv as its output
    file's pins, which uv keeps as preferences."""
    seen: dict[str, str] = {}

    def fake_uv(argv: list[str], env: dict[str, str], cwd: Path) -> None:
        out = cwd / argv[argv.index("-o") + 1]
        if out.name == "pylock.full.toml" and out.exists():
            seen["preferences"] = out.read_text()
        if (cwd / "resolved.txt").exists():
            seen["resolved"] = (cwd / "resolved.txt").read_text()
        out.write_text(pylock(one_wheel({"torch": "2.13.0+cpu", "sympy": "1.14.0"})))

    monkeypatch.setattr(lock, "_run_uv", fake_uv)
    monkeypatch.setattr(lock, "uv_binary", lambda: "uv")
    cell = _cell("pytorch-cpu:2.13")
    texts = lock.compile_cell(cell, HostPip(), lock.Pins(), base=None, log=print,
                              reachable=lambda url: True)
    assert seen["resolved"] == "torch==2.13.0+cpu\nsympy===1.14.0\n"
    framework = locks.parse_lock(texts[locks.FRAMEWORK_LOCK])
    lock.compile_cell(cell, HostPip(), lock.Pins({locks.FRAMEWORK_LOCK: framework}, ("sympy",)), base=None,
                      log=print, reachable=lambda url: True)
    preferred = tomllib.loads(seen["preferences"])["packages"]      # names and versions only, no files
    assert {p["name"]: p["version"] for p in preferred} == {"torch": "2.13.0+cpu", "sympy": "1.14.0"}


def test_the_committed_locks_pin_exactly_and_the_promised_builds():
    """The repository's own locks pass the rules (pytorch-cuda's torch 2.13.0, PyPI's file, with CUDA 13.0's
    runtime)."""
    root = Path(__file__).resolve().parents[1]
    matrix = load_matrix(root / "matrix.yaml", root / "templates")
    assert {c.key: lock.check_cell(root, c) for c in matrix.cells} == {c.key: [] for c in matrix.cells}
    cuda = next(c for c in matrix.cells if c.key == "pytorch-cuda:2.13")
    for platform in ("linux/amd64", "linux/arm64"):   # each platform's own resolution (issue 38)
        entries = lock.read_locks(root, cuda, platform)[locks.FRAMEWORK_LOCK].entries
        assert entries["torch"].version == "2.13.0", platform
        assert all(w.name.startswith("torch-2.13.0-cp311-") and w.url.startswith("https://files.pythonhosted.org/")
                   for w in entries["torch"].wheels), platform
        assert entries["nvidia-cudnn-cu13"].version == "9.20.0.48", platform   # not PyPI's 0.0.0a0 placeholder
        assert "nvidia-nccl-cu13" in entries, platform
