"""The release manifests `release` writes (docs/releases/<version>.json) and the catalogue reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from buildtool.common.errors import UserError

RELEASES_DIR = "docs/releases"
MANIFEST_SCHEMA = 1


def load_release_manifests(root: Path) -> list[dict[str, Any]]:
    """Every docs/releases/<version>.json, oldest release first (for the catalogue). A file named otherwise is
    not one `release` writes and is left alone; one named by a version that cannot be read as the manifest
    release writes is a UserError naming it (fail closed: skipping it would list an older release as the
    newest)."""
    from packaging.version import InvalidVersion, Version

    found = []
    for path in sorted((root / RELEASES_DIR).glob("*.json")):
        try:
            version = Version(path.stem)
        except InvalidVersion:
            continue
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _unreadable(path, str(exc)) from None
        problem = _manifest_problem(manifest, version)
        if problem:
            raise _unreadable(path, problem)
        found.append((version, manifest))
    return [m for _, m in sorted(found, key=lambda pair: pair[0])]


def _unreadable(path: Path, why: str) -> UserError:
    return UserError(f"{path}: cannot read the release manifest ({why}); restore the file `buildtool release` "
                     "wrote (git checkout), or remove it")


def _manifest_problem(manifest: Any, version: Any) -> str:
    """What of a release manifest latest_by_cell reads is missing or of another type ("" when nothing)."""
    from packaging.version import InvalidVersion, Version

    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not an object"
    try:
        if Version(str(manifest.get("version"))) != version:
            return f"its version is {manifest.get('version')!r}, not the file name's"
    except InvalidVersion:
        return f"its version {manifest.get('version')!r} is not a version"
    images = manifest.get("images")
    if not isinstance(images, list) or not all(isinstance(img, dict) for img in images):
        return "`images` is not a list of objects"
    for index, img in enumerate(images):
        packages, platforms = img.get("packages") or {}, img.get("platforms")
        fields = {key: isinstance(img.get(key), str) for key in ("cell", "pinned", "digest")}
        fields["tags"] = isinstance(img.get("tags"), list) and all(isinstance(t, str) for t in img["tags"])
        fields["packages"] = isinstance(packages, dict) and _objects(packages.get("platforms"))
        fields["platforms"] = _objects(platforms) and all(isinstance(p.get("verdict") or {}, dict)
                                                          for p in platforms or [])
        wrong = [key for key, good in fields.items() if not good]
        if wrong:
            return f"image {index} ({img.get('cell', 'no cell')}): {', '.join(wrong)} missing or of another type"
    return ""


def _objects(value: Any) -> bool:
    """An optional list of objects: absent, null or a list of JSON objects."""
    return value is None or isinstance(value, list) and all(isinstance(v, dict) for v in value)


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
