"""`buildtool diff` against real images: the local mmdebstrap base (in the local registry, with no
SBOM: probed) against a pytorch-cpu dev image pushed with its SBOM; and that dev image probed under
a local name against its own SBOM (the probe and the SBOM list the same packages).

The dev image is this commit's pytorch-cpu cell, built by buildtool's Builder (a retag when an image
with the same content key exists, e.g. from test_build) and pushed into a registry namespace of its
own (`127.0.0.1:5000/t-diff-<random>/...`), removed at the end; its base is filled by the Builder
(mmdebstrap) when the registry lacks it.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from buildtool.common import docker_cli
from buildtool.common.refs import split_repo
from buildtool.imagebuild.builder import Builder, BuildOptions, CellResult
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.plan import CellPlan, Settings, git_revision, plan_cell
from buildtool.registry.client import RegistryClient
from buildtool.sbom.document import contents, load_sbom
from tests import signing
from tests.integration.test_build import _cleanup_namespace

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]

ROOT = Path(__file__).resolve().parents[2]
LOCAL = "127.0.0.1:5000"
CELL = "pytorch-cpu:2.13"
KINDS = ("removed", "changed", "added")


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CellPlan, CellResult]]:
    namespace = f"t-diff-{secrets.token_hex(4)}"
    settings = Settings(registry=f"{LOCAL}/{namespace}", release_registry=f"{LOCAL}/{namespace}", base_mirror=LOCAL)
    matrix = load_matrix(ROOT / "matrix.yaml", ROOT / "templates")
    revision = git_revision(ROOT)
    plan = plan_cell(next(c for c in matrix.cells if c.key == CELL), settings, revision)
    options = BuildOptions(push=True, jobs=1, log_dir=tmp_path_factory.mktemp("build-logs"),
                           builder_key=lambda: signing.KEY, matrix=ROOT / "matrix.yaml")
    try:
        [result] = Builder(ROOT, matrix.source, settings, revision, options, log=print).run([plan])
        assert result.ok and result.digest and result.sbom and result.provenance, result.message
        yield plan, result
    finally:
        _cleanup_namespace(namespace)


@pytest.fixture(autouse=True)
def builder_key_of_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """diff shows only SBOMs a trusted builder signed: the key the fixture built with is this machine's builder
    key (DL_IMAGES_BUILDER_KEY), as on the machine that pushed the image."""
    monkeypatch.setenv("DL_IMAGES_BUILDER_KEY", signing.KEY.pem.decode())


def _lines(out: str) -> list[str]:
    return out.splitlines()


def _kind(line: str) -> str:
    return "removed" if line.startswith("removed ") else "added" if line.startswith("added ") else "changed"


def test_the_base_without_sbom_is_probed_and_what_pytorch_cpu_adds_is_listed(pushed, run_cli):
    plan, result = pushed
    assert plan.base.startswith(f"{LOCAL}/library/debian:")
    code, out, err = run_cli("diff", plan.base, result.ref)
    assert code == 0, err
    assert f"before: {plan.base}: no SBOM attached, probed image sha256:" in err
    assert "Python environments: none (Debian packages only)" in err      # minbase has no Python
    # The SBOM diff reads is the one the builder signed: the line names that attestation, of the image's digest.
    after = next(line for line in err.splitlines() if line.startswith(f"after: {result.ref}: SBOM sha256:"))
    assert f" of {result.digest}: " in after, after
    packages = [line for line in _lines(out) if " (python) " in line or " (apt) " in line]
    kinds = [_kind(line) for line in packages]
    assert kinds == sorted(kinds, key=KINDS.index), packages              # removed, changed, added
    _, repo, _ = split_repo(result.ref)
    found = load_sbom(RegistryClient(LOCAL), repo, result.digest)
    assert found is not None
    dev = contents(found[0])
    # Every Python package of the image is new on top of the base; Python itself comes from Debian.
    added_python = {line.split()[1] for line in packages if line.startswith("added ") and " (python) " in line}
    assert added_python == set(dev.python)
    assert f"added torch (python) {dev.python['torch']}" in packages
    assert any(line.startswith("added python3.11 (apt) ") for line in packages)
    assert any(line.startswith("added python3-venv (apt) ") for line in packages)
    assert any(line.startswith("added python 3.") for line in _lines(out))   # the headline fact


def test_the_dev_image_probed_lists_what_its_sbom_lists(pushed, run_cli):
    plan, result = pushed
    local = f"t-diff-probe-{secrets.token_hex(4)}:{result.digest.split(':')[1][:12]}"
    docker_cli.docker("tag", result.ref, local, timeout=60, check=True)
    try:
        code, out, err = run_cli("diff", "--json", result.ref, local)
    finally:
        docker_cli.docker("rmi", local, timeout=60)
    assert code == 0, err
    document = json.loads(out)
    assert document["before"]["source"] == "sbom" and document["after"]["source"] == "probe"
    assert document["after"]["digest"] is None and document["after"]["image_id"].startswith("sha256:")
    environments = document["after"]["python_environments"]
    assert environments[0]["python"] == "/opt/venv/bin/python", environments
    # Same packages; and the facts a probe sees (Python, OS, CUDA) are the SBOM's: nothing differs.
    assert document["changes"] == []
