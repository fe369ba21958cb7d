"""A multi-platform cell end to end on an amd64 machine: jax-cpu, built for linux/amd64 and linux/arm64 (arm64
under QEMU user emulation), pushed as one OCI index, the arm64 image run and validated under emulation with a
verdict of its own, and the release gate naming each platform that lacks a passing verdict.

    buildtool build -f jax-cpu:0.10 --push     (REGISTRY=127.0.0.1:5000/t-multiarch-<random>, BASE_MIRROR)

Runs in its own registry namespace; the Debian base becomes an index over both platforms in the shared
mirror (make bases does the same), its amd64 image unchanged.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from buildtool.attest.keys import TrustedKeys, dev_public_key
from buildtool.attest.provenance_store import find_provenance
from buildtool.common import docker_cli
from buildtool.common.refs import split_repo
from buildtool.contracts import platforms
from buildtool.contracts.locks import FRAMEWORK_LOCK, parse_lock
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.plan import Settings, git_revision, plan_cell
from buildtool.registry.client import RegistryClient
from buildtool.sbom.document import load_sbom
from buildtool.sbom.signing import find_sbom_attestation
from buildtool.validate.verdicts import find_verdicts
from tests import bundle_check
from tests.integration import fixture_images

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]

ROOT = Path(__file__).resolve().parents[2]
CELL = "jax-cpu:0.10"
BOTH = ["linux/amd64", "linux/arm64"]
# What users rely on, under emulation: data-parallel training across processes (gloo), the profiler's trace in
# TensorBoard's profile plugin, and /dev/shm (the DDP, profiler and shm checks, JAX's versions of them).
EMULATED_CHECKS = ("(test_distributed and (psum or loss_falls or identical_parameters)) or test_profiler "
                   "or test_shm")


def _trusted() -> TrustedKeys:
    trusted = TrustedKeys()
    trusted.add_dev(dev_public_key())
    return trusted


@pytest.fixture(scope="module")
def pushed() -> dict[str, Any]:
    registry = f"127.0.0.1:5000/t-multiarch-{secrets.token_hex(4)}"
    env = {**os.environ, "REGISTRY": registry, "BASE_MIRROR": "127.0.0.1:5000"}
    env.pop("RELEASE_REGISTRY", None)

    def buildtool(*args: str, timeout: int = 3600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "buildtool", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout)

    # The shared mirror's Debian base may need its arm64 child (minutes under QEMU): made once, not beside a
    # fixture image build doing the same (tests/integration/fixture_images.py builds jax-cpu too).
    with fixture_images.one_builder():
        build = buildtool("build", "-f", CELL, "--push", "--json")
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    [result] = json.loads(build.stdout)["results"]
    matrix = load_matrix(ROOT / "matrix.yaml")
    cell = next(c for c in matrix.cells if c.key == CELL)
    plan = plan_cell(cell, Settings.from_env(env), git_revision(ROOT))
    _, repo, tag = split_repo(plan.dev_ref)
    return {"result": result, "plan": plan, "cell": cell, "repo": repo, "tag": tag, "buildtool": buildtool,
            "children": {p["platform"]: p["digest"] for p in result["platforms"]}}


def test_the_dev_tag_is_an_index_with_each_platforms_own_signed_image(pushed: dict[str, Any]) -> None:
    assert pushed["result"]["result"] in ("pushed", "retagged", "up to date"), pushed["result"]
    raw = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{pushed['plan'].dev_ref}"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    index = json.loads(raw)
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    listed = {platforms.from_descriptor(m["platform"]).name: m["digest"] for m in index["manifests"]}
    assert list(listed) == BOTH and listed == pushed["children"]
    assert pushed["result"]["digest"] == RegistryClient("127.0.0.1:5000").manifest_digest(pushed["repo"],
                                                                                         pushed["tag"])
    client, trusted = RegistryClient("127.0.0.1:5000"), _trusted()
    for platform, digest in listed.items():
        # SBOM and provenance are each platform's own, signed, on its own manifest digest.
        assert find_sbom_attestation(client, pushed["repo"], digest, trusted).digest, platform
        provenance = find_provenance(client, pushed["repo"], digest, trusted).provenance
        assert provenance is not None, platform


def test_each_platforms_bundles_verify_with_sigstore_js(pushed: dict[str, Any], tmp_path: Path) -> None:
    """Issue 40: each platform manifest's provenance and SBOM as Sigstore bundles (and its verdict's, where
    validate has run), verified by sigstore-js through the fallback tag and the referrers API, and refused with
    one byte changed."""
    bundle_check.need_verifier()
    roles = bundle_check.attestation_roles()
    bundle_check.check_both_ways(pushed["repo"], [pushed["children"][p] for p in BOTH],
                                 bundle_check.dev_key_file(tmp_path), roles, tmp_path,
                                 required={t for t, role in roles.items() if role == "builder"})


def test_the_arm64_image_runs_aarch64_with_the_wheel_its_own_lock_names(pushed: dict[str, Any]) -> None:
    probe = ("import pathlib, platform, jax, jaxlib; print(platform.machine(), jax.__version__); "
             "print(next(pathlib.Path(jaxlib.__file__).parents[1].glob('jaxlib-*.dist-info/WHEEL')).read_text())")
    run = docker_cli.docker("run", "--rm", "--platform", "linux/arm64", pushed["plan"].dev_ref, "python", "-c", probe,
                            timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    first, *wheel = run.stdout.splitlines()
    assert first == "aarch64 0.10.2"
    assert any(line.startswith("Tag: cp311-cp311-manylinux") and line.endswith("_aarch64") for line in wheel), wheel
    # Each image's jaxlib is a wheel its own platform's lock names (uv checks its sha256), and the arm64 one is
    # none the amd64 lock would take: the image's SBOM records the hash of the file it installed. (Each lock
    # lists the files of its own platform.)
    folder = ROOT / pushed["cell"].dockerfile.rsplit("/", 1)[0]
    locks = {arch: {h.removeprefix("sha256:") for e in parse_lock((folder / arch / FRAMEWORK_LOCK).read_text())
                    .entries.values() for h in e.hashes} for arch in ("amd64", "arm64")}
    client = RegistryClient("127.0.0.1:5000")
    installed = {}
    for platform, digest in pushed["children"].items():
        document = load_sbom(client, pushed["repo"], digest)
        document = document[0] if isinstance(document, tuple) else document
        [jaxlib] = [c for c in document["components"] if c.get("name") == "jaxlib"]
        [installed[platform]] = [h["content"] for h in jaxlib["hashes"] if h["alg"] == "SHA-256"]
        assert installed[platform] in locks[platforms.get(platform).architecture], platform
    assert installed["linux/arm64"] != installed["linux/amd64"]
    assert installed["linux/arm64"] not in locks["amd64"]


def test_arm64_is_validated_under_emulation_and_its_verdict_is_its_own(pushed: dict[str, Any],
                                                                      tmp_path: Path) -> None:
    run = pushed["buildtool"]("validate", pushed["plan"].dev_ref, "--platform", "linux/arm64", "-k",
                              EMULATED_CHECKS, "--reports", str(tmp_path), "--json")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [verdict] = json.loads(run.stdout)
    assert (verdict["platform"], verdict["emulated"]) == ("linux/arm64", True)
    assert verdict["digest"] == pushed["children"]["linux/arm64"]
    assert verdict["deadline_s"] == pushed["cell"].validate_deadline_s * pushed["cell"].emulation_factor
    ran = {t["id"].split("::")[1].split("[")[0]: t["result"] for t in verdict["tests"]}
    assert {"test_psum_across_processes_gives_known_sum", "test_loss_falls_with_averaged_gradients",
            "test_processes_end_with_identical_parameters", "test_jax_profiler_writes_xplane",
            "test_trace_holds_the_traced_steps", "test_workers_pass_large_batches_through_shm"} <= {
        name for name, result in ran.items() if result == "passed"}, ran
    assert "failed" not in ran.values(), ran
    # A selection never releases: incomplete, saying why.
    assert verdict["result"] == "incomplete" and any("deselected" in r for r in verdict["incomplete"])
    client, trusted = RegistryClient("127.0.0.1:5000"), _trusted()
    stored = find_verdicts(client, pushed["repo"], pushed["children"]["linux/arm64"], trusted, CELL).chosen
    assert stored is not None and stored.verdict.platform == "linux/arm64" and stored.verdict.emulated
    assert find_verdicts(client, pushed["repo"], pushed["children"]["linux/amd64"], trusted, CELL).chosen is None

    # Release: each platform without a passing verdict is refused by name, and nothing is promoted.
    release = pushed["buildtool"]("release", "--version", "0.0.1", "-f", CELL, "--trust-local-key", "--dry-run",
                                  "--json")
    assert release.returncode == 1, release.stdout[-2000:] + release.stderr[-2000:]
    problems = json.loads(release.stdout)["status"][CELL]["problems"]
    assert any(p.startswith("linux/amd64") and "verdict" in p for p in problems), problems
    assert any(p.startswith("linux/arm64") and "incomplete" in p for p in problems), problems
