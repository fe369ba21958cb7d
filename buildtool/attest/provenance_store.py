"""The SLSA provenance of an image digest in the registry: attached at push, read by release and `verify`.

Stored as an OCI referrer artifact of the digest (artifactType names.PROVENANCE_TYPE) whose one layer is
a DSSE envelope (intoto.DSSE_MEDIA_TYPE) of an in-toto Statement about the digest, predicate
provenance.PREDICATE_TYPE, signed by a builder key. The manifest's `in-toto.io/predicate-type` annotation
is a hint for people listing referrers; what counts is only what the signature covers.

`find_provenance` accepts a provenance only when its envelope verifies against a key trusted in the
builder role, its statement names this digest (a provenance copied from another digest is a replay) and
its predicate parses strictly. Everything else is listed with the reason it was rejected.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field

from buildtool.attest import intoto
from buildtool.attest.attested import Outcome, each_signed, open_signed
from buildtool.attest.bundles import attach_bundle
from buildtool.attest.dsse import PrivateKey, PublicKey, sign_envelope
from buildtool.attest.keys import TrustedKeys
from buildtool.attest.provenance_model import PREDICATE_TYPE, Provenance, ProvenanceError, parse_provenance
from buildtool.attest.referrers import Payload, Referrer, attach
from buildtool.attest.trust import BUILDER, Trusted
from buildtool.contracts.names import PROVENANCE_TYPE
from buildtool.registry.client import RegistryClient

ENVELOPE_TITLE = "provenance.intoto.jsonl"
# How far after the reader's clock a provenance may say its build finished: a builder's clock a little ahead. One
# dated later cannot be placed, and would otherwise count over every provenance of the digest ever signed after it
# (the newest counts). The same limit as the verdicts' (buildtool.validate.verdict_choice.CLOCK_SKEW_S; attest
# does not import validate: tests/test_gate_attacks.py keeps the two equal).
CLOCK_SKEW_S = 300


def only_key(key: PublicKey) -> TrustedKeys:
    """`key` alone, trusted as builder: what a push checks an attached provenance against (its own key), so that
    a provenance signed by anyone else is replaced, never kept."""
    return TrustedKeys(keys={key.keyid: key}, names={key.keyid: "this builder key"},
                       roles={key.keyid: frozenset({BUILDER})})


def attach_provenance(client: RegistryClient, repo: str, digest: str, provenance: Provenance,
                      key: PrivateKey) -> Referrer:
    """Sign `provenance` (about repo@digest) with the builder's `key` and attach it; returns the artifact."""
    data = sign_provenance(f"{client.host}/{repo}", digest, provenance, key)
    referrer = attach(client, repo, digest, PROVENANCE_TYPE,
                      [Payload(intoto.DSSE_MEDIA_TYPE, data, ENVELOPE_TITLE)],
                      {intoto.PREDICATE_ANNOTATION: PREDICATE_TYPE})
    attach_bundle(client, repo, digest, data, PREDICATE_TYPE)   # the same envelope, for Sigstore verifiers
    return referrer


def sign_provenance(repository: str, digest: str, provenance: Provenance, key: PrivateKey) -> bytes:
    """The DSSE envelope (JSON bytes) of the in-toto Statement that `provenance` is about repository@digest."""
    body = intoto.statement(repository, digest, PREDICATE_TYPE, provenance.to_json())
    return json.dumps(sign_envelope(key, intoto.PAYLOAD_TYPE, body), sort_keys=True).encode()


@dataclass
class ProvenanceFindings:
    """What `find_provenance` found: the valid provenance (None when none verifies), who signed it,
    and every other provenance artifact of the digest with why it does not count."""

    provenance: Provenance | None = None
    keyid: str = ""
    signer: str = ""                 # the key's description in the trusted keys (id and name)
    artifact: str = ""               # digest of the provenance artifact chosen
    referrer: Referrer | None = None   # its descriptor (release copies it with the image)
    rejected: list[tuple[str, str]] = field(default_factory=list)    # (artifact digest, reason)

    def why_none(self) -> str:
        """Why no provenance counts, for the message that refuses the image."""
        if not self.rejected:
            return "no provenance attached (push it with `make push`, which signs it with the builder key)"
        shown = "; ".join(f"{artifact[:19]}…: {reason}" for artifact, reason in self.rejected[:4])
        more = f" (and {len(self.rejected) - 4} more)" if len(self.rejected) > 4 else ""
        return f"no provenance verifies: {shown}{more}"


def find_provenance(client: RegistryClient, repo: str, digest: str, trusted: Trusted,
                    now: dt.datetime | None = None) -> ProvenanceFindings:
    """The provenance of `repo@digest` that verifies against `trusted` in the builder role. Of several
    valid ones, the one that finished last (signed `finishedOn`), ties by artifact digest; one that finished more
    than CLOCK_SKEW_S after `now` (the reader's clock, default this machine's) is rejected."""
    findings = ProvenanceFindings()
    valid: list[tuple[Referrer, str, Provenance]] = []
    now = now or dt.datetime.now(dt.UTC)
    for ref, opened in each_signed(client, repo, digest, PROVENANCE_TYPE, PREDICATE_TYPE,
                                   trusted.for_role(BUILDER), trusted, BUILDER):
        outcome = _parsed(opened)
        if isinstance(outcome, str):
            findings.rejected.append((ref.digest, outcome))
        elif outcome[0].runDetails.metadata.finished_at() > now + dt.timedelta(seconds=CLOCK_SKEW_S):
            clock = now.isoformat(timespec="seconds")
            findings.rejected.append((ref.digest, f"it finished at {outcome[0].runDetails.metadata.finishedOn}, "
                                                  f"more than {CLOCK_SKEW_S} s after this machine's clock ({clock}): "
                                                  "it cannot be placed in time"))
        else:
            valid.append((ref, outcome[1], outcome[0]))
    if valid:
        ref, keyid, provenance = max(valid, key=lambda v: (v[2].runDetails.metadata.finished_at(), v[0].digest))
        findings.provenance, findings.keyid, findings.artifact, findings.referrer = provenance, keyid, ref.digest, ref
        findings.signer = trusted.describe(keyid)
    return findings


def verify(payloads: list[Payload], digest: str, trusted: Trusted) -> tuple[Provenance, str] | str:
    """(provenance, signing key id) of one artifact's payloads, or why it does not count."""
    return _parsed(open_signed(payloads, digest, PREDICATE_TYPE, trusted.for_role(BUILDER), trusted,
                               BUILDER))


def _parsed(opened: Outcome) -> tuple[Provenance, str] | str:
    if isinstance(opened, str):
        return opened
    try:
        return parse_provenance(opened[0], "the signed provenance"), opened[1]
    except ProvenanceError as exc:
        return str(exc)
