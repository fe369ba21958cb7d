"""Multi-platform bases: one OCI image index per base tag, one image per platform (the index itself is
read and written by buildtool.registry.image_index).

`rootfs_image` turns a sealed root file system (of any platform: Debian's docker 20.10 has no
`docker import --platform`, and `docker import` stamps the wall clock into the config) into an image written
straight to the registry: a layer tarred here (names sorted, numeric owners, the tree's clamped mtimes,
gzip without a timestamp) and a config stating the platform, dated by the suite's InRelease. The same tree
gives the same bytes, so the same digest: the base is reproducible without the engine in the loop.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import tarfile
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from buildtool.contracts import platforms
from buildtool.registry.client import OCI_MANIFEST, RegistryClient, RegistryError, sha256_digest

# Bases and their tests read and write indexes through here.
from buildtool.registry.image_index import Child as Child
from buildtool.registry.image_index import index_body as index_body
from buildtool.registry.image_index import platform_manifest as platform_manifest
from buildtool.registry.image_index import put_index as put_index
from buildtool.registry.image_index import read_children as read_children

OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
# Docker's own default (compress/gzip DefaultCompression); a fixed level keeps the blob's bytes fixed.
GZIP_LEVEL = 6


@dataclass(frozen=True)
class Layer:
    path: Path      # the gzipped tar
    digest: str     # of the gzipped bytes (the blob)
    diff_id: str    # of the tar (the config's rootfs)
    size: int


def rootfs_layer(rootfs: Path, out: Path) -> Layer:
    """The tree as one gzipped layer: entries sorted by name, numeric owners only, integer mtimes, no
    gzip name or time. Hard links stay links; sockets are left out (as tar does)."""
    with (out.open("wb") as raw,
          gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=raw, mtime=0) as gz,
          tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar):
        for path in sorted(rootfs.rglob("*"), key=lambda p: p.relative_to(rootfs).as_posix()):
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
    with out.open("rb") as blob, gzip.open(out) as layer:
        digest, diff_id = (hashlib.file_digest(f, "sha256").hexdigest() for f in (blob, layer))
    return Layer(out, f"sha256:{digest}", f"sha256:{diff_id}", out.stat().st_size)


def tag_child(client: RegistryClient, repo: str, tag: str, child: Child) -> str:
    """Point `tag` at one platform's image (a base of one platform): its manifest's very bytes, so one digest."""
    body, media_type, _ = client.get_manifest(repo, child.digest)
    return client.put_manifest(repo, tag, body, media_type)


def rootfs_image(client: RegistryClient, repo: str, rootfs: Path, platform: str, *, epoch: int, cmd: list[str],
                 labels: dict[str, str], created_by: str) -> Child:
    """Push the tree as a one-layer image of `platform` by digest (no tag moves); returns it. Its config is the one
    `docker import` would write (Cmd and Labels as its changes say), dated by `epoch` instead of the wall clock."""
    with tempfile.TemporaryDirectory(prefix="buildtool-layer-") as tmp:
        layer = rootfs_layer(rootfs, Path(tmp) / "layer.tar.gz")
        if client.put_blob(repo, layer.path.read_bytes()) != layer.digest:
            raise RegistryError(f"{repo}: the layer's digest changed on upload")
    created = datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    chosen = platforms.get(platform)
    config = json.dumps({"architecture": chosen.architecture, "os": chosen.os, "created": created,
                         "config": {"Cmd": cmd, "Labels": labels},
                         "rootfs": {"type": "layers", "diff_ids": [layer.diff_id]},
                         "history": [{"created": created, "created_by": created_by}]},
                        sort_keys=True, separators=(",", ":")).encode()
    config_digest = client.put_blob(repo, config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(config)},
                           "layers": [{"mediaType": OCI_LAYER_GZIP, "digest": layer.digest, "size": layer.size}]},
                          separators=(",", ":")).encode()
    digest = client.put_manifest(repo, sha256_digest(manifest), manifest, OCI_MANIFEST)
    return Child(chosen.name, digest, OCI_MANIFEST, len(manifest), json.loads(config))

