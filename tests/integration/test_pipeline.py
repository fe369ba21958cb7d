"""The main job end to end, as a user runs it: build + push the CPU cells, validate them in
their real dev images (verdicts stored by digest), and a dry-run release whose gates read
those verdicts back from the registry. This is the README's first command, plus release.

Runs in its own registry namespace (REGISTRY=127.0.0.1:5000/t-pipeline-<random>) so it
never touches anyone's dev tags; the build is a retag when test_build already built the
same content.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.build.engine import image_labels as engine_labels
from buildtool.common.refs import split_repo
from buildtool.contracts import label_keys
from buildtool.matrix.plan import Settings, git_revision, plan_cell
from buildtool.matrix.schema import load_matrix
from buildtool.registry.client import RegistryClient
from buildtool.registry.sbom import contents, load_sbom
from buildtool.validate.verdicts import load_verdict

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CELLS = ("pytorch-cpu:2.13", "tensorflow-cpu:2.21")


def _buildtool(args: list[str], env: dict[str, str], timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "buildtool", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_build_validate_and_release_gates_on_the_real_cpu_images(tmp_path: Path):
    registry = f"127.0.0.1:5000/t-pipeline-{secrets.token_hex(4)}"
    env = {**os.environ, "REGISTRY": registry, "BASE_MIRROR": "127.0.0.1:5000"}
    revision = git_revision(ROOT)
    selection = ",".join(CELLS)

    build = _buildtool(["build", "-f", "pytorch-cpu", "--push", "--revision", revision], env, 1800)
    assert build.returncode == 0, build.stdout + build.stderr[-3000:]
    build = _buildtool(["build", "-f", "tensorflow-cpu", "--push", "--revision", revision], env, 1800)
    assert build.returncode == 0, build.stdout + build.stderr[-3000:]

    matrix = load_matrix(ROOT / "matrix.yaml")
    settings = Settings.from_env(env)
    plans = [plan_cell(next(c for c in matrix.cells if c.key == key), settings, revision) for key in CELLS]
    client = RegistryClient("127.0.0.1:5000")
    digests = {}
    for plan in plans:
        _, repo, tag = split_repo(plan.dev_ref)
        digests[plan.cell.key] = client.manifest_digest(repo, tag)
        assert digests[plan.cell.key], f"{plan.dev_ref} not in the registry after build --push"

    # As `make validate FRAMEWORK=...` runs it: this commit's dev image, the other framework's as the peer.
    for image in ("pytorch-cpu", "tensorflow-cpu"):
        validate = _buildtool(["validate", "-f", image, "--revision", revision,
                               "--reports", str(tmp_path / "reports")], env, 1800)
        assert validate.returncode == 0, validate.stdout[-3000:] + validate.stderr[-3000:]

    for plan in plans:
        _, repo, _ = split_repo(plan.dev_ref)
        verdict = load_verdict(client, repo, digests[plan.cell.key])
        assert verdict is not None, f"no verdict stored for {plan.dev_ref}"
        assert verdict["result"] == "passed" and verdict["cell"] == plan.cell.key
        results = {t["result"] for t in verdict["tests"]}
        assert "failed" not in results and "passed" in results
        # Every skip says why, with a code the release gate judges: on these CPU cells, the GPU checks.
        for test in verdict["tests"]:
            if test["result"] == "skipped":
                assert test["skip_code"] == "gpu-not-in-cell" and test["skip_reason"], test

    release = _buildtool(["release", "--version", "0.0.1", "--framework", selection, "--from", revision,
                          "--dry-run", "--json"], env, 600)
    assert release.returncode == 0, release.stdout[-3000:] + release.stderr[-3000:]
    report = json.loads(release.stdout)
    assert report["ok"] is True
    assert {cell: s["status"] for cell, s in report["status"].items()} == {key: "dry-run" for key in CELLS}
    assert {i["cell"]: i["digest"] for i in report["release"]["images"]} == digests
    # Every pushed digest has its SBOM, lock-exact, that the release notes point at.
    for plan in plans:
        _, repo, _ = split_repo(plan.dev_ref)
        found = load_sbom(client, repo, digests[plan.cell.key])
        assert found is not None, f"no SBOM attached to {plan.dev_ref}"
        python = contents(found[0]).python
        locked = json.loads(engine_labels(plan.dev_ref)[label_keys.PACKAGES])
        assert locked and all(python.get(name) == version for name, version in locked.items())
    for image in report["release"]["images"]:
        assert image["packages"]["sbom"].startswith(image["repository"] + "@sha256:"), image["packages"]
        assert image["packages"]["note"] == "first release of this image version"
        assert image["packages"]["python_packages"] >= 20 and image["packages"]["apt_packages"] > 100
