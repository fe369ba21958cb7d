"""The release manifests `release` writes (docs/releases/<version>.json) and the catalogue reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RELEASES_DIR = "docs/releases"
MANIFEST_SCHEMA = 1


def load_release_manifests(root: Path) -> list[dict[str, Any]]:
    """Every docs/releases/<version>.json, oldest release first (for the catalogue)."""
    from packaging.version import Version  # its InvalidVersion is a ValueError

    found = []
    for path in (root / RELEASES_DIR).glob("*.json"):
        try:
            manifest = json.loads(path.read_text())
            found.append((Version(str(manifest["version"])), manifest))
        except (OSError, ValueError, KeyError):
            continue   # not a release manifest; the catalogue shows only what it can read
    return [m for _, m in sorted(found, key=lambda pair: pair[0])]


def latest_by_cell(root: Path) -> dict[str, dict[str, Any]]:
    """cell key -> {release, tags, pinned, digest, sbom, platforms} of its newest release: what the catalogue
    can list (`platforms`: platform, digest and whether its verdict ran emulated, of each platform manifest).
    `sbom` is the image's for a single manifest; an index's are per platform (each platform manifest has its
    own): `sbom` in each of its `platforms`, the top-level one None."""
    latest: dict[str, dict[str, Any]] = {}
    for manifest in load_release_manifests(root):
        for img in manifest["images"]:
            packages = img.get("packages") or {}
            # `packages` is one section for a single manifest, {"platforms": [section, ...]} for an index.
            per_platform = {s.get("platform"): s.get("sbom") for s in packages.get("platforms") or []}
            platforms = [{"platform": p.get("platform"), "digest": p.get("digest"),
                          "emulated": bool((p.get("verdict") or {}).get("emulated")),
                          **({"sbom": per_platform.get(p.get("platform"))} if "platforms" in packages else {})}
                         for p in img.get("platforms") or []]
            latest[img["cell"]] = {"release": manifest["version"], "tags": img["tags"], "pinned": img["pinned"],
                                   "digest": img["digest"], "sbom": packages.get("sbom"), "platforms": platforms}
    return latest
