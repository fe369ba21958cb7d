"""A multi-platform cell's dev tag: one image per platform, built from the cell's one Dockerfile with
BuildKit's --platform, each pushed under its platform tag (`<dev tag>__<arch>`, which is not a dev tag), then
an OCI image index over them put at the dev tag. The index goes up only after every platform's image is in
the registry: a platform that fails fails the cell and leaves no half index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from buildtool.common.errors import FailedError
from buildtool.contracts import label_keys, names, platforms
from buildtool.registry.client import NotFound, RegistryClient, RegistryError, sha256_digest

INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"


def platform_tag(dev_tag: str, platform: str) -> str:
    """`0123abcd4567-0.10__arm64`: where one platform's image of a dev tag lives (parse_dev_tag never matches it)."""
    return names.platform_tag(dev_tag, platforms.get(platform).architecture)


@dataclass(frozen=True)
class Child:
    platform: str
    digest: str
    media_type: str
    size: int


def child_of(client: RegistryClient, repo: str, ref: str, platform: str) -> Child:
    """The manifest at repo:ref as an index entry, checked to be a single image of `platform`."""
    body, media_type, digest = client.get_manifest(repo, ref)
    manifest = json.loads(body)
    if "config" not in manifest:
        raise FailedError(f"{repo}:{ref} is not a single image (no config): cannot be the {platform} entry")
    config = json.loads(client.get_blob(repo, manifest["config"]["digest"]))
    found = f"{config.get('os')}/{config.get('architecture')}"
    if found != platform:
        raise FailedError(f"{repo}:{ref} is a {found} image, not {platform}")
    return Child(platform, digest, media_type, len(body))


def index_body(children: list[Child]) -> bytes:
    """The OCI image index over `children`, in the cell's platform order."""
    return json.dumps({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [{"mediaType": c.media_type, "digest": c.digest, "size": c.size,
                       "platform": platforms.get(c.platform).descriptor} for c in children],
    }, indent=2).encode()


def put_index(client: RegistryClient, repo: str, tag: str, children: list[Child]) -> str:
    body = index_body(children)
    digest = client.put_manifest(repo, tag, body, INDEX_MEDIA_TYPE)
    if digest != sha256_digest(body):
        raise FailedError(f"registry stored the index {repo}:{tag} as {digest}, not {sha256_digest(body)}")
    return digest


def index_children(client: RegistryClient, repo: str, ref: str) -> dict[str, str] | None:
    """platform -> manifest digest of the index at repo:ref; None when there is no such tag or it is not an
    index. An entry of an unknown platform makes the whole index unusable (refused by name)."""
    try:
        manifest = json.loads(client.get_manifest(repo, ref)[0])
    except NotFound:
        return None
    if "manifests" not in manifest:
        return None
    found: dict[str, str] = {}
    for entry in manifest["manifests"]:
        if platforms.is_attestation(entry):
            continue
        try:
            found[platforms.from_descriptor(entry.get("platform")).name] = entry["digest"]
        except platforms.UnknownPlatform as exc:
            raise RegistryError(f"{repo}:{ref}: entry {entry.get('digest')}: {exc}") from None
    return found


def content_key_of(client: RegistryClient, repo: str, digest: str) -> str | None:
    """The content key label of a single image in the registry (None: not there or no label)."""
    try:
        manifest = json.loads(client.get_manifest(repo, digest)[0])
    except NotFound:
        return None
    if "config" not in manifest:
        return None
    config = json.loads(client.get_blob(repo, manifest["config"]["digest"]))
    return ((config.get("config") or {}).get("Labels") or {}).get(label_keys.CONTENT_KEY)


def matching_index(client: RegistryClient, repo: str, tags: list[str], keys: dict[str, str]) -> tuple[str, str] | None:
    """(tag, index digest) of the first of `tags` holding an index whose platforms are exactly `keys`' and
    whose every platform image carries that platform's content key."""
    for tag in tags:
        children = index_children(client, repo, tag)
        if children is None or set(children) != set(keys):
            continue
        if all(content_key_of(client, repo, children[p]) == keys[p] for p in keys):
            digest = client.manifest_digest(repo, tag)
            if digest:
                return tag, digest
    return None
