"""OCI image indexes: one image per platform under one tag (a base, or a multi-platform dev tag).

`read_children` reads what a tag holds by platform (checking each entry against its image's config),
`platform_manifest` picks one platform's image (a build pins that child by digest), `put_index` writes an
index over platform images, in the platform table's order so the same set gives the same bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from buildtool.contracts import platforms
from buildtool.registry.client import INDEX_TYPES, OCI_INDEX, OCI_MANIFEST, NotFound, RegistryClient, RegistryError

# The most an image config may be: one is KiB (a few hundred for many layers' history); anyone who may push writes it.
MAX_CONFIG_BYTES = 4 << 20


class PlatformMissing(NotFound):
    """The tag exists but holds no image of the platform asked for."""


@dataclass(frozen=True)
class Child:
    """One platform's image in a base tag: what an index entry names, and its config."""

    platform: str
    digest: str
    media_type: str
    size: int
    config: dict[str, Any]

    @property
    def labels(self) -> dict[str, str]:
        return dict((self.config.get("config") or {}).get("Labels") or {})


def _image(client: RegistryClient, repo: str, digest: str, manifest: dict[str, Any], media_type: str,
           size: int, where: str) -> Child:
    if "config" not in manifest:
        raise RegistryError(f"{where} is not an image manifest (no config)")
    blob = manifest["config"].get("digest") if isinstance(manifest["config"], dict) else None
    if not isinstance(blob, str):
        raise RegistryError(f"{where} is not an image manifest (no config digest)")
    try:
        config = json.loads(client.get_blob(repo, blob, limit=MAX_CONFIG_BYTES))
    except ValueError:      # not JSON, not UTF-8
        config = None
    inner = (config.get("config") or {}) if isinstance(config, dict) else None
    if not isinstance(inner, dict) or not isinstance(inner.get("Labels") or {}, dict):
        # Anyone who may push can write one; Child.labels and the platform check read it as an image config.
        raise RegistryError(f"{where}: its config {blob} is not an image config (a JSON object whose config.Labels, "
                            "where present, is an object)")
    try:
        found = platforms.from_descriptor({"os": config.get("os"), "architecture": config.get("architecture")}).name
    except platforms.UnknownPlatform:
        raise RegistryError(f"{where}: image config says {config.get('os')}/{config.get('architecture')}, "
                            f"a platform none of {', '.join(platforms.KNOWN)}") from None
    return Child(found, digest, media_type or manifest.get("mediaType", OCI_MANIFEST), size, config)


def read_children(client: RegistryClient, repo: str, ref: str, *, strict: bool = False) -> dict[str, Child]:
    """The images a tag holds by platform: one for a single image, one per entry for an index.

    Every entry must name its os/architecture, and its config must say the same; two entries of one
    platform are refused. Entries of platforms outside the table (an upstream index's s390x, BuildKit's
    unknown/unknown attestations) are left out of a base's index: they are not images this project builds
    or runs. `strict` (an index this project made: a dev tag) refuses them instead, but for BuildKit's
    attestation entries: an image there that nobody validates must never pass unseen."""
    return _read_tag(client, repo, ref, strict)[0]


def _read_tag(client: RegistryClient, repo: str, ref: str, strict: bool) -> tuple[dict[str, Child], bool]:
    """read_children's images, and whether the tag holds an index."""
    body, media_type, digest = client.get_manifest(repo, ref)
    manifest = json.loads(body)
    where = f"{repo}:{ref}"
    if _is_index(manifest, media_type):
        return _entries(client, repo, manifest, where, strict), True
    child = _image(client, repo, digest, manifest, media_type, len(body), where)
    return {child.platform: child}, False


def read_index(client: RegistryClient, repo: str, ref: str) -> dict[str, Child] | None:
    """The platform images of the index at repo:ref, strictly (an index this project made: an entry of an
    unknown platform is refused by name); None when the tag holds a single image."""
    body, media_type, _ = client.get_manifest(repo, ref)
    manifest = json.loads(body)
    if not _is_index(manifest, media_type):
        return None
    return _entries(client, repo, manifest, f"{repo}:{ref}", strict=True)


def _is_index(manifest: dict[str, Any], media_type: str) -> bool:
    return media_type in INDEX_TYPES or "manifests" in manifest


def _entries(client: RegistryClient, repo: str, manifest: dict[str, Any], where: str,
             strict: bool) -> dict[str, Child]:
    children: dict[str, Child] = {}
    entries = manifest.get("manifests") or []
    if not isinstance(entries, list):
        raise RegistryError(f"{where}: its manifests are not a list (not an OCI image index)")
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("digest"), str):
            raise RegistryError(f"{where}: index entry {str(entry)[:60]!r} is no descriptor with a digest")
        descriptor = entry.get("platform") or {}
        if not isinstance(descriptor, dict) or not descriptor.get("os") or not descriptor.get("architecture"):
            raise RegistryError(f"{where}: index entry {entry.get('digest')} names no platform os/architecture")
        try:
            wanted = platforms.from_descriptor(descriptor)
        except platforms.UnknownPlatform as exc:
            if strict and not platforms.is_attestation(entry):
                raise RegistryError(f"{where}: index entry {entry.get('digest')}: {exc}") from None
            continue
        if wanted.name in children:
            raise RegistryError(f"{where}: index lists {wanted.name} twice ({children[wanted.name].digest}, "
                                f"{entry.get('digest')})")
        child_body, child_type, child_digest = client.get_manifest(repo, entry["digest"])
        if child_digest != entry["digest"]:
            raise RegistryError(f"{where}: registry served {child_digest} for index entry {entry['digest']}")
        child_where = f"{where} {wanted.name} entry {child_digest}"
        child_manifest = json.loads(child_body)
        if _is_index(child_manifest, child_type):
            raise RegistryError(f"{child_where} is itself an index")
        child = _image(client, repo, child_digest, child_manifest, child_type, len(child_body), child_where)
        if child.platform != wanted.name:
            raise RegistryError(f"{child_where}: index says {wanted.name}, its config says {child.platform}")
        children[wanted.name] = child
    return children


def platform_manifest(client: RegistryClient, repo: str, ref: str, platform: str) -> tuple[str, dict[str, Any]]:
    """(manifest digest, image config) of `platform`'s image in repo:ref, an index or a single image.

    A single image of another platform, or an index without one of `platform`, is an error naming both."""
    wanted = platforms.get(platform).name
    children, is_index = _read_tag(client, repo, ref, strict=False)
    if wanted not in children:
        held = ", ".join(sorted(children)) or "no known platform"
        what = f"an index of {held}, without {wanted}" if is_index else f"a single {held} image, not {wanted}"
        raise PlatformMissing(f"{repo}:{ref} is {what}; make the base for {wanted} (`make bases`)")
    return children[wanted].digest, children[wanted].config


def index_body(children: list[Child]) -> bytes:
    """An OCI image index over the children, in the platform table's order (the same set, the same bytes)."""
    order = list(platforms.KNOWN)
    entries = [{"mediaType": c.media_type, "digest": c.digest, "size": c.size,
                "platform": platforms.get(c.platform).descriptor}
               for c in sorted(children, key=lambda c: order.index(c.platform))]
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries},
                      separators=(",", ":")).encode()


def put_index(client: RegistryClient, repo: str, tag: str, children: list[Child]) -> str:
    if not children:   # an empty index would be a tag of no platform at all
        raise ValueError(f"no platform image to put in the index {repo}:{tag}; an index lists at least one "
                         "(push its platform images first)")
    if len({c.platform for c in children}) != len(children):
        raise ValueError(f"one image per platform in an index, got {[c.platform for c in children]}")
    return client.put_manifest(repo, tag, index_body(children), OCI_INDEX)
