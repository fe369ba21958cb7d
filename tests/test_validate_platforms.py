"""Validation per platform (buildtool.validate.containers): an image index is validated one platform manifest
at a time, each pinned by its own digest and checked to be the image its entry says; its entries are
named by the platform table (an unknown one is refused, never skipped). No engine: an in-memory registry,
and the engine's inspect answered from a table (or refused, where resolve must stop before docker)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from buildtool.common.errors import UserError
from buildtool.contracts import platforms
from buildtool.contracts.verdict import Selection, derive_result
from buildtool.registry.client import OCI_INDEX, OCI_MANIFEST
from buildtool.validate import containers as engine
from tests.memregistry import MemRegistry

REPO = "wt-schema5/jax-cpu-dev"
TAG = "0123abc-0.10"


class Registry(MemRegistry):
    def ping(self) -> None:
        return None


def _image(client: Registry, os: str, architecture: str) -> str:
    """A one-layer image whose config says `os`/`architecture`; returns its manifest digest."""
    config = client.put_blob(REPO, json.dumps({"architecture": architecture, "os": os}).encode())
    layer = client.put_blob(REPO, f"layer of {os}/{architecture}".encode())
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 2},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": 1}]}
    return client.put_manifest(REPO, f"{architecture}-{TAG}", json.dumps(manifest).encode(), OCI_MANIFEST)


def _index(client: Registry, entries: list[tuple[str, str, str]], tag: str = TAG) -> str:
    """An OCI image index at `tag`: one entry per (os, architecture, manifest digest), in that order."""
    body = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": digest, "size": 1, "platform": {"os": os, "architecture": arch}}
        for os, arch, digest in entries]}
    return client.put_manifest(REPO, tag, json.dumps(body).encode(), OCI_INDEX)


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Registry:
    """The registry every RegistryClient of the engine module reaches; the engine is never asked."""
    registry = Registry()
    monkeypatch.setattr(engine, "RegistryClient", lambda host, **_: registry)

    def no_engine(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the engine was asked: {args}")

    monkeypatch.setattr(engine, "inspect_image", no_engine)
    monkeypatch.setattr(engine.docker_cli, "docker", no_engine)
    return registry


def ref(client: Registry, tag_or_digest: str = TAG) -> str:
    sep = "@" if tag_or_digest.startswith("sha256:") else ":"
    return f"{client.host}/{REPO}{sep}{tag_or_digest}"


# -- index_platforms ------------------------------------------------------------------------------

def test_an_index_names_its_platforms_in_index_order(client: Registry) -> None:
    arm, amd = _image(client, "linux", "arm64"), _image(client, "linux", "amd64")
    _index(client, [("linux", "arm64", arm), ("linux", "amd64", amd)])
    assert engine.index_platforms(ref(client)) == ["linux/arm64", "linux/amd64"]     # not sorted: as listed
    digest = _index(client, [("linux", "amd64", amd), ("linux", "arm64", arm)], tag="other")
    assert engine.index_platforms(ref(client, digest)) == ["linux/amd64", "linux/arm64"]


def test_a_single_image_or_a_local_one_has_no_platforms_to_expand(client: Registry) -> None:
    amd = _image(client, "linux", "amd64")
    assert engine.index_platforms(ref(client, amd)) == []
    assert engine.index_platforms(ref(client, f"amd64-{TAG}")) == []
    assert engine.index_platforms("jax-cpu-dev:local") == []        # no registry: nothing is asked


def test_an_index_entry_of_an_unknown_platform_is_refused_naming_it_not_skipped(client: Registry) -> None:
    amd, riscv = _image(client, "linux", "amd64"), _image(client, "linux", "riscv64")
    _index(client, [("linux", "amd64", amd), ("linux", "riscv64", riscv)])
    with pytest.raises(UserError) as info:
        engine.index_platforms(ref(client))
    message = str(info.value)
    assert f"entry {riscv}: unknown platform 'linux/riscv64'" in message and ref(client) in message, message


def test_an_image_the_registry_lacks_is_named(client: Registry) -> None:
    with pytest.raises(UserError, match=f"image {ref(client, 'gone')} not found in registry {client.host}"):
        engine.index_platforms(ref(client, "gone"))


# -- resolve on an index: a platform must be named, and the index must have it ---------------------------

def test_an_index_without_a_platform_is_refused_listing_its_platforms(client: Registry) -> None:
    arm, amd = _image(client, "linux", "arm64"), _image(client, "linux", "amd64")
    _index(client, [("linux", "amd64", amd), ("linux", "arm64", arm)])
    with pytest.raises(UserError) as info:
        engine.resolve(ref(client), print)
    assert str(info.value) == (f"image {ref(client)} is an image index: validate each of its platforms "
                               "(linux/amd64, linux/arm64)")


def test_a_platform_the_index_lacks_is_refused_naming_it(client: Registry) -> None:
    amd = _image(client, "linux", "amd64")
    _index(client, [("linux", "amd64", amd)])
    with pytest.raises(UserError) as info:
        engine.resolve(ref(client), print, "linux/arm64")
    assert str(info.value) == f"image {ref(client)} has no linux/arm64 image"


def _engine_holds(monkeypatch: pytest.MonkeyPatch, held: dict[str, dict[str, Any]]) -> None:
    """The engine's `image inspect`, answered for the references in `held` (None for any other)."""
    monkeypatch.setattr(engine, "inspect_image", held.get)


def test_a_named_platform_pins_its_own_manifest_and_says_whether_it_runs_emulated(
        client: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    arm, amd = _image(client, "linux", "arm64"), _image(client, "linux", "amd64")
    _index(client, [("linux", "amd64", amd), ("linux", "arm64", arm)])
    monkeypatch.setattr(platforms._host, "machine", lambda: "x86_64")      # an amd64 runner
    _engine_holds(monkeypatch, {
        ref(client, arm): {"Id": "sha256:" + "a" * 64, "Os": "linux", "Architecture": "arm64", "Variant": "v8",
                           "Config": {"Labels": {"k": "v"}, "Env": ["A=1"]}},
        ref(client, amd): {"Id": "sha256:" + "b" * 64, "Os": "linux", "Architecture": "amd64", "Config": {}}})
    image = engine.resolve(ref(client), print, "linux/arm64")
    assert (image.digest, image.run_ref, image.platform, image.emulated) == (arm, ref(client, arm), "linux/arm64",
                                                                             True)
    assert image.labels == {"k": "v"} and image.env == {"A": "1"}
    native = engine.resolve(ref(client), print, "linux/amd64")
    assert (native.digest, native.platform, native.emulated) == (amd, "linux/amd64", False)


def test_an_entry_whose_image_is_of_another_platform_is_refused(client: Registry,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The index says linux/arm64, but the image it points at is an amd64 one (a mislabelled entry)."""
    amd = _image(client, "linux", "amd64")
    _index(client, [("linux", "arm64", amd)])
    _engine_holds(monkeypatch, {ref(client, amd): {"Id": "sha256:" + "b" * 64, "Os": "linux",
                                                   "Architecture": "amd64", "Config": {}}})
    with pytest.raises(UserError) as info:
        engine.resolve(ref(client), print, "linux/arm64")
    assert str(info.value) == f"image {ref(client)}: its linux/arm64 entry {amd} is a linux/amd64 image"


# -- an emulated GPU run is not a GPU run -----------------------------------------------------------------

GPU_TEST = "pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw"
CPU_TEST = "common/test_shm.py::test_shm_size_matches_run_profile"


@pytest.mark.parametrize("emulated", [False, True])
def test_a_gpu_cell_run_under_emulation_is_incomplete_even_when_every_test_passed(emulated: bool) -> None:
    ran = [{"id": CPU_TEST, "result": "passed"}, {"id": GPU_TEST, "result": "passed"}]
    result, reasons = derive_result(0, ran, defined=[CPU_TEST, GPU_TEST], selection=Selection(),
                                    gpu_cell=True, gpu_tests=[GPU_TEST], emulated=emulated)
    if not emulated:
        assert (result, reasons) == ("passed", [])      # the same run, native: it covers the cell
        return
    assert result == "incomplete" and len(reasons) == 1, reasons
    assert "an emulated GPU run is not a GPU run" in reasons[0] and "native runner" in reasons[0]


def test_a_cpu_cell_run_under_emulation_counts() -> None:
    ran = [{"id": CPU_TEST, "result": "passed"}]
    assert derive_result(0, ran, defined=[CPU_TEST], selection=Selection(), gpu_cell=False,
                         gpu_tests=[], emulated=True) == ("passed", [])


def test_buildkits_attestation_entry_is_passed_over_but_an_unknown_image_entry_is_not(client: Registry) -> None:
    amd, arm = _image(client, "linux", "amd64"), _image(client, "linux", "arm64")
    body = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": amd, "size": 1, "platform": {"os": "linux", "architecture": "amd64"}},
        {"mediaType": OCI_MANIFEST, "digest": arm, "size": 1, "platform": {"os": "linux", "architecture": "arm64"}},
        {"mediaType": OCI_MANIFEST, "digest": amd, "size": 1, "platform": {"os": "unknown", "architecture": "unknown"},
         "annotations": {"vnd.docker.reference.type": "attestation-manifest", "vnd.docker.reference.digest": amd}}]}
    client.put_manifest(REPO, TAG, json.dumps(body).encode(), OCI_INDEX)
    assert engine.index_platforms(ref(client)) == ["linux/amd64", "linux/arm64"]
    del body["manifests"][2]["annotations"]       # the same entry without the annotation: an image nobody knows
    client.put_manifest(REPO, TAG, json.dumps(body).encode(), OCI_INDEX)
    with pytest.raises(UserError, match="unknown platform 'unknown/unknown'"):
        engine.index_platforms(ref(client))


# -- --platform: one platform of the index (the nightly's native runners) --------------------------------------

def _validate_cli(monkeypatch: pytest.MonkeyPatch, entries: list[str]) -> list[str | None]:
    """`buildtool validate IMAGE` with the index read and each platform's run stubbed: the platforms it ran."""
    from buildtool.validate import runner

    ran: list[str | None] = []

    def run(ref: str, loaded: object, root: object, options: object, log: object, platform: str | None) -> dict:
        ran.append(platform)
        return {"image": ref, "cell": "c", "platform": platform or "", "emulated": False, "digest": "sha256:0",
                "result": "passed", "tests": [], "duration_s": 0.0}

    monkeypatch.setattr(engine, "index_platforms", lambda ref: {p: "sha256:" + str(i) for i, p in enumerate(entries)})
    monkeypatch.setattr(runner, "validate_image", run)
    return ran


def test_validate_runs_only_the_platform_named_and_refuses_one_the_index_lacks(
        run_cli, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    from tests.conftest import REPO

    image = "127.0.0.1:5000/t/jax-cpu-dev:0123456789ab-0.10"
    ran = _validate_cli(monkeypatch, ["linux/amd64", "linux/arm64"])
    code, _, err = run_cli("validate", image, "--platform", "linux/arm64", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    assert ran == ["linux/arm64"]
    ran.clear()
    assert run_cli("validate", image, "--matrix", str(REPO / "matrix.yaml"))[0] == 0
    assert ran == ["linux/amd64", "linux/arm64"]                     # default: every platform
    ran.clear()
    _validate_cli(monkeypatch, ["linux/amd64"])
    code, _, err = run_cli("validate", image, "--platform", "linux/arm64", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and f"--platform linux/arm64: {image} is an index of linux/amd64 only" in err
    code, _, err = run_cli("validate", image, "--platform", "linux/s390x", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and "--platform: unknown platform 'linux/s390x'" in err


# -- an image config that is no image config (anyone who may push can write one) ---------------------------------

def _image_with_config(client: Registry, config: bytes) -> str:
    blob = client.put_blob(REPO, config)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": blob,
                           "size": len(config)}, "layers": []}
    return client.put_manifest(REPO, TAG, json.dumps(manifest).encode(), OCI_MANIFEST)


@pytest.mark.parametrize("config", [b"[]", b'"text"', b'{"config": []}', b'{"config": {"Labels": []}}',
                                    b'{"config": {"Env": "A=1"}}', b"\xff"])
def test_a_config_that_is_no_image_config_is_refused_naming_it_not_a_traceback(client: Registry,
                                                                                config: bytes) -> None:
    """pin (what reuse looks a verdict up with) read the config with .get: a list or a string was AttributeError."""
    _image_with_config(client, config)
    blob = "sha256:" + __import__("hashlib").sha256(config).hexdigest()
    with pytest.raises(UserError) as info:
        engine.pin(ref(client))
    assert str(info.value).startswith(f"image {ref(client)}: its config {blob} is not an image config"), info.value


@pytest.mark.parametrize("config", [b"[]", b'{"rootfs": []}', b'{"rootfs": {"diff_ids": "sha256:x"}}'])
def test_a_config_that_is_no_image_config_is_pulled_not_loaded_over_layers(client: Registry,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           config: bytes) -> None:
    """resolve's load-over-layers path read rootfs with .get: a list was AttributeError. Now that path is not taken,
    and the pull (which the engine refuses) says why in one line."""
    digest = _image_with_config(client, config)
    monkeypatch.setattr(engine, "inspect_image", lambda ref: None)
    pulls: list[tuple[str, ...]] = []

    def docker(*args: str, **_: Any) -> Any:
        pulls.append(args)
        return type("Proc", (), {"returncode": 1, "stderr": "manifest invalid", "stdout": ""})()

    monkeypatch.setattr(engine.docker_cli, "docker", docker)
    with pytest.raises(UserError) as info:
        engine.resolve(ref(client), print)
    assert pulls == [("pull", ref(client, digest))]
    assert str(info.value) == f"cannot pull {ref(client, digest)}: manifest invalid"


def test_an_image_entry_annotated_as_an_attestation_is_still_validated(client: Registry) -> None:
    """Before, any entry annotated attestation-manifest was passed over whatever its platform, so an arm64 image
    so annotated was never validated (BuildKit's attestations are unknown/unknown)."""
    amd, arm = _image(client, "linux", "amd64"), _image(client, "linux", "arm64")
    body = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": amd, "size": 1, "platform": {"os": "linux", "architecture": "amd64"}},
        {"mediaType": OCI_MANIFEST, "digest": arm, "size": 1, "platform": {"os": "linux", "architecture": "arm64"},
         "annotations": {"vnd.docker.reference.type": "attestation-manifest", "vnd.docker.reference.digest": amd}}]}
    client.put_manifest(REPO, TAG, json.dumps(body).encode(), OCI_INDEX)
    assert engine.index_platforms(ref(client)) == ["linux/amd64", "linux/arm64"]
    body["manifests"][1]["platform"] = {"os": "linux", "architecture": "riscv64"}    # nor is an unknown one hidden
    client.put_manifest(REPO, TAG, json.dumps(body).encode(), OCI_INDEX)
    with pytest.raises(UserError, match="unknown platform 'linux/riscv64'"):
        engine.index_platforms(ref(client))


def test_an_index_with_one_platform_twice_is_refused_by_name(client: Registry) -> None:
    """Before, two linux/amd64 entries gave validate linux/amd64 twice, both runs on the first digest: the second
    image (the one a runtime may pull) was never validated."""
    first = _image(client, "linux", "amd64")
    config = client.put_blob(REPO, json.dumps({"architecture": "amd64", "os": "linux", "created": "x"}).encode())
    second = client.put_manifest(REPO, "other", json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": {
        "mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 2}, "layers": []}).encode(),
        OCI_MANIFEST)
    _index(client, [("linux", "amd64", first), ("linux", "amd64", second)])
    with pytest.raises(UserError, match=f"index lists linux/amd64 twice \\({first}, {second}\\)"):
        engine.index_platforms(ref(client))


@pytest.mark.parametrize("entry", ["sha256:" + "0" * 64, {"mediaType": OCI_MANIFEST,
                                   "platform": {"os": "linux", "architecture": "amd64"}}])
def test_an_index_entry_that_is_no_descriptor_is_refused_not_a_traceback(client: Registry, entry: Any) -> None:
    """Before, an entry that was no object gave an AttributeError traceback, and one without a digest a KeyError
    when its platform was pinned."""
    body = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]}
    client.put_manifest(REPO, TAG, json.dumps(body).encode(), OCI_INDEX)
    with pytest.raises(UserError, match=r"image .*: index entry .* is no descriptor with a digest"):
        engine.pin(ref(client), "linux/amd64")


def test_an_entry_that_is_itself_an_index_is_refused(client: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, an arm64 entry naming another index was pulled (the engine picking an image out of it) and its
    verdict signed for the inner index's digest: an index in an index, which release refuses."""
    amd, arm = _image(client, "linux", "amd64"), _image(client, "linux", "arm64")
    inner = _index(client, [("linux", "arm64", arm)], tag="inner")
    _index(client, [("linux", "amd64", amd), ("linux", "arm64", inner)])
    _engine_holds(monkeypatch, {ref(client, inner): {"Id": "sha256:" + "a" * 64, "Os": "linux",
                                                     "Architecture": "arm64", "Config": {}}})
    with pytest.raises(UserError) as info:
        engine.resolve(ref(client), print, "linux/arm64")
    assert str(info.value) == (f"image {ref(client)}: its linux/arm64 entry {inner} is itself an index, not one "
                               "platform's image; push it again")


def test_a_config_over_the_size_limit_is_not_read_past_it(client: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, pin and the load over layers held here read an image's config whole, whatever its size (anyone who may
    push writes it); release and verify read it to MAX_CONFIG_BYTES only. Now the same limit here."""
    from buildtool.registry.client import RegistryError

    monkeypatch.setattr(engine, "MAX_CONFIG_BYTES", 64, raising=False)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["A=" + "x" * 100]}}).encode()
    digest = _image_with_config(client, config)
    blob = "sha256:" + __import__("hashlib").sha256(config).hexdigest()
    said = f"blob {blob} of {REPO} is over the 64-byte limit; not read further"
    with pytest.raises(RegistryError) as info:
        engine.pin(ref(client))
    assert str(info.value) == said
    with pytest.raises(RegistryError) as info:
        engine._from_layers_here(client, REPO, digest)  # type: ignore[arg-type]
    assert str(info.value) == said
