"""The apt lock against the real mmdebstrap base in the local registry: `make lock`'s resolution gives the
committed lock's packages; its re-resolution finds no drift and names hand edits; the pinned step installs
exactly the lock; one that would add an unlocked package stops; and a locked version Debian does not serve
fails the build with the one line naming `make lock` (about 2 min: three containers of the base and three
builds of the apt step)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from buildtool.common.files import write_changed
from buildtool.contracts.apt_lock_format import parse_entries
from buildtool.imagebuild import aptlock, engine
from buildtool.imagebuild.bases import fill_bases
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.plan import mirror_base
from buildtool.render.dockerfiles import render_cell_dockerfile

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]
ROOT = Path(__file__).resolve().parents[2]
LOCAL = "127.0.0.1:5000"
CELL = "pytorch-cpu:2.13"


def _cell():
    return next(c for c in load_matrix(ROOT / "matrix.yaml", ROOT / "templates").cells if c.key == CELL)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    cell = _cell()
    fill_bases([cell], LOCAL, force=False, log=lambda line: None, log_dir=tmp_path_factory.mktemp("logs"),
               templates=ROOT / "templates")
    return mirror_base(cell.base, LOCAL)


def test_resolution_in_the_base_matches_the_committed_lock_and_re_resolves_clean(base: str, tmp_path: Path):
    cell = _cell()
    committed = aptlock.read(ROOT, cell)
    # The resolution, written into a copy of the cell's folder: the same packages at the same versions.
    folder = tmp_path / Path(cell.dockerfile).parent
    folder.mkdir(parents=True)
    write_changed(aptlock.lock_texts(tmp_path, cell, base, log=lambda line: None))
    fresh = aptlock.read(tmp_path, cell)
    assert fresh.entries == committed.entries and fresh.inputs == committed.inputs
    assert "openssl" in fresh.entries and "python3.11" in fresh.entries
    assert aptlock.cell_drift(ROOT, cell, base, log=lambda line: None) == []
    # Every package of the base and of the lock gets its .deb's sha256 from the archive's index (the SBOM's).
    hashes = aptlock.read_hashes(tmp_path, cell)
    assert hashes == aptlock.read_hashes(ROOT, cell)
    assert len(hashes) == len(fresh.entries) + len(parse_entries((folder / "base.dpkg").read_text(), ""))
    assert all(len(sha) == 64 for sha in hashes.values()), [k for k, v in hashes.items() if len(v) != 64]


def test_re_resolution_names_hand_edits_by_package(base: str, tmp_path: Path):
    cell = _cell()
    folder = tmp_path / Path(cell.dockerfile).parent
    folder.mkdir(parents=True)
    source = ROOT / Path(cell.dockerfile).parent
    (folder / "base.dpkg").write_text((source / "base.dpkg").read_text())
    lock = (source / "apt.lock").read_text()
    openssl = next(line for line in lock.splitlines() if line.startswith("openssl="))
    edited = (lock.replace("media-types=10.0.0\n", "").replace(openssl, "openssl=0.0.1-gone")
              + "zlib1g=1:1.2.13.dfsg-1\n")
    (folder / "apt.lock").write_text(edited)
    problems = aptlock.cell_drift(tmp_path, cell, base, log=lambda line: None)
    rel = f"{Path(cell.dockerfile).parent}/apt.lock"
    fix = f"; run `make lock FRAMEWORK={CELL}`"
    assert problems == [
        f"{rel}: media-types deleted by hand (the resolution installs media-types 10.0.0){fix}",
        f"{rel}: openssl 0.0.1-gone is no longer served by Debian (it serves {openssl.split('=', 1)[1]}){fix}",
        f"{rel}: zlib1g added by hand (1:1.2.13.dfsg-1 is listed but nothing installs it){fix}",
    ]


def _restamped(text: str) -> str:
    """The lock with its `entries` digest recorded for the entries it now has: what `make lock` writes when
    Debian or the base moved on after it ran (render refuses a lock whose entries do not match the digest)."""
    import re

    from buildtool.contracts.apt_lock_format import entries_digest, parse_entries

    return re.sub(r"(?m)^# entries: sha256:[0-9a-f]{64}$", f"# entries: {entries_digest(parse_entries(text, 'x'))}",
                  text)


def _build_apt_step(base: str, tmp_path: Path, edit) -> str:
    """Build only the base and the rendered apt step of the cell, from its lock as `edit` leaves it (its digest
    recorded again); returns the tag (removed by the caller) or raises BuildFailed."""
    cell = _cell()
    folder = tmp_path / Path(cell.dockerfile).parent
    folder.mkdir(parents=True)
    lock = (ROOT / Path(cell.dockerfile).parent / "apt.lock").read_text()
    (folder / "apt.lock").write_text(_restamped(edit(lock)))
    matrix = load_matrix(ROOT / "matrix.yaml", ROOT / "templates")
    text = render_cell_dockerfile(matrix, cell, ROOT / "templates", root=tmp_path)
    (folder / "Dockerfile").write_text(text[:text.index("\nFROM base AS uv")] + "\n")   # before the uv stage
    tag = f"t-aptlock-{secrets.token_hex(4)}"
    engine.build(engine.resolve_build_client(), engine.BuildRequest(
        folder, folder / "Dockerfile", build_args={"BASE_IMAGE": base},
                 labels={}, secrets={}, log_path=tmp_path / "build.log", tag=tag, no_cache=True))
    return tag


def test_the_pinned_apt_step_installs_exactly_the_lock(base: str, tmp_path: Path):
    tag = _build_apt_step(base, tmp_path, lambda text: text)
    try:
        installed = dict(line.split("=", 1) for line in engine.run_output(
            tag, ["dpkg-query", "-W", "-f", "${Package}=${Version}\n"]).split())
    finally:
        engine.sdk().images.remove(tag, force=True)
    lock = aptlock.read(ROOT, _cell())
    assert {n: installed[n] for n in lock.entries} == lock.entries


def test_a_build_of_a_locked_version_debian_does_not_serve_names_make_lock(base: str, tmp_path: Path):
    with pytest.raises(engine.BuildFailed) as failed:
        _build_apt_step(base, tmp_path, lambda text: text.replace("media-types=10.0.0", "media-types=0.0.0-gone"))
    assert str(failed.value).endswith("apt.lock pins media-types=0.0.0-gone, which Debian no longer serves; run "
                                      "`make lock` (FRAMEWORK=<cell>) and commit the new apt.lock")


def test_a_build_that_would_add_an_unlocked_package_stops(base: str, tmp_path: Path):
    """A lock without one dependency (a hand edit, or another base than the lock's): apt would add it unpinned."""
    with pytest.raises(engine.BuildFailed) as failed:
        _build_apt_step(base, tmp_path, lambda text: text.replace("media-types=10.0.0\n", ""))
    assert ("ERROR: apt added media-types=10.0.0, which apt.lock does not list (another base than it was resolved "
            "in); run make lock FRAMEWORK=pytorch-cpu:2.13") in str(failed.value)
