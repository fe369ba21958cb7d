"""Artifacts attached to an image digest in the local registry (distribution 2.8: no referrers
API, so the OCI 1.1 `sha256-<hex>` index fallback), read back by this module and by plain HTTP."""

from __future__ import annotations

import json
import secrets
import threading

import pytest
import requests

from buildtool.attest.referrers import Payload, attach, copy, fetch, referrers
from buildtool.contracts.names import referrers_tag
from buildtool.registry.client import EMPTY_JSON, EMPTY_JSON_TYPE, OCI_MANIFEST, RegistryClient, RegistryError

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]
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


def _proxied(proxy) -> RegistryClient:  # noqa: ANN001
    return RegistryClient(proxy.address)


def test_a_repository_without_the_referrers_api_is_asked_once_per_client(repo):
    from tests.faultproxy import FaultProxy

    _, name, digest = repo
    with FaultProxy(upstream=("127.0.0.1", 5000)) as proxy:
        client = _proxied(proxy)
        art = attach(client, name, digest, "application/x.test", [Payload("text/plain", b"one")])
        assert [r.digest for r in referrers(client, name, digest)] == [art.digest]
        assert [r.digest for r in referrers(client, name, digest)] == [art.digest]
        asked = [s for s in proxy.seen if "/referrers/" in s.path]
        assert len(asked) == 1, asked          # distribution 2.8 answered 404 once; the fallback index since
        # Another client (another run) asks again: the answer is kept per client, not forever.
        assert [r.digest for r in referrers(_proxied(proxy), name, digest)] == [art.digest]
        assert len([s for s in proxy.seen if "/referrers/" in s.path]) == 2


def test_several_artifacts_are_listed_with_one_index_write_and_never_twice(repo):
    from buildtool.attest.referrers import add_referrers, copy_artifact
    from tests.faultproxy import FaultProxy

    client, name, digest = repo
    arts = [attach(client, name, digest, f"application/x.test-{i}", [Payload("text/plain", b"%d" % i)])
            for i in range(2)]
    target = name.rsplit("/", 1)[0] + "/listed"
    raw, media_type, _ = client.get_manifest(name, digest)
    for blob in [json.loads(raw)["config"]["digest"]] + [layer["digest"] for layer in json.loads(raw)["layers"]]:
        assert client.mount_blob(target, blob, name)
    client.put_manifest(target, digest, raw, media_type)
    with FaultProxy(upstream=("127.0.0.1", 5000)) as proxy:
        via = _proxied(proxy)
        for art in arts:
            copy_artifact(via, name, target, art)
        add_referrers(via, target, digest, arts, exclusive=True)
        add_referrers(via, target, digest, arts, exclusive=True)     # already listed: nothing written
        index_writes = [s for s in proxy.seen if s.method == "PUT" and "/manifests/sha256-" in s.path]
    assert len(index_writes) == 1, index_writes
    assert sorted(r.digest for r in referrers(client, target, digest)) == sorted(a.digest for a in arts)


def test_mount_of_a_blob_the_target_already_has_is_true_even_when_the_source_lacks_it(repo):
    client, name, _ = repo
    blob = client.put_blob(name, secrets.token_bytes(32))
    empty_source = name.rsplit("/", 1)[0] + "/nothing-here"
    assert client.mount_blob(name, blob, empty_source)          # declined (202), but the target holds it
    other = name.rsplit("/", 1)[0] + "/other"
    assert not client.mount_blob(other, blob, empty_source)     # neither has it: a refusal, not a copy
    assert not client.has_blob(other, blob)
