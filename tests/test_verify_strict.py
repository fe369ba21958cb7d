"""`buildtool verify` as strict as release, through release's own code (issue 37): what release refuses,
verify refuses, and it says which checks it could not run (no checkout). Disguised index entries: an entry
is left out as an attestation only when it is one. In-memory registry, release-grade fixtures (those of
tests/test_release_platforms.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from buildtool.matrix.plan import Settings
from buildtool.registry.client import OCI_INDEX, OCI_MANIFEST, sha256_digest
from buildtool.release.chain import Checkout, Verification, verify_reference
from buildtool.sbom.document import store_sbom
from tests import signing
from tests.test_release_platforms import CPU, MULTI, Dev

ROOT = Path(__file__).resolve().parents[1]


def checkout(cell: object = CPU) -> Checkout:
    return Checkout(root=ROOT, cells=[cell], settings=Settings(registry="127.0.0.1:5999/t"),   # type: ignore[list-item]
                    known_code=signing.known_code(), source_check=signing.source_check())


def verify(dev: Dev, with_checkout: bool = True, ref: str = "") -> Verification:
    reference = f"{dev.client.host}/{dev.repo}:{ref or dev.plan.dev_tag}"
    return verify_reference(dev.client, reference, signing.trusted(),   # type: ignore[arg-type]
                            checkout(dev.cell) if with_checkout else None)


def single(dev: Dev, digest: str) -> None:
    """The dev tag names the one platform image (a single-platform cell)."""
    raw, media_type, _ = dev.client.get_manifest(dev.repo, digest)
    dev.client.put_manifest(dev.repo, dev.plan.dev_tag, raw, media_type)


def index(dev: Dev, entries: list[dict[str, object]]) -> str:
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
    return dev.client.put_manifest(dev.repo, dev.plan.dev_tag, body, OCI_INDEX)


def entry(dev: Dev, digest: str, os_: str = "linux", arch: str = "amd64", **annotations: str) -> dict[str, object]:
    raw = dev.client.get_manifest(dev.repo, digest)[0]
    found: dict[str, object] = {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw),
                                "platform": {"os": os_, "architecture": arch}}
    if annotations:
        found["annotations"] = annotations
    return found


def attestation_manifest(dev: Dev, layer_type: str = "application/vnd.in-toto+json") -> str:
    """What BuildKit attaches to an index for an image's attestations: an in-toto layer, nothing to run."""
    config = b'{"architecture":"unknown","os":"unknown","config":{},"rootfs":{"type":"layers","diff_ids":[]}}'
    layer = b'{"_type":"https://in-toto.io/Statement/v0.1"}'
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": dev.client.put_blob(dev.repo, config), "size": len(config)},
                "layers": [{"mediaType": layer_type, "digest": dev.client.put_blob(dev.repo, layer),
                            "size": len(layer), "annotations": {"in-toto.io/predicate-type": "https://spdx.dev/Document"}}]}
    raw = json.dumps(manifest).encode()
    return dev.client.put_manifest(dev.repo, sha256_digest(raw), raw, OCI_MANIFEST)


ATTESTATION = {"vnd.docker.reference.type": "attestation-manifest"}


# -- disguised index entries ----------------------------------------------------------------------

def test_an_untested_image_annotated_as_an_attestation_is_refused_by_release_and_verify() -> None:
    """The audit: an `unknown/unknown` entry with only the annotation, over an image nobody validated, was
    released (the release repository then served it by digest) and verify skipped it."""
    dev = Dev(CPU)
    amd = dev.validated("amd64")
    untested = dev.image("amd64", payload=b"not what was validated")
    index(dev, [entry(dev, amd), entry(dev, untested, "unknown", "unknown", **ATTESTATION,
                                       **{"vnd.docker.reference.digest": amd})])
    problems = dev.gather().problems
    assert any(p.startswith(f"index entry {untested} (unknown/unknown, annotated attestation-manifest) is not an "
                            "attestation: it has layers of type application/vnd.oci.image.layer.v1.tar+gzip")
               for p in problems), problems
    for with_checkout in (False, True):
        found = verify(dev, with_checkout)
        assert not found.ok and f"index entry {untested}" in found.problem and "is not an attestation" in found.problem


@pytest.mark.parametrize(("reference", "why"), [
    ("", "its vnd.docker.reference.digest (none) is not another entry of the index"),
    ("sha256:" + "e" * 64, f"its vnd.docker.reference.digest sha256:{'e' * 64} is not another entry of the index"),
    ("self", "is not another entry of the index"),
])
def test_an_attestation_entry_must_refer_to_another_entry_of_the_index(reference: str, why: str) -> None:
    dev = Dev(CPU)
    amd = dev.validated("amd64")
    proof = attestation_manifest(dev)
    annotations = {**ATTESTATION, **({"vnd.docker.reference.digest": proof if reference == "self" else reference}
                                     if reference else {})}
    index(dev, [entry(dev, amd), entry(dev, proof, "unknown", "unknown", **annotations)])
    problems = dev.gather().problems
    assert any(why in p for p in problems), problems
    assert not verify(dev, False).ok


def test_a_real_attestation_entry_is_left_out_by_release_and_verify() -> None:
    dev = Dev(CPU)
    amd = dev.validated("amd64")
    proof = attestation_manifest(dev)
    index(dev, [entry(dev, amd), entry(dev, proof, "unknown", "unknown", **ATTESTATION,
                                       **{"vnd.docker.reference.digest": amd})])
    item = dev.gather()
    assert item.problems == [] and [ev.digest for ev in item.evidence] == [amd]
    found = verify(dev)
    assert found.ok, found.problem
    assert [c.platform for c in found.chains] == ["linux/amd64"] and found.not_run == []


def test_an_unannotated_unknown_entry_is_refused_by_verify_too() -> None:
    dev = Dev(CPU)
    amd = dev.validated("amd64")
    index(dev, [entry(dev, amd), entry(dev, attestation_manifest(dev), "unknown", "unknown")])
    found = verify(dev, False)
    assert not found.ok and "unknown/unknown" in found.problem
    assert "a platform this toolkit does not know" in found.problem


# -- verify refuses what release refuses --------------------------------------------------------------

def evidence(dev: Dev, digest: str, *, verdict: dict[str, object] | None = None, **provenance: object) -> None:
    signing.attest_sbom(dev.client, dev.repo, digest)   # type: ignore[arg-type]
    signing.attach_provenance(dev.client, dev.repo, digest,   # type: ignore[arg-type]
                              signing.provenance(dev.cell, platform="linux/amd64", **provenance))
    signing.attest(dev.client, dev.repo, digest,   # type: ignore[arg-type]
                   signing.verdict(dev.cell, digest, "passed", platform="linux/amd64", **(verdict or {})))


def test_a_release_grade_image_verifies_and_without_a_checkout_says_what_it_did_not_run() -> None:
    dev = Dev(CPU)
    single(dev, dev.validated("amd64"))
    found = verify(dev)
    assert found.ok and found.not_run == [] and found.cell == CPU.key, found.problem
    bare = verify(dev, with_checkout=False)
    assert bare.ok and len(bare.not_run) == 3
    assert bare.not_run[0].startswith("the cell's checks (its test groups and every test they define")
    assert bare.not_run[0].endswith(": no checkout (run verify in the project, or pass --matrix)")
    assert "the provenance's revision" in bare.not_run[1] and "no git checkout" in bare.not_run[1]


@pytest.mark.parametrize(("change", "cause", "needs_checkout"), [
    ({"cell": "tensorflow-cpu:2.21"}, "is for cell 'tensorflow-cpu:2.21', not pytorch-cpu:2.13", False),
    ({"standin": True}, "names a stand-in base", False),
    ({"revision": "f" * 40}, f"the provenance's revision {'f' * 40} is not a commit git knows", True),
])
def test_verify_refuses_a_provenance_release_refuses(change: dict[str, object], cause: str,
                                                      needs_checkout: bool) -> None:
    dev = Dev(CPU)
    digest = dev.image("amd64")
    evidence(dev, digest, **change)
    single(dev, digest)
    assert any(cause in p for p in dev.gather().problems)
    found = verify(dev)
    assert not found.ok and cause in " ".join([found.problem, *found.problems]), (found.problem, found.problems)
    if not needs_checkout:
        bare = verify(dev, with_checkout=False)
        assert not bare.ok and cause in bare.problem, bare.problem


def test_verify_refuses_a_rewritten_plain_sbom() -> None:
    dev = Dev(CPU)
    digest = dev.validated("amd64")
    single(dev, digest)
    forged = signing.minimal_sbom(digest, 0)
    forged["components"] = [{"type": "library", "name": "totally-safe", "version": "1.0", "bom-ref": "x"}]
    store_sbom(dev.client, dev.repo, digest, forged)   # type: ignore[arg-type]
    for with_checkout in (False, True):
        found = verify(dev, with_checkout)
        assert not found.ok and f"the plain SBOM of {digest}" in found.problem and "someone rewrote it" in found.problem


def test_verify_refuses_a_pass_dated_in_the_future() -> None:
    dev = Dev(CPU)
    digest = dev.image("amd64")
    evidence(dev, digest, verdict={"started": "2099-01-01T00:00:00.000+00:00"})
    single(dev, digest)
    found = verify(dev, with_checkout=False)
    assert not found.ok and "dated 2099-01-01" in found.problem, found.problem


def test_verify_refuses_an_index_without_a_platform_its_matrix_cell_declares() -> None:
    dev = Dev(MULTI)
    amd = dev.validated("amd64")
    dev.index([(amd, "linux/amd64")])
    found = verify(dev)
    assert not found.ok and any("the index has no linux/arm64 manifest" in p for p in found.problems), found.problems
    assert verify(dev, with_checkout=False).not_run   # without the matrix: said, not checked


def test_verify_refuses_a_verdict_of_a_cell_the_matrix_does_not_have() -> None:
    dev = Dev(CPU)
    single(dev, dev.validated("amd64"))
    other = dataclasses.replace(CPU, version="9.9")
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}",   # type: ignore[arg-type]
                             signing.trusted(), checkout(other))
    assert not found.ok and "is of cell 'pytorch-cpu:2.13'" in found.problem and "which the matrix of" in found.problem


def test_verify_takes_releases_waiver_of_a_skip_and_refuses_it_without() -> None:
    """An image released with `--accept-skip` verifies with the same waiver, through the same gate; without it
    verify refuses the skip as release would (the secure-registry pipeline released pytorch-cpu so)."""
    dev = Dev(CPU)
    digest = dev.image("amd64")
    tests = [signing.result(f"{g}/test_x.py::test_{g}") for g in CPU.tests]
    tests.append(signing.result("common/test_cross_tensorboard.py::test_peer", "skipped", "no-peer-image",
                                "no tensorflow image of this commit"))
    evidence(dev, digest, verdict={"tests": tests, "defined_tests": [t["id"] for t in tests]})
    single(dev, digest)
    reference = f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}"
    strict = verify(dev)
    assert not strict.ok and "skipped where the matrix expects them to run" in strict.problem, strict.problem
    waived = verify_reference(dev.client, reference, signing.trusted(),   # type: ignore[arg-type]
                              checkout(dev.cell), accept_skips=("no-peer-image",))
    assert waived.ok, (waived.problem, waived.problems)
    other = verify_reference(dev.client, reference, signing.trusted(),   # type: ignore[arg-type]
                             checkout(dev.cell), accept_skips=("ulimit-not-granted",))
    assert not other.ok and "skipped where the matrix expects them to run" in other.problem


def test_an_index_whose_platforms_name_different_cells_says_they_disagree_naming_both() -> None:
    """Named by digest (no cell's dev tag), an index whose arm64 platform is labelled another cell: verify said "neither
    a cell label nor a signed provenance names the cell", though each platform names one; now it says they disagree."""
    from buildtool.contracts import label_keys

    dev = Dev(MULTI)
    arm = dev.image("arm64", extra_labels={label_keys.CELL: "jax-cpu:0.10"})
    dev.evidence(arm, "linux/arm64", emulated=True)
    digest = dev.index([(dev.validated("amd64"), "linux/amd64"), (arm, "linux/arm64")])
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}@{digest}", signing.trusted(),   # type: ignore[arg-type]
                             checkout(MULTI))
    assert not found.ok and not found.gated
    assert found.problems == ["the platforms are of different cells (jax-cpu:0.10, pytorch-cpu:2.13)"], found.problems
    said = ("release's gate: the platforms disagree on the cell: their cell labels, else their signed provenances, "
            "name jax-cpu:0.10 and pytorch-cpu:2.13, so there is no one cell to check the image as; name the image by "
            "the dev tag of the cell to check it as")
    assert found.not_run == [said], found.not_run
