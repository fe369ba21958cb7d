"""Sigstore bundles attached to an image digest, in the OCI referrers layout cosign (`--new-bundle-format`) and
GitHub's artifact attestations use: an artifact manifest of artifactType BUNDLE_MEDIA_TYPE, an empty config,
the bundle (buildtool.attest.sigstore_bundle) as its one layer, `subject` the image, annotated
`dev.sigstore.bundle.content: dsse-envelope` and `dev.sigstore.bundle.predicateType`. Listed in the referrers
API, or in the fallback index `sha256-<hex>` where the registry has none (buildtool.attest.referrers).

Each signed attestation (provenance, SBOM, verdict) is published twice: the toolkit's own artifact and this
bundle around the same envelope. The toolkit's readers read both (`signed_referrers`, `fetch_envelopes`), so
an image that carries only bundles verifies too; a bundle carrying the same envelope as an artifact already
read is the same attestation, not a second one (buildtool.validate.verdicts counts it once).

RFC 3161 timestamps (issue 52): written where DL_IMAGES_TSA_URL names an authority (attach_bundle), verified
against DL_IMAGES_TSA_CERTS (timestamp_check); buildtool.common.tsa.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from buildtool.attest.dsse import canonical
from buildtool.attest.intoto import DSSE_MEDIA_TYPE
from buildtool.attest.referrers import Payload, Referrer, attach, fetch, referrers
from buildtool.attest.sigstore_bundle import (
    BUNDLE_MEDIA_TYPE,
    CONTENT_ANNOTATION,
    DSSE_CONTENT,
    PREDICATE_TYPE_ANNOTATION,
    BundleError,
    TimestampCheck,
    bundle,
    envelope,
    signature_bytes,
)
from buildtool.common import strict_json, tsa
from buildtool.registry.call_errors import TooLarge
from buildtool.registry.client import NotFound, RegistryClient, RegistryError


def attach_bundle(client: RegistryClient, repo: str, digest: str, envelope_data: bytes,
                  predicate_type: str) -> Referrer:
    """Publish the signed envelope `envelope_data` (about repo@digest) as a Sigstore bundle referrer, with a
    timestamp over its signature from the authority DL_IMAGES_TSA_URL names, when it names one."""
    notes = {CONTENT_ANNOTATION: DSSE_CONTENT, PREDICATE_TYPE_ANNOTATION: predicate_type}
    tsa.check_writer(None, writes=True)   # never a bundle without the timestamp DL_IMAGES_TSA_CERTS asks for
    url = tsa.configured_url()
    stamps = [tsa.request_timestamp(url, signature_bytes(envelope_data))] if url else []
    return attach(client, repo, digest, BUNDLE_MEDIA_TYPE, [Payload(BUNDLE_MEDIA_TYPE, bundle(envelope_data, stamps))],
                  notes)


def timestamp_check() -> TimestampCheck | None:
    """How readers check a bundle's RFC 3161 timestamps: against the authority DL_IMAGES_TSA_CERTS names; None
    when it names none (a bundle carrying a timestamp is then refused)."""
    authority = tsa.configured_authority()
    if authority is None:
        return None
    return lambda stamp, signature: tsa.timestamp_problem(stamp, signature, authority)


def is_bundle(ref: Referrer, predicate: Callable[[str], bool]) -> bool:
    """A DSSE bundle whose annotated predicate type `predicate` accepts (the annotation only selects; what
    counts is the signed statement, which the reader checks)."""
    return (ref.artifact_type == BUNDLE_MEDIA_TYPE and ref.annotations.get(CONTENT_ANNOTATION) == DSSE_CONTENT
            and predicate(ref.annotations.get(PREDICATE_TYPE_ANNOTATION, "")))


def signed_referrers(client: RegistryClient, repo: str, digest: str, artifact_type: str,
                     predicate_type: str) -> list[Referrer]:
    """The `artifact_type` referrers of repo@digest, oldest first (as referrers.referrers orders them), then its
    bundles of `predicate_type`: where both carry one envelope, readers keep the toolkit's own artifact (the one
    release copies and verdict pins name, as before bundles)."""
    listed = referrers(client, repo, digest)
    return ([r for r in listed if r.artifact_type == artifact_type]
            + [r for r in listed if is_bundle(r, lambda t: t == predicate_type)])


def own_first(listed: list[Referrer]) -> list[Referrer]:
    """`listed` with the bundles after every other artifact (see signed_referrers), otherwise in its order."""
    return sorted(listed, key=lambda r: r.artifact_type == BUNDLE_MEDIA_TYPE)


def fetch_envelopes(client: RegistryClient, repo: str, ref: Referrer, digest: str) -> list[Payload]:
    """An artifact's payloads (referrers.fetch), each bundle layer replaced by the DSSE envelope it carries;
    BundleError naming the fault for a bundle that does not read (RegistryError, NotFound as fetch's)."""
    payloads = fetch(client, repo, ref, digest)
    if ref.artifact_type != BUNDLE_MEDIA_TYPE:
        return payloads
    check = timestamp_check()
    return [Payload(DSSE_MEDIA_TYPE, envelope(p.data, check), p.title) if p.media_type == BUNDLE_MEDIA_TYPE else p
            for p in payloads]


def same_envelope(payloads: list[Payload], signed: bool = False) -> str | None:
    """One text per envelope, whichever artifact or bundle carried it, however its JSON was spaced and whichever
    base64 (standard or URL-safe, padded or not) it was written in (dsse.canonical): the same envelope verifies (or
    is refused) alike wherever it is. None unless there is one envelope that parses. `signed`: its payloadType and
    payload alone, what its signatures sign: two envelopes that both verified with that text are one attestation,
    whatever other signatures (an untrusted key's, junk) either carries; compared only among envelopes that verified,
    so a copy that does not verify never hides one that does."""
    envelopes = [p.data for p in payloads if p.media_type == DSSE_MEDIA_TYPE]
    if len(envelopes) != 1:
        return None
    try:
        # Strict: an envelope with a repeated key is no envelope here, never the same as one without it.
        parsed = strict_json.loads(envelopes[0])
    except ValueError:
        return None
    text = canonical(parsed) if isinstance(parsed, dict) else parsed
    if signed and isinstance(text, dict):
        text = {"payloadType": text.get("payloadType"), "payload": text.get("payload")}
    return json.dumps(text, sort_keys=True, separators=(",", ":"))


def read_once(client: RegistryClient, repo: str, ref: Referrer, digest: str,
              seen: set[str]) -> list[Payload] | str | None:
    """What a reader of signed referrers does with each: its payloads; or why they cannot be read (listed but
    missing, not what its descriptor says, a bundle that does not read); or None when it carries an envelope
    already in `seen` (push publishes each envelope in both layouts: that attestation again, not counted twice)."""
    try:
        payloads = fetch_envelopes(client, repo, ref, digest)
    except NotFound:
        return "missing: listed, but the artifact is not in the registry"
    except TooLarge as exc:
        return f"too large: {exc}"
    except RegistryError as exc:
        return f"mismatched: {exc}"
    except BundleError as exc:
        return str(exc)
    same = same_envelope(payloads)
    if same is not None:
        if same in seen:
            return None
        seen.add(same)
    return payloads


def beside(client: RegistryClient, repo: str, digest: str, artifacts: list[Referrer]) -> list[Referrer]:
    """The bundles of repo@digest that carry the envelope of one of `artifacts` (the toolkit's own, already
    verified by the caller): release copies them with the image, so the released digest has them too."""
    def text(ref: Referrer) -> str | None:
        try:
            return same_envelope(fetch_envelopes(client, repo, ref, digest))
        except (RegistryError, BundleError):
            return None    # a bundle that does not read is not copied; its reader refuses it where it is

    wanted = {found for artifact in artifacts if (found := text(artifact)) is not None}
    chosen = []
    for ref in referrers(client, repo, digest, BUNDLE_MEDIA_TYPE):
        found = text(ref)
        if found in wanted:
            wanted.discard(found)
            chosen.append(ref)
    return chosen


def ensure_bundle(client: RegistryClient, repo: str, digest: str, artifact: Referrer,
                  predicate_type: str) -> Referrer | None:
    """The bundle of `artifact`'s envelope (an attestation its writer verified and keeps), published unless
    one is there already: a push that keeps what an earlier push attached, before bundles were published,
    adds the bundle. Returns the bundle attached, None when there was one."""
    if beside(client, repo, digest, [artifact]):
        return None
    envelopes = [p.data for p in fetch_envelopes(client, repo, artifact, digest) if p.media_type == DSSE_MEDIA_TYPE]
    if len(envelopes) != 1:
        raise RegistryError(f"artifact {artifact.digest} holds {len(envelopes)} DSSE envelopes, not one")
    return attach_bundle(client, repo, digest, envelopes[0], predicate_type)
