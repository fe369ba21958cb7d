"""What the registry answers that the gate cannot read, as someone with push rights can write it: release and verify
stop with the same one line naming what cannot be read (RegistryError: exit 1), never a traceback. In-memory
registry (tests/memregistry.py)."""

from __future__ import annotations

import json

import pytest

from buildtool.contracts import label_keys
from buildtool.registry.client import OCI_MANIFEST, RegistryError, sha256_digest
from buildtool.release.chain import verify_reference
from tests import signing
from tests.test_release_platforms import CPU, Dev
from tests.test_verify_strict import checkout, single


def _with_config(dev: Dev, config: bytes) -> str:
    """A validated image of the cell whose config blob is `config`; the dev tag names it."""
    good = dev.image("amd64")
    manifest = json.loads(dev.client.get_manifest(dev.repo, good)[0])
    manifest["config"].update(digest=dev.client.put_blob(dev.repo, config), size=len(config))
    raw = json.dumps(manifest).encode()
    digest = dev.client.put_manifest(dev.repo, sha256_digest(raw), raw, OCI_MANIFEST)
    dev.evidence(digest, "linux/amd64")
    single(dev, digest)
    return dev.client.put_blob(dev.repo, config)


@pytest.mark.parametrize("config", [b"not json", b"\xff\xfe", b"[]", b'{"config": []}',
                                    b'{"os": "linux", "config": {"Labels": ["a"]}}',
                                    json.dumps({"os": "linux", "config": {"Labels": {label_keys.CELL: 1}}}).encode()],
                         ids=["not-json", "not-utf8", "a-list", "config-a-list", "labels-a-list", "a-label-a-number"])
def test_a_config_that_is_no_image_config_stops_release_and_verify_naming_it(config: bytes) -> None:
    """Before: a traceback (JSONDecodeError, AttributeError) from release and verify alike."""
    dev = Dev(CPU)
    blob = _with_config(dev, config)
    said = f"the config {blob} of an image is not an image config"
    with pytest.raises(RegistryError, match=said):
        dev.gather()
    with pytest.raises(RegistryError, match=said):
        verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}",   # type: ignore[arg-type]
                         signing.trusted(), checkout(CPU))
