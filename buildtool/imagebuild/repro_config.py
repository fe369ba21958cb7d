"""Image configs that do not depend on when or with what cache an image was built (issue 40; docs/contents.md,
Reproducibility). Docker 20.10's BuildKit (v0.8) stamps the config's `created` and every `history[].created` with
the build's wall-clock time, and the inline cache (engine.INLINE_CACHE_ARG) writes `moby.buildkit.cache.v0` into
the config: two builds of one commit give equal layers but different image digests. So the push path rewrites the
pushed config in the registry: the times set to the commit's (SOURCE_DATE_EPOCH), the cache metadata dropped, the
manifest's layers kept. The image as built stays under the cache tag (cache_sources reads it through the
provenance's byproduct). A config already in that form is left as is.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from buildtool.common.errors import FailedError
from buildtool.contracts import label_keys
from buildtool.registry.client import RegistryClient
from buildtool.registry.image_index import MAX_CONFIG_BYTES

# What BuildKit writes into a config about its cache and its own run, never about the image.
BUILD_METADATA = ("moby.buildkit.cache.v0", "moby.buildkit.buildinfo.v1")
CACHE_SUFFIX = "__cache"     # beside the staging tag's `__push`: never a dev tag (no revision contains `__`)
GIT_TIMEOUT_S = 30


def commit_time(root: Path, revision: str) -> int:
    """SOURCE_DATE_EPOCH: the committer time of `revision` (`<commit>-dirty.<hash>`: of the commit); a
    UserError-free FailedError naming the revision when git does not know it."""
    commit = revision.partition("-dirty.")[0]
    try:
        found = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%ct", commit], capture_output=True,
                               text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FailedError(f"cannot read the commit time of {commit} ({exc})") from None
    text = found.stdout.strip()
    if found.returncode != 0 or not text.isdigit():
        raise FailedError(f"git knows no commit {commit} in {root} (SOURCE_DATE_EPOCH is its commit time): "
                          f"{found.stderr.strip()[:200]}")
    return int(text)


def normalise(config: dict[str, Any], epoch: int) -> tuple[dict[str, Any], list[str]]:
    """(config with `created`, every history entry's `created` and the created label at `epoch` and no build
    metadata, the fields that changed: [] when it already was so)."""
    when = datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    new = {k: v for k, v in config.items() if k not in BUILD_METADATA}
    changed = sorted(k for k in config if k in BUILD_METADATA)
    if "created" in new and new["created"] != when:
        new["created"] = when
        changed.append("created")
    labels = (new.get("config") or {}).get("Labels") or {}
    if labels.get(label_keys.OCI_CREATED, when) != when:     # `buildtool build` wrote the build's time there
        new["config"] = {**new["config"], "Labels": {**labels, label_keys.OCI_CREATED: when}}
        changed.append(f"config.Labels[{label_keys.OCI_CREATED}]")
    history = new.get("history")
    if isinstance(history, list):
        entries = [{**h, "created": when} if isinstance(h, dict) and "created" in h else h for h in history]
        if entries != history:
            changed.append("history[].created")
        new["history"] = entries
    return new, changed


def canonical(document: dict[str, Any]) -> bytes:
    """The one byte form of a config or manifest this module writes (so equal content, equal digest)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Published:
    digest: str        # the image's manifest at the tag now: the normalised one
    cache: str         # the manifest as built (inline cache and all) under the cache tag; "" when nothing changed
    changed: tuple[str, ...]


def cache_tag(tag: str) -> str:
    return f"{tag.removesuffix('__push')}{CACHE_SUFFIX}"


def publish_normalised(client: RegistryClient, repo: str, tag: str, epoch: int) -> Published:
    """Rewrite the image at repo:tag (a single-platform manifest just pushed) to its normalised config,
    keeping the manifest as built under cache_tag(tag). Returns the digests; FailedError naming the
    manifest when it is not a single image."""
    body, media_type, built = client.get_manifest(repo, tag)
    manifest = json.loads(body)
    if not isinstance(manifest.get("config"), dict) or not isinstance(manifest.get("layers"), list):
        raise FailedError(f"{repo}:{tag} ({built}) is not a single image's manifest ({media_type})")
    config = json.loads(client.get_blob(repo, manifest["config"]["digest"], limit=MAX_CONFIG_BYTES))
    new, changed = normalise(config, epoch)
    if not changed:
        return Published(built, "", ())
    data = canonical(new)
    config_digest = client.put_blob(repo, data)
    expected = "sha256:" + hashlib.sha256(data).hexdigest()
    if config_digest != expected:
        raise FailedError(f"{repo}: the registry stored the normalised config as {config_digest}, not {expected}")
    rewritten = {**manifest, "config": {**manifest["config"], "digest": config_digest, "size": len(data)}}
    client.put_manifest(repo, cache_tag(tag), body, media_type)
    digest = client.put_manifest(repo, tag, canonical(rewritten), media_type)
    if client.manifest_digest(repo, tag) != digest:
        raise FailedError(f"{repo}:{tag} does not name the normalised manifest {digest} after putting it")
    return Published(digest, built, tuple(changed))
