"""Verdicts stored with the image in its registry, as signed attestations attached to its digest.

validate signs each verdict (an in-toto Statement in a DSSE envelope, see
buildtool.contracts.attestation) and attaches it to the image digest as an OCI referrer
(buildtool.registry.referrers): pushed by digest, listed in the registry's referrers API or
the `sha256-<hex>` index, never replacing an earlier verdict, and pinned by a tag named by its
own digest (names.verdict_pin_tag). Any machine with registry access can ask "did this exact
digest pass?"; only a verdict signed by a trusted key answers.

What an attacker who may push (but not delete) can and cannot do: a forged, tampered, replayed
or untrusted verdict never counts (it does not verify); rewriting the `sha256-<hex>` index to
drop a verdict does not hide it (its pin tag still lists it); pointing a pin tag at another
manifest is detected (the tag's name is its content's digest) and refuses the release. Hiding
a verdict takes deleting its manifest: delete permission on the registry (as it does with the
OCI referrers API, where the registry keeps the list).

Which verdict counts (the rule release, verify and report apply): of the attestations attached to
the digest, those that verify (a signature by a trusted key, a statement whose signed subject is
this digest, a verdict of a schema this toolkit reads (buildtool.contracts.verdict: the current
and the one before) that parses, names this digest and, for release, this cell). The signer's
clock alone never decides (docs/release-trust.md, "Which verdict counts"):

- a verdict whose `started` does not parse, or lies more than CLOCK_SKEW_S after the reader's clock,
  cannot be placed in time: if it passed it is refused (listed as rejected, naming its time); if it
  did not pass it counts, as the newest (a failure nobody can order blocks);
- of the others, the newest by signed `started` (ties: the attestation digest) is the candidate; when
  it passed, a verdict that did not pass and comes after it by upload order (its place in the
  registry's list of referrers: the fallback index is appended to) or by its artifact's creation
  annotation counts instead. A pass counts only when it is the newest by every order.

A newer verdict that does not verify never hides an older one that does.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass, field

from buildtool.common.dsse import EnvelopeError, claimed_keyids, open_envelope, sign_envelope
from buildtool.contracts import label_keys
from buildtool.contracts.attestation import (
    DSSE_MEDIA_TYPE,
    ENVELOPE_TITLE,
    PAYLOAD_TYPE,
    VERDICT_PREDICATE_PREFIX,
    StatementError,
    read_statement,
    statement,
)
from buildtool.contracts.label_keys import ARTIFACT_CREATED
from buildtool.contracts.names import (
    ATTESTATION_TYPE,
    VERDICT_TYPE,
    parse_verdict_pin_tag,
    verdict_pin_tag,
    verdict_tag,
)
from buildtool.contracts.verdict import Verdict
from buildtool.registry.bundles import attach_bundle, is_bundle, own_first, read_once
from buildtool.registry.client import NotFound, RegistryClient
from buildtool.registry.referrers import Payload, Referrer, attach, listed_referrers
from buildtool.validate.keys import TESTER, SigningKey, TrustedKeys

log = logging.getLogger(__name__)

__all__ = ["CLOCK_SKEW_S", "Found", "Findings", "Rejected", "attest", "find_verdicts", "verdict_tag"]

# How far after the reader's clock a verdict's signed `started` may lie (runners' clocks drift; NTP keeps
# them within seconds): beyond it the verdict cannot be placed in time (see the module's rule).
CLOCK_SKEW_S = 300


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
class Found:
    """A verdict that verified."""

    artifact: str                  # digest of the attestation artifact
    verdict: Verdict
    keyid: str
    referrer: Referrer

    listed_at: int | None = None   # its place in the registry's list of referrers (None: found by its pin tag)

    @property
    def started(self) -> dt.datetime:
        when = _when(self.verdict.started)
        assert when is not None, "an unplaceable verdict is never ordered by time"
        return when

    @property
    def created(self) -> str:
        return self.referrer.annotations.get(ARTIFACT_CREATED, "") if self.referrer is not None else ""


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

    @property
    def chosen(self) -> Found | None:
        """The verdict that counts (see the module's rule)."""
        return self._choose()[0]

    @property
    def order_note(self) -> str:
        """Why the verdict that counts is not simply the newest by signed time ("" when it is)."""
        return self._choose()[1]

    def _choose(self) -> tuple[Found | None, str]:
        if self.unplaced:
            found, why = self.unplaced[0]
            return found, (f"verdict {found.artifact} ({found.verdict.result}) counts as the newest: {why}, so no "
                           "older pass can be ordered after it")
        if not self.found:
            return None, ""
        newest = max(self.found, key=lambda f: (f.started, f.artifact))
        if newest.verdict.result != "passed":
            return newest, ""
        later = [f for f in self.found if f.verdict.result != "passed" and _after(f, newest)]
        if not later:
            return newest, ""
        blocker = max(later, key=lambda f: (f.listed_at if f.listed_at is not None else -1, f.created, f.artifact))
        return blocker, (f"verdict {blocker.artifact} ({blocker.verdict.result}, started {blocker.verdict.started}) "
                         f"counts over the pass {newest.artifact} (started {newest.verdict.started}): it was "
                         "uploaded after it; the signer's clock alone does not order verdicts")

    def why_none(self, trusted: TrustedKeys) -> str:
        """Why no verdict counts, for the message that refuses the image."""
        if self.rejected:
            shown = "; ".join(f"{r.artifact[:19]}…: {r.reason}" for r in self.rejected[:4])
            more = f" (and {len(self.rejected) - 4} more)" if len(self.rejected) > 4 else ""
            return f"no verdict verifies against {trusted.source}: {shown}{more}"
        if self.legacy:
            return ("only an unsigned verdict (the old `.verdict` tag, schema 1): release needs a signed "
                    "verdict; validate the image again")
        return "no verdict"


def _after(later: Found, earlier: Found) -> bool:
    """Whether `later` was uploaded after `earlier`: by its place in the registry's list, or by the creation
    annotation of its artifact (both unsigned: they only ever let a verdict that did not pass win)."""
    if later.listed_at is not None and earlier.listed_at is not None and later.listed_at > earlier.listed_at:
        return True
    return bool(later.created and earlier.created and later.created > earlier.created)


def _when(value: str) -> dt.datetime | None:
    """The signed `started` time, None when it does not parse as an ISO 8601 time."""
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def unplaceable(started: str, now: dt.datetime) -> str:
    """Why a verdict's signed `started` cannot be placed in time ("" when it can)."""
    when = _when(started)
    if when is None:
        return f"its started time {started[:40]!r} does not parse"
    if when > now + dt.timedelta(seconds=CLOCK_SKEW_S):
        return (f"it is dated {started[:40]}, more than {CLOCK_SKEW_S} s after this machine's clock "
                f"({now.isoformat(timespec='seconds')})")
    return ""


def find_verdicts(client: RegistryClient, repo: str, digest: str, trusted: TrustedKeys,
                  cell: str | None = None, now: dt.datetime | None = None) -> Findings:
    """Every verdict attached to `digest` in `repo` (listed as a referrer, or pinned by a tag of
    its own), verified against `trusted`; `cell` set: a verdict for another cell is rejected too.
    `now`: the reader's clock (default this machine's), that no verdict may be dated after."""
    findings = Findings()
    now = now or dt.datetime.now(dt.UTC)
    listed = {r.digest: r for r in listed_referrers(client, repo, digest)}
    position = {d: i for i, d in enumerate(listed)}
    for tag, artifact in _pinned(client, repo, digest, findings).items():
        if artifact not in listed:
            try:
                raw, _, _ = client.get_manifest(repo, artifact)
            except NotFound:
                continue   # deleted since the tag was read: nothing to verify
            manifest = json.loads(raw)
            listed[artifact] = Referrer(artifact, str(manifest.get("artifactType") or ""), len(raw),
                                        dict(manifest.get("annotations") or {}))
            log.info("verdict %s of %s is pinned by tag %s but not listed as a referrer", artifact, digest, tag)
    counted: set[str] = set()    # the envelopes read: a bundle of one already read is the same verdict again
    for ref in own_first(list(listed.values())):
        if ref.artifact_type == VERDICT_TYPE:
            findings.rejected.append(Rejected(ref.digest, "unsigned: a plain verdict artifact, not a signed "
                                                          "attestation (hand-pushed?)"))
            continue
        if ref.artifact_type != ATTESTATION_TYPE and not is_bundle(ref, _verdict_predicate):
            continue
        payloads = read_once(client, repo, ref, digest, counted)
        if payloads is None:
            continue
        outcome = payloads if isinstance(payloads, str) else _verify(payloads, digest, trusted, cell)
        if isinstance(outcome, str):
            findings.rejected.append(Rejected(ref.digest, outcome))
        else:
            verdict, keyid = outcome
            found = Found(ref.digest, verdict, keyid, ref, position.get(ref.digest))
            why = unplaceable(verdict.started, now)
            if not why:
                findings.found.append(found)
            elif verdict.result == "passed":
                findings.rejected.append(Rejected(ref.digest, f"a pass whose time cannot be placed: {why}"))
            else:
                findings.unplaced.append((found, why))
    if not findings.found and not findings.rejected and not findings.unplaced:
        findings.legacy = client.manifest_digest(repo, verdict_tag(digest)) is not None
    return findings


def _verdict_predicate(predicate_type: str) -> bool:
    return predicate_type.startswith(VERDICT_PREDICATE_PREFIX)


def _pinned(client: RegistryClient, repo: str, digest: str, findings: Findings) -> dict[str, str]:
    """tag -> attestation digest of every verdict pin tag of `digest`; a pin tag that no longer
    names the manifest its name says was overwritten: recorded in `findings.overwritten`."""
    pins = {}
    for tag in client.tags(repo):
        named = parse_verdict_pin_tag(tag, digest)
        if named is None:
            continue
        now = client.manifest_digest(repo, tag)
        if now is None:
            continue
        if not now.partition(":")[2].startswith(named):
            findings.overwritten.append(f"{tag} now names {now}")
            continue
        pins[tag] = now
    return pins


def _verify(payloads: list[Payload], digest: str, trusted: TrustedKeys,
            cell: str | None) -> tuple[Verdict, str] | str:
    envelopes = [p for p in payloads if p.media_type == DSSE_MEDIA_TYPE]
    if len(envelopes) != 1:
        return f"unsigned: {len(envelopes)} DSSE envelopes in the artifact, not one"
    try:
        opened = open_envelope(envelopes[0].data, trusted.for_role(TESTER))
    except EnvelopeError as exc:
        # A key trusted in another role only (a builder's) is named as such, not as "untrusted".
        held = [why for k in claimed_keyids(envelopes[0].data) if k in trusted.keys
                and (why := trusted.role_problem(k, TESTER))]
        return held[0] if held else str(exc)
    if opened.payload_type != PAYLOAD_TYPE:
        return f"not an in-toto statement: payloadType {opened.payload_type!r}"
    try:
        verdict = read_statement(opened.payload, digest)
    except StatementError as exc:
        return str(exc)
    if cell is not None and verdict.cell != cell:
        return f"mismatched: the verdict is for cell {verdict.cell!r}, not {cell}"
    return verdict, opened.keyid
