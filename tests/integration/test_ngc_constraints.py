"""NGC cells install their tools lock under the base's own PIP_CONSTRAINT: with constraints the
lock agrees with, the build succeeds and the framework is untouched; with a base that pins a
locked package to another version (as NGC pins its numpy), the build fails naming it instead of
replacing anything. The base is the local pytorch-ngc stand-in plus a constraint file and
PIP_CONSTRAINT, as NGC sets them (about 60 s: two thin bases, two tool installs). The cell is pytorch-ngc:25.10,
whose tools are installed natively (parts/ngc_native.j2); its base is pytorch-ngc:25.01's stand-in, checked to be
made as 25.10's amd64 one is: 25.10's own stand-in is an index whose arm64 child carries PyPI's CUDA torch
(4.9 GB), more than CI's disk holds beside the rest of the suite."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from buildtool.contracts.locks import TOOLS_LOCK
from buildtool.imagebuild import engine
from buildtool.imagebuild.bases import fill_bases
from buildtool.imagebuild.lock import read_locks
from buildtool.imagebuild.pipconfig import pip_secrets
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.plan import mirror_base

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]
ROOT = Path(__file__).resolve().parents[2]
LOCAL = "127.0.0.1:5000"
CELL = "pytorch-ngc:25.10"
STANDIN_OF = "pytorch-ngc:25.01"


def _ngc_like_base(tmp: Path, standin: str, extra_pin: str, ref: str) -> str:
    """The stand-in with a constraint file of its own packages (+ one pin) named by PIP_CONSTRAINT."""
    tmp.mkdir()
    (tmp / "Dockerfile").write_text(f"""\
ARG BASE_IMAGE={standin}
FROM ${{BASE_IMAGE}}
RUN mkdir -p /etc/pip && python -m pip list --format=freeze > /etc/pip/constraint.txt \\
 && echo '{extra_pin}' >> /etc/pip/constraint.txt
ENV PIP_CONSTRAINT=/etc/pip/constraint.txt
""")
    engine.build(engine.resolve_build_client(), engine.BuildRequest(
        tmp, tmp / "Dockerfile", build_args={"BASE_IMAGE": standin}, labels={}, secrets={},
        log_path=tmp / "base.log", tag=ref))
    engine.push(ref)
    return ref


def test_tools_are_installed_under_the_bases_constraints_and_a_conflict_fails(tmp_path: Path):
    cells = {c.key: c for c in load_matrix(ROOT / "matrix.yaml").cells}
    cell, single = cells[CELL], cells[STANDIN_OF]
    assert cell.standin is not None and single.standin is not None and not single.multi_platform
    assert single.standin.base == cell.standin.base and single.platforms == ("linux/amd64",)
    assert single.standin.requirements_for("linux/amd64") == cell.standin.requirements_for("linux/amd64")
    fill_bases([single], LOCAL, force=False, log=print, log_dir=tmp_path, templates=ROOT / "templates")
    standin = mirror_base(single.base, LOCAL)
    space = f"{LOCAL}/t-ngc-{secrets.token_hex(4)}"
    # Built here for this machine's platform (the cell is built for linux/amd64 and linux/arm64): the base and the
    # build machine's base (parts/ngc_native.j2) are the same image, whose constraints the native install obeys.
    numpy = read_locks(ROOT, cell, "linux/amd64")[TOOLS_LOCK].versions()["numpy"]
    folder = (ROOT / cell.dockerfile).parent
    refs = []
    try:
        with pip_secrets() as pip:
            agreeing = _ngc_like_base(tmp_path / "a", standin, "# nothing more", f"{space}/base:agree")
            built = f"{space}/pytorch-ngc-dev:agree"
            engine.build(engine.resolve_build_client(), engine.BuildRequest(folder, folder / "Dockerfile",
                         build_args={"BASE_IMAGE": agreeing, "BUILD_BASE_IMAGE": agreeing}, labels={},
                         secrets=pip.files,
                         log_path=tmp_path / "agree.log", tag=built))
            refs += [agreeing, built]
            torch_before = engine.run_output(agreeing, ["python", "-c", "import torch; print(torch.__version__)"])
            torch_after = engine.run_output(built, ["python", "-c", "import torch, tensorboard, numpy; "
                                                     "print(torch.__version__)"])
            assert torch_after == torch_before
            assert engine.run_output(built, ["python", "-c", "import numpy; print(numpy.__version__)"]).strip() == numpy

            conflicting = _ngc_like_base(tmp_path / "c", standin, "numpy==1.26.4", f"{space}/base:conflict")
            refs.append(conflicting)
            with pytest.raises(engine.BuildFailed):
                engine.build(engine.resolve_build_client(), engine.BuildRequest(folder, folder / "Dockerfile",
                             build_args={"BASE_IMAGE": conflicting, "BUILD_BASE_IMAGE": conflicting}, labels={},
                             secrets=pip.files,
                             log_path=tmp_path / "conflict.log", tag=f"{space}/pytorch-ngc-dev:conflict"))
            log = (tmp_path / "conflict.log").read_text()
            assert f"numpy=={numpy} and numpy==1.26.4" in log and "unsatisfiable" in log, log[-2000:]
    finally:
        for ref in refs:
            engine.untag(ref)
