"""Multi-platform bases against an in-memory registry (no engine, no debootstrap): a platform's image is
picked from an index or a single image and refused by name when it is not there or says otherwise; a tree
becomes the same layer bytes every time; `fill_bases` adds a missing platform to a base, keeps the host
image by digest, and leaves the tag alone when a platform fails."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from buildtool.common.errors import FailedError, UserError
from buildtool.contracts import label_keys, platforms
from buildtool.imagebuild import base_index, bases
from buildtool.imagebuild.base_index import Child
from buildtool.registry.client import DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST, RegistryError, sha256_digest
from tests.conftest import fixture_matrix
from tests.memregistry import MemRegistry

REPO = "library/debian"
TAG = "bookworm-slim"
REF = f"127.0.0.1:5999/{REPO}:{TAG}"
BOTH = ["linux/amd64", "linux/arm64"]
EPOCH = 1783764997
AMD64_SOURCE = bases.base_source("bookworm")
ARM64_SOURCE = bases.base_source("bookworm", "linux/arm64")


def tree(root: Path, marker: str = "x") -> Path:
    """A small root file system: a directory, a file, a hard link, a symlink, all at EPOCH."""
    (root / "etc").mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    (root / "etc/os-release").write_text(f"ID=debian {marker}\n")
    (root / "usr/bin/true").write_bytes(b"\x7fELF")
    os.link(root / "usr/bin/true", root / "usr/bin/also-true")
    (root / "bin").symlink_to("usr/bin")
    for path in [*root.rglob("*"), root]:
        os.utime(path, (EPOCH, EPOCH), follow_symlinks=False)
    return root


def image(client: MemRegistry, tag: str | None, arch: str, source: str | None = AMD64_SOURCE,
          media_type: str = DOCKER_MANIFEST, os_name: str = "linux") -> Child:
    """A one-layer image as the engine pushes it (Docker media types), config saying os/arch."""
    labels = {label_keys.BASE_SOURCE: source} if source else {}
    config = json.dumps({"architecture": arch, "os": os_name, "config": {"Labels": labels}}).encode()
    config_digest, layer = client.put_blob(REPO, config), client.put_blob(REPO, f"layer {arch}".encode())
    body = json.dumps({"schemaVersion": 2, "mediaType": media_type,
                       "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                                  "digest": config_digest, "size": len(config)},
                       "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                                   "digest": layer, "size": 9}]}).encode()
    digest = client.put_manifest(REPO, tag or sha256_digest(body), body, media_type)
    return Child(f"{os_name}/{arch}", digest, media_type, len(body), json.loads(config))


def index(client: MemRegistry, entries: list[tuple[Child, dict]]) -> str:
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": c.media_type, "digest": c.digest, "size": c.size, "platform": p} for c, p in entries]})
    return client.put_manifest(REPO, TAG, body.encode(), OCI_INDEX)


def arm64(client: MemRegistry, tmp_path: Path, marker: str = "x", source: str = ARM64_SOURCE) -> Child:
    return base_index.rootfs_image(client, REPO, tree(tmp_path / f"rootfs-{marker}", marker),  # type: ignore[arg-type]
                                   "linux/arm64", epoch=EPOCH, cmd=["bash"],
                                   labels={label_keys.BASE_SOURCE: source}, created_by="test")


# -- picking a platform ------------------------------------------------------------------------------

def test_a_platform_is_picked_from_an_index_by_its_entry_and_config(tmp_path):
    client = MemRegistry()
    amd, arm = image(client, None, "amd64"), arm64(client, tmp_path)
    index_digest = base_index.put_index(client, REPO, TAG, [arm, amd])  # type: ignore[arg-type]
    for child in (amd, arm):
        digest, config = base_index.platform_manifest(client, REPO, TAG, child.platform)  # type: ignore[arg-type]
        assert digest == child.digest != index_digest
        assert f"{config['os']}/{config['architecture']}" == child.platform
    entries = json.loads(client.get_manifest(REPO, TAG)[0])["manifests"]
    assert [e["platform"] for e in entries] == [{"architecture": "amd64", "os": "linux"},
                                                {"architecture": "arm64", "os": "linux"}]
    assert [e["mediaType"] for e in entries] == [DOCKER_MANIFEST, OCI_MANIFEST]
    # The same set of children, the same index bytes.
    assert base_index.index_body([amd, arm]) == base_index.index_body([arm, amd])


def test_a_single_image_answers_for_its_own_platform_only():
    client = MemRegistry()
    amd = image(client, TAG, "amd64")
    assert base_index.platform_manifest(client, REPO, TAG, "linux/amd64")[0] == amd.digest  # type: ignore[arg-type]
    with pytest.raises(RegistryError, match=f"{REPO}:{TAG} is a single linux/amd64 image, not linux/arm64"):
        base_index.platform_manifest(client, REPO, TAG, "linux/arm64")  # type: ignore[arg-type]


def test_an_index_without_the_platform_is_refused_naming_what_it_has():
    client = MemRegistry()
    index(client, [(image(client, None, "amd64"), {"os": "linux", "architecture": "amd64"})])
    with pytest.raises(RegistryError, match=r"is an index of linux/amd64, without linux/arm64"):
        base_index.platform_manifest(client, REPO, TAG, "linux/arm64")  # type: ignore[arg-type]


def test_an_entry_whose_config_says_another_architecture_is_refused():
    client = MemRegistry()
    index(client, [(image(client, None, "amd64"), {"os": "linux", "architecture": "arm64"})])
    with pytest.raises(RegistryError, match="index says linux/arm64, its config says linux/amd64"):
        base_index.platform_manifest(client, REPO, TAG, "linux/arm64")  # type: ignore[arg-type]


@pytest.mark.parametrize(("descriptor", "cause"), [
    ({}, "names no platform os/architecture"),
    ({"os": "linux"}, "names no platform os/architecture"),
])
def test_an_entry_without_a_platform_is_refused(descriptor, cause):
    client = MemRegistry()
    index(client, [(image(client, None, "amd64"), descriptor)])
    with pytest.raises(RegistryError, match=cause):
        base_index.platform_manifest(client, REPO, TAG, "linux/amd64")  # type: ignore[arg-type]


def test_an_image_config_of_an_unknown_platform_is_refused():
    client = MemRegistry()
    image(client, TAG, "s390x")
    with pytest.raises(RegistryError, match="image config says linux/s390x, a platform none of linux/amd64"):
        base_index.platform_manifest(client, REPO, TAG, "linux/amd64")  # type: ignore[arg-type]


def test_an_unknown_platform_is_refused_before_the_registry_is_asked():
    with pytest.raises(platforms.UnknownPlatform, match="unknown platform 'linux/riscv64'"):
        base_index.platform_manifest(MemRegistry(), REPO, TAG, "linux/riscv64")  # type: ignore[arg-type]


def test_entries_of_platforms_outside_the_table_are_passed_over_and_duplicates_refused(tmp_path):
    """An upstream index lists s390x; BuildKit lists attestations as unknown/unknown: not ours to run."""
    client = MemRegistry()
    amd, arm = image(client, None, "amd64"), arm64(client, tmp_path)
    other = image(client, None, "s390x")
    index(client, [(other, {"os": "linux", "architecture": "s390x"}), (other, {"os": "unknown",
          "architecture": "unknown"}), (arm, {"os": "linux", "architecture": "arm64", "variant": "v8"}),
          (amd, {"os": "linux", "architecture": "amd64"})])
    assert base_index.platform_manifest(client, REPO, TAG, "linux/arm64")[0] == arm.digest  # type: ignore[arg-type]
    index(client, [(amd, {"os": "linux", "architecture": "amd64"}), (amd, {"os": "linux", "architecture": "amd64"})])
    with pytest.raises(RegistryError, match="index lists linux/amd64 twice"):
        base_index.platform_manifest(client, REPO, TAG, "linux/amd64")  # type: ignore[arg-type]


# -- the written image -------------------------------------------------------------------------------

def test_a_tree_gives_the_same_layer_every_time_with_numeric_owners_and_links_kept(tmp_path):
    root = tree(tmp_path / "rootfs")
    one, two = (base_index.rootfs_layer(root, tmp_path / f"{n}.tar.gz") for n in (1, 2))
    assert one.path.read_bytes() == two.path.read_bytes() and (one.digest, one.diff_id) == (two.digest, two.diff_id)
    data = one.path.read_bytes()
    assert data[4:8] == b"\0\0\0\0", "gzip header carries a timestamp"
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) == ["bin", "etc", "etc/os-release", "usr", "usr/bin", "usr/bin/also-true",
                                      "usr/bin/true"]
    by_name = {m.name: m for m in members}
    assert by_name["bin"].issym() and by_name["bin"].linkname == "usr/bin"
    assert by_name["usr/bin/true"].islnk() and by_name["usr/bin/true"].linkname == "usr/bin/also-true"
    assert {(m.uname, m.gname, m.mtime) for m in members} == {("", "", EPOCH)}


def test_the_written_image_states_its_platform_and_is_reproducible(tmp_path):
    client = MemRegistry()
    one = arm64(client, tmp_path, "a")
    again = arm64(client, tmp_path / "again", "a")
    other = arm64(client, tmp_path, "b")
    assert one.digest == again.digest != other.digest
    assert (one.config["architecture"], one.config["os"], one.config["created"]) == ("arm64", "linux",
                                                                                     "2026-07-11T10:16:37Z")
    assert one.config["config"] == {"Cmd": ["bash"], "Labels": {label_keys.BASE_SOURCE: ARM64_SOURCE}}
    manifest = json.loads(client.get_manifest(REPO, one.digest)[0])
    layer = client.get_blob(REPO, manifest["layers"][0]["digest"])
    assert one.config["rootfs"]["diff_ids"] == [sha256_digest(gzip.decompress(layer))]


# -- fill_bases --------------------------------------------------------------------------------------

class Made:
    """What the fakes of mmdebstrap did, in order."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.states: list[bases.ArchiveState] = []


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """bases against a MemRegistry and a fake archive: each platform's mmdebstrap writes a real (tiny) tree
    through base_index, by digest (this machine's as amd64, another's as arm64)."""
    client = MemRegistry()
    made = Made()
    monkeypatch.setattr(bases, "RegistryClient", lambda host, **_: client)
    monkeypatch.setattr(bases.platforms, "binfmt_problem", lambda name: None)
    monkeypatch.setattr(bases.platforms, "host", lambda: platforms.get("linux/amd64"))

    def make(client_, repo, suite, slim, platform, state, log, log_file):
        made.steps.append(f"mmdebstrap {platform}")
        made.states.append(state)
        if platform == "linux/amd64":
            return base_index.rootfs_image(client, REPO, tree(tmp_path / f"t{len(made.steps)}"),  # type: ignore[arg-type]
                                           "linux/amd64", epoch=EPOCH, cmd=["bash"],
                                           labels={label_keys.BASE_SOURCE: AMD64_SOURCE}, created_by="test")
        return arm64(client, tmp_path / f"t{len(made.steps)}", str(len(made.steps)))

    monkeypatch.setattr(bases, "_make_platform", make)
    return client, made


IN_RELEASE = b"Origin: Debian\nDate: Sat, 11 Jul 2026 10:16:37 UTC\n"


def fill(tmp_path: Path, wanted: list[str], logged: list[str] | None = None) -> dict[str, tuple[str, str]]:
    results = bases._debian_base(REF, "docker.io/library/debian:bookworm-slim", wanted,
                                 (logged if logged is not None else []).append, tmp_path, lambda uri: IN_RELEASE)
    return {r.platform: (r.action, r.digest) for r in results}


def test_a_current_amd64_base_becomes_the_amd64_child_and_a_second_run_is_present(fake, tmp_path):
    client, made = fake
    amd = image(client, TAG, "amd64")
    first = fill(tmp_path, BOTH)
    assert made.steps == ["mmdebstrap linux/arm64"], "the current amd64 base was made again"
    assert first["linux/amd64"] == ("present", amd.digest)
    assert first["linux/arm64"][0] == "mmdebstrap"
    assert client.get_manifest(REPO, TAG)[1] == OCI_INDEX
    assert base_index.platform_manifest(client, REPO, TAG, "linux/amd64")[0] == amd.digest  # type: ignore[arg-type]
    assert base_index.platform_manifest(client, REPO, TAG, "linux/arm64")[0] == first["linux/arm64"][1]  # type: ignore[arg-type]
    index_digest = client.manifest_digest(REPO, TAG)
    second = fill(tmp_path, BOTH)
    assert made.steps == ["mmdebstrap linux/arm64"]
    assert second == {"linux/amd64": ("present", amd.digest), "linux/arm64": ("present", first["linux/arm64"][1])}
    assert client.manifest_digest(REPO, TAG) == index_digest
    # An amd64-only cell finds its platform present in the index and leaves it alone.
    assert fill(tmp_path, ["linux/amd64"]) == {"linux/amd64": ("present", amd.digest)}


def test_nothing_there_makes_every_platform_from_one_archive_state_before_the_tag_moves(fake, tmp_path):
    client, made = fake
    results = fill(tmp_path, BOTH)
    assert made.steps == ["mmdebstrap linux/amd64", "mmdebstrap linux/arm64"]
    assert len({id(s) for s in made.states}) == 1, "each platform read the archive again: they could disagree"
    assert made.states[0].release.uri == "http://deb.debian.org/debian/dists/bookworm/InRelease"
    assert {action for action, _ in results.values()} == {"mmdebstrap"}
    for name, (_, digest) in results.items():
        assert base_index.platform_manifest(client, REPO, TAG, name)[0] == digest  # type: ignore[arg-type]


def test_one_platform_stays_a_single_image_as_today(fake, tmp_path):
    client, made = fake
    results = fill(tmp_path, ["linux/amd64"])
    assert made.steps == ["mmdebstrap linux/amd64"]
    assert client.get_manifest(REPO, TAG)[1] == OCI_MANIFEST
    assert results["linux/amd64"][1] == client.manifest_digest(REPO, TAG)


def test_a_platform_that_fails_to_bootstrap_leaves_the_tag_as_it_was(fake, monkeypatch, tmp_path):
    client, made = fake
    amd = image(client, TAG, "amd64")

    def broken(*args, **kwargs):
        raise FailedError("mmdebstrap --architectures=arm64 --variant=minbase bookworm exited 1; see log")

    monkeypatch.setattr(bases, "_make_platform", broken)
    with pytest.raises(FailedError, match="arm64.*exited 1"):
        fill(tmp_path, BOTH)
    assert client.manifest_digest(REPO, TAG) == amd.digest
    assert client.get_manifest(REPO, TAG)[1] == DOCKER_MANIFEST
    assert made.steps == [], "the amd64 base was made although it was current"


def test_an_older_recipe_child_is_made_again_and_the_current_one_kept(fake, tmp_path):
    client, made = fake
    amd = image(client, None, "amd64")
    old = arm64(client, tmp_path, "old", source="debootstrap --arch=arm64 --variant=minbase bookworm, recipe 2")
    base_index.put_index(client, REPO, TAG, [amd, old])  # type: ignore[arg-type]
    logged: list[str] = []
    results = fill(tmp_path, BOTH, logged)
    assert made.steps == ["mmdebstrap linux/arm64"]
    assert results["linux/amd64"] == ("present", amd.digest) and results["linux/arm64"][1] != old.digest
    assert any("linux/arm64 was made by" in line and "making it again" in line for line in logged)
    assert bases.stale_platforms(REF, tuple(BOTH), "bookworm") == []


def test_stale_platforms_names_what_a_build_would_miss(fake, tmp_path):
    client, _ = fake
    assert bases.stale_platforms(REF, tuple(BOTH), "bookworm") == BOTH
    image(client, TAG, "amd64")
    assert bases.stale_platforms(REF, tuple(BOTH), "bookworm") == ["linux/arm64"]


def test_a_platform_qemu_cannot_run_is_refused_before_any_mmdebstrap(fake, monkeypatch, tmp_path):
    _, made = fake
    monkeypatch.setattr(bases.platforms, "binfmt_problem", lambda name: None if name == "linux/amd64" else
                        "binfmt_misc entry qemu-aarch64 is disabled; run `update-binfmts --enable qemu-aarch64`")
    with pytest.raises(UserError, match="cannot make the linux/arm64 base .*update-binfmts --enable qemu-aarch64"):
        fill(tmp_path, BOTH)
    assert made.steps == []


def test_a_multi_platform_stand_in_needs_its_debian_base_on_each_platform(monkeypatch):
    monkeypatch.setattr(bases.platforms, "host", lambda: platforms.get("linux/amd64"))
    cell = next(c for c in fixture_matrix().cells if c.standin is not None)
    assert bases.debian_platforms(cell) == ("linux/amd64",)
    assert bases.debian_platforms(dataclasses.replace(cell, platforms=tuple(BOTH))) == tuple(BOTH)
    debian = next(c for c in fixture_matrix().cells if c.standin is None)
    assert bases.debian_platforms(dataclasses.replace(debian, platforms=tuple(BOTH))) == tuple(BOTH)


@pytest.mark.parametrize("descriptor", ["linux/amd64", ["linux", "amd64"], 7])
def test_an_entry_whose_platform_is_not_an_object_is_refused_not_a_traceback(descriptor):
    """A registry's index JSON can hold any type where `platform` belongs: AttributeError before."""
    client = MemRegistry()
    index(client, [(image(client, None, "amd64"), descriptor)])
    with pytest.raises(RegistryError, match="names no platform os/architecture"):
        base_index.platform_manifest(client, REPO, TAG, "linux/amd64")  # type: ignore[arg-type]
    with pytest.raises(platforms.UnknownPlatform, match="is not an OCI platform object"):
        platforms.from_descriptor(descriptor)  # type: ignore[arg-type]


def test_a_debian_base_is_made_with_the_hosts_index_secrets_masked_in_its_log(fake, monkeypatch, tmp_path):
    """The secrets every build log is masked with (the host's index credentials) reach mmdebstrap's log writer."""
    from buildtool.imagebuild.pipconfig import HostPip

    client, made = fake
    seen: list[object] = []
    make = bases._make_platform
    monkeypatch.setattr(bases.HostPip, "from_host",
                        classmethod(lambda cls: HostPip(index_url="https://u:s3cr3tTOKEN@pkgs.example/simple")))
    monkeypatch.setattr(bases, "_make_platform", lambda *args: seen.append(args[-1]) or make(*args))
    fill(tmp_path, ["linux/amd64"])
    assert made.steps == ["mmdebstrap linux/amd64"]
    assert seen == [bases.LogFile(tmp_path / "base-debian-bookworm-amd64.log", ["s3cr3tTOKEN"])]


@pytest.mark.parametrize(("manifests", "cause"), [
    (["sha256:" + "0" * 64], "index entry 'sha256:0+' is no descriptor with a digest"),
    ([{"mediaType": OCI_MANIFEST, "platform": {"os": "linux", "architecture": "amd64"}}],
     "index entry .{'mediaType'.* is no descriptor with a digest"),
    ({"linux/amd64": "sha256:0"}, "its manifests are not a list"),
])
def test_an_index_entry_that_is_no_descriptor_is_refused_not_a_traceback(manifests, cause):
    """Before, an entry that was no object, or named no digest, or manifests that were no list, gave an
    AttributeError or KeyError traceback instead of a RegistryError naming the entry."""
    client = MemRegistry()
    client.put_manifest(REPO, TAG, json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                                               "manifests": manifests}).encode(), OCI_INDEX)
    with pytest.raises(RegistryError, match=cause):
        base_index.platform_manifest(client, REPO, TAG, "linux/amd64")  # type: ignore[arg-type]


@pytest.mark.parametrize("config", ["sha256:0", {"mediaType": "application/vnd.oci.image.config.v1+json"}])
def test_a_manifest_whose_config_is_no_descriptor_is_refused_not_a_traceback(config):
    """Before, a manifest whose config was no object, or named no digest, gave a TypeError or KeyError traceback."""
    client = MemRegistry()
    client.put_manifest(REPO, TAG, json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config,
                                               "layers": []}).encode(), OCI_MANIFEST)
    with pytest.raises(RegistryError, match=f"{REPO}:{TAG} is not an image manifest \\(no config digest\\)"):
        base_index.platform_manifest(client, REPO, TAG, "linux/amd64")  # type: ignore[arg-type]
