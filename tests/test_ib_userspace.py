"""Issue 39: the pip CUDA images carry the InfiniBand/RoCE userspace NCCL loads at run time (rdma-core's
libraries, as NVIDIA's framework containers carry rdma-core), locked like every Debian package, installed by
the rendered Dockerfile at the locked versions, and listed by the SBOM. Before, pytorch-cuda's apt.lock (40
packages) had no libibverbs1, and NCCL fell back to TCP sockets with one INFO line.

What the image's SBOM lists is the dpkg database of the built image (image-tests/scripts/packages.py), and
the build refuses an image whose Debian packages differ from its apt.lock (imagebuild.contents); so the SBOM
is made here from a probe whose Debian packages are the lock's. The image itself was not built here (the
CUDA wheels are several GB): see docs/gpu.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from buildtool.imagebuild import aptlock
from buildtool.matrix.loader import load_matrix
from buildtool.sbom import document as sbom
from tests import sbom_probe

REPO = Path(__file__).resolve().parent.parent
IB_USERSPACE = ("libibverbs1", "ibverbs-providers", "librdmacm1")


def gpu_pip_cells():
    matrix = load_matrix(REPO / "matrix.yaml", REPO / "templates", display="matrix.yaml",
                         tests_dir=REPO / "image-tests")
    cells = [c for c in matrix.cells if c.needs_gpu and aptlock.has_apt_step(c)]
    assert [c.key for c in cells] == ["pytorch-cuda:2.13"], "a new pip GPU cell: it needs the IB userspace too"
    return cells


CELLS = gpu_pip_cells()
PLATFORMS = [(c, p) for c in CELLS for p in c.platforms]


@pytest.mark.parametrize(("cell", "platform"), PLATFORMS, ids=[f"{c.key}-{p}" for c, p in PLATFORMS])
def test_every_gpu_pip_cell_locks_the_ib_userspace_on_every_platform(cell, platform):
    assert set(IB_USERSPACE) <= set(aptlock.named_packages(cell)), aptlock.named_packages(cell)
    lock = aptlock.read(REPO, cell, platform if cell.multi_platform else None)
    missing = [name for name in IB_USERSPACE if name not in lock.entries]
    assert not missing, f"{cell.key} {platform}: apt.lock has no {', '.join(missing)}"
    hashes = aptlock.read_hashes(REPO, cell, platform if cell.multi_platform else None)
    for name in IB_USERSPACE:
        assert len(hashes[f"{name}={lock.entries[name]}"]) == 64, name   # the .deb's sha256 is recorded


@pytest.mark.parametrize("cell", CELLS, ids=[c.key for c in CELLS])
def test_the_rendered_dockerfile_installs_them_at_the_locked_versions(cell):
    text = (REPO / cell.dockerfile).read_text()
    for platform in cell.platforms:
        which = platform if cell.multi_platform else None
        lock = aptlock.read(REPO, cell, which)
        for name in IB_USERSPACE:
            pin = f"{name}={lock.entries[name]}"
            if cell.native_installs:   # fetched on the build machine with the sha256 debs.sha256 records
                pin = f"'{pin} {aptlock.read_hashes(REPO, cell, which)[pin]}'"
            assert re.search(rf"^\s+{re.escape(pin)} \\$", text, re.M), name


@pytest.mark.parametrize(("cell", "platform"), PLATFORMS, ids=[f"{c.key}-{p}" for c, p in PLATFORMS])
def test_the_sbom_of_an_image_installed_from_the_lock_lists_libibverbs(cell, platform):
    which = platform if cell.multi_platform else None
    lock, hashes = aptlock.read(REPO, cell, which), aptlock.read_hashes(REPO, cell, which)
    arch = aptlock.architecture(cell, which)
    probe = sbom_probe.probe()
    probe["deb_packages"] = [
        {"Package": name, "Version": version, "Architecture": arch, "source:Package": "rdma-core"
         if name in IB_USERSPACE else name, "source:Version": version, "Depends": "", "Pre-Depends": "",
         "Provides": "", "licenses": None} for name, version in sorted(lock.entries.items())]
    probe["apt_packages"] = dict(sorted(lock.entries.items()))
    doc = sbom.make_sbom(probe, repository=f"r/{cell.name}", digest="sha256:" + "0" * 64, facts={}, locks={},
                         identified={}, deb_hashes=hashes, indexes=sbom_probe.INDEXES)
    sbom.validate_sbom(doc)
    found = {c["name"]: c for c in doc["components"]}
    for name in IB_USERSPACE:
        component = found[name]
        assert component["version"] == lock.entries[name]
        assert component["purl"].startswith(f"pkg:deb/debian/{name}@{lock.entries[name]}?arch={arch}")
        assert component["hashes"] == [{"alg": "SHA-256", "content": hashes[f"{name}={lock.entries[name]}"]}]
