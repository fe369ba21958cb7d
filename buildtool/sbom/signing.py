"""The SBOM as a signed attestation: an in-toto Statement about the image digest whose predicate is the
CycloneDX document (predicateType SBOM_PREDICATE), in a DSSE envelope signed by the builder's key, attached
to the digest as a referrer (artifactType names.SBOM_ATTESTATION_TYPE, one layer intoto.DSSE_MEDIA_TYPE,
the manifest annotated `in-toto.io/predicate-type`). Push attaches it beside the plain SBOM artifact
(buildtool.sbom.document, which scanners read); the plain one is unsigned, so anyone who may push can
rewrite it, and what counts is this one.

The SBOM's digest (`sbom_digest`) is the sha256 of the CycloneDX document's canonical bytes (JSON, keys
sorted, no spaces, ASCII escapes), not of the envelope or the artifact manifest: the same document has
the same digest whether it came signed or plain, and wherever it was copied. The verdict names it
(buildtool.contracts.verdict, schema 4), release and `buildtool verify` compare it.

Deterministic: the same document about the same digest, signed with the same key, gives the same
envelope bytes (canonical statement, Ed25519 signatures are deterministic).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from buildtool.attest.attested import each_signed
from buildtool.attest.bundles import attach_bundle
from buildtool.attest.dsse import PrivateKey, PublicKey, sign_envelope
from buildtool.attest.intoto import (
    DSSE_MEDIA_TYPE,
    PAYLOAD_TYPE,
    PREDICATE_ANNOTATION,
    statement,
)
from buildtool.attest.referrers import Payload, Referrer, attach
from buildtool.attest.trust import BUILDER, Trusted
from buildtool.common.refs import shown_plain
from buildtool.contracts import label_keys
from buildtool.contracts.names import SBOM_ATTESTATION_TYPE
from buildtool.registry.client import RegistryClient, RegistryError, sha256_digest
from buildtool.sbom.document import load_sbom, shape_problem

SBOM_PREDICATE = "https://cyclonedx.org/bom"
ENVELOPE_TITLE = "sbom.intoto.jsonl"


def sbom_digest(document: dict[str, Any]) -> str:
    """What a verdict names: sha256 of the document's canonical bytes (see the module)."""
    return sha256_digest(json.dumps(document, sort_keys=True, separators=(",", ":")).encode())


def envelope_bytes(repository: str, digest: str, document: dict[str, Any], key: PrivateKey) -> bytes:
    """The signed envelope, byte for byte what is stored."""
    payload = statement(repository, digest, SBOM_PREDICATE, document)
    return json.dumps(sign_envelope(key, PAYLOAD_TYPE, payload), sort_keys=True).encode()


def attest_sbom(client: RegistryClient, repo: str, digest: str, document: dict[str, Any],
                key: PrivateKey) -> Referrer:
    """Sign `document` (the SBOM of repo@digest) with the builder's `key` and attach it to the digest."""
    data = envelope_bytes(f"{client.host}/{repo}", digest, document, key)
    notes = {PREDICATE_ANNOTATION: SBOM_PREDICATE, label_keys.SBOM_DIGEST: sbom_digest(document)}
    referrer = attach(client, repo, digest, SBOM_ATTESTATION_TYPE, [Payload(DSSE_MEDIA_TYPE, data, ENVELOPE_TITLE)],
                      notes)
    attach_bundle(client, repo, digest, data, SBOM_PREDICATE)   # the same envelope, for Sigstore verifiers
    return referrer


@dataclass(frozen=True)
class AttestedSbom:
    document: dict[str, Any]
    digest: str           # sbom_digest(document)
    signer: str           # key id
    artifact: str         # the attestation artifact's digest
    referrer: Referrer


@dataclass
class SbomFindings:
    """The SBOM attestations of a digest: `found` verified, `rejected` (artifact, why) did not.
    `document`, `digest`, `signer`, `artifact` and `referrer` are those of the one that counts: the
    verified ones must agree on one document (two signed SBOMs that disagree count as none)."""

    found: list[AttestedSbom] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)

    @property
    def chosen(self) -> AttestedSbom | None:
        if not self.found or len({f.digest for f in self.found}) != 1:
            return None
        return self.found[-1]

    @property
    def document(self) -> dict[str, Any] | None:
        return self.chosen.document if self.chosen else None

    @property
    def digest(self) -> str:
        return self.chosen.digest if self.chosen else ""

    @property
    def signer(self) -> str:
        return self.chosen.signer if self.chosen else ""

    @property
    def artifact(self) -> str:
        return self.chosen.artifact if self.chosen else ""

    @property
    def referrer(self) -> Referrer | None:
        return self.chosen.referrer if self.chosen else None

    def why_none(self) -> str:
        """Why no SBOM attestation counts ("" when one does)."""
        if self.chosen is not None:
            return ""
        if self.found:
            return (f"{len(self.found)} signed SBOMs disagree ({', '.join(sorted({f.digest for f in self.found}))}): "
                    "push again from one build")
        if self.rejected:
            shown = "; ".join(f"{a[:19]}…: {why}" for a, why in self.rejected[:3])
            return f"no SBOM attestation verifies against the builder keys: {shown}"
        return "no SBOM attestation is attached (pushed before SBOMs were signed? push it again)"


def find_sbom_attestation(client: RegistryClient, repo: str, digest: str, trusted: Trusted) -> SbomFindings:
    """Every SBOM attestation attached to repo@digest, verified against the keys `trusted` (release's
    buildtool.attest.keys.TrustedKeys) holds in the builder role (a tester key's signature does not
    count, naming its role)."""
    return _find(client, repo, digest, trusted.for_role(BUILDER), trusted)


def signed_by(client: RegistryClient, repo: str, digest: str, key: PublicKey) -> AttestedSbom | None:
    """The SBOM attestation of repo@digest that `key` signed, if any (push: is there one already?)."""
    found = _find(client, repo, digest, {key.keyid: key}, None).found
    return found[-1] if found else None


def _find(client: RegistryClient, repo: str, digest: str, keys: dict[str, PublicKey],
          trusted: Trusted | None) -> SbomFindings:
    findings = SbomFindings()
    for ref, opened in each_signed(client, repo, digest, SBOM_ATTESTATION_TYPE, SBOM_PREDICATE, keys, trusted,
                                   BUILDER):
        outcome = opened if isinstance(opened, str) else _cyclonedx(opened[0], digest)
        if isinstance(outcome, str):
            findings.rejected.append((ref.digest, outcome))
        else:
            findings.found.append(AttestedSbom(outcome, sbom_digest(outcome), opened[1], ref.digest, ref))
    return findings


def _cyclonedx(document: dict[str, Any], digest: str) -> dict[str, Any] | str:
    """The predicate when it is a CycloneDX document about `digest`, else why not."""
    if document.get("bomFormat") != "CycloneDX" or not isinstance(document.get("specVersion"), str):
        return "malformed: the predicate is not a CycloneDX document (bomFormat, specVersion)"
    problem = shape_problem(document)
    if problem:
        return f"malformed: the predicate's {problem}"
    described = ((document.get("metadata") or {}).get("component") or {}).get("version")
    if described != digest:
        return f"mismatched: the SBOM describes {shown_plain(described)}, not {digest}"
    return document


def plain_sbom_problem(client: RegistryClient, repo: str, digest: str, attested: str) -> str:
    """Why the plain SBOM artifact of repo@digest (what scanners and release notes read) is not the
    attested document `attested` (a digest, `sbom_digest`): missing, or rewritten; "" when it is."""
    try:
        found = load_sbom(client, repo, digest)
    except RegistryError as exc:
        return f"the plain SBOM of {digest} cannot be read: {exc}"
    if found is None:
        return f"{digest} has a signed SBOM but no plain SBOM artifact beside it (scanners read that one)"
    plain = sbom_digest(found[0])
    if plain != attested:
        return (f"the plain SBOM of {digest} ({found[1]}) is the document {plain}, not the signed {attested}: "
                "someone rewrote it")
    return ""


class SbomRefused(RegistryError):
    """The SBOM a reader would show is not the one the builder signed (or none is signed)."""


def read_signed_sbom(client: RegistryClient, repo: str, digest: str,
                     trusted: Trusted) -> tuple[dict[str, Any], str] | None:
    """(document, attestation artifact) of repo@digest's SBOM as a trusted builder signed it, for readers that
    show or compare it (`buildtool sbom`, `buildtool diff`); None when the image has no SBOM at all. Refused
    (SbomRefused): an SBOM that no trusted builder signed, and a plain SBOM beside the signed one that is
    another document (someone rewrote it: a reader must not show the rewrite). Release and verify check the
    same two things (buildtool.release.sbomgate)."""
    findings = find_sbom_attestation(client, repo, digest, trusted)
    chosen = findings.chosen
    plain = load_sbom(client, repo, digest)
    if chosen is None:
        if plain is None and not findings.found and not findings.rejected:
            return None
        raise SbomRefused(f"{digest} has no SBOM signed by a trusted builder ({findings.why_none()}); an unsigned "
                          "SBOM is not shown (anyone who may push can attach one)")
    if plain is not None and sbom_digest(plain[0]) != chosen.digest:
        raise SbomRefused(plain_sbom_problem(client, repo, digest, chosen.digest))
    return chosen.document, chosen.artifact
