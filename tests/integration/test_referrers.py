"""Artifacts attached to an image digest in the local registry (distribution 2.8: no referrers
API, so the OCI 1.1 `sha256-<hex>` index fallback), read back by this module and by plain HTTP."""

from __future__ import annotations

import json
import secrets
import threading

import pytest
import requests

from buildtool.contracts.names import referrers_tag
from buildtool.registry.client import EMPTY_JSON, EMPTY_JSON_TYPE, OCI_MANIFEST, RegistryClient, RegistryError
from buildtool.registry.referrers import Payload, attach, copy, fetch, referrers

pytestmark = pytest.mark.integration
HOST = "127.0.0.1:5000"


def _image(client: RegistryClient, repo: str) -> str:
    """A tiny single-layer image manifest pushed by digest; returns its digest."""
    layer = secrets.token_bytes(64)
    layer_digest = client.put_blob(repo, layer)
    config = client.put_blob(repo, EMPTY_JSON)
    raw = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                      "config": {"mediaType": EMPTY_JSON_TYPE, "digest": config, "size": 2},
                      "layers": [{"mediaType": "application/octet-stream", "digest": layer_digest, "size": 64}]},
                     sort_keys=True).encode()
    return client.put_manifest(repo, "v1", raw, OCI_MANIFEST)


@pytest.fixture
def repo() -> tuple[RegistryClient, str, str]:
    client = RegistryClient(HOST)
    name = f"t-referrers-{secrets.token_hex(4)}/img"
    return client, name, _image(client, name)


def test_attached_artifacts_are_listed_by_an_independent_client_and_never_replaced(repo):
    client, name, digest = repo
    first = attach(client, name, digest, "application/x.test.one", [Payload("application/json", b'{"n":1}', "a.json")])
    second = attach(client, name, digest, "application/x.test.one", [Payload("application/json", b'{"n":2}', "b.json")])
    other = attach(client, name, digest, "application/x.test.two", [Payload("text/plain", b"x")])
    assert [r.digest for r in referrers(client, name, digest, "application/x.test.one")] == [first.digest,
                                                                                            second.digest]
    assert {r.digest for r in referrers(client, name, digest)} == {first.digest, second.digest, other.digest}
    assert fetch(client, name, second, digest)[0].data == b'{"n":2}'
    # Plain HTTP, as any OCI 1.1 client reads the fallback: an index under sha256-<hex>.
    index = requests.get(f"http://{HOST}/v2/{name}/manifests/{referrers_tag(digest)}", timeout=10,
                         headers={"Accept": "application/vnd.oci.image.index.v1+json"}).json()
    assert {d["digest"] for d in index["manifests"]} == {first.digest, second.digest, other.digest}
    artifact = requests.get(f"http://{HOST}/v2/{name}/manifests/{first.digest}", timeout=10,
                            headers={"Accept": OCI_MANIFEST}).json()
    assert artifact["subject"]["digest"] == digest and artifact["artifactType"] == "application/x.test.one"


def test_concurrent_attaches_all_end_up_listed(repo):
    client, name, digest = repo
    made: list[str] = []

    def one(i: int) -> None:
        made.append(attach(RegistryClient(HOST), name, digest, "application/x.test",
                           [Payload("text/plain", f"{i}".encode())]).digest)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(made) == 4
    assert {r.digest for r in referrers(client, name, digest)} == set(made)


def test_fetch_refuses_an_artifact_of_another_subject(repo):
    client, name, digest = repo
    other = _image(client, name)
    art = attach(client, name, other, "application/x.test", [Payload("text/plain", b"x")])
    with pytest.raises(RegistryError, match="not attached to"):
        fetch(client, name, art, digest)


def test_copy_keeps_the_artifact_digest_in_the_target_repository(repo):
    client, name, digest = repo
    art = attach(client, name, digest, "application/x.test", [Payload("text/plain", b"payload")])
    target = name.rsplit("/", 1)[0] + "/released"
    raw, media_type, _ = client.get_manifest(name, digest)
    for blob in [json.loads(raw)["config"]["digest"]] + [layer["digest"] for layer in json.loads(raw)["layers"]]:
        assert client.mount_blob(target, blob, name)
    client.put_manifest(target, digest, raw, media_type)
    copy(client, name, target, art, digest)
    listed = referrers(client, target, digest)
    assert [r.digest for r in listed] == [art.digest]
    assert fetch(client, target, listed[0], digest)[0].data == b"payload"
