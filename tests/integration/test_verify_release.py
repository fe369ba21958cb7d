"""`buildtool verify` on a released image in the real local registry: push's attestations (the SBOM, plain
and signed; the provenance), validate's read of the signed SBOM into the verdict, release (which copies
the signed artifacts with the image), then the command prints the whole chain from the release repository.

The image is test_release's small synthetic one (nothing is built); the verdict is signed by hand as
validate signs it (tests/signing.py), naming the SBOM digest that validate's own reader
(buildtool.validate.sbomref.verdict_sbom) returns from the registry. The provenance is attached by
tests/signing.attest_provenance, in the form the stand-in reader (buildtool.attest.provenance_store) reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.attest.keys import trusted_entry
from buildtool.attest.referrers import referrers
from buildtool.attest.sigstore_bundle import BUNDLE_MEDIA_TYPE, PREDICATE_TYPE_ANNOTATION
from buildtool.attest.verdict_statement import VERDICT_PREDICATE
from buildtool.contracts import names
from buildtool.contracts.names import SBOM_ATTESTATION_TYPE
from buildtool.sbom.signing import SBOM_PREDICATE
from buildtool.validate.containers import Resolved
from buildtool.validate.sbomref import verdict_sbom
from tests import signing
from tests.integration.test_release import CPU, HOST, Space, commit_of, labels_for, push_single

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]

ROOT = Path(__file__).resolve().parents[2]


def test_verify_on_a_released_image_prints_the_whole_chain(tmp_path: Path) -> None:
    space, r = Space(), signing.head_commit()[:12]   # built at HEAD, which the `built` line names
    repo = space.dev_repo(CPU)
    digest, _ = push_single(space.client, repo, names.dev_tag(r, CPU.version), labels_for(CPU))
    # push: the provenance (built at r, a commit of this checkout: release wants the dev tag's revision, the release
    # commit or an ancestor), the SBOM plain and signed
    signing.attach_provenance(space.client, repo, digest, signing.provenance(CPU, revision=commit_of(r)))
    signing.attest_sbom(space.client, repo, digest)
    (tmp_path / "config").mkdir()
    keys = tmp_path / "config/trusted-keys.yaml"
    keys.write_text("keys:\n" + trusted_entry("ci", signing.KEY.public(), ("builder", "tester")))
    image = Resolved(f"{HOST}/{repo}@{digest}", f"{HOST}/{repo}@{digest}", digest, HOST, repo, {})
    named, problem = verdict_sbom(image, tmp_path, print)        # validate: which SBOM the verdict names
    assert problem == "" and named.startswith("sha256:")
    signing.attest(space.client, repo, digest, signing.verdict(CPU, digest, sbom=named))
    report = space.release([CPU], r, "0.1.0")
    assert report.ok, report.images[0].problems
    [copied] = referrers(space.client, space.rel_repo(CPU), digest, SBOM_ATTESTATION_TYPE)
    # the same artifact, by digest, in the release repo
    assert copied == report.images[0].evidence[0].sbom_attestation
    # with the Sigstore bundles of the SBOM and the verdict (this test's provenance is attached without one)
    bundles = referrers(space.client, space.rel_repo(CPU), digest, BUNDLE_MEDIA_TYPE)
    assert sorted(b.annotations[PREDICATE_TYPE_ANNOTATION] for b in bundles) == sorted(
        [SBOM_PREDICATE, VERDICT_PREDICATE])

    def verify(*args: str) -> subprocess.CompletedProcess[str]:
        # Outside the checkout (its verdict's test code is the fixtures', which release took from a stand-in):
        # the chain only, and verify says which of release's checks it could not run (tests/test_verify_strict.py).
        return subprocess.run([sys.executable, "-m", "buildtool", "verify", *args, "--keys", str(keys)],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              capture_output=True, text=True, timeout=120)

    released = f"{HOST}/{space.rel_repo(CPU)}:2.13-0.1.0"
    done = verify(released)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"image   {HOST}/{space.rel_repo(CPU)}@{digest}"
    assert lines[1].startswith(f"built   by https://ci.example.invalid/runs/1 (key {signing.KEY.keyid[:16]} (ci)), "
                               f"from {signing.head_commit()}, base {CPU.base}@{signing.BASE_DIGEST}")
    assert lines[2] == f"sbom    2 components, {named} signed by {signing.KEY.keyid[:16]} (ci)"
    assert lines[3].startswith(f"tested  by ci (key {signing.KEY.keyid[:16]} (ci)), passed, 2 passed, 0 failed")
    assert lines[3].endswith(f"names sbom {named} (matches)") and lines[4].startswith("note    builder and tester")
    # One result line, last, after what could not be checked (issue 50: no "verified" above a "NOT verified").
    assert lines[5].startswith("not run the cell's checks")
    assert lines[-1] == "result  verified (without release's gate: see `not run`)"
    as_json = json.loads(verify(released, "--json").stdout)
    assert as_json["verified"] is True and as_json["manifests"][0]["sbom"]["digest"] == named

    # An attacker who may push attaches their own signed SBOM to the released digest: it does not count,
    # and the chain still verifies; one signed by a trusted builder with another document breaks it.
    signing.attest_sbom(space.client, space.rel_repo(CPU), digest, signing.minimal_sbom(digest, 7),
                        key=signing.ATTACKER, plain=False)
    assert verify(released).returncode == 0
    rewritten = signing.attest_sbom(space.client, space.rel_repo(CPU), digest, signing.minimal_sbom(digest, 7))
    broken = verify(released)
    assert broken.returncode == 1
    assert broken.stderr.strip().startswith(f"failed: {digest} has no valid SBOM attestation (2 signed SBOMs "
                                            "disagree"), broken.stderr
    assert named in broken.stderr and rewritten in broken.stderr
