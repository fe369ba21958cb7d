"""The SBOM as a signed attestation (buildtool.sbom.signing), its place in the verdict and
the release gate (buildtool.release.sbomgate), checked with tools that are not ours: PyNaCl's Ed25519 over
DSSE's PAE written here from the spec, and cyclonedx-python-lib's strict JSON validator."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from buildtool.attest.dsse import generate
from buildtool.attest.intoto import DSSE_MEDIA_TYPE, PREDICATE_ANNOTATION
from buildtool.attest.referrers import fetch, referrers
from buildtool.contracts.names import SBOM_ATTESTATION_TYPE
from buildtool.contracts.verdict import VerdictError, parse_verdict
from buildtool.release.model import Evidence
from buildtool.release.sbomgate import gate_sbom, sbom_problems
from buildtool.sbom import document as sbom
from buildtool.sbom.signing import (
    SBOM_PREDICATE,
    attest_sbom,
    envelope_bytes,
    find_sbom_attestation,
    plain_sbom_problem,
    sbom_digest,
)
from tests import sbom_probe, signing
from tests.conftest import fixture_matrix
from tests.memregistry import MemRegistry

REPO = "team/pytorch-cpu-dev"
CPU = next(c for c in fixture_matrix().cells if c.key == "pytorch-cpu:2.13")
TESTER_ONLY = generate()


def real_document(client: MemRegistry, digest: str) -> dict[str, Any]:
    """The CycloneDX document push makes, from the recorded probe of a real image."""
    return sbom.make_sbom(sbom_probe.probe(), repository=f"{client.host}/{REPO}", digest=digest,
                          facts={"framework": "pytorch 2.13.0+cpu"}, locks=sbom_probe.LOCKS, identified={},
                          indexes=sbom_probe.INDEXES)


@pytest.fixture
def image() -> tuple[MemRegistry, str]:
    client = MemRegistry()
    return client, client.push_image(REPO, "abc-2.13")


def stored_envelope(client: MemRegistry, digest: str) -> bytes:
    (ref,) = referrers(client, REPO, digest, SBOM_ATTESTATION_TYPE)   # type: ignore[arg-type]
    (layer,) = fetch(client, REPO, ref, digest)   # type: ignore[arg-type]
    assert layer.media_type == DSSE_MEDIA_TYPE and ref.annotations[PREDICATE_ANNOTATION] == SBOM_PREDICATE
    return layer.data


def test_the_attestation_verifies_with_pynacl_and_its_predicate_is_valid_cyclonedx(image) -> None:  # noqa: ANN001
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_pem_public_key
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator
    from nacl.signing import VerifyKey

    client, digest = image
    document = real_document(client, digest)
    attest_sbom(client, REPO, digest, document, signing.KEY)   # type: ignore[arg-type]
    envelope = json.loads(stored_envelope(client, digest))
    payload = base64.b64decode(envelope["payload"])
    kind = envelope["payloadType"].encode()
    pae = b"DSSEv1 " + str(len(kind)).encode() + b" " + kind + b" " + str(len(payload)).encode() + b" " + payload
    raw = load_pem_public_key(signing.KEY.public().pem.encode()).public_bytes(Encoding.Raw, PublicFormat.Raw)
    (sig,) = envelope["signatures"]
    VerifyKey(raw).verify(pae, base64.b64decode(sig["sig"]))     # raises BadSignatureError when it does not hold
    statement = json.loads(payload)
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://cyclonedx.org/bom"
    assert statement["subject"] == [{"name": f"{client.host}/{REPO}", "digest": {"sha256": digest[7:]}}]
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(statement["predicate"])) is None
    assert statement["predicate"] == document


def test_the_same_image_gives_the_same_bytes_and_the_reader_returns_document_signer_and_artifact(image) -> None:  # noqa: ANN001
    client, digest = image
    document = real_document(client, digest)
    again = real_document(client, digest)
    first = envelope_bytes(f"{client.host}/{REPO}", digest, document, signing.KEY)
    assert first == envelope_bytes(f"{client.host}/{REPO}", digest, again, signing.KEY)
    artifact = attest_sbom(client, REPO, digest, document, signing.KEY)   # type: ignore[arg-type]
    assert stored_envelope(client, digest) == first
    found = find_sbom_attestation(client, REPO, digest, signing.trusted(roles=("builder",)))  # type: ignore[arg-type]
    assert found.document == document and found.signer == signing.KEY.keyid and found.artifact == artifact.digest
    assert found.digest == sbom_digest(document) and found.rejected == []
    # The digest is the document's, however it is serialised: the plain artifact's indented bytes give the same.
    assert sbom_digest(json.loads(json.dumps(document, indent=1))) == found.digest


@pytest.mark.parametrize(("key", "cause"), [
    (signing.ATTACKER, "which is not a trusted key"),
    (TESTER_ONLY, "trusted as tester, not as builder"),
])
def test_an_sbom_signed_by_an_untrusted_or_a_tester_only_key_does_not_count(image, key, cause) -> None:  # noqa: ANN001
    client, digest = image
    trusted = signing.trusted(roles=("builder",))
    trusted.keys[TESTER_ONLY.keyid] = TESTER_ONLY.public()
    trusted.names[TESTER_ONLY.keyid] = "gpu-runners"
    trusted.roles[TESTER_ONLY.keyid] = frozenset({"tester"})
    artifact = attest_sbom(client, REPO, digest, signing.minimal_sbom(digest), key)   # type: ignore[arg-type]
    found = find_sbom_attestation(client, REPO, digest, trusted)   # type: ignore[arg-type]
    assert found.chosen is None and found.document is None
    ((rejected, reason),) = found.rejected
    assert rejected == artifact.digest and cause in reason, reason
    assert "no SBOM attestation verifies against the builder keys" in found.why_none()


def test_an_sbom_signed_for_another_digest_or_describing_another_is_refused(image) -> None:  # noqa: ANN001
    client, digest = image
    other = client.push_image(REPO, "def-2.13", b"other")
    # A valid attestation of `other`, its envelope attached to `digest` as anyone who may push can.
    data = envelope_bytes(f"{client.host}/{REPO}", other, signing.minimal_sbom(other), signing.KEY)
    signing.attach_raw(client, REPO, digest, data, artifact_type=SBOM_ATTESTATION_TYPE)   # type: ignore[arg-type]
    lying = envelope_bytes(f"{client.host}/{REPO}", digest, signing.minimal_sbom(other), signing.KEY)
    signing.attach_raw(client, REPO, digest, lying, artifact_type=SBOM_ATTESTATION_TYPE)   # type: ignore[arg-type]
    found = find_sbom_attestation(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    reasons = [why for _, why in found.rejected]
    assert found.chosen is None and len(reasons) == 2
    assert reasons[0].startswith(f"replayed: signed for {other}")
    assert reasons[1] == f"mismatched: the SBOM describes {other}, not {digest}"


def test_a_described_version_of_a_megabyte_with_newlines_is_shown_bounded_on_one_line(image) -> None:  # noqa: ANN001
    """Before, the mismatch reason put the signed document's metadata.component.version into the message whole: a
    megabyte string with newlines (anyone who may push can have a key sign one) became a megabyte, many-line reason."""
    client, digest = image
    document = signing.minimal_sbom(digest)
    described = "sha256:" + "a" * 1_000_000 + "\nrelease: ok"
    document["metadata"]["component"]["version"] = described
    data = envelope_bytes(f"{client.host}/{REPO}", digest, document, signing.KEY)
    signing.attach_raw(client, REPO, digest, data, artifact_type=SBOM_ATTESTATION_TYPE)   # type: ignore[arg-type]
    found = find_sbom_attestation(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    ((_, reason),) = found.rejected
    assert reason == (f"mismatched: the SBOM describes {ascii(described[:80])}... ({len(described)} characters), "
                      f"not {digest}")


def test_two_signed_sboms_that_disagree_count_as_none(image) -> None:  # noqa: ANN001
    client, digest = image
    attest_sbom(client, REPO, digest, signing.minimal_sbom(digest, 2), signing.KEY)   # type: ignore[arg-type]
    attest_sbom(client, REPO, digest, signing.minimal_sbom(digest, 3), signing.KEY)   # type: ignore[arg-type]
    found = find_sbom_attestation(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    assert found.chosen is None and "2 signed SBOMs disagree" in found.why_none()


# -- the release gate --------------------------------------------------------------------------------

def gated(client: MemRegistry, digest: str, **verdict_changes: Any) -> Evidence:
    item = Evidence(digest)
    item.verdict = parse_verdict(signing.verdict(CPU, digest, **verdict_changes), "test")
    gate_sbom(client, item, REPO, signing.trusted())   # type: ignore[arg-type]
    return item


def test_release_takes_the_sbom_the_verdict_names_and_notes_its_signer(image) -> None:  # noqa: ANN001
    client, digest = image
    named = signing.attest_sbom(client, REPO, digest)   # type: ignore[arg-type]
    item = gated(client, digest, sbom=named)
    assert item.problems == [] and item.sbom_attestation is not None
    assert f"SBOM {named} signed by {signing.KEY.keyid[:16]} (test runner)" in item.notes


def test_release_refuses_a_verdict_that_names_no_sbom(image) -> None:  # noqa: ANN001
    client, digest = image
    named = signing.attest_sbom(client, REPO, digest)   # type: ignore[arg-type]
    assert gated(client, digest, schema=4, sbom=named).problems == []    # the schema before names one too
    none = gated(client, digest, sbom="", sbom_problem="no SBOM attestation is attached")
    assert none.problems == [f"the verdict of {digest} names no SBOM (no SBOM attestation is attached); push the "
                             "image again (push signs its SBOM), then validate it again"]
    # A verdict from before verdicts named SBOMs (schema 3) is not even read: never a verdict release counts.
    with pytest.raises(VerdictError) as info:
        gated(client, digest, schema=3)
    assert "unsupported verdict schema 3 (this toolkit reads schemas 4, 5 and 6)" in str(info.value)


def test_release_refuses_an_sbom_attestation_rewritten_after_validation_naming_both_digests(image) -> None:  # noqa: ANN001
    """Someone with push access and a builder key's signature on another document (an older build, say)
    attaches it after the tester signed the verdict: the verdict's digest no longer names what is there."""
    client, digest = image
    named = signing.attest_sbom(client, REPO, digest)   # type: ignore[arg-type]
    client.manifests.pop((REPO, "sha256-" + digest[7:]))   # the index rewritten without the first one
    other = signing.attest_sbom(client, REPO, digest, signing.minimal_sbom(digest, 5))   # type: ignore[arg-type]
    item = gated(client, digest, sbom=named)
    (problem,) = item.problems
    assert f"the signed SBOM of {digest} in the registry is {other}" in problem
    assert f"but the verdict names {named}" in problem and item.sbom_attestation is None


def test_release_refuses_an_sbom_attestation_hidden_from_the_index(image) -> None:  # noqa: ANN001
    client, digest = image
    named = signing.attest_sbom(client, REPO, digest)   # type: ignore[arg-type]
    client.manifests.pop((REPO, "sha256-" + digest[7:]))
    (problem,) = gated(client, digest, sbom=named).problems
    assert problem.startswith(f"{digest} has no valid SBOM attestation (no SBOM attestation is attached")
    assert f"but its verdict names SBOM {named}" in problem


def test_an_attacker_signed_sbom_does_not_replace_the_builder_one(image) -> None:  # noqa: ANN001
    client, digest = image
    named = signing.attest_sbom(client, REPO, digest)   # type: ignore[arg-type]
    signing.attest_sbom(client, REPO, digest, signing.minimal_sbom(digest, 9), key=signing.ATTACKER,  # type: ignore[arg-type]
                        plain=False)
    item = gated(client, digest, sbom=named)
    assert item.problems == [] and any("untrusted key" in i for i in item.ignored)


def test_release_refuses_a_rewritten_plain_sbom_naming_both_digests(image) -> None:  # noqa: ANN001
    client, digest = image
    named = signing.attest_sbom(client, REPO, digest)   # type: ignore[arg-type]
    forged = signing.minimal_sbom(digest, 0)           # the attacker's: no packages to scan
    artifact = sbom.store_sbom(client, REPO, digest, forged)   # type: ignore[arg-type]
    (problem,) = gated(client, digest, sbom=named).problems
    assert problem == (f"the plain SBOM of {digest} ({artifact}) is the document {sbom_digest(forged)}, not the "
                       f"signed {named}: someone rewrote it")
    assert plain_sbom_problem(client, REPO, digest, named) == problem   # type: ignore[arg-type]


def test_sbom_problems_is_pure_and_says_which_link_fails() -> None:
    digest = "sha256:" + "1" * 64
    verdict = parse_verdict(signing.verdict(CPU, digest), "t")
    from buildtool.sbom.signing import SbomFindings

    assert "has no valid SBOM attestation" in sbom_problems(digest, verdict, SbomFindings())[0]


# -- validate: which SBOM the verdict names -------------------------------------------------------------

@pytest.fixture
def validate_root(tmp_path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN001, ANN201
    from buildtool.attest.keys import trusted_entry
    from buildtool.validate import sbomref

    (tmp_path / "config").mkdir()
    (tmp_path / "config/trusted-keys.yaml").write_text(
        "keys:\n" + trusted_entry("ci-builder", signing.KEY.public(), ("builder",))
        + trusted_entry("gpu-runners", TESTER_ONLY.public(), ("tester",)))
    client = MemRegistry()
    monkeypatch.setattr(sbomref, "RegistryClient", lambda host: client)
    return tmp_path, client


def resolved(client: MemRegistry, digest: str, host: str | None = None):  # noqa: ANN201
    from buildtool.validate.containers import Resolved

    return Resolved("x", "x", digest, host if host is not None else client.host, REPO if host != "" else None, {})


def test_validate_names_the_signed_sbom_or_says_why_there_is_none(validate_root) -> None:  # noqa: ANN001
    from buildtool.validate.sbomref import verdict_sbom

    root, client = validate_root
    digest = client.push_image(REPO, "abc-2.13")
    said: list[str] = []
    assert verdict_sbom(resolved(client, digest), root, said.append) == (
        "", "no SBOM attestation is attached (pushed before SBOMs were signed? push it again)")
    attest_sbom(client, REPO, digest, signing.minimal_sbom(digest, 4), TESTER_ONLY)   # type: ignore[arg-type]
    named, why = verdict_sbom(resolved(client, digest), root, said.append)
    assert named == "" and "trusted as tester, not as builder" in why
    named_sbom = signing.attest_sbom(client, REPO, digest)   # type: ignore[arg-type]
    assert verdict_sbom(resolved(client, digest), root, said.append) == (named_sbom, "")
    assert said[-1] == f"SBOM {named_sbom} of {digest} signed by {signing.KEY.keyid[:16]} (ci-builder)"
    assert verdict_sbom(resolved(client, digest, host=""), root, said.append) == (
        "", "the image is not in a registry, so it has no signed SBOM to name")


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"metadata": "x"}'])
def test_release_refuses_a_plain_sbom_that_is_not_a_document_by_name(image, body: bytes) -> None:  # noqa: ANN001
    """A pusher attaches bytes that are no JSON object as the plain SBOM: the gate died with a JSON traceback."""
    from buildtool.attest import referrers as attached
    from buildtool.contracts.names import SBOM_TYPE

    client, digest = image
    named = signing.attest_sbom(client, REPO, digest, plain=False)   # type: ignore[arg-type]
    artifact = attached.attach(client, REPO, digest, SBOM_TYPE,  # type: ignore[arg-type]
                               [attached.Payload(media_type=SBOM_TYPE, data=body, title="sbom.cdx.json")]).digest
    (problem,) = gated(client, digest, sbom=named).problems
    assert problem == (f"the plain SBOM of {digest} cannot be read: SBOM {artifact} of {REPO}@{digest} is not a "
                       "CycloneDX JSON document")
