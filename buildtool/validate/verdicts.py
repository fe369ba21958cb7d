"""Verdicts stored with the image in its registry, addressed by the image's digest.

A verdict is a JSON document (what ran, what passed, figures, the runner). It is pushed
as an OCI artifact into the image's own repository: an image manifest whose
`artifactType` is VERDICT_TYPE, whose one layer is the verdict JSON and whose `subject`
is the image. Registries without the referrers API (distribution 2.8 among them) find it
through the fallback tag `sha256-<hex>.verdict`, the convention cosign uses. Any machine
can then ask "did this exact digest pass?" with nothing but registry access.
"""

from __future__ import annotations

import json
from typing import Any

from buildtool.contracts import label_keys
from buildtool.registry.client import EMPTY_JSON, EMPTY_JSON_TYPE, OCI_MANIFEST, NotFound, RegistryClient

VERDICT_TYPE = "application/vnd.dl-images.verdict.v1+json"
VERDICT_SCHEMA = 1


def verdict_tag(image_digest: str) -> str:
    algorithm, _, hexdigest = image_digest.partition(":")
    return f"{algorithm}-{hexdigest}.verdict"


def store_verdict(client: RegistryClient, repo: str, image_digest: str, verdict: dict[str, Any]) -> str:
    """Push `verdict` for `image_digest` into `repo`; returns the verdict manifest's digest.

    Storing again for the same digest replaces the pointer tag (a re-validation wins).
    """
    if verdict.get("digest") != image_digest:
        raise ValueError(f"verdict is for {verdict.get('digest')}, not {image_digest}")
    subject_body, subject_type, subject_digest = client.get_manifest(repo, image_digest)
    body = json.dumps(verdict, sort_keys=True, indent=1).encode()
    layer_digest = client.put_blob(repo, body)
    empty_digest = client.put_blob(repo, EMPTY_JSON)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": VERDICT_TYPE,
        "config": {"mediaType": EMPTY_JSON_TYPE, "digest": empty_digest, "size": len(EMPTY_JSON)},
        "layers": [{"mediaType": VERDICT_TYPE, "digest": layer_digest, "size": len(body),
                    "annotations": {"org.opencontainers.image.title": "verdict.json"}}],
        "subject": {"mediaType": subject_type, "digest": subject_digest, "size": len(subject_body)},
        "annotations": {label_keys.VERDICT_RESULT: str(verdict.get("result")),
                        label_keys.VERDICT_CELL: str(verdict.get("cell"))},
    }
    raw = json.dumps(manifest, sort_keys=True).encode()
    return client.put_manifest(repo, verdict_tag(image_digest), raw, OCI_MANIFEST)


def load_verdict(client: RegistryClient, repo: str, image_digest: str) -> dict[str, Any] | None:
    """The verdict stored for `image_digest` in `repo`, or None when there is none."""
    try:
        raw, _, _ = client.get_manifest(repo, verdict_tag(image_digest))
    except NotFound:
        return None
    manifest = json.loads(raw)
    if manifest.get("artifactType") != VERDICT_TYPE or manifest.get("subject", {}).get("digest") != image_digest:
        return None
    layer = next((d for d in manifest.get("layers", []) if d.get("mediaType") == VERDICT_TYPE), None)
    if layer is None:
        return None
    verdict = json.loads(client.get_blob(repo, layer["digest"]))
    return verdict if verdict.get("digest") == image_digest else None
