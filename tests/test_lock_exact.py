"""Locks pin exactly: a local build on a find-links folder (`torch-2.13.0+cpu`) cannot take the place
of the locked wheel. Installs run the build's own path (the `uv.toml` secret over the loopback server,
`uv pip install --require-hashes --no-deps`) on tiny wheels made here; no network."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from buildtool.contracts import locks
from buildtool.imagebuild import lock
from buildtool.imagebuild.pipconfig import HostPip, pip_secrets
from buildtool.matrix.loader import load_matrix
from tests.conftest import fixture_matrix
from tests.fakewheels import fake_wheel


@pytest.fixture
def sources(tmp_path: Path) -> tuple[HostPip, dict[str, str]]:
    """An index with the plain wheel (as PyPI serves torch 2.13.0, hashes in its links) and a find-links
    folder with local builds of the same version (as /opt/wheels holds torch 2.13.0+cpu)."""
    (tmp_path / "files").mkdir()
    (tmp_path / "simple" / "fakepkg").mkdir(parents=True)
    (tmp_path / "links").mkdir()
    name, plain = fake_wheel(tmp_path / "files", "fakepkg", "1.0")
    (tmp_path / "simple" / "fakepkg" / "index.html").write_text(
        f'<html><body><a href="../../files/{name}#sha256={plain}">{name}</a></body></html>')
    hashes = {"1.0": plain}
    for local in ("1.0+cpu", "1.0+cu130"):
        hashes[local] = fake_wheel(tmp_path / "links", "fakepkg", local)[1]
    host = HostPip(extra_index_urls=(f"file://{tmp_path / 'simple'}",), find_links=(str(tmp_path / "links"),))
    return host, hashes


def _install(host: HostPip, lock_text: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """What the Dockerfile's RUN step does with a lock, with the secrets a build gets."""
    (tmp_path / "the.lock").write_text(lock_text)
    target = tmp_path / "site"
    with pip_secrets(host) as secrets:
        env = {**os.environ, "UV_CONFIG_FILE": str(secrets.files["uv.toml"]), "UV_CACHE_DIR": str(tmp_path / "cache"),
               "UV_PYTHON_DOWNLOADS": "never"}
        env.pop("UV_NO_CONFIG", None)
        run = subprocess.run([lock.uv_binary(), "pip", "install", "--no-progress", "--target", str(target),
                              "--require-hashes", "--no-deps", "-r", str(tmp_path / "the.lock")],
                             env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    return run, target


def _uv_entry(version: str, digest: str) -> str:
    """An entry as `uv pip compile --generate-hashes` writes it."""
    return f"fakepkg=={version} \\\n    --hash=sha256:{digest}\n    # via -r matrix.in\n"


def test_a_loose_pin_takes_the_local_build_and_fails_the_hash_check(sources, tmp_path: Path):
    """The bug as a runner met it: `==1.0` is satisfied by the find-links folder's local builds, which uv
    prefers (a local version sorts above the plain one); the plain wheel's hash then refuses it."""
    host, hashes = sources
    run, _ = _install(host, _uv_entry("1.0", hashes["1.0"]), tmp_path)
    assert run.returncode != 0
    assert re.search(r"Failed to download `fakepkg==1\.0\+(cpu|cu130)`", run.stderr), run.stderr
    assert "Hash-checking is enabled" in run.stderr


def test_the_exact_pin_a_lock_now_holds_installs_the_locked_wheel(sources, tmp_path: Path):
    host, hashes = sources
    entry = locks.parse_lock(_uv_entry("1.0", hashes["1.0"])).entries["fakepkg"].pinned_exactly()
    assert entry.text.startswith("fakepkg===1.0 \\") and entry.exact
    run, target = _install(host, entry.text + "\n", tmp_path)
    assert run.returncode == 0, run.stderr
    assert [p.name for p in target.glob("fakepkg-*.dist-info")] == ["fakepkg-1.0.dist-info"]


def test_a_local_version_pin_takes_that_build_and_no_other(sources, tmp_path: Path):
    """`==1.0+cu130` (a local version is compared whole): the +cpu beside it is not a candidate."""
    host, hashes = sources
    entry = locks.parse_lock(_uv_entry("1.0+cu130", hashes["1.0+cu130"])).entries["fakepkg"]
    assert entry.exact and entry.pinned_exactly() == entry
    run, target = _install(host, entry.text + "\n", tmp_path)
    assert run.returncode == 0, run.stderr
    assert [p.name for p in target.glob("fakepkg-*.dist-info")] == ["fakepkg-1.0+cu130.dist-info"]


# -- what `buildtool lock` writes and `buildtool check` refuses -----------------------------------

H = "--hash=sha256:" + "a" * 64


def _cell(key: str):
    return next(c for c in fixture_matrix().cells if c.key == key)


def _write(root: Path, cell, framework: dict[str, str], op: str = "===") -> None:
    """A cell's two locks, plain versions pinned with `op`, local ones with `==`."""
    folder = (root / cell.dockerfile).parent
    folder.mkdir(parents=True)
    tools = {name: version for name, version in (*cell.packages, ("pip", "26.3"))}
    for part, entries in ((locks.FRAMEWORK_LOCK, framework), (locks.TOOLS_LOCK, tools)):
        body = "".join(f"{n}{'==' if '+' in v else op}{v} \\\n    {H}\n" for n, v in entries.items())
        (folder / part).write_text(f"# inputs: {lock.fingerprint(cell, part)}\n{body}")


CUDA_FW = {"torch": "2.13.0", "nvidia-cuda-runtime": "13.0.96", "sympy": "1.14.0"}


def test_check_accepts_pypis_cuda_wheel_pinned_exactly(tmp_path: Path):
    cell = _cell("pytorch-cuda:2.13")
    _write(tmp_path, cell, CUDA_FW)
    assert lock.check_cell(tmp_path, cell) == []


def test_check_flags_a_loose_pin(tmp_path: Path):
    cell = _cell("pytorch-cuda:2.13")
    _write(tmp_path, cell, CUDA_FW, op="==")
    problems = lock.check_cell(tmp_path, cell)
    rel = Path(cell.dockerfile).parent / locks.FRAMEWORK_LOCK
    assert any(p.startswith(f"{rel} pins torch==2.13.0, nvidia-cuda-runtime==13.0.96, sympy==1.14.0 loosely: "
                            "a local build (such as +cpu on a find-links folder) satisfies `==` too") for p in problems)


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


def test_compile_writes_exact_pins_and_hands_uv_its_own_spelling_back(monkeypatch):
    """uv writes `==V`; the lock says `===V` (a local version stays `==`). The previous lock goes back to uv
    as `==`: uv keeps an output file's pin as a preference only in that spelling."""
    seen: list[str] = []

    def fake_uv(argv: list[str], env: dict[str, str], cwd: Path) -> None:
        out = cwd / argv[argv.index("-o") + 1]
        if out.name == "full.txt" and out.exists():
            seen.append(out.read_text())
        out.write_text(f"torch==2.13.0+cpu \\\n    {H}\nsympy==1.14.0 \\\n    {H}\n")

    monkeypatch.setattr(lock, "_run_uv", fake_uv)
    monkeypatch.setattr(lock, "uv_binary", lambda: "uv")
    cell = _cell("pytorch-cpu:2.13")
    texts = lock.compile_cell(cell, HostPip(), previous={}, upgrade=None, base=None, log=print,
                              reachable=lambda url: True)
    framework = locks.parse_lock(texts[locks.FRAMEWORK_LOCK])
    assert framework.entries["torch"].text.startswith("torch==2.13.0+cpu")
    assert framework.entries["sympy"].text.startswith("sympy===1.14.0")
    previous = {locks.FRAMEWORK_LOCK: framework}
    lock.compile_cell(cell, HostPip(), previous=previous, upgrade=("sympy",), base=None, log=print,
                      reachable=lambda url: True)
    assert "sympy==1.14.0 \\" in seen[0] and "===" not in seen[0]


def test_the_committed_locks_pin_exactly_and_the_promised_builds():
    """The repository's own locks pass the new rules (pytorch-cuda's torch===2.13.0 with CUDA 13.0's runtime)."""
    root = Path(__file__).resolve().parents[1]
    matrix = load_matrix(root / "matrix.yaml", root / "templates")
    assert {c.key: lock.check_cell(root, c) for c in matrix.cells} == {c.key: [] for c in matrix.cells}
    cuda = next(c for c in matrix.cells if c.key == "pytorch-cuda:2.13")
    for platform in ("linux/amd64", "linux/arm64"):   # each platform's own resolution (issue 38)
        entries = lock.read_locks(root, cuda, platform)[locks.FRAMEWORK_LOCK].entries
        assert entries["torch"].text.startswith("torch===2.13.0 \\"), platform
        assert entries["nvidia-cudnn-cu13"].version == "9.20.0.48", platform   # not PyPI's 0.0.0a0 placeholder
        assert "nvidia-nccl-cu13" in entries, platform
