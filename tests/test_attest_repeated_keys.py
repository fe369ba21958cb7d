"""A signed statement, its DSSE envelope or a Sigstore bundle that names one key twice in a JSON object is refused,
naming the key. Python's json keeps the last of a repeated key, other verifiers (and the people reading the JSON)
may keep the first: a runner's key that signs `{"subject": [<image A>], "subject": [<image B>]}` vouches for B here
and for A elsewhere, and a pusher who puts a second "payload" before the signed one shows other readers a payload
nobody signed. Every reader here (release, verify, push's own check) opens attestations through these three."""

from __future__ import annotations

import base64
import json

import pytest

from buildtool.attest import sigstore_bundle
from buildtool.attest.attested import open_signed
from buildtool.attest.bundles import same_envelope
from buildtool.attest.dsse import EnvelopeError, open_envelope, sign_envelope
from buildtool.attest.intoto import DSSE_MEDIA_TYPE, PAYLOAD_TYPE, StatementError, read_statement
from buildtool.attest.referrers import Payload
from buildtool.attest.verdict_statement import VERDICT_PREDICATE_PREFIX
from buildtool.contracts.verdict import SCHEMA
from buildtool.validate.verdicts import _verify
from tests.conftest import fixture_matrix
from tests.signing import KEY, envelope, trusted, verdict

CPU = next(c for c in fixture_matrix().cells if c.key == "pytorch-cpu:2.13")
D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
VERDICT_TYPE = f"{VERDICT_PREDICATE_PREFIX}{SCHEMA}"
AGREE = "in one JSON object (JSON readers disagree on which one counts)"


def payload_of(data: bytes) -> bytes:
    return base64.b64decode(json.loads(data)["payload"])


def signed(payload: bytes) -> bytes:
    """`payload`, as it is, in an envelope the trusted runner's key signed."""
    return json.dumps(sign_envelope(KEY, PAYLOAD_TYPE, payload), sort_keys=True).encode()


def two_subjects() -> bytes:
    """The statement about D1 with a `subject` naming D2 before its own: D1 to Python, D2 to a first-key reader."""
    honest = payload_of(envelope("r", D1, verdict(CPU, D1)))
    assert honest.count(b'"subject":') == 1
    return honest.replace(b'"subject":', b'"subject":[{"digest":{"sha256":"' + b"2" * 64 + b'"},"name":"r"}],'
                                         b'"subject":')


def two_digests() -> bytes:
    """The statement about D1 whose one subject names a `digest` of D2 first."""
    honest = payload_of(envelope("r", D1, verdict(CPU, D1)))
    return honest.replace(b'"digest":{"sha256":"' + b"1" * 64 + b'"}',
                          b'"digest":{"sha256":"' + b"2" * 64 + b'"},"digest":{"sha256":"' + b"1" * 64 + b'"}', 1)


@pytest.mark.parametrize(("payload", "key"), [(two_subjects, "subject"), (two_digests, "digest")])
def test_a_signed_statement_that_repeats_a_key_is_refused_naming_it(payload, key: str) -> None:  # noqa: ANN001
    data = signed(payload())
    cause = f"malformed: the signed statement repeats the key {key!r} {AGREE}"
    # The verdict reader (release and verify) ...
    assert _verify([Payload(DSSE_MEDIA_TYPE, data)], D1, trusted(), CPU.key) == cause
    # ... and the provenance's and the SBOM attestation's (attested.open_signed).
    assert open_signed([Payload(DSSE_MEDIA_TYPE, data)], D1, VERDICT_TYPE, trusted().keys, None, "tester") == cause
    with pytest.raises(StatementError) as refused:
        read_statement(payload(), D1, VERDICT_TYPE)
    assert str(refused.value) == cause


def test_an_envelope_with_a_second_payload_is_refused_naming_the_key() -> None:
    """The signature verifies over the last payload (what Python keeps); a first-key reader sees the first."""
    honest = envelope("r", D1, verdict(CPU, D1))
    other = base64.b64encode(payload_of(envelope("r", D1, verdict(CPU, D1, "failed")))).decode()
    data = honest.replace(b'"payload": ', f'"payload": "{other}", "payload": '.encode(), 1)
    assert json.loads(data) == json.loads(honest)    # what a reader keeping the last key sees: the signed one
    with pytest.raises(EnvelopeError) as refused:
        open_envelope(data, trusted().keys)
    assert str(refused.value) == f"malformed: the DSSE envelope repeats the key 'payload' {AGREE}"
    assert same_envelope([Payload(DSSE_MEDIA_TYPE, data)]) is None   # never the same attestation as the honest one


def test_a_sigstore_bundle_that_repeats_a_key_is_refused_naming_it() -> None:
    honest = envelope("r", D1, verdict(CPU, D1))
    other = envelope("r", D2, verdict(CPU, D2)).decode()
    data = sigstore_bundle.bundle(honest).replace(b'"dsseEnvelope": ', f'"dsseEnvelope": {other}, "dsseEnvelope": '
                                                  .encode(), 1)
    assert json.loads(sigstore_bundle.envelope(sigstore_bundle.bundle(honest))) == json.loads(honest)
    with pytest.raises(sigstore_bundle.BundleError) as refused:
        sigstore_bundle.envelope(data)
    assert str(refused.value) == f"malformed: the Sigstore bundle repeats the key 'dsseEnvelope' {AGREE}"


def test_an_envelope_that_repeats_its_signatures_is_refused_naming_the_key_not_a_role() -> None:
    """The signers named only by the last `signatures` (what Python's json keeps) were taken as the envelope's: a
    verdict reader refused it as "signed by <a builder key>, trusted as builder, not as tester", a cause that only
    that reading of the envelope has."""
    from buildtool.attest.dsse import generate

    builder = generate()
    keys = trusted(KEY, roles=("tester",))
    keys.keys[builder.keyid] = builder.public()
    keys.roles[builder.keyid] = frozenset({"builder"})
    honest = envelope("r", D1, verdict(CPU, D1))
    second = json.dumps([{"keyid": builder.keyid, "sig": "AA=="}])
    # The signed signatures first, then a builder key's (the one Python keeps); the original list's text stays, unread.
    data = honest.replace(b'"signatures": ', f'"signatures": {json.dumps(json.loads(honest)["signatures"])}, '
                                            f'"signatures": {second}, "ignored": '.encode(), 1)
    cause = f"malformed: the DSSE envelope repeats the key 'signatures' {AGREE}"
    assert _verify([Payload(DSSE_MEDIA_TYPE, data)], D1, keys, CPU.key) == cause
    assert open_signed([Payload(DSSE_MEDIA_TYPE, data)], D1, VERDICT_TYPE, keys.for_role("tester"), keys,
                       "tester") == cause


def test_json_nested_too_deeply_is_refused_as_not_json_never_a_traceback() -> None:
    """JSON nested a hundred thousand deep makes json.loads raise RecursionError, no ValueError: anyone who may push
    could attach such an envelope to an image, and every verdict reader (report --fetch, verify, release) ended with
    a traceback before any signature was checked. Now strict_json raises a ValueError, read as JSON that is not."""
    from buildtool.common import strict_json

    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(ValueError, match="nested too deeply"):
        strict_json.loads(deep)
    assert _verify([Payload(DSSE_MEDIA_TYPE, deep)], D1, trusted(), CPU.key) == (
        "unsigned: not a DSSE envelope (not JSON)")
    with pytest.raises(StatementError):
        read_statement(deep, D1, VERDICT_TYPE)
