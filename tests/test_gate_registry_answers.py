"""What the registry answers that the gate cannot read, as someone with push rights can write it: release and verify
stop with the same one line naming what cannot be read (RegistryError: exit 1), never a traceback. In-memory
registry (tests/memregistry.py)."""

from __future__ import annotations

import json

import pytest

from buildtool.contracts import label_keys
from buildtool.registry.client import OCI_INDEX, OCI_MANIFEST, NotFound, RegistryClient, RegistryError, sha256_digest
from buildtool.release.chain import verify_reference
from tests import signing
from tests.memregistry import MemRegistry, _Answer
from tests.test_release_platforms import CPU, MULTI, Dev
from tests.test_verify_strict import checkout, entry, index, single


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


def _index_with(dev: Dev, broken: object) -> None:
    """The cell's index at its dev tag, both platforms validated, and beside them the entry `broken` (a "{amd64}" in
    it: the amd64 image's digest)."""
    amd, arm = dev.validated("amd64"), dev.validated("arm64")
    if isinstance(broken, dict) and broken.get("digest") == "{amd64}":
        broken = {**broken, "digest": amd}
    index(dev, [entry(dev, amd), entry(dev, arm, arch="arm64"), broken])


def _broken_entries() -> dict[str, object]:
    return {"platform-a-string": {"mediaType": OCI_MANIFEST, "digest": "{amd64}", "size": 2,
                                  "platform": "linux/amd64"},
            "no-digest": {"mediaType": OCI_MANIFEST, "size": 2, "platform": {"os": "linux", "architecture": "arm64"}},
            "digest-a-number": {"mediaType": OCI_MANIFEST, "digest": 7, "size": 2,
                                "platform": {"os": "linux", "architecture": "arm64"}},
            "a-string": "sha256:" + "1" * 64}


@pytest.mark.parametrize("name", sorted(_broken_entries()))
def test_an_index_entry_that_is_no_descriptor_is_refused_by_release_and_verify_naming_it(name: str) -> None:
    """Before: a traceback (AttributeError: 'str' object has no attribute 'get'), or a failure to read
    `manifests/` (an entry with no digest) that named neither the entry nor the index."""
    dev = Dev(MULTI)
    _index_with(dev, _broken_entries()[name])
    item = dev.gather()
    assert item.status == "refused"
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}",   # type: ignore[arg-type]
                             signing.trusted(), checkout(MULTI))
    assert not found.ok and found.all_problems == item.problems, (found.all_problems, item.problems)
    if name == "platform-a-string":
        assert any(p.startswith("index entry sha256:") and "declares no platform" in p for p in item.problems), \
            item.problems
    else:
        assert any(p.startswith("an index entry (") and "names no digest (or is no descriptor)" in p
                   for p in item.problems), item.problems


def test_manifests_that_is_no_list_is_refused_by_release_and_verify() -> None:
    dev = Dev(MULTI)
    amd = dev.validated("amd64")
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entry(dev, amd)}).encode()
    dev.client.put_manifest(dev.repo, dev.plan.dev_tag, body, OCI_INDEX)
    item = dev.gather()
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}",   # type: ignore[arg-type]
                             signing.trusted(), checkout(MULTI))
    assert item.status == "refused" and not found.ok
    assert found.all_problems == item.problems
    assert any("names no digest (or is no descriptor)" in p for p in item.problems), item.problems


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_an_index_entry_whose_manifest_the_registry_lacks_stops_release_and_verify_naming_it(arch: str) -> None:
    """The platform manifest deleted after the push: release and verify (with and without a checkout) stopped with the
    registry's bare "GET …/manifests/sha256:…: not found", naming neither the index nor the platform, nor what to do."""
    from tests.test_gate_revision import release_dry_run

    dev = Dev(MULTI)
    amd, arm = dev.validated("amd64"), dev.validated("arm64")
    named = dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    gone = amd if arch == "amd64" else arm
    del dev.client.manifests[(dev.repo, gone)]
    said = (f"the index {dev.client.host}/{dev.repo}@{named} names {gone} for linux/{arch}, a manifest the registry "
            "does not have (deleted after the push?): that platform cannot be read, so the image is neither released "
            "nor verified; push the cell again")
    reference = f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}"
    stops = [lambda: release_dry_run(dev), dev.gather,
             lambda: verify_reference(dev.client, reference, signing.trusted(), checkout(MULTI)),   # type: ignore[arg-type]
             lambda: verify_reference(dev.client, reference, signing.trusted())]   # type: ignore[arg-type]
    for stop in stops:
        with pytest.raises(RegistryError) as stopped:
            stop()
        assert str(stopped.value) == said


class _Served(MemRegistry):
    """The in-memory registry read through RegistryClient's own get_manifest, so with its checks of what a manifest
    is (answers.manifest_problem), as release and verify read a real registry."""

    get_manifest = RegistryClient.get_manifest

    def request(self, method: str, path: str, **kwargs: object) -> _Answer:
        repo, _, ref = path.partition("/manifests/")
        if not ref:
            return super().request(method, path, **kwargs)   # type: ignore[no-any-return]
        if (repo, ref) not in self.manifests:
            raise NotFound(f"{method} {path}: not found")
        raw, media_type = self.manifests[(repo, ref)]
        headers = {"Content-Type": media_type}
        write = kwargs["sink"](200, headers) if callable(kwargs.get("sink")) else None   # as the transports do
        if write is None:
            return _Answer(200, headers, raw)
        write(raw)
        return _Answer(200, headers, b"")


def _stops_alike(dev: Dev, cell: object) -> str:
    """The one line release --dry-run, release's gather and verify (with and without a checkout) all stop with."""
    from tests.test_gate_revision import release_dry_run

    reference = f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}"
    stops = [lambda: release_dry_run(dev), dev.gather,
             lambda: verify_reference(dev.client, reference, signing.trusted(), checkout(cell)),   # type: ignore[arg-type]
             lambda: verify_reference(dev.client, reference, signing.trusted())]   # type: ignore[arg-type]
    said = set()
    for stop in stops:
        with pytest.raises(RegistryError) as stopped:
            stop()
        said.add(str(stopped.value))
    (line,) = said
    assert "\n" not in line
    return line


def test_a_config_over_the_size_limit_is_not_read_by_release_or_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, release and verify read an image's config blob whole whatever its size: anyone who may push could
    make them read gigabytes (a descriptor saying so, or a registry lying about it)."""
    from buildtool.release import read

    dev = Dev(CPU)
    manifest = json.loads(dev.client.get_manifest(dev.repo, dev.image("amd64"))[0])
    blob, big = manifest["config"]["digest"], read.MAX_CONFIG_BYTES + 1
    manifest["config"]["size"] = big
    raw = json.dumps(manifest).encode()
    digest = dev.client.put_manifest(dev.repo, sha256_digest(raw), raw, OCI_MANIFEST)
    dev.evidence(digest, "linux/amd64")
    single(dev, digest)
    assert (f"the config {blob} of an image is {big} bytes, over the {read.MAX_CONFIG_BYTES}-byte limit"
            in _stops_alike(dev, CPU))
    # Its descriptor within the limit, the read itself stops there.
    manifest["config"]["size"] = 2
    raw = json.dumps(manifest).encode()
    single(dev, dev.client.put_manifest(dev.repo, sha256_digest(raw), raw, OCI_MANIFEST))
    monkeypatch.setattr(read, "MAX_CONFIG_BYTES", 16)
    with pytest.raises(RegistryError, match=f"blob {blob} of {dev.repo} is over the 16-byte limit"):
        dev.gather()


_BASE = "base/img"


@pytest.mark.parametrize(("broken", "said"), [
    ("sha256:" + "1" * 64, "manifests[0] is a JSON string, not a descriptor object"),
    ({"mediaType": OCI_MANIFEST, "size": 2, "platform": {"os": "linux", "architecture": "amd64"}},
     "manifests[0] has the digest null, not algorithm:hex"),
    ({"mediaType": OCI_MANIFEST, "digest": "sha256:" + "2" * 64, "size": 2, "platform": "linux/amd64"},
     f"manifests[0] sha256:{'2' * 64} has a platform that is a JSON string, not an object")],
    ids=["entry-a-string", "no-digest", "platform-a-string"])
def test_a_malformed_base_index_stops_release_and_verify_with_the_clients_one_line(broken: object, said: str) -> None:
    """The image's labels name a base index (in this registry) whose entries are no descriptors: read._base_labels
    walks them unchecked (with MemRegistry's unchecked reads an AttributeError or KeyError), but the registry client
    refuses such an index where it is fetched, so release and verify stop with the same one line naming it."""
    dev = Dev(CPU)
    dev.client = _Served()
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [broken]}).encode()
    base = dev.client.put_manifest(_BASE, sha256_digest(body), body, OCI_INDEX)
    image = dev.image("amd64", extra_labels={label_keys.OCI_BASE_DIGEST: base,
                                             label_keys.BASE_REF: f"{dev.client.host}/{_BASE}:1"})
    dev.evidence(image, "linux/amd64")
    single(dev, image)
    assert _stops_alike(dev, CPU) == f"{dev.client.host}/{_BASE}@{base} is no manifest OCI's image spec allows: {said}"


@pytest.mark.parametrize("body", [b"<html>502 Bad Gateway</html>", b"\xff\xfe"], ids=["not-json", "not-utf8"])
def test_a_dev_tag_whose_index_is_not_json_stops_release_and_verify_with_the_clients_one_line(body: bytes) -> None:
    """The dev tag's manifest is no JSON at all: the registry client refuses it where it is fetched (gather reads it
    only after that), so release and verify stop with the same one line naming the tag and its digest."""
    dev = Dev(MULTI)
    dev.client = _Served()
    dev.client.put_manifest(dev.repo, dev.plan.dev_tag, body, OCI_INDEX)
    line = _stops_alike(dev, MULTI)
    assert line.startswith(f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag} (digest {sha256_digest(body)}) is no "
                           "manifest OCI's image spec allows: it is not JSON ("), line
