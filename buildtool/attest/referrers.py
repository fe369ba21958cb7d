"""Artifacts attached to an image digest (verdicts, attestations, SBOMs): OCI 1.1 referrers.

An artifact is an OCI image manifest with an `artifactType`, its payload as layers, and a
`subject` naming the image. It is pushed by digest (no tag of its own, so nothing can be
overwritten in place), and made findable through the referrers API where the registry has one
(`GET /v2/<repo>/referrers/<digest>`), else through the OCI 1.1 fallback: an image index under
the tag `sha256-<hex>` listing every referrer. Attaching adds to that list; it never removes or
replaces an entry. Any OCI 1.1 client (oras, regctl, cosign) finds the same artifacts.

Which answers mean "no referrers API here" (as regclient takes them), what is remembered of that, and when
the fallback index is written (`OCI-Subject`, as the distribution spec asks): docs/registries.md, "Referrers".
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from buildtool.contracts.label_keys import ARTIFACT_CREATED, ARTIFACT_TITLE
from buildtool.contracts.names import referrers_tag
from buildtool.registry.call_errors import TooLarge
from buildtool.registry.client import (
    EMPTY_JSON,
    EMPTY_JSON_TYPE,
    OCI_INDEX,
    OCI_MANIFEST,
    NotFound,
    RegistryClient,
    RegistryError,
    sha256_digest,
)

_INDEX_UPDATE_ATTEMPTS = 5
# The most a referrer's layer (an SBOM, a signed statement, a Sigstore bundle) may be: a CycloneDX SBOM of a CUDA
# image (thousands of components) is a few MiB, a signed statement KiB; anything bigger is refused unread.
MAX_REFERRER_LAYER_BYTES = 64 << 20
# The most referrers one subject may have (its referrers API pages are bounded by client.LIST_PAGES): this toolkit
# attaches a provenance, an SBOM and a verdict a night, each in two layouts, so a digest validated every night for ten
# years has some 7,300. More is refused, never read in part: a list cut short could hide a signature or pick another.
MAX_REFERRERS = 10_000
_DIGEST = re.compile(r"[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+")    # OCI's digest grammar
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Payload:
    """One file of an artifact: stored as a layer blob."""

    media_type: str
    data: bytes
    title: str = ""


@dataclass(frozen=True)
class Referrer:
    """A descriptor of an artifact attached to a subject, as the referrers list gives it."""

    digest: str
    artifact_type: str
    size: int
    annotations: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_descriptor(cls, d: dict[str, Any]) -> Referrer:
        """A descriptor of a referrers list (the registry's answer, or the fallback index anyone who may push
        writes); RegistryError naming it when its digest, size or annotations are not what OCI says."""
        digest, size, notes = d.get("digest"), d.get("size") or 0, d.get("annotations") or {}
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest) or not isinstance(size, int | str) \
                or isinstance(size, bool) or not re.fullmatch("[0-9]+", str(size)) \
                or not isinstance(notes, dict) or not all(isinstance(v, str) for v in notes.values()):
            raise RegistryError(f"the referrers list holds a malformed descriptor (its digest must be algorithm:hex, "
                                f"its size a number, its annotations strings): {json.dumps(d, default=str)[:160]}")
        return cls(digest=digest, artifact_type=str(d.get("artifactType") or ""),
                   size=int(size), annotations=dict(notes))

    def descriptor(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": OCI_MANIFEST, "digest": self.digest, "size": self.size,
                               "artifactType": self.artifact_type}
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out


def attach(client: RegistryClient, repo: str, subject_digest: str, artifact_type: str, payloads: list[Payload],
           annotations: dict[str, str] | None = None) -> Referrer:
    """Push an artifact whose subject is `subject_digest` (which must exist in `repo`) and list it
    as a referrer of it. Returns its descriptor."""
    subject_body, subject_type, subject = client.get_manifest(repo, subject_digest)
    if subject != subject_digest:
        raise RegistryError(f"{repo}@{subject_digest} came back as {subject}")
    layers = []
    for payload in payloads:
        digest = client.put_blob(repo, payload.data)
        layer: dict[str, Any] = {"mediaType": payload.media_type, "digest": digest, "size": len(payload.data)}
        if payload.title:
            layer["annotations"] = {ARTIFACT_TITLE: payload.title}
        layers.append(layer)
    empty = client.put_blob(repo, EMPTY_JSON)
    notes = {ARTIFACT_CREATED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **(annotations or {})}
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": {"mediaType": EMPTY_JSON_TYPE, "digest": empty, "size": len(EMPTY_JSON)},
        "layers": layers,
        "subject": {"mediaType": subject_type, "digest": subject_digest, "size": len(subject_body)},
        "annotations": notes,
    }
    raw = json.dumps(manifest, sort_keys=True).encode()
    digest = client.put_manifest(repo, sha256_digest(raw), raw, OCI_MANIFEST)
    referrer = Referrer(digest=digest, artifact_type=artifact_type, size=len(raw), annotations=notes)
    add_referrers(client, repo, subject_digest, [referrer])
    return referrer


def referrers(client: RegistryClient, repo: str, subject_digest: str,
              artifact_type: str | None = None) -> list[Referrer]:
    """Every artifact attached to `subject_digest` in `repo` (of one type when given), oldest first
    by their creation annotation."""
    chosen = [r for r in listed_referrers(client, repo, subject_digest)
              if artifact_type is None or r.artifact_type == artifact_type]
    return sorted(chosen, key=lambda r: r.annotations.get(ARTIFACT_CREATED, ""))


def listed_referrers(client: RegistryClient, repo: str, subject_digest: str) -> list[Referrer]:
    """Every artifact attached to `subject_digest`, in the order the registry lists them: the referrers
    API's order, or the fallback index's (attaching appends, so that is upload order). A verdict's place in
    this list is one of the orders release reads (buildtool.validate.verdicts)."""
    found = _api_referrers(client, repo, subject_digest)
    if found is not None:
        return found
    listed = _fallback_index(client, repo, subject_digest)["manifests"]
    return [Referrer.from_descriptor(d) for d in _at_most(listed, repo, subject_digest)]


def _at_most(listed: list[Any], repo: str, subject_digest: str) -> list[Any]:
    """`listed`, unless it holds more than MAX_REFERRERS: then a RegistryError naming the subject and the limit."""
    if len(listed) > MAX_REFERRERS:
        raise RegistryError(f"{repo}@{subject_digest} has more than {MAX_REFERRERS} referrers; refused, not read "
                            "further (a list read in part could hide a signature or choose another)")
    return listed


def fetch(client: RegistryClient, repo: str, referrer: Referrer, subject_digest: str) -> list[Payload]:
    """The payloads of an artifact, checked to be attached to `subject_digest` (a descriptor in a
    mutable list proves nothing; the artifact's own manifest, addressed by digest, does)."""
    raw, _, digest = client.get_manifest(repo, referrer.digest)
    if digest != referrer.digest:
        raise RegistryError(f"artifact {referrer.digest} came back as {digest}")
    manifest = _artifact_manifest(raw, referrer.digest)
    if (manifest.get("subject") or {}).get("digest") != subject_digest:
        raise RegistryError(f"artifact {referrer.digest} is not attached to {subject_digest}")
    if manifest.get("artifactType") != referrer.artifact_type:
        raise RegistryError(f"artifact {referrer.digest} is a {manifest.get('artifactType')}, "
                            f"not a {referrer.artifact_type}")
    layers = manifest.get("layers", [])
    for layer in layers:     # get_manifest checked each size is an integer
        if layer["size"] > MAX_REFERRER_LAYER_BYTES:
            raise TooLarge(f"artifact {referrer.digest}: its layer {layer['digest']} is {layer['size']} bytes, "
                           f"over the {MAX_REFERRER_LAYER_BYTES}-byte limit")
    # The layers together too (the toolkit's artifacts have one): thousands, each under the limit, are never read.
    if (total := sum(layer["size"] for layer in layers)) > MAX_REFERRER_LAYER_BYTES:
        raise TooLarge(f"artifact {referrer.digest}: its {len(layers)} layers are {total} bytes together, over the "
                       f"{MAX_REFERRER_LAYER_BYTES}-byte limit")
    payloads, left = [], MAX_REFERRER_LAYER_BYTES
    for layer in layers:     # each read bounded by what is left: a registry may send more than a size says
        data = client.get_blob(repo, layer["digest"], limit=left)    # checks the digest
        left -= len(data)
        payloads.append(Payload(data=data, title=(layer.get("annotations") or {}).get(ARTIFACT_TITLE, ""),
                                media_type=str(layer.get("mediaType"))))
    return payloads


def _artifact_manifest(raw: bytes, digest: str) -> dict[str, Any]:
    """An artifact's manifest as read, checked to have the shape OCI gives it (anyone who may push can write any
    bytes under a digest): a JSON object whose subject is an object, whose config and layers are descriptors naming
    their digest (each layer's annotations an object); RegistryError naming the artifact and the fault otherwise."""
    try:
        manifest = json.loads(raw)
    except ValueError:
        raise RegistryError(f"artifact {digest} is not a JSON manifest") from None
    if not isinstance(manifest, dict):
        raise RegistryError(f"artifact {digest} is a JSON {type(manifest).__name__}, not a manifest object")
    config, layers = manifest.get("config"), manifest.get("layers", [])
    if not isinstance(manifest.get("subject") or {}, dict):
        raise RegistryError(f"artifact {digest}: its subject is not a descriptor object")
    if not isinstance(config, dict) or not isinstance(config.get("digest"), str):
        raise RegistryError(f"artifact {digest}: its config is not a descriptor naming its digest")
    if not isinstance(layers, list) or not all(isinstance(layer, dict) and isinstance(layer.get("digest"), str)
                                               and isinstance(layer.get("annotations") or {}, dict)
                                               for layer in layers):
        raise RegistryError(f"artifact {digest}: its layers are not a list of descriptors, each naming its digest")
    return manifest


def copy(client: RegistryClient, src_repo: str, dst_repo: str, referrer: Referrer, subject_digest: str) -> None:
    """Make an artifact of `subject_digest` in src_repo a referrer of the same digest in dst_repo
    (blobs mounted, manifest bytes unchanged, so its digest and any signature in it still hold)."""
    copy_artifact(client, src_repo, dst_repo, referrer)
    add_referrers(client, dst_repo, subject_digest, [referrer])


def copy_artifact(client: RegistryClient, src_repo: str, dst_repo: str, referrer: Referrer) -> None:
    """The artifact's manifest and blobs in dst_repo, by digest and untagged, not yet listed as a
    referrer (`add_referrers` does that). Content-addressed: safe to do without any lock."""
    raw, media_type, _ = client.get_manifest(src_repo, referrer.digest)
    manifest = _artifact_manifest(raw, referrer.digest)
    blobs = [manifest["config"]["digest"], *(layer["digest"] for layer in manifest.get("layers", []))]
    client.mount_blobs(dst_repo, blobs, src_repo)
    client.put_manifest(dst_repo, referrer.digest, raw, media_type)


def add_referrers(client: RegistryClient, repo: str, subject_digest: str, found: list[Referrer],
                  exclusive: bool = False) -> None:
    """List artifacts already in `repo` as referrers of `subject_digest`: those whose PUT the registry did not
    answer with `OCI-Subject` (it did not index them) go into the fallback index, one write for all of them.
    `exclusive`: the caller holds a lock every writer of `repo` takes (release's repository lock), so the
    referrers index is written once, without waiting for a concurrent writer to land."""
    unindexed = [r for r in found if f"{repo}@{r.digest}" not in client.subject_indexed]
    if unindexed:
        _add_to_fallback_index(client, repo, subject_digest, unindexed, settle=not exclusive)


# -- the two ways of listing -----------------------------------------------------------------

def _api_referrers(client: RegistryClient, repo: str, subject_digest: str) -> list[Referrer] | None:
    """The referrers API's answer (every page), or None where the registry has none: any first answer but an
    OCI image index (docs/registries.md). Remembered per repository for this client, except a 404
    naming the repository or the subject as unknown."""
    if repo in client.no_referrers_api:
        return None
    path = f"{repo}/referrers/{subject_digest}"
    response = client.answer("GET", path, repo=repo, headers={"Accept": OCI_INDEX})
    manifests = _index_manifests(response) if response.status_code == 200 else None
    if manifests is None:
        if not (response.status_code == 404 and _names_unknown(response)):
            client.no_referrers_api.add(repo)
        log.info("registry %s: %s answered HTTP %s %s, not an image index: reading the %s tag instead", client.host,
                 path, response.status_code, response.headers.get("Content-Type", ""), referrers_tag(subject_digest))
        return None
    found = [Referrer.from_descriptor(d) for d in _at_most(manifests, repo, subject_digest)]
    for page in itertools.islice(client.pages(path, repo, response, headers={"Accept": OCI_INDEX}), 1, None):
        more = _index_manifests(page)
        if more is None:
            raise RegistryError(f"{client.host}: a later page of {path} is not an OCI image index")
        found += [Referrer.from_descriptor(d) for d in _at_most(more, repo, subject_digest)]
        _at_most(found, repo, subject_digest)
    return found


def _index_manifests(response: Any) -> list[dict[str, Any]] | None:
    """The descriptors of an OCI image index answer, None when the answer is not one."""
    if response.headers.get("Content-Type", "").split(";")[0].strip() != OCI_INDEX:
        return None
    try:
        manifests = response.json().get("manifests")
    except (ValueError, AttributeError):
        return None
    if not isinstance(manifests, list) or not all(isinstance(d, dict) for d in manifests):
        return None
    return manifests


def _names_unknown(response: Any) -> bool:
    """A 404 whose registry errors say the repository or the manifest is unknown (the subject is not there)."""
    try:
        errors = response.json().get("errors")
    except (ValueError, AttributeError):
        return False
    unknown = ("NAME_UNKNOWN", "MANIFEST_UNKNOWN")
    return isinstance(errors, list) and any(isinstance(e, dict) and e.get("code") in unknown for e in errors)


def _fallback_index(client: RegistryClient, repo: str, subject_digest: str) -> dict[str, Any]:
    try:
        raw, _, _ = client.get_manifest(repo, referrers_tag(subject_digest))
    except NotFound:
        return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    try:
        index = json.loads(raw)
    except ValueError:
        index = None
    # Anyone who may push can write this tag: what is no index of descriptors is refused by name, never a traceback.
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(index, dict) or index.get("mediaType") != OCI_INDEX or not isinstance(manifests, list) \
            or not all(isinstance(d, dict) for d in manifests):
        raise RegistryError(f"{repo}:{referrers_tag(subject_digest)} is not an OCI referrers index")
    return index


def _add_to_fallback_index(client: RegistryClient, repo: str, subject_digest: str, found: list[Referrer],
                           settle: bool = True) -> None:
    """Append to the `sha256-<hex>` index. Registries have no compare-and-swap on tags, so the
    write is read back: when a concurrent writer's index replaced ours, add ours again. Without
    `settle` (no concurrent writer possible) the first write stands."""
    tag = referrers_tag(subject_digest)

    def missing(index: dict[str, Any]) -> list[Referrer]:
        listed = {d.get("digest") for d in index["manifests"]}
        return [r for r in found if r.digest not in listed]

    for _ in range(_INDEX_UPDATE_ATTEMPTS):
        index = _fallback_index(client, repo, subject_digest)
        todo = missing(index)
        if not todo:
            return
        index["manifests"] += [r.descriptor() for r in todo]
        raw = json.dumps(index, sort_keys=True).encode()
        started = time.monotonic()
        client.put_manifest(repo, tag, raw, OCI_INDEX)
        if not settle:
            return
        # A writer that read the index when we did writes within about one round trip of us: waiting
        # several round trips (as the release lock does) lets its write land before we read back.
        time.sleep(max(0.01, 5 * (time.monotonic() - started)))
    left = missing(_fallback_index(client, repo, subject_digest))
    if left:
        raise RegistryError(f"could not list {', '.join(r.digest for r in left)} in {repo}:{tag}: concurrent "
                            "writers kept replacing it")
