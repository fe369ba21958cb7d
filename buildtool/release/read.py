"""Reads of a release (no writes): each platform image's size, labels and layers, the base's labels,
the mirror's stand-ins, the release repository's tags now and its previous release.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from buildtool.common.refs import split_repo, split_repo_path
from buildtool.contracts import label_keys
from buildtool.matrix.plan import CellPlan, Settings, mirror_base
from buildtool.registry.client import (
    INDEX_TYPES,
    NotFound,
    RegistryClient,
    RegistryError,
    RegistryUnreachable,
    RetryPolicy,
    sha256_digest,
)
from buildtool.registry.image_index import MAX_CONFIG_BYTES
from buildtool.release.gates import Platform, StandIns, declared_platform, index_entries, known_platform
from buildtool.release.model import ImageRelease, TagState
from buildtool.release.tag_plan import apply_tag_plan, releases_in

if TYPE_CHECKING:
    from buildtool.matrix.schema import Cell

READ_THREADS = 8


def _or_empty(value: Any) -> Any:
    """A config's field as written, {} where it is absent or null (Docker writes `"Labels": null`)."""
    return {} if value is None else value


def _config(client: RegistryClient, repo: str, manifest: dict[str, Any]) -> tuple[dict[str, str], str]:
    config = manifest.get("config", {})
    if not config.get("digest"):
        return {}, ""
    if int(config.get("size") or 0) > MAX_CONFIG_BYTES:     # an integer: get_manifest checked the descriptor
        raise RegistryError(f"{client.host}/{repo}: the config {config['digest']} of an image is {config['size']} "
                            f"bytes, over the {MAX_CONFIG_BYTES}-byte limit: it is not read, so the image is neither "
                            "released nor verified; push the cell again")
    try:
        body = json.loads(client.get_blob(repo, config["digest"], limit=MAX_CONFIG_BYTES))
    except ValueError:    # not JSON, not UTF-8
        body = None
    inner = _or_empty(body.get("config")) if isinstance(body, dict) else None
    labels = _or_empty(inner.get("Labels")) if isinstance(inner, dict) else None
    if not isinstance(body, dict) or not isinstance(labels, dict) or not all(
            isinstance(v, str) for v in labels.values()):
        # Anyone who may push can write such a config: its labels (cell, base) cannot be read, so nothing is judged.
        raise RegistryError(f"{client.host}/{repo}: the config {config['digest']} of an image is not an image config "
                            "(a JSON object whose config.Labels, where present, maps names to strings): its labels "
                            "cannot be read, so the image is neither released nor verified; push the cell again")
    fields = {k: body[k] for k in ("os", "architecture", "variant") if body.get(k)}
    platform = "/".join(str(v) for v in fields.values())
    if any("/" in str(v) for v in fields.values()):    # runtimes compare the fields: linux + arm64/v8 is no linux/arm64
        platform = f"the broken platform {json.dumps(fields, sort_keys=True)[:160]} (a '/' in a field)"
    return dict(labels), platform


def read_platforms(client: RegistryClient, repo: str, raw: bytes, media_type: str) -> list[Platform]:
    """Size, labels and layers of each platform image (config blobs are small; layers are not read),
    and the labels of the base each names by digest, where that base is in the same registry."""
    manifest = json.loads(raw)
    if media_type in INDEX_TYPES:
        out = []
        for entry in index_entries(manifest):   # BuildKit's attestation manifests left out, nothing else
            if not entry.digest:
                continue   # an entry that names no digest: refused by gates.entry_problems, nothing to read
            child_raw, child_type, child_digest = read_child(client, repo, sha256_digest(raw), entry.digest,
                                                             known_platform(entry.platform) or entry.platform)
            if child_type in INDEX_TYPES:
                continue   # an index in an index: refused by gates.entry_problems, not read further
            for p in read_platforms(client, repo, child_raw, child_type):
                out.append(Platform(entry.platform, child_digest, p.size, p.labels, p.layers, p.base_labels,
                                    p.config_platform))
        return out
    config = manifest.get("config", {})
    layers = tuple(str(layer.get("digest")) for layer in manifest.get("layers", []))
    size = int(config.get("size", 0)) + sum(int(layer.get("size", 0)) for layer in manifest.get("layers", []))
    labels, declared = _config(client, repo, manifest)
    return [Platform("", sha256_digest(raw), size, labels, layers, _base_labels(client, labels), declared)]


def read_child(client: RegistryClient, repo: str, index: str, digest: str, platform: str) -> tuple[bytes, str, str]:
    """The platform manifest `digest` that the index `index` names for `platform`, read by its digest (release and
    verify read it here alike). One the registry lacks (deleted after the push) is named with its index and platform:
    the registry's bare "not found" says neither, nor what to do."""
    try:
        return client.get_manifest(repo, digest)
    except NotFound:
        raise RegistryError(f"the index {client.host}/{repo}@{index} names {digest} for {platform or 'no platform'}, "
                            "a manifest the registry does not have (deleted after the push?): that platform cannot be "
                            "read, so the image is neither released nor verified; push the cell again") from None


def _base_labels(client: RegistryClient, labels: dict[str, str]) -> dict[str, str] | None:
    """The labels of the base image the labels name (by digest, in the repository of the base the
    build pulled), when that repository is in this registry; None when it cannot be found here."""
    digest, ref = labels.get(label_keys.OCI_BASE_DIGEST, ""), labels.get(label_keys.BASE_REF, "")
    if not digest.startswith("sha256:") or not ref:
        return None
    try:
        host, repo, _ = split_repo(ref)
    except ValueError:
        return None
    if host != client.host:
        return None
    try:
        raw, media_type, _ = client.get_manifest(repo, digest)
        manifest = json.loads(raw)
        if media_type not in INDEX_TYPES:
            return _config(client, repo, manifest)[0]
    except NotFound:
        return None
    # Every platform of a base index is read, one missing child aside: a stand-in child behind a clean first one,
    # or behind a deleted one, is still found.
    found: list[dict[str, str]] = []
    for child in manifest.get("manifests", []):
        if declared_platform(child) != "unknown/unknown":
            try:
                found.append(_config(client, repo, json.loads(client.get_manifest(repo, child["digest"])[0]))[0])
            except NotFound:
                continue
    return next((labels for labels in found if label_keys.standin_keys(labels)), found[0] if found else {})


def read_standins(client: RegistryClient, settings: Settings, cells: Sequence[Cell]) -> tuple[StandIns, list[str]]:
    """The stand-in bases of the mirror (BASE_MIRROR, or the registry released into when unset):
    digests and layer lists of every upstream base the matrix gives a stand-in for. Returns them
    and the problems reading them (a mirror that cannot be read cannot vouch for provenance)."""
    found, problems = StandIns(), []
    mirror = settings.base_mirror or client.host
    for cell in cells:
        if cell.standin is None:
            continue
        ref = mirror_base(cell.base, mirror)
        if ref == cell.base:
            continue   # BASE_MIRROR maps other upstreams only: this base has no mirror to hold a stand-in
        try:
            host, repo, tag = split_repo(ref)
        except ValueError:
            continue
        if host != client.host and not settings.base_mirror:
            continue
        reader = client if host == client.host else RegistryClient(host, retry=RetryPolicy(attempts=2, timeout=10))
        try:
            raw, media_type, digest = reader.get_manifest(repo, tag)
        except NotFound:
            continue
        except (RegistryError, RegistryUnreachable) as exc:
            problems.append(f"cannot read the stand-in {ref} to check provenance ({exc})")
            continue
        manifest = json.loads(raw)
        found.add(ref, digest, [str(layer.get("digest")) for layer in manifest.get("layers", [])])
        if media_type in INDEX_TYPES:
            try:
                for child in manifest.get("manifests", []):
                    child_raw, _, child_digest = reader.get_manifest(repo, child["digest"])
                    layers = [str(layer.get("digest")) for layer in json.loads(child_raw).get("layers", [])]
                    found.add(ref, child_digest, layers)
            except (RegistryError, RegistryUnreachable) as exc:     # a child the index names is no child: NotFound too
                problems.append(f"cannot read the stand-in {ref} to check provenance ({exc})")
    return found, problems


def read_tag_state(client: RegistryClient, plan: CellPlan, version: str, with_previous: bool = True) -> TagState:
    _, repo = split_repo_path(plan.release_repo)
    tags = client.tags(repo)
    current = {t: (client.manifest_digest(repo, t) if t in tags else None)
               for t in (*plan.release_tags, *plan.moving_tags)}
    return TagState(current, tags, previous_release(client, repo, plan.cell, version, tags) if with_previous else None)


def plan_item(client: RegistryClient, item: ImageRelease, plan: CellPlan, version: str, force: bool,
              with_previous: bool = True, state: TagState | None = None) -> None:
    state = state or read_tag_state(client, plan, version, with_previous)
    apply_tag_plan(item, plan, version, force, state, with_previous)


def previous_release(client: RegistryClient, repo: str, cell: Cell, version: str,
                     tags: list[str]) -> dict[str, Any] | None:
    """The newest earlier release of this cell in the release repository: tag, digest, size, labels, and
    `platforms`: platform -> digest of each platform manifest (a single manifest's platform is the one its
    config declares, "" when it declares none), so each platform is compared with its own image."""
    older = {v: t for v, t in releases_in(tags, cell).items() if v < Version(version)}
    if not older:
        return None
    number = max(older)
    raw, media_type, digest = client.get_manifest(repo, older[number])
    platforms = read_platforms(client, repo, raw, media_type)
    return {"release": str(number), "tag": older[number], "digest": digest,
            "size": sum(p.size for p in platforms), "labels": platforms[0].labels if platforms else {},
            "platforms": {p.platform or p.config_platform: p.digest for p in platforms}}
