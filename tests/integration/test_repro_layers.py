"""Two cold builds of one tiny Dockerfile FROM the local mmdebstrap base give identical layers.

Each RUN stamps what it wrote with SOURCE_DATE_EPOCH, as the templates do, so what is left to
differ is what the runtime does to the base around every RUN: on a base without /etc/hosts,
/etc/resolv.conf or /etc/hostname it creates them as mount points and removes them after the
step, and /etc lands in the layer with the wall-clock time (tests/test_base_repro.py checks the
base's recipe without an engine). About 30 s with the base present; making it first adds a
mmdebstrap (a minute or two)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from buildtool.common import docker_cli
from buildtool.imagebuild import engine
from buildtool.imagebuild.bases import fill_bases
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.plan import mirror_base

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]
ROOT = Path(__file__).resolve().parents[2]
LOCAL = "127.0.0.1:5000"
# Each RUN stamps what it wrote with SOURCE_DATE_EPOCH by name (the templates' `find -newer
# /run/stamp` would miss a file written within the kernel's timestamp tick of the stamp, which a
# one-line RUN can do).
DOCKERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG CACHE_EPOCH
ARG SOURCE_DATE_EPOCH=0
RUN mkdir /opt/one && echo one > /opt/one/file && touch --date=@${SOURCE_DATE_EPOCH} /opt /opt/one /opt/one/file
RUN echo two > /opt/two && touch --date=@${SOURCE_DATE_EPOCH} /opt /opt/two
"""


def test_two_cold_builds_on_the_base_give_identical_layers(tmp_path: Path):
    cell = next(c for c in load_matrix(ROOT / "matrix.yaml").cells if c.key == "pytorch-cpu:2.13")
    fill_bases([cell], LOCAL, force=False, log=print, log_dir=tmp_path, templates=ROOT / "templates")
    base = mirror_base(cell.base, LOCAL)
    (tmp_path / "Dockerfile").write_text(DOCKERFILE)
    tag = f"t-repro-{secrets.token_hex(4)}"
    refs = [f"{tag}/tiny:{n}" for n in (1, 2)]
    try:
        for ref in refs:
            # A new CACHE_EPOCH per build: nothing of the first build is reused by the second.
            engine.build(engine.resolve_build_client(), engine.BuildRequest(tmp_path, tmp_path / "Dockerfile",
                         build_args={"BASE_IMAGE": base, "CACHE_EPOCH": secrets.token_hex(6)}, labels={},
                         secrets={}, log_path=tmp_path / f"{ref.rsplit(':', 1)[1]}.log", tag=ref))
        first, second = ((engine.image_attrs(ref) or {})["RootFS"]["Layers"] for ref in refs)
    finally:
        for ref in refs:
            docker_cli.docker("rmi", "-f", ref, timeout=120)
    assert len(first) == len(second) >= 3
    differing = [n for n, (a, b) in enumerate(zip(first, second, strict=True)) if a != b]
    assert differing == [], f"layers {differing} differ between two cold builds of the same Dockerfile"
