"""`make check` re-resolves each lock and compares it entry by entry: a package deleted, added,
re-versioned or re-hashed by hand is drift. Resolved with the real uv against a local index of
tiny wheels made here (sympy needs mpmath, as torch's closure does); no network."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from buildtool.common.errors import FailedError
from buildtool.contracts import locks
from buildtool.imagebuild import lock, lockdrift
from buildtool.imagebuild.pipconfig import HostPip
from buildtool.matrix.loader import load_matrix
from tests.conftest import fixture_matrix
from tests.fakewheels import fake_wheel

# name -> version -> Requires-Dist lines. Two builds of every version, so each entry has two hashes.
WHEELS = {
    "sympy": {"1.14.0": ["mpmath<1.4,>=1.1.0"]},
    "mpmath": {"1.2.1": [], "1.3.0": []},
    "tensorboard": {"2.21.0": ["markdown>=2.6.8"]},
    "markdown": {"3.11.3": []},
    "torch-tb-profiler": {"0.4.3": ["tensorboard"]},
    "pip": {"26.3": []},
    "six": {"1.17.0": []},
}
CELL_KEY = "pytorch-cpu:2.13"


@pytest.fixture
def host(tmp_path: Path) -> HostPip:
    """A local simple index whose links carry the files' hashes, as PyPI's do (so every file of a
    version is in the lock, not only the one uv picks); no other index: the same answer every time."""
    (tmp_path / "files").mkdir()
    for name, versions in WHEELS.items():
        links = []
        for version, requires in versions.items():
            for tag in ("py3-none-any", "py2.py3-none-any"):
                file, digest = fake_wheel(tmp_path / "files", name, version, requires, tag)
                links.append(f'<a href="../../files/{file}#sha256={digest}">{file}</a>')
        (tmp_path / "simple" / name).mkdir(parents=True)
        (tmp_path / "simple" / name / "index.html").write_text(f"<html><body>{''.join(links)}</body></html>")
    return HostPip(index_url=f"file://{tmp_path / 'simple'}")


def _cell():
    """pytorch-cpu with sympy as its framework (torch's closure in small) and no remote index."""
    cell = next(c for c in fixture_matrix().cells if c.key == CELL_KEY)
    return replace(cell, framework_requirements=("sympy==1.14.0",), extra_index_urls=(), index_url=None)


@pytest.fixture
def locked(tmp_path: Path, host: HostPip) -> tuple[Path, Path]:
    """A project root with the cell's locks as `make lock` writes them; (root, pylock.framework.toml)."""
    root = tmp_path / "root"
    lock.lock_cells(root, [_cell()], {}, (), log=lambda line: None, host=host)
    return root, (root / _cell().dockerfile).parent / locks.FRAMEWORK_LOCK


def _drift(root: Path, host: HostPip) -> list[str]:
    return lockdrift.cell_drift(root, _cell(), host, log=lambda line: None)


def _block(text: str, name: str) -> str:
    """A package's [[packages]] table in a pylock.toml, up to the next table."""
    match = re.search(rf'(?ms)^\[\[packages\]\]\nname = "{name}"\n.*?(?=^\[|\Z)', text)
    assert match, name
    return match.group(0)


def _reversion(text: str, name: str, old: str, new: str) -> str:
    """The lock with `name`'s version changed by hand (its files and hashes kept)."""
    block = _block(text, name)
    return text.replace(block, block.replace(f'version = "{old}"', f'version = "{new}"'))


def test_an_untouched_lock_resolves_to_itself(locked, host):
    root, framework = locked
    assert _block(framework.read_text(), "mpmath").startswith('[[packages]]\nname = "mpmath"\nversion = "1.3.0"\n')
    # the newest mpmath sympy allows
    assert lock.check_cell(root, _cell()) == []
    assert _drift(root, host) == []


def test_a_deleted_package_is_drift(locked, host):
    root, framework = locked
    text = framework.read_text()
    framework.write_text(text.replace(_block(text, "mpmath"), ""))
    assert lock.check_cell(root, _cell()) == []          # the offline check does not see it
    assert _drift(root, host) == [
        "dockerfiles/pytorch/pytorch-cpu/2.13/pylock.framework.toml: mpmath deleted by hand (the resolution needs "
        "mpmath 1.3.0); run `make lock FRAMEWORK=pytorch-cpu:2.13`"]


def test_an_added_line_is_drift(locked, host):
    root, framework = locked
    framework.write_text(framework.read_text() + '\n[[packages]]\nname = "six"\nversion = "1.17.0"\n'
                         'wheels = [{ url = "https://x/six-1.17.0-py3-none-any.whl", hashes = { sha256 = "'
                         + "1" * 64 + '" } }]\n')
    assert lock.check_cell(root, _cell()) == []
    assert _drift(root, host) == [
        "dockerfiles/pytorch/pytorch-cpu/2.13/pylock.framework.toml: six added by hand (1.17.0 is listed but nothing "
        "requires it); run `make lock FRAMEWORK=pytorch-cpu:2.13`"]


def test_a_transitive_version_changed_by_hand_is_drift(locked, host):
    """mpmath 1.2.1 satisfies sympy too, but the hashes kept are 1.3.0's."""
    root, framework = locked
    framework.write_text(_reversion(framework.read_text(), "mpmath", "1.3.0", "1.2.1"))
    assert lock.check_cell(root, _cell()) == []
    assert _drift(root, host) == [
        "dockerfiles/pytorch/pytorch-cpu/2.13/pylock.framework.toml: mpmath re-versioned by hand (the lock's hashes "
        "for 1.2.1 are none of 1.2.1's 2 files); run `make lock FRAMEWORK=pytorch-cpu:2.13`"]


def test_a_replaced_hash_is_drift(locked, host):
    root, framework = locked
    text = framework.read_text()
    first = re.search(r'sha256 = "([0-9a-f]{64})"', _block(text, "mpmath"))
    assert first
    framework.write_text(text.replace(first.group(1), "0" * 64))
    assert lock.check_cell(root, _cell()) == []
    assert _drift(root, host) == [
        "dockerfiles/pytorch/pytorch-cpu/2.13/pylock.framework.toml: mpmath re-hashed by hand (1.3.0: 1 hash(es) of "
        "no file of it, 1 of its files' hashes missing); run `make lock FRAMEWORK=pytorch-cpu:2.13`"]


def test_drift_in_the_tools_lock_names_that_file(locked, host):
    root, framework = locked
    tools = framework.parent / locks.TOOLS_LOCK
    text = tools.read_text()
    tools.write_text(text.replace(_block(text, "markdown"), ""))
    assert _drift(root, host) == [
        "dockerfiles/pytorch/pytorch-cpu/2.13/pylock.tools.toml: markdown deleted by hand (the resolution needs "
        "markdown 3.11.3); run `make lock FRAMEWORK=pytorch-cpu:2.13`"]


def test_the_check_never_writes_the_committed_lock(locked, host):
    root, framework = locked
    edited = _reversion(framework.read_text(), "mpmath", "1.3.0", "1.2.1")
    framework.write_text(edited)
    _drift(root, host)
    assert framework.read_text() == edited


def test_an_index_that_cannot_be_reached_is_an_error_not_a_pass(locked, monkeypatch):
    root, _ = locked
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")   # the error, without uv's backoff
    gone = HostPip(index_url="http://127.0.0.1:9/simple")
    with pytest.raises(FailedError, match=r"pytorch-cpu:2.13: cannot re-resolve its locks to check them \(uv pip "
                                          r"compile failed: .*\); the check needs the package index") as raised:
        _drift(root, gone)
    assert "Failed to fetch: http://127.0.0.1:9/simple/" in str(raised.value)   # the index, named


def test_make_check_fails_naming_the_package_and_make_lock(project: Path, run_cli, host, monkeypatch):
    """The CLI: one pip cell (the fixture's others removed) whose pylock.framework.toml lost mpmath."""
    matrix = project / "matrix.yaml"
    text = matrix.read_text()
    cell_block = text[text.index("  - name: pytorch-cpu"):text.index("  - name: pytorch-cuda")]
    cell_block = re.sub(r"    index:\n      extra_urls: \[[^\]]*\]\n", "", cell_block)
    matrix.write_text(text[:text.index("images:")] + "images:\n" + cell_block.replace(
        'framework_requirements: ["torch==2.13.0+cpu"]', 'framework_requirements: ["sympy==1.14.0"]'))
    assert run_cli("render", "--prune", "--matrix", str(matrix))[0] == 0
    monkeypatch.setattr(HostPip, "from_host", classmethod(lambda cls, python=None: host))
    cell = next(iter(load_matrix(matrix).cells))
    lock.lock_cells(project, [cell], {}, (), log=lambda line: None, host=host)
    code, _, err = run_cli("check", "--matrix", str(matrix))
    assert code == 0, err
    assert "1 re-resolved with uv" in err
    framework = project / "dockerfiles/pytorch/pytorch-cpu/2.13" / locks.FRAMEWORK_LOCK
    framework.write_text(framework.read_text().replace(_block(framework.read_text(), "mpmath"), ""))
    assert run_cli("check", "--offline", "--matrix", str(matrix))[0] == 0     # the old check passes it
    code, _, err = run_cli("check", "--matrix", str(matrix))
    assert code == 1
    assert ("lock: dockerfiles/pytorch/pytorch-cpu/2.13/pylock.framework.toml: mpmath deleted by hand (the resolution "
            "needs mpmath 1.3.0); run `make lock FRAMEWORK=pytorch-cpu:2.13`") in err
    assert "1 lock problem(s); run `make lock`" in err


def _ngc_cell():
    cell = next(c for c in fixture_matrix().cells if c.key == "pytorch-ngc:25.10")
    return replace(cell, extra_index_urls=(), index_url=None)


def test_an_ngc_cell_is_re_resolved_against_its_base_only_when_one_is_named(tmp_path: Path, host, monkeypatch):
    """The base (asked in a container, faked here) has markdown: a constraint, left out of the lock. With
    a base reference (BASE_MIRROR's) the cell is checked; without one it is named as not re-resolved."""
    base = lock.BaseFacts(python="3.11", packages={"markdown": "3.11.3"}, ref="mirror/pytorch:25.10")
    asked: list[str] = []

    def ask(ref: str) -> lock.BaseFacts:
        asked.append(ref)
        return base

    monkeypatch.setattr(lock, "base_facts", ask)
    cell, root = _ngc_cell(), tmp_path / "root"
    lock.lock_cells(root, [cell], {cell.key: "mirror/pytorch:25.10"}, (), log=lambda line: None, host=host)
    tools = (root / cell.dockerfile).parent / locks.TOOLS_LOCK
    assert "markdown" not in locks.parse_lock(tools.read_text()).entries     # uv names it in a comment as left out
    assert 'name = "tensorboard"\nversion = "2.21.0"' in tools.read_text()
    refs = {cell.key: "mirror/pytorch:25.10"}
    assert lockdrift.check_cells(root, [cell], lambda line: None, host, refs, ask) == ([], [])
    assert lockdrift.check_cells(root, [cell], lambda line: None, host, {}, ask) == ([], [cell.key])
    text = tools.read_text()
    tools.write_text(text.replace(_block(text, "tensorboard"), ""))
    assert lockdrift.check_cells(root, [cell], lambda line: None, host, refs, ask)[0] == [
        "dockerfiles/pytorch/pytorch-ngc/25.10/pylock.tools.toml: tensorboard deleted by hand (the resolution needs "
        "tensorboard 2.21.0); run `make lock FRAMEWORK=pytorch-ngc:25.10`"]
    assert asked == ["mirror/pytorch:25.10"] * 3


def test_an_ngc_base_that_cannot_be_asked_is_an_error(tmp_path: Path, host):
    def gone(ref: str) -> lock.BaseFacts:
        raise FailedError(f"cannot ask the base {ref} for its packages: pull of {ref} failed")

    with pytest.raises(FailedError, match=r"pytorch-ngc:25.10: cannot ask the base m/p:1 .*`make bases "
                                          r"FRAMEWORK=pytorch-ngc:25.10`"):
        lockdrift.check_cells(tmp_path, [_ngc_cell()], lambda line: None, host, {"pytorch-ngc:25.10": "m/p:1"}, gone)
