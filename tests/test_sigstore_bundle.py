"""Each signed attestation as a Sigstore bundle v0.3 in the referrers layout cosign (`--new-bundle-format`) and
GitHub's artifact attestations use (issue 40), and the toolkit's readers reading that layout: an image whose
attestations are only bundles verifies, and a bundle with a changed byte, a wrong key hint or no envelope is
refused naming why (in-memory registry, no referrers API: the fallback index `sha256-<hex>`)."""

from __future__ import annotations

import base64
import json

import pytest

from buildtool.attest import sigstore_bundle
from buildtool.attest.bundles import attach_bundle
from buildtool.attest.provenance_model import PREDICATE_TYPE
from buildtool.attest.provenance_store import find_provenance
from buildtool.attest.referrers import Payload, attach, listed_referrers
from buildtool.attest.verdict_statement import VERDICT_PREDICATE
from buildtool.contracts.names import SBOM_TYPE, referrers_tag
from buildtool.registry.client import EMPTY_JSON_TYPE
from buildtool.release.chain import verify_digest
from buildtool.sbom.signing import SBOM_PREDICATE, find_sbom_attestation
from buildtool.validate.verdicts import find_verdicts
from tests import provenance_fixture, signing
from tests.memregistry import MemRegistry
from tests.test_verify import LABELS, REPO, chained

BUNDLE = sigstore_bundle.BUNDLE_MEDIA_TYPE


def bundles(client: MemRegistry, digest: str) -> dict[str, tuple[dict, dict]]:
    """predicate type -> (artifact manifest, bundle) of every bundle referrer of `digest`."""
    found = {}
    for ref in listed_referrers(client, REPO, digest):   # type: ignore[arg-type]
        if ref.artifact_type == BUNDLE:
            manifest = json.loads(client.get_manifest(REPO, ref.digest)[0])
            body = json.loads(client.get_blob(REPO, manifest["layers"][0]["digest"]))
            found[manifest["annotations"]["dev.sigstore.bundle.predicateType"]] = (manifest, body)
    return found


def only(client: MemRegistry, digest: str) -> None:
    """Leave only the bundles (and the plain, unsigned SBOM scanners read) listed for `digest` and drop the
    verdict pin tags: an image whose attestations are only bundles (as cosign or GitHub's attest action make)."""
    raw, media_type, _ = client.get_manifest(REPO, referrers_tag(digest))
    index = json.loads(raw)
    index["manifests"] = [d for d in index["manifests"] if d.get("artifactType") in (BUNDLE, SBOM_TYPE)]
    client.put_manifest(REPO, referrers_tag(digest), json.dumps(index).encode(), media_type)
    for key in [k for k in client.manifests if k[0] == REPO and ".v-" in k[1]]:
        del client.manifests[key]


def with_provenance_bundle(client: MemRegistry, digest: str) -> None:
    """The test provenance (provenance_fixture attaches only the toolkit's artifact) as a bundle too."""
    ref = provenance_fixture.attest_provenance(client, REPO, digest)   # type: ignore[arg-type]
    manifest = json.loads(client.get_manifest(REPO, ref.digest)[0])
    attach_bundle(client, REPO, digest, client.get_blob(REPO, manifest["layers"][0]["digest"]),  # type: ignore[arg-type]
                  PREDICATE_TYPE)


def replace_bundle(client: MemRegistry, digest: str, predicate_type: str, change) -> None:  # noqa: ANN001
    """Attach, in place of the listed bundle of `predicate_type`, one whose JSON `change` edited."""
    manifest, body = bundles(client, digest)[predicate_type]
    change(body)
    raw, media_type, _ = client.get_manifest(REPO, referrers_tag(digest))
    index = json.loads(raw)
    index["manifests"] = [d for d in index["manifests"]
                          if (d.get("annotations") or {}).get("dev.sigstore.bundle.predicateType") != predicate_type]
    client.put_manifest(REPO, referrers_tag(digest), json.dumps(index).encode(), media_type)
    # With the annotations cosign writes, in the artifact's own manifest (readers type an artifact by its own
    # manifest, never by the listing: issue 48).
    notes = {k: v for k, v in manifest["annotations"].items() if k.startswith("dev.sigstore.")}
    attach(client, REPO, digest, BUNDLE, [Payload(BUNDLE, json.dumps(body).encode())], notes)  # type: ignore[arg-type]


# A Rekor v1 entry as Sigstore's clients write it in a bundle (protobuf-specs TransparencyLogEntry, JSON form).
REKOR_ENTRY = {"logIndex": "25579", "logId": {"keyId": "wNI9atQGlz+VWfO6LRygH4QUfY/8W4RFwiT5i5WRgB0="},
               "kindVersion": {"kind": "dsse", "version": "0.0.1"}, "integratedTime": "1700000000",
               "inclusionPromise": {"signedEntryTimestamp": "MEUCIQ=="},
               "canonicalizedBody": "eyJhcGlWZXJzaW9uIjoiMC4wLjEifQ=="}


def one_byte_changed(body: dict) -> None:
    payload = bytearray(base64.b64decode(body["dsseEnvelope"]["payload"]))
    payload[payload.index(b"sha256")] ^= 0x01       # 's' -> 'r': one byte of the signed statement
    body["dsseEnvelope"]["payload"] = base64.b64encode(bytes(payload)).decode()


@pytest.fixture
def client() -> MemRegistry:
    return MemRegistry()


def test_push_and_validate_publish_each_attestation_as_a_bundle_in_cosigns_layout(client: MemRegistry) -> None:
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    with_provenance_bundle(client, digest)
    chained(client, digest, provenance=False)   # the SBOM (push) and the verdict (validate), by their writers
    found = bundles(client, digest)
    assert set(found) == {PREDICATE_TYPE, SBOM_PREDICATE, VERDICT_PREDICATE}
    for predicate_type, (manifest, body) in found.items():
        assert manifest["artifactType"] == BUNDLE and manifest["config"]["mediaType"] == EMPTY_JSON_TYPE
        assert [layer["mediaType"] for layer in manifest["layers"]] == [BUNDLE]
        assert manifest["subject"]["digest"] == digest
        assert manifest["annotations"]["dev.sigstore.bundle.content"] == "dsse-envelope"
        assert manifest["annotations"]["dev.sigstore.bundle.predicateType"] == predicate_type
        # tlogEntries written, empty (issue 52: sigstore-models requires the key); no timestamp without a TSA.
        assert body["mediaType"] == BUNDLE and body["verificationMaterial"]["tlogEntries"] == []
        assert "timestampVerificationData" not in body["verificationMaterial"]
        assert body["verificationMaterial"]["publicKey"]["hint"] == signing.KEY.keyid
        statement = json.loads(base64.b64decode(body["dsseEnvelope"]["payload"]))
        assert statement["predicateType"] == predicate_type
        assert statement["subject"][0]["digest"] == {"sha256": digest.partition(":")[2]}
    # Listed in the fallback index (no referrers API here) with the annotations cosign's readers select by.
    listed = [d for d in json.loads(client.get_manifest(REPO, referrers_tag(digest))[0])["manifests"]
              if d["artifactType"] == BUNDLE]
    assert sorted(d["annotations"]["dev.sigstore.bundle.predicateType"] for d in listed) == sorted(found)


def test_a_bundle_and_the_artifact_beside_it_count_once(client: MemRegistry) -> None:
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    with_provenance_bundle(client, digest)
    chained(client, digest, provenance=False)
    trusted = signing.trusted()
    findings = find_verdicts(client, REPO, digest, trusted)   # type: ignore[arg-type]
    assert len(findings.found) == 1 and not findings.rejected
    assert findings.chosen is not None and findings.chosen.referrer.artifact_type != BUNDLE   # the pinned one
    sbom = find_sbom_attestation(client, REPO, digest, trusted)   # type: ignore[arg-type]
    assert len(sbom.found) == 1 and sbom.referrer is not None and sbom.referrer.artifact_type != BUNDLE


def test_an_image_with_only_bundles_verifies(client: MemRegistry) -> None:
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    with_provenance_bundle(client, digest)
    chained(client, digest, provenance=False)
    only(client, digest)
    assert {r.artifact_type for r in listed_referrers(client, REPO, digest)} == {BUNDLE, SBOM_TYPE}  # type: ignore[arg-type]
    chain = verify_digest(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    assert chain.ok, chain.problem
    assert chain.facts["verdict"]["artifact"] in {r.digest for r in listed_referrers(client, REPO, digest)}  # type: ignore[arg-type]


@pytest.mark.parametrize(("predicate", "change", "cause"), [
    ("verdict", one_byte_changed, "has no valid verdict: no verdict verifies against config/trusted-keys.yaml: "
                                  "sha256:"),
    ("provenance", one_byte_changed, "has no valid provenance (no provenance verifies: sha256:"),
    ("sbom", one_byte_changed, "has no valid SBOM attestation (no SBOM attestation verifies against the builder"),
])
def test_verify_refuses_a_bundle_with_one_byte_changed(client: MemRegistry, predicate: str, change, cause: str) -> None:  # noqa: ANN001
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    with_provenance_bundle(client, digest)
    chained(client, digest, provenance=False)
    only(client, digest)
    predicate_type = {"verdict": VERDICT_PREDICATE, "provenance": PREDICATE_TYPE,
                      "sbom": SBOM_PREDICATE}[predicate]
    replace_bundle(client, digest, predicate_type, change)
    chain = verify_digest(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    assert not chain.ok and cause in chain.problem, chain.problem
    assert "wrongly signed: the signature of trusted key" in chain.problem   # the changed byte, not a lookup


@pytest.mark.parametrize(("change", "cause"), [
    (lambda b: b["verificationMaterial"]["publicKey"].update(hint=signing.ATTACKER.keyid),
     "mismatched: the bundle's key hint"),
    (lambda b: b["verificationMaterial"].pop("publicKey"), "names no public key"),
    (lambda b: b.pop("dsseEnvelope"), "carries no dsseEnvelope"),
    (lambda b: b.update(mediaType="application/vnd.dev.sigstore.bundle+json;version=0.1"),
     "not application/vnd.dev.sigstore.bundle.v0.3+json"),
    # Issue 48, decided: a transparency-log entry nobody here can verify (sigstore-js refuses the bundle: the
    # toolkit used to read past it), in Rekor's form; a timestamp; a certificate: refused, naming what.
    (lambda b: b["verificationMaterial"].update(tlogEntries=[REKOR_ENTRY]),
     "unverifiable: the Sigstore bundle carries 1 transparency-log entries, which this toolkit cannot verify"),
    (lambda b: b["verificationMaterial"].update(timestampVerificationData={"rfc3161Timestamps": [
        {"signedTimestamp": "MIIC"}]}), "unverifiable: the Sigstore bundle carries RFC 3161 timestamps"),
    (lambda b: b["verificationMaterial"].update(certificate={"rawBytes": "MIIB"}),
     "unverifiable: the Sigstore bundle carries a certificate"),
])
def test_a_bundle_the_toolkit_does_not_read_is_refused_naming_why(client: MemRegistry, change, cause: str) -> None:  # noqa: ANN001
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    with_provenance_bundle(client, digest)
    only(client, digest)
    replace_bundle(client, digest, PREDICATE_TYPE, change)
    found = find_provenance(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    assert found.provenance is None
    ((_, reason),) = found.rejected
    assert cause in reason, reason


@pytest.mark.parametrize("signatures", [5, True, "sig", {"keyid": signing.KEY.keyid},
                                        ["junk", {"keyid": signing.KEY.keyid, "sig": "AA=="}]])
@pytest.mark.parametrize("timestamps", [False, True])
def test_a_bundle_whose_signatures_are_not_a_list_of_objects_is_refused_not_a_traceback(
        client: MemRegistry, monkeypatch: pytest.MonkeyPatch, signatures: object, timestamps: bool) -> None:
    """Anyone who may push can attach such a bundle: every reader (release, verify, push's own check) stopped with a
    TypeError or AttributeError instead of listing it among the attestations that do not count."""
    if timestamps:   # a timestamp authority trusted: the signature is decoded for the timestamp check too
        monkeypatch.setattr("buildtool.attest.bundles.timestamp_check", lambda: (lambda stamp, signature: ""))
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    with_provenance_bundle(client, digest)
    only(client, digest)
    replace_bundle(client, digest, PREDICATE_TYPE, lambda b: b["dsseEnvelope"].update(signatures=signatures))
    found = find_provenance(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    assert found.provenance is None
    ((_, reason),) = found.rejected
    assert reason == "malformed: the Sigstore bundle's dsseEnvelope.signatures is not a list of {keyid, sig}", reason


def test_bundle_of_an_envelope_with_no_single_signature_is_refused() -> None:
    with pytest.raises(sigstore_bundle.BundleError, match="one key: the envelope has 2 signatures"):
        sigstore_bundle.bundle(json.dumps({"payloadType": "x", "payload": "",
                                           "signatures": [{"keyid": "a", "sig": ""}, {"keyid": "b", "sig": ""}]}
                                          ).encode())
    with pytest.raises(sigstore_bundle.BundleError, match="not JSON"):
        sigstore_bundle.envelope(b"{")


def drop_bundles(client: MemRegistry, digest: str) -> None:
    """The referrers of `digest` as a push before bundles left them: the toolkit's artifacts only."""
    raw, media_type, _ = client.get_manifest(REPO, referrers_tag(digest))
    index = json.loads(raw)
    index["manifests"] = [d for d in index["manifests"] if d.get("artifactType") != BUNDLE]
    client.put_manifest(REPO, referrers_tag(digest), json.dumps(index).encode(), media_type)


def test_a_push_that_keeps_attestations_made_before_bundles_publishes_their_bundles_once(client: MemRegistry) -> None:
    from types import SimpleNamespace

    from buildtool.imagebuild.builder import Builder

    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    provenance_fixture.attest_provenance(client, REPO, digest)   # type: ignore[arg-type]
    signing.attest_sbom(client, REPO, digest)   # type: ignore[arg-type]
    drop_bundles(client, digest)
    assert bundles(client, digest) == {}
    push = SimpleNamespace(registry=client, _key=signing.KEY)
    ref = f"{client.host}/{REPO}:2.13-0.1.0"
    for _ in range(2):     # a push, and a push again: one bundle each, not two
        Builder._ensure_provenance(push, None, ref, digest, None, None)   # type: ignore[arg-type]
        Builder._ensure_sbom(push, None, ref, digest, "linux/amd64")   # type: ignore[arg-type]
        found = bundles(client, digest)
        assert set(found) == {PREDICATE_TYPE, SBOM_PREDICATE}
        assert len([r for r in listed_referrers(client, REPO, digest) if r.artifact_type == BUNDLE]) == 2  # type: ignore[arg-type]
    # the same envelopes the kept artifacts hold
    prov = find_provenance(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    assert prov.referrer is not None and prov.referrer.artifact_type != BUNDLE
    layer = json.loads(client.get_manifest(REPO, prov.artifact)[0])["layers"][0]
    kept = json.loads(client.get_blob(REPO, layer["digest"]))
    assert found[PREDICATE_TYPE][1]["dsseEnvelope"] == kept


def test_a_bundle_with_an_empty_transparency_log_list_still_reads() -> None:
    """`tlogEntries: []` (what Sigstore's parsers want present) carries nothing to verify: read as without it."""
    env = json.loads(signing.envelope("r", "sha256:" + "1" * 64, {"x": 1}))
    body = json.loads(sigstore_bundle.bundle(json.dumps(env).encode()))
    body["verificationMaterial"]["tlogEntries"] = []
    assert json.loads(sigstore_bundle.envelope(json.dumps(body).encode())) == env


def test_a_bundle_key_hint_is_shown_without_its_control_characters() -> None:
    """A bundle anyone may push names its key hint: a line break or terminal escape in it went into the one-line
    refusal as it was, so it broke the line, or rewrote the terminal's (CI log's) line, where verify prints it."""
    data = json.loads(sigstore_bundle.bundle(signing.envelope(REPO, "sha256:" + "1" * 64, {})))
    data["verificationMaterial"]["publicKey"]["hint"] = "\x1b[2K\rok\nverified"
    with pytest.raises(sigstore_bundle.BundleError) as refused:
        sigstore_bundle.envelope(json.dumps(data).encode())
    said = str(refused.value)
    assert said.isprintable() and "key hint '\\x1b[2K\\rok\\nverified' is not" in said, said


def test_a_bundle_with_more_timestamps_than_the_bound_is_refused_before_any_is_checked() -> None:
    """Before: every RFC 3161 timestamp a bundle carried was checked (a signature verification each), however many:
    anyone who may push attaches a bundle with thousands of copies of one valid timestamp and each reader pays for
    every one. Now more than MAX_TIMESTAMPS is refused unchecked, naming the count; up to it each is still checked."""
    env = signing.envelope("r", "sha256:" + "1" * 64, {"x": 1})
    checked: list[bytes] = []

    def check(stamp: bytes, signature: bytes) -> str:
        checked.append(stamp)
        return ""

    most = sigstore_bundle.MAX_TIMESTAMPS
    assert json.loads(sigstore_bundle.envelope(sigstore_bundle.bundle(env, [b"t"] * most), check)) == json.loads(env)
    assert len(checked) == most
    checked.clear()
    with pytest.raises(sigstore_bundle.BundleError, match=rf"^malformed: the Sigstore bundle carries {most + 1} RFC "
                                                          rf"3161 timestamps, more than the {most} a reader checks$"):
        sigstore_bundle.envelope(sigstore_bundle.bundle(env, [b"t"] * (most + 1)), check)
    assert checked == []
