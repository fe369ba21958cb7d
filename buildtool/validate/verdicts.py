"""Verdicts stored with the image in its registry, as signed attestations attached to its digest.

validate signs each verdict (an in-toto Statement in a DSSE envelope, see
buildtool.attest.verdict_statement) and attaches it to the image digest as an OCI referrer
(buildtool.attest.referrers): pushed by digest, listed in the registry's referrers API or
the `sha256-<hex>` index, never replacing an earlier verdict, and pinned by a tag named by its
own digest (names.verdict_pin_tag). Any machine with registry access can ask "did this exact
digest pass?"; only a verdict signed by a trusted key answers.

The one reading release, verify and report use: every artifact listed as a referrer of the digest or named by a
verdict pin tag, each read by its own digest and typed by its own manifest (never by the listing, which anyone who
may push can rewrite); what cannot be read or typed blocks (`Findings.blocking`). Hiding a verdict takes deleting
its manifest. What is read, what blocks and what an attacker who may push can and cannot do: docs/release-trust.md
("Which verdict counts", "What an attacker with push access can and cannot do"); which verdict counts is
buildtool.validate.verdict_choice.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from buildtool.attest import referrers
from buildtool.attest.bundles import attach_bundle, fetch_envelopes, is_bundle, own_first, same_envelope
from buildtool.attest.dsse import EnvelopeError, claimed_keyids, open_envelope, sign_envelope
from buildtool.attest.intoto import check_subject, load_statement
from buildtool.attest.keys import TESTER, SigningKey, TrustedKeys
from buildtool.attest.referrers import Payload, Referrer, attach, listed_referrers
from buildtool.attest.sigstore_bundle import BundleError
from buildtool.attest.verdict_statement import (
    DSSE_MEDIA_TYPE,
    ENVELOPE_TITLE,
    PAYLOAD_TYPE,
    VERDICT_PREDICATE_PREFIX,
    StatementError,
    read_statement,
    statement,
)
from buildtool.contracts import label_keys
from buildtool.contracts.names import (
    ATTESTATION_TYPE,
    VERDICT_TYPE,
    parse_verdict_pin_tag,
    verdict_pin_tag,
    verdict_tag,
)
from buildtool.contracts.verdict import READ_SCHEMAS, Verdict
from buildtool.registry.client import NotFound, RegistryClient, RegistryError
from buildtool.validate.verdict_choice import CLOCK_SKEW_S, Decision, Found, decide, has_failure, unplaceable

__all__ = ["CLOCK_SKEW_S", "Found", "Findings", "Rejected", "attest", "find_verdicts", "verdict_tag"]


def attest(client: RegistryClient, repo: str, digest: str, verdict: Verdict, key: SigningKey) -> Referrer:
    """Sign `verdict` (about `digest`) and attach it to the image; returns the artifact."""
    if verdict.digest != digest:
        raise ValueError(f"verdict is for {verdict.digest}, not {digest}")
    body = statement(f"{client.host}/{repo}", digest, verdict.to_json())
    envelope = sign_envelope(key.key, PAYLOAD_TYPE, body)
    data = json.dumps(envelope, sort_keys=True).encode()
    # Annotations are hints for people listing referrers; release reads only the signed statement.
    notes = {label_keys.VERDICT_RESULT: verdict.result, label_keys.VERDICT_CELL: verdict.cell,
             label_keys.VERDICT_SIGNER: key.key.keyid}
    referrer = attach(client, repo, digest, ATTESTATION_TYPE, [Payload(DSSE_MEDIA_TYPE, data, ENVELOPE_TITLE)], notes)
    pin(client, repo, digest, referrer.digest)
    # The same envelope as a Sigstore bundle, for verifiers that read only that layout (cosign, gh, sigstore-js).
    attach_bundle(client, repo, digest, data, json.loads(body)["predicateType"])
    return referrer


def pin(client: RegistryClient, repo: str, subject: str, artifact: str) -> None:
    """Tag the attestation by its own digest (names.verdict_pin_tag), so that it stays findable
    when the mutable referrers index is rewritten."""
    raw, media_type, _ = client.get_manifest(repo, artifact)
    client.put_manifest(repo, verdict_pin_tag(subject, artifact), raw, media_type)


@dataclass(frozen=True)
class Rejected:
    artifact: str
    reason: str


@dataclass
class Findings:
    found: list[Found] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    legacy: bool = False           # an unsigned schema-1 verdict sits under the old `.verdict` tag
    overwritten: list[str] = field(default_factory=list)   # verdict pin tags pointed elsewhere: tampering
    # Valid verdicts that did not pass and whose time cannot be placed (unparseable, or in the future), and why:
    # each counts as the newest.
    unplaced: list[tuple[Found, str]] = field(default_factory=list)
    # Verdicts of the digest that cannot be read or typed, each with why: release and verify refuse while any is.
    blocking: list[str] = field(default_factory=list)

    def decision(self) -> Decision:
        """Which verdict counts, and its one-GPU companion (buildtool.validate.verdict_choice)."""
        return decide(self.found, self.unplaced)

    @property
    def chosen(self) -> Found | None:
        """The verdict that counts (see buildtool.validate.verdict_choice)."""
        return self.decision().counted

    @property
    def order_note(self) -> str:
        """Why the verdict that counts is not simply the newest ("" when it is)."""
        return self.decision().note

    def tampered(self, digest: str) -> str:
        """Why `digest` is refused when a verdict pin tag of it was pointed elsewhere ("" when none was): release
        and the report say it alike."""
        if not self.overwritten:
            return ""
        return (f"a verdict of {digest} was overwritten in the registry ({'; '.join(self.overwritten)}): the "
                "registry was tampered with; find out who wrote it, then validate the image again")

    def why_none(self, trusted: TrustedKeys, otherwise: str = "no verdict") -> str:
        """Why no verdict counts, for the message that refuses the image (`otherwise`: when none was found)."""
        if self.rejected:
            shown = "; ".join(f"{r.artifact[:19]}…: {r.reason}" for r in self.rejected[:4])
            more = f" (and {len(self.rejected) - 4} more)" if len(self.rejected) > 4 else ""
            return f"no verdict verifies against {trusted.source}: {shown}{more}"
        if self.legacy:
            return ("only an unsigned verdict (the old `.verdict` tag, schema 1): release needs a signed "
                    "verdict; validate the image again")
        return otherwise


@dataclass
class _Reading:
    """One reading of a digest's verdicts: where, against which keys and cell, by whose clock; the envelopes read
    so far (a bundle of one already read is the same verdict again) and what was found."""

    client: RegistryClient
    repo: str
    digest: str
    trusted: TrustedKeys
    cell: str | None
    now: dt.datetime
    findings: Findings = field(default_factory=Findings)
    counted: set[str] = field(default_factory=set)
    verified: set[str | None] = field(default_factory=set)   # what each verdict that verified signs (same_envelope)


def find_verdicts(client: RegistryClient, repo: str, digest: str, trusted: TrustedKeys,
                  cell: str | None = None, now: dt.datetime | None = None) -> Findings:
    """Every verdict attached to `digest` in `repo` (listed as a referrer, or pinned by a tag of its own),
    each read by its own digest and verified against `trusted`; `cell` set: a verdict for another cell is
    rejected too. `now`: the reader's clock (default this machine's), that no verdict may be dated after."""
    reading = _Reading(client, repo, digest, trusted, cell, now or dt.datetime.now(dt.UTC))
    findings = reading.findings
    # Pinned first: where a copy carries the same envelope, the artifact validate attached and pinned is read.
    candidates = {artifact: f"pinned by tag {tag}" for tag, artifact in _pinned(client, repo, digest, findings).items()}
    for listed in listed_referrers(client, repo, digest):
        candidates.setdefault(listed.digest, "listed")
    own = [r for artifact, how in candidates.items() if (r := _own_descriptor(reading, artifact, how)) is not None]
    for ref in own_first(own):
        if ref.artifact_type == VERDICT_TYPE:
            findings.rejected.append(Rejected(ref.digest, "unsigned: a plain verdict artifact, not a signed "
                                                          "attestation (hand-pushed?)"))
            continue
        verdict_bundle = is_bundle(ref, lambda t: t.startswith(VERDICT_PREDICATE_PREFIX))
        if ref.artifact_type != ATTESTATION_TYPE and not verdict_bundle:
            if candidates[ref.digest] != "listed":
                kind = ref.artifact_type or "(no artifact type)"
                findings.blocking.append(f"{ref.digest}, {candidates[ref.digest]}, is a {kind}, not a verdict "
                                         "attestation: a verdict pin names it")
            continue
        _read_one(reading, ref)
    if not findings.found and not findings.rejected and not findings.unplaced and not findings.blocking:
        findings.legacy = client.manifest_digest(repo, verdict_tag(digest)) is not None
    return findings


def _own_descriptor(reading: _Reading, artifact: str, how: str) -> Referrer | None:
    """The artifact as its own manifest describes it (read by its digest), or None: a listed artifact that is
    not there, or does not name this digest as its subject, cannot be shown not to be a verdict (blocking)."""
    findings, digest = reading.findings, reading.digest
    try:
        raw, _, got = reading.client.get_manifest(reading.repo, artifact)
        manifest = json.loads(raw)
    except NotFound:
        findings.blocking.append(f"{artifact}, {how}, is not in the registry: it may be a verdict nobody can read")
        return None
    except (RegistryError, ValueError) as exc:
        findings.blocking.append(f"{artifact}, {how}, cannot be read ({str(exc)[:200]})")
        return None
    if got != artifact or not isinstance(manifest, dict):
        findings.blocking.append(f"{artifact}, {how}, came back as {got}")
        return None
    malformed = _malformed(manifest)
    if malformed:
        # Anyone who may push can write such a manifest: what cannot be read cannot be shown not to be a verdict.
        findings.blocking.append(f"{artifact}, {how}, is no manifest this toolkit can read: {malformed}")
        return None
    if (manifest.get("subject") or {}).get("digest") != digest:
        # Not attached to this digest: nothing it says is about this image (a listing can name anything).
        findings.rejected.append(Rejected(artifact, f"mismatched: artifact {artifact} is not attached to {digest}"))
        return None
    return Referrer(artifact, str(manifest.get("artifactType") or ""), len(raw),
                    {str(k): str(v) for k, v in (manifest.get("annotations") or {}).items()})


def _malformed(manifest: dict[str, Any]) -> str:
    """What of an artifact's manifest, as read, has not the shape OCI gives it ("" when all has): its subject and
    annotations objects, its layers a list of descriptors, each naming its digest."""
    for name in ("subject", "annotations"):
        if manifest.get(name) is not None and not isinstance(manifest[name], dict):
            return f"its {name!r} field is a JSON {type(manifest[name]).__name__}, not an object"
    layers = manifest.get("layers", [])
    if not isinstance(layers, list) or not all(isinstance(layer, dict) and isinstance(layer.get("digest"), str)
                                               and isinstance(layer.get("annotations") or {}, dict)
                                               for layer in layers):
        return "its layers are not a list of descriptors, each with its digest"
    return ""


def _read_one(reading: _Reading, ref: Referrer) -> None:
    """One verdict attestation (by its own manifest): found, rejected, unplaced or blocking."""
    findings = reading.findings
    try:
        payloads = fetch_envelopes(reading.client, reading.repo, ref, reading.digest)
    except (NotFound, RegistryError) as exc:
        findings.blocking.append(f"verdict attestation {ref.digest} cannot be read ({str(exc)[:200]})")
        return
    except BundleError as exc:
        findings.rejected.append(Rejected(ref.digest, str(exc)))
        return
    same = same_envelope(payloads)
    if same is not None:
        if same in reading.counted:
            return   # that envelope again (push publishes each in both layouts): the same verdict
        reading.counted.add(same)
    outcome = _verify(payloads, reading.digest, reading.trusted, reading.cell)
    if isinstance(outcome, Untyped):
        findings.blocking.append(f"verdict attestation {ref.digest}: {outcome.why}")
        return
    if isinstance(outcome, str):
        findings.rejected.append(Rejected(ref.digest, outcome))
        return
    verdict, keyid = outcome
    if (signed := same_envelope(payloads, signed=True)) in reading.verified:
        return   # that signed verdict again, with other signatures beside its own: the same verdict
    reading.verified.add(signed)
    found = Found(ref.digest, verdict, keyid, ref)
    why = unplaceable(verdict.started, reading.now)
    if not why:
        findings.found.append(found)
    elif verdict.result == "passed" and not has_failure(verdict):
        findings.rejected.append(Rejected(ref.digest, f"a pass whose time cannot be placed: {why}"))
    else:
        findings.unplaced.append((found, why))


def _pinned(client: RegistryClient, repo: str, digest: str, findings: Findings) -> dict[str, str]:
    """tag -> attestation digest of every verdict pin tag of `digest`; a pin tag that no longer
    names the manifest its name says was overwritten: recorded in `findings.overwritten`; one listed that names no
    manifest the registry has may name a verdict nobody can read: recorded in `findings.blocking`."""
    named_by = {tag: named for tag in client.tags(repo) if (named := parse_verdict_pin_tag(tag, digest)) is not None}
    if len(named_by) > referrers.MAX_REFERRERS:     # each pins a referrer: no more of them than of referrers
        raise RegistryError(f"{repo}@{digest} has more than {referrers.MAX_REFERRERS} verdict pin tags; refused, not "
                            "read further (a list read in part could hide a signature or choose another)")
    pins = {}
    for tag, named in named_by.items():
        now = client.manifest_digest(repo, tag)
        if now is None:
            findings.blocking.append(f"the verdict pin tag {tag} is listed, but the registry has no manifest for it: "
                                     "it may name a verdict nobody can read")
            continue
        if not now.partition(":")[2].startswith(named):
            findings.overwritten.append(f"{tag} now names {now}")
            continue
        pins[tag] = now
    return pins


@dataclass(frozen=True)
class Untyped:
    """A trusted tester's envelope about this digest whose content is no verdict this toolkit reads: it blocks."""

    signer: str
    cause: str       # what does not parse, as the statement's reader says

    @property
    def why(self) -> str:
        return (f"signed by {self.signer}, but cannot be typed: {self.cause}; a verdict this toolkit cannot read "
                "blocks (upgrade the toolkit, or validate the image again)")


def _verify(payloads: list[Payload], digest: str, trusted: TrustedKeys,
            cell: str | None) -> tuple[Verdict, str] | str | Untyped:
    """(verdict, key id); or why it does not count (a string); or, for a trusted tester's statement about this
    digest that cannot be typed, why it blocks."""
    envelopes = [p for p in payloads if p.media_type == DSSE_MEDIA_TYPE]
    if len(envelopes) != 1:
        return f"unsigned: {len(envelopes)} DSSE envelopes in the artifact, not one"
    try:
        opened = open_envelope(envelopes[0].data, trusted.for_role(TESTER))
    except EnvelopeError as exc:
        # A key trusted in another role only (a builder's) is named as such, not as "untrusted"; unless a tester key
        # claimed it too, whose signature's fault is the cause.
        claimed = claimed_keyids(envelopes[0].data)
        if any(k in trusted.for_role(TESTER) for k in claimed):
            return str(exc)
        held = [why for k in claimed if k in trusted.keys and (why := trusted.role_problem(k, TESTER))]
        # This machine's dev key, where --trust-local-key would trust it, is named with the flag.
        held += [hint for k in claimed if (hint := trusted.untrusted_hint(k))]
        return held[0] if held else str(exc)
    signer = trusted.describe(opened.keyid)
    if opened.payload_type != PAYLOAD_TYPE:
        return Untyped(signer, f"not an in-toto statement (payloadType {opened.payload_type!r})")
    try:
        body = load_statement(opened.payload)
        check_subject(body, digest)
    except StatementError as exc:
        return str(exc)     # not a statement about this digest: a replay of another image's, or no statement
    try:
        verdict = read_statement(opened.payload, digest)
    except StatementError as exc:
        schema = (body.get("predicate") or {}).get("schema") if isinstance(body.get("predicate"), dict) else None
        if isinstance(schema, int) and not isinstance(schema, bool) and schema < READ_SCHEMAS[0]:
            # A retired schema, from a toolkit older than the one before: ignored, never blocking (validating the
            # image again is what replaces it); a newer or malformed one blocks.
            return f"retired: {exc}"
        return Untyped(signer, str(exc))
    if cell is not None and verdict.cell != cell:
        return f"mismatched: the verdict is for cell {verdict.cell!r}, not {cell}"
    return verdict, opened.keyid
