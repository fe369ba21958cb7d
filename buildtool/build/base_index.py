"""Multi-platform bases: one OCI image index per base tag, one image per platform.

`platform_manifest` picks a platform's image from a tag that is an index or a single image (the build
pins that child by digest). `rootfs_image` turns a sealed root file system of a platform this engine
cannot import natively (Debian's docker 20.10 has no `docker import --platform`) into an image written
straight to the registry: a layer tarred here (names sorted, numeric owners, the tree's clamped mtimes,
gzip without a timestamp) and a config stating the platform, dated by the suite's Release. The same tree
gives the same bytes, so the same digest: the base stays reproducible without the engine in the loop.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from buildtool.contracts import platforms
from buildtool.registry.client import (
    INDEX_TYPES,
    OCI_INDEX,
    OCI_MANIFEST,
    RegistryClient,
    RegistryError,
    sha256_digest,
)

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
# Docker's own default (compress/gzip DefaultCompression); a fixed level keeps the blob's bytes fixed.
GZIP_LEVEL = 6


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


def _config_platform(config: dict[str, Any], where: str) -> platforms.Platform:
    try:
        return platforms.from_descriptor({"os": config.get("os"), "architecture": config.get("architecture")})
    except platforms.UnknownPlatform:
        raise RegistryError(f"{where}: image config says {config.get('os')}/{config.get('architecture')}, "
                            f"a platform none of {', '.join(platforms.KNOWN)}") from None


def _image(client: RegistryClient, repo: str, digest: str, manifest: dict[str, Any], media_type: str,
           size: int, where: str) -> tuple[Child, platforms.Platform]:
    if "config" not in manifest:
        raise RegistryError(f"{where} is not an image manifest (no config)")
    config = json.loads(client.get_blob(repo, manifest["config"]["digest"]))
    found = _config_platform(config, where)
    return Child(found.name, digest, media_type or manifest.get("mediaType", OCI_MANIFEST), size, config), found


def read_children(client: RegistryClient, repo: str, ref: str) -> dict[str, Child]:
    """The images a tag holds by platform: one for a single image, one per entry for an index.

    Every entry must name its os/architecture, and its config must say the same; two entries of one
    platform are refused. Entries of platforms outside the table (an upstream index's s390x, BuildKit's
    unknown/unknown attestations) are left out: they are not images this project builds or runs."""
    body, media_type, digest = client.get_manifest(repo, ref)
    manifest = json.loads(body)
    where = f"{repo}:{ref}"
    if media_type not in INDEX_TYPES and "manifests" not in manifest:
        child, _ = _image(client, repo, digest, manifest, media_type, len(body), where)
        return {child.platform: child}
    children: dict[str, Child] = {}
    for entry in manifest.get("manifests") or []:
        descriptor = entry.get("platform") or {}
        if not descriptor.get("os") or not descriptor.get("architecture"):
            raise RegistryError(f"{where}: index entry {entry.get('digest')} names no platform os/architecture")
        try:
            wanted = platforms.from_descriptor(descriptor)
        except platforms.UnknownPlatform:
            continue
        if wanted.name in children:
            raise RegistryError(f"{where}: index lists {wanted.name} twice ({children[wanted.name].digest}, "
                                f"{entry.get('digest')})")
        child_body, child_type, child_digest = client.get_manifest(repo, entry["digest"])
        if child_digest != entry["digest"]:
            raise RegistryError(f"{where}: registry served {child_digest} for index entry {entry['digest']}")
        child_where = f"{where} {wanted.name} entry {child_digest}"
        child_manifest = json.loads(child_body)
        if child_type in INDEX_TYPES or "manifests" in child_manifest:
            raise RegistryError(f"{child_where} is itself an index")
        child, found = _image(client, repo, child_digest, child_manifest, child_type, len(child_body), child_where)
        if found != wanted:
            raise RegistryError(f"{child_where}: index says {wanted.name}, its config says {found.name}")
        children[wanted.name] = child
    return children


def platform_manifest(client: RegistryClient, repo: str, ref: str, platform: str) -> tuple[str, dict[str, Any]]:
    """(manifest digest, image config) of `platform`'s image in repo:ref, an index or a single image.

    A single image of another platform, or an index without one of `platform`, is an error naming both."""
    wanted = platforms.get(platform).name
    body, media_type, digest = client.get_manifest(repo, ref)
    manifest = json.loads(body)
    if media_type not in INDEX_TYPES and "manifests" not in manifest:
        child, found = _image(client, repo, digest, manifest, media_type, len(body), f"{repo}:{ref}")
        if found.name != wanted:
            raise RegistryError(f"{repo}:{ref} is a single {found.name} image, not {wanted}; make the base for "
                                f"{wanted} (`make bases`)")
        return child.digest, child.config
    children = read_children(client, repo, ref)
    if wanted not in children:
        raise RegistryError(f"{repo}:{ref} is an index of {', '.join(sorted(children)) or 'no known platform'}, "
                            f"without {wanted}; make the base for {wanted} (`make bases`)")
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
    if len({c.platform for c in children}) != len(children):
        raise ValueError(f"one image per platform in an index, got {[c.platform for c in children]}")
    return client.put_manifest(repo, tag, index_body(children), OCI_INDEX)


class _Hashing(io.RawIOBase):
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, out: IO[bytes] | gzip.GzipFile) -> None:
        super().__init__()
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.size += view.nbytes
        self.out.write(view)
        return view.nbytes


@dataclass(frozen=True)
class Layer:
    path: Path      # the gzipped tar
    digest: str     # of the gzipped bytes (the blob)
    diff_id: str    # of the tar (the config's rootfs)
    size: int


def rootfs_layer(rootfs: Path, out: Path) -> Layer:
    """The tree as one gzipped layer: entries sorted by name, numeric owners only, integer mtimes, no
    gzip name or time. Hard links stay links; sockets are left out (as tar does)."""
    with out.open("wb") as raw:
        blob = _Hashing(raw)
        with gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=blob, mtime=0) as gz:
            tar_hash = _Hashing(gz)
            with tarfile.open(fileobj=tar_hash, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for path in _walk_sorted(rootfs):
                    info = tar.gettarinfo(str(path), arcname=str(path.relative_to(rootfs)))
                    if info is None:
                        continue
                    info.mtime = int(info.mtime)
                    info.uname = info.gname = ""
                    if info.isreg():
                        with path.open("rb") as data:
                            tar.addfile(info, data)
                    else:
                        tar.addfile(info)
    return Layer(out, "sha256:" + blob.sha.hexdigest(), "sha256:" + tar_hash.sha.hexdigest(), blob.size)


def _walk_sorted(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        base = Path(folder)
        found.extend(base / name for name in dirs)
        found.extend(base / name for name in files)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def image_config(platform: str, layer: Layer, *, epoch: int, cmd: list[str], labels: dict[str, str],
                 created_by: str) -> bytes:
    """The config `docker import` would write for the tree (Cmd and Labels as its changes say), stating
    `platform` and dated by `epoch` instead of the wall clock."""
    created = datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    chosen = platforms.get(platform)
    config = {"architecture": chosen.architecture, "os": chosen.os, "created": created,
              "config": {"Cmd": cmd, "Labels": labels},
              "rootfs": {"type": "layers", "diff_ids": [layer.diff_id]},
              "history": [{"created": created, "created_by": created_by}]}
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def rootfs_image(client: RegistryClient, repo: str, rootfs: Path, platform: str, *, epoch: int, cmd: list[str],
                 labels: dict[str, str], created_by: str) -> Child:
    """Push the tree as a one-layer image of `platform` by digest (no tag moves); returns it."""
    with tempfile.TemporaryDirectory(prefix="buildtool-layer-") as tmp:
        layer = rootfs_layer(rootfs, Path(tmp) / "layer.tar.gz")
        if client.put_blob(repo, layer.path.read_bytes()) != layer.digest:
            raise RegistryError(f"{repo}: the layer's digest changed on upload")
    config = image_config(platform, layer, epoch=epoch, cmd=cmd, labels=labels, created_by=created_by)
    config_digest = client.put_blob(repo, config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(config)},
                           "layers": [{"mediaType": OCI_LAYER_GZIP, "digest": layer.digest, "size": layer.size}]},
                          separators=(",", ":")).encode()
    digest = client.put_manifest(repo, sha256_digest(manifest), manifest, OCI_MANIFEST)
    return Child(platforms.get(platform).name, digest, OCI_MANIFEST, len(manifest), json.loads(config))

