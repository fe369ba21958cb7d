"""A multi-platform cell's dev tag: one image per platform, built from the cell's one Dockerfile with
BuildKit's --platform, each pushed under its platform tag (`<dev tag>__<arch>`, which is not a dev tag), then
an OCI image index over them put at the dev tag (buildtool.registry.image_index). The index goes up only after
every platform's image is in the registry: a platform that fails fails the cell and leaves no half index.
"""

from __future__ import annotations

from buildtool.common.errors import FailedError
from buildtool.contracts import label_keys, names, platforms
from buildtool.imagebuild.cache_sources import Candidate
from buildtool.registry.client import NotFound, RegistryClient
from buildtool.registry.image_index import Child, read_children, read_index


def platform_tag(dev_tag: str, platform: str) -> str:
    """`0123abcd4567-0.10__arm64`: where one platform's image of a dev tag lives (parse_dev_tag never matches it)."""
    return names.platform_tag(dev_tag, platforms.get(platform).architecture)


def child_of(client: RegistryClient, repo: str, tag: str, platform: str) -> Child:
    """The image at repo:tag as the index entry of `platform`: a single image whose config says that platform."""
    if read_index(client, repo, tag) is not None:
        raise FailedError(f"{repo}:{tag} is an index, not a single image: it cannot be the {platform} entry")
    found = next(iter(read_children(client, repo, tag, strict=True).values()))
    if found.platform != platform:
        raise FailedError(f"{repo}:{tag} is a {found.platform} image, not {platform}")
    return found


def index_children(client: RegistryClient, repo: str, ref: str) -> dict[str, Child] | None:
    """The platform images of the index at repo:ref; None when there is no such tag or it is a single image.
    An entry of an unknown platform is refused by name (strict: this project made the index)."""
    try:
        return read_index(client, repo, ref)
    except NotFound:
        return None


def content_key_of(client: RegistryClient, repo: str, ref: str) -> str | None:
    """The content key label of the single image at repo:ref (None: not there, an index, or no label)."""
    try:
        if read_index(client, repo, ref) is not None:
            return None
        children = read_children(client, repo, ref, strict=True)
    except NotFound:
        return None
    return next(iter(children.values())).labels.get(label_keys.CONTENT_KEY)


def read_indexes(client: RegistryClient, repo: str, tags: list[str]) -> dict[str, dict[str, Child]]:
    """tag -> its index's platform images, for those of `tags` that hold an index (in the order given)."""
    return {tag: children for tag in tags if (children := index_children(client, repo, tag)) is not None}


def platform_candidates(indexes: dict[str, dict[str, Child]], platform: str, exclude: str) -> list[Candidate]:
    """Earlier indexes' images of `platform` (not the one at `exclude`, the tag being built): what a build of
    that platform may take unchanged layers from (buildtool.imagebuild.cache_sources checks each one's provenance
    on its own digest, as for a single-platform cell)."""
    return [Candidate(tag, children[platform].digest, children[platform].labels)
            for tag, children in indexes.items() if tag != exclude and platform in children]


def matching_index(client: RegistryClient, repo: str, indexes: dict[str, dict[str, Child]],
                   keys: dict[str, str]) -> tuple[str, str] | None:
    """(tag, index digest) of the first of `indexes` (read_indexes) whose platforms are exactly `keys`' and
    whose every platform image carries that platform's content key."""
    for tag, children in indexes.items():
        if set(children) == set(keys) and all(children[p].labels.get(label_keys.CONTENT_KEY) == keys[p] for p in keys):
            digest = client.manifest_digest(repo, tag)
            if digest:
                return tag, digest
    return None
