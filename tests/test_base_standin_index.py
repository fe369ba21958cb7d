"""The base an image names by digest may be an image index (a multi-platform base): release reads the labels of
every platform of it, so a stand-in child behind a clean first child is still found (gates: "labelled a stand-in").
Attacker: someone with push rights to the base's repository who puts a clean amd64 child first and a stand-in
arm64 child after it, so that a check reading only the first child passes."""

from __future__ import annotations

import json

from buildtool.contracts import label_keys
from buildtool.registry.call_errors import NotFound
from buildtool.registry.client import sha256_digest
from buildtool.release.gates import Platform, image_problems
from buildtool.release.read import read_platforms
from tests.conftest import fixture_matrix

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
HOST = "127.0.0.1:5000"


class Registry:
    """Manifests and blobs by digest, as RegistryClient answers them (get_manifest, get_blob)."""

    host = HOST

    def __init__(self) -> None:
        self.manifests: dict[str, tuple[bytes, str]] = {}
        self.blobs: dict[str, bytes] = {}

    def image(self, labels: dict[str, str]) -> str:
        config = json.dumps({"os": "linux", "architecture": "amd64", "config": {"Labels": labels}}).encode()
        self.blobs[sha256_digest(config)] = config
        body = json.dumps({"mediaType": MANIFEST, "config": {"digest": sha256_digest(config), "size": len(config)},
                           "layers": []}).encode()
        self.manifests[sha256_digest(body)] = (body, MANIFEST)
        return sha256_digest(body)

    def index(self, children: list[tuple[dict, str]]) -> str:
        body = json.dumps({"mediaType": INDEX, "manifests": [
            {"mediaType": MANIFEST, "digest": digest, "platform": platform} for platform, digest in children]}).encode()
        self.manifests[sha256_digest(body)] = (body, INDEX)
        return sha256_digest(body)

    def get_manifest(self, repo: str, ref: str) -> tuple[bytes, str, str]:
        if ref not in self.manifests:
            raise NotFound(f"manifest {ref} not found")
        body, media_type = self.manifests[ref]
        return body, media_type, ref

    def get_blob(self, repo: str, digest: str, limit: int | None = None) -> bytes:
        return self.blobs[digest]


AMD64 = {"os": "linux", "architecture": "amd64"}
ARM64 = {"os": "linux", "architecture": "arm64"}


def _base_labels_of(registry: Registry, base_digest: str) -> dict[str, str] | None:
    image = registry.image({label_keys.OCI_BASE_DIGEST: base_digest,
                            label_keys.BASE_REF: f"{HOST}/nvidia/pytorch:25.10-py3"})
    [platform] = read_platforms(registry, "dl/pytorch-ngc-dev", *registry.get_manifest("", image)[:2])  # type: ignore[arg-type]
    return platform.base_labels


def test_a_standin_child_behind_a_clean_first_child_of_the_base_index_is_found_and_refused() -> None:
    registry = Registry()
    clean = registry.image({label_keys.OCI_TITLE: "base"})
    standin = registry.image({label_keys.STANDIN: "true"})
    base = registry.index([(AMD64, clean), (ARM64, standin)])
    labels = _base_labels_of(registry, base)
    assert labels is not None and label_keys.STANDIN in labels
    ngc = next(c for c in fixture_matrix().cells if c.base.startswith("nvcr.io"))
    problems = image_problems(ngc, [Platform("", "sha256:" + "1" * 64, 1,
                                             {label_keys.CELL: ngc.key, label_keys.OCI_BASE_NAME: ngc.base,
                                              label_keys.OCI_BASE_DIGEST: base}, base_labels=labels)])
    assert any("labelled a stand-in" in p for p in problems), problems


def test_a_base_index_of_clean_children_gives_the_first_childs_labels() -> None:
    registry = Registry()
    first = registry.image({label_keys.OCI_TITLE: "first"})
    second = registry.image({label_keys.OCI_TITLE: "second"})
    assert _base_labels_of(registry, registry.index([(AMD64, first), (ARM64, second)])) == {
        label_keys.OCI_TITLE: "first"}


def test_a_deleted_child_does_not_hide_the_standin_child_after_it() -> None:
    registry = Registry()
    deleted = registry.image({label_keys.OCI_TITLE: "gone"})
    standin = registry.image({label_keys.STANDIN: "true"})
    base = registry.index([(AMD64, deleted), (ARM64, standin)])
    del registry.manifests[deleted]
    labels = _base_labels_of(registry, base)
    assert labels is not None and label_keys.STANDIN in labels
