"""A signed attestation as a Sigstore bundle v0.3 (https://github.com/sigstore/protobuf-specs, bundle.proto),
the form cosign's `--new-bundle-format`, GitHub's artifact attestations, sigstore-js and sigstore-go read.

    Bundle {"mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {"publicKey": {"hint": <the key id: sha256 of the raw Ed25519 key, hex>},
                                     "tlogEntries": [],
                                     ["timestampVerificationData": {"rfc3161Timestamps": [{"signedTimestamp":
                                         <base64 DER TimeStampResp over the signature>}]}]},
            "dsseEnvelope": <the DSSE envelope, as signed: payload, payloadType, signatures [{keyid, sig}]>}

No transparency-log entries (the keys are the project's own, not Sigstore's public-good instance), yet
`tlogEntries` is written, empty, for sigstore-python (issue 52); an RFC 3161 timestamp only where the writer
named a timestamp authority (buildtool.common.tsa). A reader refuses what it cannot verify (a transparency-log
entry, a certificate, a timestamp of no authority it trusts), as a Sigstore verifier does (issue 48): why, and
the options verifiers need, in docs/release-trust.md, "Sigstore bundles". The envelope is the same bytes'
content the toolkit's own artifact carries: one signature, so a bundle and the artifact beside it are the same
attestation. In the registry a bundle is an OCI artifact (buildtool.attest.bundles).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Any

from buildtool.attest.dsse import b64decode, short
from buildtool.common import strict_json

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
CONTENT_ANNOTATION = "dev.sigstore.bundle.content"
PREDICATE_TYPE_ANNOTATION = "dev.sigstore.bundle.predicateType"
DSSE_CONTENT = "dsse-envelope"


class BundleError(ValueError):
    """A bundle this toolkit does not read; the message names why."""


# The most RFC 3161 timestamps a bundle may carry: this toolkit writes one (the --tsa authority's), other writers a few.
MAX_TIMESTAMPS = 16
# Why an RFC 3161 timestamp (DER) over a signature (raw bytes) does not verify, "" when it does.
TimestampCheck = Callable[[bytes, bytes], str]


def signature_bytes(envelope: bytes) -> bytes:
    """The raw bytes of a DSSE envelope's one signature: what a timestamp authority stamps for a bundle."""
    env = json.loads(envelope)
    signatures = env.get("signatures") or []
    if len(signatures) != 1 or not signatures[0].get("keyid"):
        raise BundleError(f"a bundle names one key: the envelope has {len(signatures)} signatures")
    return _decoded(signatures[0].get("sig"))


def bundle(envelope: bytes, timestamps: Sequence[bytes] = ()) -> bytes:
    """The bundle (JSON bytes, keys sorted) of one signed DSSE envelope (JSON bytes, as sign_envelope makes),
    with the RFC 3161 timestamps (DER TimeStampResp each) over its signature when given."""
    signature_bytes(envelope)
    env = json.loads(envelope)
    material: dict[str, Any] = {"publicKey": {"hint": env["signatures"][0]["keyid"]}, "tlogEntries": []}
    if timestamps:
        material["timestampVerificationData"] = {
            "rfc3161Timestamps": [{"signedTimestamp": base64.b64encode(t).decode()} for t in timestamps]}
    body = {"mediaType": BUNDLE_MEDIA_TYPE, "verificationMaterial": material, "dsseEnvelope": env}
    return json.dumps(body, sort_keys=True).encode()


def envelope(data: bytes, check_timestamp: TimestampCheck | None = None) -> bytes:
    """The DSSE envelope (JSON bytes, keys sorted: byte for byte what the toolkit's own artifact holds) of a
    bundle; BundleError naming the fault for anything but a v0.3 DSSE bundle with a public-key hint that is
    the key id its signature claims (so this toolkit and a Sigstore verifier look up the same key). With
    `check_timestamp` it must carry RFC 3161 timestamps, each passing it (None: no timestamp authority is trusted,
    so a bundle that carries one is refused)."""
    try:
        body = strict_json.loads(data)
    except strict_json.RepeatedKey as exc:
        raise BundleError(f"malformed: the Sigstore bundle repeats the key {exc} in one JSON object (JSON readers "
                          "disagree on which one counts)") from None
    except ValueError:
        raise BundleError("malformed: the Sigstore bundle is not JSON") from None
    if not isinstance(body, dict):
        raise BundleError("malformed: the Sigstore bundle is not a JSON object")
    if body.get("mediaType") != BUNDLE_MEDIA_TYPE:
        raise BundleError(f"malformed: a Sigstore bundle of mediaType {str(body.get('mediaType'))[:80]!r}, "
                          f"not {BUNDLE_MEDIA_TYPE}")
    env = body.get("dsseEnvelope")
    if not isinstance(env, dict):
        raise BundleError("malformed: the Sigstore bundle carries no dsseEnvelope")
    hint = _get(body, "verificationMaterial", "publicKey", "hint")
    if not isinstance(hint, str) or not hint:
        raise BundleError("malformed: the Sigstore bundle names no public key (verificationMaterial.publicKey.hint)")
    material = body.get("verificationMaterial") or {}
    unverifiable = _unverifiable(material, check_timestamp is not None)
    if unverifiable:
        raise BundleError(f"unverifiable: the Sigstore bundle carries {unverifiable}, which this toolkit cannot verify "
                          "(it trusts keys, not a transparency log, and a timestamp authority only where "
                          "DL_IMAGES_TSA_CERTS names one); Sigstore's verifiers refuse what they cannot verify too, "
                          "so it is refused, not read past")
    signatures = env.get("signatures")
    if not isinstance(signatures, list) or not all(isinstance(s, dict) for s in signatures):
        raise BundleError("malformed: the Sigstore bundle's dsseEnvelope.signatures is not a list of {keyid, sig}")
    claimed = [s.get("keyid") for s in signatures]
    if claimed != [hint]:
        raise BundleError(f"mismatched: the bundle's key hint {short(hint)} is not the key its one signature names "
                          f"({', '.join(short(str(k)) for k in claimed) or 'none'})")
    if check_timestamp is not None:
        signature = _decoded(env["signatures"][0].get("sig"))
        stamps = _get(material, "timestampVerificationData", "rfc3161Timestamps") or []
        if not stamps:
            # Fail closed, as sigstore-js does with the authority trusted (timestamp threshold 1): a reader told to
            # trust an authority takes no bundle that authority did not date.
            raise BundleError("unverifiable: the Sigstore bundle carries no RFC 3161 timestamp, and "
                              "DL_IMAGES_TSA_CERTS names a timestamp authority to trust: each bundle must carry its "
                              "timestamp (write it with --tsa URL), or unset DL_IMAGES_TSA_CERTS")
        if len(stamps) > MAX_TIMESTAMPS:    # each costs a signature check: refused before any is made
            raise BundleError(f"malformed: the Sigstore bundle carries {len(stamps)} RFC 3161 timestamps, more than "
                              f"the {MAX_TIMESTAMPS} a reader checks")
        for n, stamp in enumerate(stamps):
            raw = stamp.get("signedTimestamp") if isinstance(stamp, dict) else None
            problem = check_timestamp(_decoded(raw), signature)
            if problem:
                raise BundleError(f"unverifiable: the Sigstore bundle's RFC 3161 timestamp {n + 1} {problem}")
    return json.dumps(env, sort_keys=True).encode()


def _decoded(value: Any) -> bytes:
    """Base64 (protobuf's JSON, as DSSE, reads standard or URL-safe, padded or not) -> bytes; BundleError otherwise."""
    try:
        decoded = b64decode(value) if isinstance(value, str) else b""
    except (binascii.Error, ValueError):
        decoded = b""
    if not decoded:
        raise BundleError("malformed: a signature or timestamp of the Sigstore bundle is not base64")
    return decoded


def _unverifiable(material: dict[str, Any], timestamps_checked: bool) -> str:
    """What verification material a keyed bundle carries beyond its key hint that nothing here verifies ("" when
    nothing): a transparency-log entry, a timestamp (unless a timestamp authority is trusted), a certificate.
    Issue 48 decided: such a bundle is refused (sigstore-js refuses a bundle whose transparency-log entry it
    cannot verify), so the toolkit and a Sigstore verifier agree."""
    found = []
    entries = material.get("tlogEntries")
    if entries not in (None, []):
        found.append(f"{len(entries) if isinstance(entries, list) else 'malformed'} transparency-log entries")
    data = material.get("timestampVerificationData")
    stamps = _get(material, "timestampVerificationData", "rfc3161Timestamps")
    if data is not None and (not isinstance(data, dict) or set(data) - {"rfc3161Timestamps"}
                             or not isinstance(stamps, list | None)):
        found.append("timestamp verification data other than RFC 3161 timestamps")
    elif stamps and not timestamps_checked:
        found.append("RFC 3161 timestamps")
    found += [f"a {k}" for k in sorted(set(material) - {"publicKey", "tlogEntries", "timestampVerificationData"})]
    return ", ".join(found)


def _get(body: dict[str, Any], *path: str) -> Any:
    for name in path:
        if not isinstance(body, dict):
            return None
        body = body.get(name)   # type: ignore[assignment]
    return body
