"""STAND-IN, to be dropped: branch `provenance` writes the real module under this name (push attaches
the SLSA provenance, release gates on it). Branch `sbom-attest` needs only its reader's interface,
for `buildtool verify` and its tests:

    find_provenance(client, repo, digest, trusted) -> ProvenanceFindings: .provenance (contracts.provenance.
    Provenance or None), .keyid, .signer (trusted.describe(keyid)), .artifact and .referrer (the attestation),
    .rejected (list of (artifact, reason)), .why_none() (the fields branch `provenance` has)

This stand-in reads any referrer of `digest` annotated `in-toto.io/predicate-type: PREDICATE_TYPE`, verifies
its DSSE envelope against the builder keys and parses the predicate strictly; the newest that verifies counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from buildtool.common.dsse import EnvelopeError, open_envelope
from buildtool.contracts.intoto import (
    DSSE_MEDIA_TYPE,
    PAYLOAD_TYPE,
    PREDICATE_ANNOTATION,
    StatementError,
    read_statement,
)
from buildtool.contracts.provenance import PREDICATE_TYPE, Provenance, ProvenanceError, parse_provenance
from buildtool.registry.client import RegistryClient, RegistryError
from buildtool.registry.referrers import Referrer, fetch, referrers

if TYPE_CHECKING:
    from buildtool.validate.keys import TrustedKeys

PROVENANCE_TYPE = "application/vnd.dl-images.provenance.v1+json"   # stand-in's artifact type


@dataclass
class ProvenanceFindings:
    provenance: Provenance | None = None
    keyid: str = ""
    signer: str = ""
    artifact: str = ""
    referrer: Referrer | None = None
    rejected: list[tuple[str, str]] = field(default_factory=list)

    def why_none(self) -> str:
        if not self.rejected:
            return "no provenance attached"
        return "no provenance verifies: " + "; ".join(f"{a[:19]}…: {why}" for a, why in self.rejected[:4])


def find_provenance(client: RegistryClient, repo: str, digest: str, trusted: TrustedKeys) -> ProvenanceFindings:
    found = ProvenanceFindings()
    keys = trusted.for_role("builder")
    for ref in referrers(client, repo, digest):
        if ref.annotations.get(PREDICATE_ANNOTATION) != PREDICATE_TYPE:
            continue
        try:
            envelopes = [p for p in fetch(client, repo, ref, digest) if p.media_type == DSSE_MEDIA_TYPE]
            if len(envelopes) != 1:
                raise EnvelopeError(f"unsigned: {len(envelopes)} DSSE envelopes in the artifact, not one")
            opened = open_envelope(envelopes[0].data, keys)
            if opened.payload_type != PAYLOAD_TYPE:
                raise EnvelopeError(f"not an in-toto statement: payloadType {opened.payload_type!r}")
            predicate = read_statement(opened.payload, digest, PREDICATE_TYPE)
            provenance = parse_provenance(predicate, "the signed provenance")
        except (RegistryError, EnvelopeError, StatementError, ProvenanceError) as exc:
            found.rejected.append((ref.digest, str(exc)))
            continue
        found.provenance, found.keyid, found.artifact, found.referrer = provenance, opened.keyid, ref.digest, ref
        found.signer = trusted.describe(opened.keyid)
    return found
