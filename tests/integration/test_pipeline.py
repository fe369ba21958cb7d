"""The README's main job end to end, as a user runs it, in a temporary copy of the project:

    make push validate FRAMEWORK=pytorch-cpu BASE_MIRROR=127.0.0.1:5000

with the DEFAULT reports folder (reports/, inside the project: the case issue 11 found the skip
gate blind to), verdicts signed with this machine's local dev key, then the release gates on
those verdicts, the waiver of a runner's limit by name, and the re-run of the same release
command after the release wrote its files into the project.

Runs in its own registry namespace (REGISTRY=127.0.0.1:5000/t-pipeline-<random>) so it never
touches anyone's dev tags; the build is a retag when test_build already built the same content.
The copy is a git clone of the work tree's files, so nothing is written into the repository.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.attest.keys import TrustedKeys, dev_public_key
from buildtool.common.refs import split_repo, split_repo_path
from buildtool.contracts import label_keys
from buildtool.imagebuild.engine import image_labels as engine_labels
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.plan import Settings, git_revision, plan_cell
from buildtool.registry.client import RegistryClient
from buildtool.sbom.document import contents, load_sbom
from buildtool.sbom.signing import find_sbom_attestation
from buildtool.validate.verdicts import find_verdicts
from tests import bundle_check

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]

ROOT = Path(__file__).resolve().parents[2]
CELLS = ("pytorch-cpu:2.13", "tensorflow-cpu:2.21")


def copy_project(dest: Path) -> Path:
    """The work tree's files (tracked and new, not ignored) in a fresh git repository."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           check=True, capture_output=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-qm", "copy"]):
        subprocess.run(["git", "-C", str(dest), *args], check=True, capture_output=True, timeout=120)
    return dest


def test_main_job_with_default_reports_then_release_gates_and_rerun(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "project")
    registry = f"127.0.0.1:5000/t-pipeline-{secrets.token_hex(4)}"
    env = {**os.environ, "REGISTRY": registry, "BASE_MIRROR": "127.0.0.1:5000"}
    env.pop("RELEASE_REGISTRY", None)

    def make(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["make", f"PYTHON={sys.executable}", *args], cwd=project, env=env,
                              capture_output=True, text=True, timeout=timeout)

    def buildtool(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "buildtool", *args], cwd=project, env=env,
                              capture_output=True, text=True, timeout=timeout)

    # The README's command, on pytorch-cpu alone: no tensorflow image of this commit exists yet.
    job = make("push", "validate", "FRAMEWORK=pytorch-cpu")
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "signed with local dev key" in job.stderr
    revision = git_revision(project)
    matrix = load_matrix(project / "matrix.yaml")
    plans = {key: plan_cell(next(c for c in matrix.cells if c.key == key), Settings.from_env(env), revision)
             for key in CELLS}
    client = RegistryClient("127.0.0.1:5000")
    _, repo, tag = split_repo(plans[CELLS[0]].dev_ref)
    digest = client.manifest_digest(repo, tag)
    assert digest, f"{plans[CELLS[0]].dev_ref} not in the registry after make push"

    # Reports went to the default folder inside the project; ids and groups do not depend on it.
    local = json.loads((project / "reports/pytorch-cpu" / digest.split(":")[1][:12] / "verdict.json").read_text())
    assert local["groups"] == ["common", "pytorch"]
    assert {t["group"] for t in local["tests"]} == {"common", "pytorch"}
    assert sorted(t["id"] for t in local["tests"]) == sorted(local["defined_tests"])
    trusted = TrustedKeys()
    trusted.add_dev(dev_public_key())
    stored = find_verdicts(client, repo, digest, trusted, CELLS[0]).chosen
    assert stored is not None and stored.verdict.to_json() == local   # the signed verdict is the local one
    # Push signed the SBOM with the dev key (builder); the verdict names that document's digest.
    signed_sbom = find_sbom_attestation(client, repo, digest, trusted)
    assert signed_sbom.digest and local["sbom"] == signed_sbom.digest, (local.get("sbom_problem"), signed_sbom)
    # The three as Sigstore bundles, each verified by sigstore-js through the fallback tag and the referrers
    # API, and refused with one byte changed (issue 40).
    bundle_check.need_verifier()
    (tmp_path / "bundles").mkdir()
    bundle_check.check_both_ways(repo, [digest], bundle_check.dev_key_file(tmp_path / "bundles"),
                                 bundle_check.attestation_roles(), tmp_path / "bundles")
    peer_skips = [t for t in local["tests"] if t["skip_code"] == "no-peer-image"]
    assert peer_skips, "expected the cross-framework checks to skip without a tensorflow image"

    # The dev key is nobody the repository trusts: refused, saying so.
    untrusted = buildtool("release", "--version", "0.0.1", "-f", "pytorch-cpu", "--json")
    assert untrusted.returncode == 1 and "untrusted key" in untrusted.stdout, untrusted.stderr[-2000:]
    # Trusted for this loopback run: now the skip gate speaks. The peer skips are a runner's state,
    # not something the matrix allows, so the release is refused and names them.
    gated = buildtool("release", "--version", "0.0.1", "-f", "pytorch-cpu", "--trust-local-key", "--json")
    assert gated.returncode == 1, gated.stdout[-2000:] + gated.stderr[-2000:]
    problems = json.loads(gated.stdout)["status"][CELLS[0]]["problems"]
    assert any("skipped where the matrix expects them to run" in p and peer_skips[0]["id"] in p for p in problems)
    assert not (project / "docs/releases/0.0.1.json").exists()

    # The tensorflow image of the same commit: validated with pytorch's image as its peer, no such skips.
    job = make("push", "validate", "FRAMEWORK=tensorflow-cpu")
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    # pytorch-cpu's skips waived by name (recorded in the notes), tensorflow-cpu's verdict needs none.
    command = ["release", "--version", "0.0.1", "-f", "pytorch-cpu,tensorflow-cpu", "--trust-local-key",
               "--accept-skip", "no-peer-image"]
    first = buildtool(*command)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    notes = (project / "docs/releases/0.0.1.md").read_text()
    assert "WAIVED by the releaser: --accept-skip no-peer-image" in notes
    manifest = json.loads((project / "docs/releases/0.0.1.json").read_text())
    assert {i["cell"] for i in manifest["images"]} == set(CELLS)
    tf = next(i for i in manifest["images"] if i["cell"] == CELLS[1])
    assert all(s["accepted_by"] == "matrix" for s in tf["verdict"]["skipped_tests"])
    assert "local dev key" in tf["verdict"]["signed_by"]
    # Every pushed digest has its SBOM, lock-exact, that the release notes point at.
    for key in CELLS:
        _, repo, tag = split_repo(plans[key].dev_ref)
        found = load_sbom(client, repo, client.manifest_digest(repo, tag))
        assert found is not None, f"no SBOM attached to {plans[key].dev_ref}"
        python = contents(found[0]).python
        locked = json.loads(engine_labels(plans[key].dev_ref)[label_keys.PACKAGES])
        assert locked and all(python.get(name) == version for name, version in locked.items())
        # The signed SBOM went with the image into the release repository, the same artifact.
        _, rel_repo = split_repo_path(plans[key].release_repo)
        assert find_sbom_attestation(client, rel_repo, client.manifest_digest(repo, tag), trusted).digest
    for image in manifest["images"]:
        assert image["packages"]["sbom"].startswith(image["repository"] + "@sha256:"), image["packages"]
        assert image["packages"]["note"] == "first release of this image version"
        assert image["packages"]["python_packages"] >= 20 and image["packages"]["apt_packages"] > 100

    # The release wrote docs/releases/ and docs/images.md into the project: re-running the same
    # command must still find the same dev images, and say the release is complete.
    written = {p: p.read_bytes() for p in (project / "docs/releases/0.0.1.json", project / "docs/images.md")}
    again = buildtool(*command)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "release 0.0.1 was already complete: nothing written" in again.stderr
    assert all(p.read_bytes() == data for p, data in written.items())
    assert git_revision(project) == revision
