"""Signed in-toto attestations attached to an image digest (the provenance, the SBOM attestation): list
them by artifact type, open each one's DSSE envelope against the keys of one role, and read the
statement about that digest. What each predicate must say is its reader's business
(buildtool.attest.provenance_store, buildtool.sbom.signing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from buildtool.attest import intoto
from buildtool.attest.bundles import read_once, same_envelope, signed_referrers
from buildtool.attest.dsse import EnvelopeError, PublicKey, claimed_keyids, open_envelope
from buildtool.attest.referrers import Payload, Referrer
from buildtool.attest.trust import Trusted
from buildtool.common.refs import shown
from buildtool.registry.client import RegistryClient

Outcome = tuple[dict[str, Any], str] | str     # (predicate, signing key id), or why it does not count


def open_signed(payloads: list[Payload], digest: str, predicate_type: str, keys: dict[str, PublicKey],
                roles: Trusted | None, role: str) -> Outcome:
    """One artifact's payloads -> (predicate, key id) when its one envelope verifies against `keys` and
    states `predicate_type` about `digest`; else why not (a key trusted only in another role is named so)."""
    envelopes = [p for p in payloads if p.media_type == intoto.DSSE_MEDIA_TYPE]
    if len(envelopes) != 1:
        return f"unsigned: {len(envelopes)} DSSE envelopes in the artifact, not one"
    data = envelopes[0].data
    try:
        opened = open_envelope(data, keys)
    except EnvelopeError as exc:
        # A key of this role claimed it: its signature's fault is the cause, not another claimed key's role.
        if roles is not None and not any(keyid in keys for keyid in claimed_keyids(data)):
            for keyid in claimed_keyids(data):
                if keyid in roles.keys and (why := roles.role_problem(keyid, role)):
                    return why
            # This machine's dev key, where --trust-local-key would trust it, is named with the flag.
            hints = [hint for keyid in claimed_keyids(data) if (hint := roles.untrusted_hint(keyid))]
            if hints:
                return hints[0]
        return str(exc)
    if opened.payload_type != intoto.PAYLOAD_TYPE:
        return f"not an in-toto statement: payloadType {shown(opened.payload_type)}"
    try:
        return intoto.read_statement(opened.payload, digest, predicate_type), opened.keyid
    except intoto.StatementError as exc:
        return str(exc)


def each_signed(client: RegistryClient, repo: str, digest: str, artifact_type: str, predicate_type: str,
                keys: dict[str, PublicKey], roles: Trusted | None, role: str) -> Iterator[tuple[Referrer, Outcome]]:
    """Every `artifact_type` referrer of repo@digest, and every Sigstore bundle of `predicate_type`
    (buildtool.attest.bundles), with what open_signed says of it (an artifact listed but missing, not what
    its descriptor says, or a bundle that does not read, is a reason too). A bundle carrying an envelope already
    read (push publishes each envelope in both layouts) is that attestation again: not yielded twice."""
    seen: set[str] = set()
    verified: set[str | None] = set()     # what the envelopes that verified sign: a copy with other signatures again
    for ref in signed_referrers(client, repo, digest, artifact_type, predicate_type):
        payloads = read_once(client, repo, ref, digest, seen)
        if payloads is None:
            continue
        if isinstance(payloads, str):
            yield ref, payloads
            continue
        outcome = open_signed(payloads, digest, predicate_type, keys, roles, role)
        if isinstance(outcome, tuple):
            if (signed := same_envelope(payloads, signed=True)) in verified:
                continue
            verified.add(signed)
        yield ref, outcome

