"""The order of a release's tag writes (buildtool.release.execute.promote): version tags first, read back, and only
then the moving ones, so that a moving tag never names an image whose version tag is not in the registry. The
in-memory registry (tests/memregistry.py) takes a concurrent writer's write as a registry does."""

from __future__ import annotations

from typing import Any

from buildtool.common.refs import split_repo_path
from buildtool.matrix.plan import Settings
from buildtool.release.model import ReleaseOptions
from buildtool.release.promote import release
from tests import signing
from tests.test_release_platforms import CPU, REVISION, Dev


def test_a_version_tag_found_elsewhere_after_its_write_leaves_the_moving_tags_where_they_were() -> None:
    """Before: the version tags were read back only after the moving ones were written, so a version tag that
    another writer took right after ours failed the release with `latest` already moved onto the image."""
    dev = Dev(CPU)
    digest = dev.validated("amd64")
    raw, media_type, _ = dev.client.get_manifest(dev.repo, digest)
    dev.client.put_manifest(dev.repo, dev.plan.dev_tag, raw, media_type)
    other = dev.image("amd64", payload=b"another writer's image")
    other_raw, other_type, _ = dev.client.get_manifest(dev.repo, other)
    _, rel = split_repo_path(dev.plan.release_repo)
    before = dev.image("amd64", payload=b"the previous release")
    before_raw, before_type, _ = dev.client.get_manifest(dev.repo, before)
    for tag in dev.plan.moving_tags:
        dev.client.put_manifest(rel, tag, before_raw, before_type)
    put = dev.client.put_manifest

    def racing_put(repo: str, ref: str, body: bytes, kind: str) -> str:
        written = put(repo, ref, body, kind)
        if repo == rel and ref in dev.plan.release_tags:     # another writer lands on the version tag right after
            put(repo, ref, other_raw, other_type)
        return written

    client: Any = dev.client
    client.put_manifest, client.ping, client.mount_blob = racing_put, lambda: None, lambda *_: True
    options = ReleaseOptions("0.1.0", REVISION, trusted=signing.trusted(), known_code=signing.known_code(),
                             source_check=signing.source_check(), lock_settle_s=0)
    settings = Settings(registry=f"{dev.client.host}/t", release_registry=f"{dev.client.host}/t/rel")
    [item] = release([CPU], settings, options, client_for=lambda host: client, matrix_cells=[CPU]).images
    assert item.status == "failed", item.problems
    [version] = dev.plan.release_tags
    assert item.problems[0] == (f"{dev.plan.release_repo}:{version} resolves to {other}, not {digest} after it was "
                                f"written; the moving tags {', '.join(dev.plan.moving_tags)} were not moved")
    assert {tag: dev.client.manifest_digest(rel, tag) for tag in dev.plan.moving_tags} == \
        dict.fromkeys(dev.plan.moving_tags, before)
    assert item.tags_made == []
