"""The release manifests `release` writes (docs/releases/<version>.json) and the catalogue reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RELEASES_DIR = "docs/releases"
MANIFEST_SCHEMA = 1


def load_release_manifests(root: Path) -> list[dict[str, Any]]:
    """Every docs/releases/<version>.json, oldest release first (for the catalogue)."""
    from packaging.version import InvalidVersion, Version

    found = []
    for path in (root / RELEASES_DIR).glob("*.json"):
        try:
            manifest = json.loads(path.read_text())
            found.append((Version(str(manifest["version"])), manifest))
        except (OSError, ValueError, KeyError, InvalidVersion):
            continue   # not a release manifest; the catalogue shows only what it can read
    return [m for _, m in sorted(found, key=lambda pair: pair[0])]


def latest_by_cell(root: Path) -> dict[str, dict[str, Any]]:
    """cell key -> {release, tags, pinned, digest, sbom, platforms} of its newest release: what the catalogue
    can list (`platforms`: platform, digest and whether its verdict ran emulated, of each platform manifest)."""
    latest: dict[str, dict[str, Any]] = {}
    for manifest in load_release_manifests(root):
        for img in manifest["images"]:
            platforms = [{"platform": p.get("platform"), "digest": p.get("digest"),
                          "emulated": bool((p.get("verdict") or {}).get("emulated"))}
                         for p in img.get("platforms") or []]
            latest[img["cell"]] = {"release": manifest["version"], "tags": img["tags"], "pinned": img["pinned"],
                                   "digest": img["digest"], "sbom": (img.get("packages") or {}).get("sbom"),
                                   "platforms": platforms}
    return latest
