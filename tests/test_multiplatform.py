"""A multi-platform dev tag: platform images under `<arch>-<dev tag>`, an OCI index over them at the dev tag,
and the index's reuse only when every platform's content key matches."""

from __future__ import annotations

import json

import pytest

from buildtool.common.errors import FailedError
from buildtool.contracts import label_keys
from buildtool.contracts.names import parse_dev_tag
from buildtool.imagebuild import multiplatform
from buildtool.registry.client import OCI_INDEX, RegistryError
from buildtool.registry.image_index import Child, index_body, put_index
from tests.memregistry import MemRegistry

REPO = "dl-images/jax-cpu-dev"
DEV_TAG = "0123456789ab-0.10"
BOTH = ("linux/amd64", "linux/arm64")


def _platform_images(reg: MemRegistry, keys: dict[str, str], dev_tag: str = DEV_TAG) -> list[Child]:
    children = []
    for platform, key in keys.items():
        arch = platform.split("/")[1]
        tag = multiplatform.platform_tag(dev_tag, platform)
        reg.push_image(REPO, tag, payload=arch.encode() + key.encode(), architecture=arch,
                       labels={label_keys.CONTENT_KEY: key})
        children.append(multiplatform.child_of(reg, REPO, tag, platform))
    return children


def test_a_platform_tag_is_never_taken_for_a_dev_tag():
    tag = multiplatform.platform_tag(DEV_TAG, "linux/arm64")
    assert tag == "0123456789ab-0.10__arm64"
    assert parse_dev_tag(tag, "0.10") is None
    assert parse_dev_tag(tag) is None
    assert parse_dev_tag(multiplatform.platform_tag(DEV_TAG, "linux/amd64")) is None
    custom = multiplatform.platform_tag("nightly-42-0.10", "linux/arm64")   # a pipeline's own revision
    assert parse_dev_tag(custom, "0.10") is None and parse_dev_tag(custom) is None


def test_the_index_names_each_platform_image_in_the_platform_tables_order():
    reg = MemRegistry()
    children = _platform_images(reg, {"linux/amd64": "k1", "linux/arm64": "k2"})
    digest = put_index(reg, REPO, DEV_TAG, children)
    body, media_type, _ = reg.get_manifest(REPO, DEV_TAG)
    index = json.loads(body)
    assert media_type == OCI_INDEX and reg.manifest_digest(REPO, DEV_TAG) == digest
    assert [m["platform"] for m in index["manifests"]] == [{"architecture": "amd64", "os": "linux"},
                                                           {"architecture": "arm64", "os": "linux"}]
    found = multiplatform.index_children(reg, REPO, DEV_TAG)
    assert found is not None and {p: c.digest for p, c in found.items()} == {c.platform: c.digest for c in children}


def test_a_platform_image_of_another_architecture_is_refused_as_an_entry():
    reg = MemRegistry()
    tag = multiplatform.platform_tag(DEV_TAG, "linux/arm64")
    reg.push_image(REPO, tag, architecture="amd64")   # an amd64 image pushed as the arm64 one
    with pytest.raises(FailedError, match="is a linux/amd64 image, not linux/arm64"):
        multiplatform.child_of(reg, REPO, tag, "linux/arm64")


def test_an_index_with_an_unknown_platform_is_refused_by_name_not_skipped():
    reg = MemRegistry()
    children = _platform_images(reg, {"linux/amd64": "k1"})
    body = json.loads(index_body(children))
    body["manifests"].append({**body["manifests"][0], "platform": {"os": "linux", "architecture": "riscv64"}})
    reg.put_manifest(REPO, DEV_TAG, json.dumps(body).encode(), OCI_INDEX)
    with pytest.raises(RegistryError, match="unknown platform 'linux/riscv64'"):
        multiplatform.index_children(reg, REPO, DEV_TAG)
    # BuildKit's attestation entry is not an image: passed over.
    body["manifests"][-1]["annotations"] = {"vnd.docker.reference.type": "attestation-manifest"}
    body["manifests"][-1]["platform"] = {"os": "unknown", "architecture": "unknown"}
    reg.put_manifest(REPO, DEV_TAG, json.dumps(body).encode(), OCI_INDEX)
    assert set(multiplatform.index_children(reg, REPO, DEV_TAG) or {}) == {"linux/amd64"}


def test_an_index_is_reused_only_when_every_platform_has_its_content_key():
    reg = MemRegistry()
    other = "fedcba987654-0.10"
    put_index(reg, REPO, other, _platform_images(reg, {"linux/amd64": "k1", "linux/arm64": "k2"},
                                                               other))
    earlier = multiplatform.read_indexes(reg, REPO, [other])
    found = multiplatform.matching_index(reg, REPO, earlier, {"linux/amd64": "k1", "linux/arm64": "k2"})
    assert found == (other, reg.manifest_digest(REPO, other))
    # One platform's content changed: the whole index is not this build's.
    assert multiplatform.matching_index(reg, REPO, earlier, {"linux/amd64": "k1", "linux/arm64": "k3"}) is None
    # A platform more or less than the cell's: not this cell's index.
    assert multiplatform.matching_index(reg, REPO, earlier, {"linux/amd64": "k1"}) is None
    # A single-platform tag is never an index match.
    reg.push_image(REPO, "single-0.10", labels={label_keys.CONTENT_KEY: "k1"})
    single = multiplatform.read_indexes(reg, REPO, ["single-0.10"])
    assert single == {} and multiplatform.matching_index(reg, REPO, single, {"linux/amd64": "k1"}) is None


def test_each_platform_takes_layers_only_from_earlier_images_of_its_own_platform():
    """The registry cache of a multi-platform cell: each platform's candidates are that platform's entries of
    earlier indexes, by their own digests; the tag being built and single images are not candidates."""
    reg = MemRegistry()
    older, newer = "aaaaaaaaaaaa-0.10", "bbbbbbbbbbbb-0.10"
    for tag, keys in ((older, {"linux/amd64": "o1", "linux/arm64": "o2"}), (newer, {"linux/amd64": "n1"}),
                      (DEV_TAG, {"linux/amd64": "d1", "linux/arm64": "d2"})):
        put_index(reg, REPO, tag, _platform_images(reg, keys, tag))
    reg.push_image(REPO, "cccccccccccc-0.10", labels={label_keys.CONTENT_KEY: "s1"})
    indexes = multiplatform.read_indexes(reg, REPO, [DEV_TAG, newer, older, "cccccccccccc-0.10"])
    assert list(indexes) == [DEV_TAG, newer, older]
    arm = multiplatform.platform_candidates(indexes, "linux/arm64", exclude=DEV_TAG)
    assert [(c.tag, c.digest, c.labels[label_keys.CONTENT_KEY]) for c in arm] == [
        (older, indexes[older]["linux/arm64"].digest, "o2")]
    amd = multiplatform.platform_candidates(indexes, "linux/amd64", exclude=DEV_TAG)
    assert [c.labels[label_keys.CONTENT_KEY] for c in amd] == ["n1", "o1"]


def test_an_index_with_no_children_is_refused_naming_the_tag_and_nothing_is_pushed():
    """put_index pushed an empty index (`manifests: []`) when given no platform image: the tag then named an image of
    no platform at all; now it is refused before any request, naming repository and tag."""
    reg = MemRegistry()
    with pytest.raises(ValueError, match=f"^no platform image to put in the index {REPO}:{DEV_TAG}; "):
        put_index(reg, REPO, DEV_TAG, [])
    assert reg.manifest_digest(REPO, DEV_TAG) is None
