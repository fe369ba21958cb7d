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
