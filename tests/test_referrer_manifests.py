"""An artifact manifest, or the fallback referrers index, that is not what OCI says: anyone who may push can write
any bytes under a digest or the `sha256-<hex>` tag. Readers (release, verify, push's own check) refuse it naming the
artifact and the fault, never a traceback; a malformed copy of a signed artifact never stands in for the original."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from buildtool.attest.provenance_store import find_provenance
from buildtool.attest.referrers import (
    MAX_REFERRER_LAYER_BYTES,
    Payload,
    Referrer,
    add_referrers,
    attach,
    copy_artifact,
    fetch,
)
from buildtool.contracts.label_keys import ARTIFACT_CREATED
from buildtool.contracts.names import PROVENANCE_TYPE
from buildtool.registry.client import OCI_MANIFEST, RegistryError, sha256_digest
from tests import signing
from tests.memregistry import MemRegistry
from tests.provenance_fixture import attest_provenance

REPO = "pytorch-cpu"


def _without(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda m: {k: v for k, v in m.items() if k != name}


def _layers(change: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    return lambda m: {**m, "layers": [change(layer) for layer in m["layers"]]}


@pytest.mark.parametrize(("change", "cause"), [
    (lambda m: b"not json", "is not a JSON manifest"),
    (lambda m: [m], "is a JSON list, not a manifest object"),
    (lambda m: {**m, "subject": m["subject"]["digest"]}, "its subject is not a descriptor object"),
    # The signed envelope, in a manifest without the config every OCI manifest has: release's copy stopped on it.
    (_without("config"), "its config is not a descriptor naming its digest"),
    (lambda m: {**m, "config": m["config"]["digest"]}, "its config is not a descriptor naming its digest"),
    (lambda m: {**m, "layers": m["layers"][0]}, "its layers are not a list of descriptors"),
    (_layers(_without("digest")), "its layers are not a list of descriptors"),
    (_layers(lambda layer: {**layer, "digest": 5}), "its layers are not a list of descriptors"),
    (_layers(lambda layer: {**layer, "annotations": ["title"]}), "its layers are not a list of descriptors"),
])
def test_a_malformed_copy_of_a_signed_artifact_is_refused_naming_why_and_the_original_counts(
        change: Callable[[dict[str, Any]], Any], cause: str) -> None:
    client = MemRegistry()
    digest = client.push_image(REPO, "2.13-dev")
    original = attest_provenance(client, REPO, digest)   # type: ignore[arg-type]
    manifest = json.loads(client.get_manifest(REPO, original.digest)[0])
    # Listed first: its creation annotation, which anyone who pushes writes, sorts before the original's.
    manifest["annotations"][ARTIFACT_CREATED] = "2000-01-01T00:00:00Z"
    changed = change(manifest)
    raw = changed if isinstance(changed, bytes) else json.dumps(changed).encode()
    copied = client.put_manifest(REPO, sha256_digest(raw), raw, OCI_MANIFEST)
    add_referrers(client, REPO, digest, [Referrer(copied, PROVENANCE_TYPE, len(raw),   # type: ignore[arg-type]
                                                  {ARTIFACT_CREATED: "2000-01-01T00:00:00Z"})])
    found = find_provenance(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    assert found.provenance is not None and found.artifact == original.digest, (found.artifact, found.rejected)
    ((artifact, reason),) = found.rejected
    assert artifact == copied and f"artifact {copied}" in reason and cause in reason, reason
    # Release copies the artifact it read (stage): a RegistryError naming it, never a KeyError.
    with pytest.raises(RegistryError, match=f"artifact {copied}.*{re.escape(cause)}"):
        copy_artifact(client, REPO, "released", Referrer(copied, PROVENANCE_TYPE, len(raw)))  # type: ignore[arg-type]


def test_a_layer_over_the_size_limit_is_refused_before_it_is_fetched_and_the_read_is_bounded(monkeypatch) -> None:
    """Before, fetch read every layer of an artifact into memory whatever its size: anyone who may push could make
    release and verify read a multi-GB layer (or a registry lying about the size could)."""
    client = MemRegistry()
    digest = client.push_image(REPO, "2.13-dev")
    small = attach(client, REPO, digest, "application/x-test", [Payload("application/json", b"{}")])  # type: ignore[arg-type]
    manifest = json.loads(client.get_manifest(REPO, small.digest)[0])
    layer, big = manifest["layers"][0]["digest"], MAX_REFERRER_LAYER_BYTES + 1
    manifest["layers"][0]["size"] = big
    raw = json.dumps(manifest).encode()
    huge = client.put_manifest(REPO, sha256_digest(raw), raw, OCI_MANIFEST)
    asked: list[dict[str, Any]] = []
    monkeypatch.setattr(client, "get_blob", lambda repo, d, **kw: asked.append(kw) or b"{}")
    with pytest.raises(RegistryError, match=f"artifact {huge}: its layer {layer} is {big} bytes, over the "
                                            f"{MAX_REFERRER_LAYER_BYTES}-byte limit"):
        fetch(client, REPO, Referrer(huge, "application/x-test", len(raw)), digest)  # type: ignore[arg-type]
    assert asked == []
    # Within the limit, the read itself is bounded too (a registry that says 2 bytes and sends gigabytes).
    fetch(client, REPO, small, digest)  # type: ignore[arg-type]
    assert asked == [{"limit": MAX_REFERRER_LAYER_BYTES}]


@pytest.mark.parametrize("lies", [False, True])
def test_a_layer_refused_for_its_size_is_reported_as_too_large_not_mismatched(lies: bool) -> None:
    """Before, a referrer whose layer was refused for its size (its descriptor's, or the bytes a registry sent past
    it) was reported to the reader with the prefix `mismatched:`, naming a cause it does not have."""
    from buildtool.attest import referrers
    from buildtool.attest.bundles import read_once

    client = MemRegistry()
    digest = client.push_image(REPO, "2.13-dev")
    small = attach(client, REPO, digest, "application/x-test", [Payload("application/json", b"{}")])  # type: ignore[arg-type]
    manifest = json.loads(client.get_manifest(REPO, small.digest)[0])
    layer = manifest["layers"][0]["digest"]
    if lies:     # the descriptor says 2 bytes; the blob is bigger than the limit
        big = b"x" * (MAX_REFERRER_LAYER_BYTES + 1)
        layer = manifest["layers"][0]["digest"] = client.put_blob(REPO, big)
    else:
        manifest["layers"][0]["size"] = MAX_REFERRER_LAYER_BYTES + 1
    raw = json.dumps(manifest).encode()
    huge = client.put_manifest(REPO, sha256_digest(raw), raw, OCI_MANIFEST)
    said = read_once(client, REPO, Referrer(huge, "application/x-test", len(raw)), digest, set())  # type: ignore[arg-type]
    cause = (f"blob {layer} of {REPO} is over the {referrers.MAX_REFERRER_LAYER_BYTES}-byte limit; not read further"
             if lies else f"artifact {huge}: its layer {layer} is {MAX_REFERRER_LAYER_BYTES + 1} bytes, over the "
             f"{MAX_REFERRER_LAYER_BYTES}-byte limit")
    assert said == f"too large: {cause}"


def test_an_artifact_whose_layers_together_are_over_the_limit_is_refused_before_any_is_fetched(monkeypatch) -> None:
    """Before, only each layer was held to MAX_REFERRER_LAYER_BYTES: an artifact of thousands of layers, each under
    the limit, made release and verify read them all into memory (the toolkit's artifacts have one layer each)."""
    client = MemRegistry()
    digest = client.push_image(REPO, "2.13-dev")
    small = attach(client, REPO, digest, "application/x-test", [Payload("application/json", b"{}")])  # type: ignore[arg-type]
    manifest = json.loads(client.get_manifest(REPO, small.digest)[0])
    half = MAX_REFERRER_LAYER_BYTES // 2
    manifest["layers"] = [{**manifest["layers"][0], "size": half} for _ in range(3)]
    raw = json.dumps(manifest).encode()
    many = client.put_manifest(REPO, sha256_digest(raw), raw, OCI_MANIFEST)
    asked: list[dict[str, Any]] = []
    monkeypatch.setattr(client, "get_blob", lambda repo, d, **kw: asked.append(kw) or b"{}")
    with pytest.raises(RegistryError) as refused:
        fetch(client, REPO, Referrer(many, "application/x-test", len(raw)), digest)  # type: ignore[arg-type]
    assert str(refused.value) == (f"artifact {many}: its 3 layers are {3 * half} bytes together, over the "
                                  f"{MAX_REFERRER_LAYER_BYTES}-byte limit")
    assert asked == []
