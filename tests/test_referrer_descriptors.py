"""A referrers list whose descriptors are not what OCI says (a registry's referrers API answer, or the fallback
index `sha256-<hex>`): a RegistryError naming the descriptor, never a traceback, and never an entry dropped."""

from __future__ import annotations

import json

import pytest

from buildtool.attest.referrers import referrers
from buildtool.contracts.label_keys import ARTIFACT_CREATED
from buildtool.contracts.names import referrers_tag
from buildtool.registry.client import OCI_INDEX, OCI_MANIFEST, RegistryError
from tests.memregistry import MemRegistry


def _listed(client: MemRegistry, digest: str, first: dict) -> None:
    second = {"mediaType": OCI_MANIFEST, "digest": "sha256:" + "2" * 64, "size": 3, "artifactType": "x",
              "annotations": {ARTIFACT_CREATED: "2026-01-01T00:00:00Z"}}
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX,
             "manifests": [{"mediaType": OCI_MANIFEST, "digest": "sha256:" + "1" * 64, "size": 3, "artifactType": "x",
                            **first}, second]}
    client.put_manifest("r", referrers_tag(digest), json.dumps(index).encode(), OCI_INDEX)


@pytest.mark.parametrize("bad", [
    {"annotations": [["a", "b"]]},
    {"annotations": "x"},
    {"annotations": {ARTIFACT_CREATED: 5}},
    {"size": "twelve"},
    {"size": [3]},
    {"size": -3},
])
def test_a_referrers_list_with_a_malformed_descriptor_is_a_registry_error_naming_it(bad: dict) -> None:
    client = MemRegistry()
    digest = client.push_image("r", "t")
    _listed(client, digest, bad)
    with pytest.raises(RegistryError, match="the referrers list holds a malformed descriptor .*sha256:1111"):
        referrers(client, "r", digest)   # type: ignore[arg-type]


def test_a_well_formed_list_still_reads() -> None:
    client = MemRegistry()
    digest = client.push_image("r", "t")
    _listed(client, digest, {"annotations": {ARTIFACT_CREATED: "2026-01-02T00:00:00Z"}})
    assert [r.digest[-1] for r in referrers(client, "r", digest)] == ["2", "1"]   # type: ignore[arg-type]


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'"index"',
                                 json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [1]}).encode(),
                                 json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                                             "manifests": ["sha256:" + "1" * 64]}).encode()])
def test_a_fallback_index_that_is_no_index_of_descriptors_is_a_registry_error_naming_its_tag(raw: bytes) -> None:
    """Anyone who may push can write the `sha256-<hex>` tag: not JSON, not an object, or descriptors that are not
    objects stopped every reader (release, verify) and writer (push's attach) with a JSONDecodeError or
    AttributeError."""
    from buildtool.attest.referrers import Referrer, add_referrers

    client = MemRegistry()
    digest = client.push_image("r", "t")
    client.put_manifest("r", referrers_tag(digest), raw, OCI_INDEX)
    with pytest.raises(RegistryError, match=f"r:{referrers_tag(digest)} is not an OCI referrers index"):
        referrers(client, "r", digest)   # type: ignore[arg-type]
    with pytest.raises(RegistryError, match=f"r:{referrers_tag(digest)} is not an OCI referrers index"):
        add_referrers(client, "r", digest, [Referrer("sha256:" + "3" * 64, "x", 3)])   # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [{"digest": None}, {"digest": "latest"}, {"digest": ["sha256:" + "1" * 64]},
                                 {"size": "²"}])
def test_a_descriptor_with_no_digest_or_a_size_of_no_ascii_digits_is_a_registry_error_naming_it(bad: dict) -> None:
    """A descriptor without a digest (or naming a tag) was listed as the referrer 'None' or 'latest' and fetched
    by that tag (then refused as 'missing' or 'mismatched', the wrong cause), and a size of '²' (isdigit, yet
    no int) ended the read in a ValueError traceback."""
    client = MemRegistry()
    digest = client.push_image("r", "t")
    _listed(client, digest, bad)
    with pytest.raises(RegistryError, match="the referrers list holds a malformed descriptor"):
        referrers(client, "r", digest)   # type: ignore[arg-type]
