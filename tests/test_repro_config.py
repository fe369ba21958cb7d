"""Reproducible image digests (buildtool.imagebuild.repro_config, issue 40): the push path sets the config's
times to the commit's (SOURCE_DATE_EPOCH) and keeps BuildKit's inline cache apart, so two builds that differ
only in when they ran and in their cache metadata push one digest; the image as built stays under the cache tag.
Also: the Debian release files the apt step read (archive_state) and the cache source a signed provenance
names (cache_sources)."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from buildtool.common.errors import FailedError
from buildtool.contracts import label_keys
from buildtool.imagebuild import archive_state, cache_sources, repro_config
from buildtool.imagebuild.cache_sources import Candidate
from tests import provenance_fixture, signing
from tests.memregistry import OCI_MANIFEST, MemRegistry

REPO = "pytorch-cpu-dev"
EPOCH = 1767225600    # 2026-01-01T00:00:00Z
WHEN = "2026-01-01T00:00:00Z"


def built_config(when: str, cache: str) -> dict:
    """An image config as Docker 20.10's BuildKit writes it, `when` it ran, with its inline cache."""
    return {"architecture": "amd64", "os": "linux", "created": when,
            "config": {"Labels": {label_keys.OCI_CREATED: when[:19] + "Z", "x": "y"}},
            "history": [{"created": when, "created_by": "RUN a", "comment": "buildkit.dockerfile.v0"},
                        {"created": when, "created_by": "LABEL", "empty_layer": True}],
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "1" * 64]},
            "moby.buildkit.cache.v0": cache}


def push(client: MemRegistry, tag: str, config: dict) -> str:
    body = json.dumps(config).encode()
    digest, layer = client.put_blob(REPO, body), client.put_blob(REPO, b"the same layer")
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest,
                           "size": len(body)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer, "size": 14}]}
    return client.put_manifest(REPO, tag, json.dumps(manifest).encode(), OCI_MANIFEST)


def test_two_builds_that_differ_in_time_and_cache_push_one_digest_and_keep_each_cache_apart() -> None:
    client = MemRegistry()
    first = push(client, "a-1__push", built_config("2026-12-03T08:19:18.125680635Z", "cache-of-build-1"))
    second = push(client, "b-1__push", built_config("2026-12-03T09:40:02.5Z", "cache-of-build-2"))
    assert first != second                                   # as built: the fault this module removes
    one = repro_config.publish_normalised(client, REPO, "a-1__push", EPOCH)
    two = repro_config.publish_normalised(client, REPO, "b-1__push", EPOCH)
    assert one.digest == two.digest and one.digest not in (first, second)
    assert (one.cache, two.cache) == (first, second)
    assert client.manifest_digest(REPO, "a-1__cache") == first and client.manifest_digest(REPO, "b-1__cache") == second
    assert set(one.changed) == {"created", "history[].created", f"config.Labels[{label_keys.OCI_CREATED}]",
                                "moby.buildkit.cache.v0"}
    manifest = json.loads(client.get_manifest(REPO, "a-1__push")[0])
    config = json.loads(client.get_blob(REPO, manifest["config"]["digest"]))
    assert config["created"] == WHEN and {h["created"] for h in config["history"]} == {WHEN}
    assert config["config"]["Labels"] == {label_keys.OCI_CREATED: WHEN, "x": "y"}
    assert "moby.buildkit.cache.v0" not in config
    assert manifest["layers"] == json.loads(client.get_manifest(REPO, first)[0])["layers"]   # no layer changed


def test_a_config_already_normalised_is_left_as_it_is() -> None:
    client = MemRegistry()
    config, _ = repro_config.normalise(built_config("2026-12-03T08:19:18Z", "c"), EPOCH)
    digest = push(client, "a-1__push", config)
    assert repro_config.publish_normalised(client, REPO, "a-1__push", EPOCH) == \
        repro_config.Published(digest, "", ())
    assert client.manifest_digest(REPO, "a-1__cache") is None


def test_an_index_is_refused_naming_it() -> None:
    client = MemRegistry()
    client.put_manifest(REPO, "x__push", json.dumps({"schemaVersion": 2, "manifests": []}).encode(),
                        "application/vnd.oci.image.index.v1+json")
    with pytest.raises(FailedError, match="x__push .* is not a single image's manifest"):
        repro_config.publish_normalised(client, REPO, "x__push", EPOCH)


def test_source_date_epoch_is_the_commit_time_and_an_unknown_commit_is_refused(tmp_path: Path) -> None:
    run = {"cwd": tmp_path, "check": True, "capture_output": True}
    subprocess.run(["git", "init", "-q"], **run)   # type: ignore[call-overload]
    env = {"GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.invalid", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@example.invalid", "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "x"], env=env, **run)  # type: ignore[call-overload]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], text=True, **run).stdout.strip()  # type: ignore[call-overload]
    assert repro_config.commit_time(tmp_path, commit) == EPOCH
    assert repro_config.commit_time(tmp_path, f"{commit}-dirty.0123abcd") == EPOCH
    with pytest.raises(FailedError, match=f"git knows no commit {'f' * 40}"):
        repro_config.commit_time(tmp_path, "f" * 40)


LOG = """#5 [base 2/4] RUN --mount=type=tmpfs,target=/run touch /run/stamp
#5 0.180 Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]
#5 0.402 Get:2 http://deb.debian.org/debian bookworm/main amd64 Packages [8792 kB]
#5 0.511 Get:3 http://deb.debian.org/debian-security bookworm-security InRelease [48.0 kB]
"""
RELEASE = b"Origin: Debian\nSuite: stable\nDate: Sat, 15 Nov 2025 09:30:00 UTC\nValid-Until: x\n"


def test_the_release_files_the_apt_step_read_are_recorded_by_digest_and_date() -> None:
    assert archive_state.release_urls(LOG) == ["http://deb.debian.org/debian/dists/bookworm/InRelease",
                                               "http://deb.debian.org/debian-security/dists/bookworm-security/InRelease"]
    began = datetime(2026, 1, 1, tzinfo=UTC)
    [main, security] = archive_state.observe(LOG, began, fetch=lambda uri: RELEASE)
    assert main.date == "2025-11-15T09:30:00Z" and main.published_during_build is False
    import hashlib

    assert main.sha256 == hashlib.sha256(RELEASE).hexdigest() and security.uri.endswith("bookworm-security/InRelease")
    # A release file dated after the build began may not be the one apt read: said, never hidden.
    [late, _] = archive_state.observe(LOG, datetime(2025, 11, 1, tzinfo=UTC), fetch=lambda uri: RELEASE)
    assert late.published_during_build is True
    with pytest.raises(FailedError, match="bookworm/InRelease: not a Debian release file"):
        archive_state.observe(LOG, began, fetch=lambda uri: b"<html>proxy error</html>")
    assert archive_state.release_urls("#5 no apt here") == []


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_a_release_date_without_a_time_zone_is_refused_on_every_machine(zone: str, monkeypatch) -> None:
    """A Date with no zone was read in the machine's local time: two machines, two dates, two base digests."""
    import time

    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        with pytest.raises(FailedError, match=re.escape("names no time zone")):
            archive_state.read_release("u", lambda uri: b"Date: Sat, 10 Aug 2024 09:40:00\n")
        for said in (b"Sat, 10 Aug 2024 09:40:00 UTC", b"Sat, 10 Aug 2024 09:40:00 -0000",
                     b"Sat, 10 Aug 2024 05:40:00 -0400"):
            [found, _] = archive_state.read_release("u", lambda uri, said=said: b"Date: " + said + b"\n")
            assert found.date == "2024-08-10T09:40:00Z"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_the_cache_source_is_the_inline_cache_the_signed_provenance_names() -> None:
    client = MemRegistry()
    digest = client.push_image(REPO, "a" * 12 + "-2.13", payload=b"a")
    cache = "sha256:" + "9" * 64
    predicate = provenance_fixture.standin_provenance(digest)
    predicate["runDetails"]["byproducts"] = [{"name": "buildkit-inline-cache", "digest": {"sha256": "9" * 64},
                                              "uri": f"oci://{client.host}/{REPO}@{cache}"}]
    provenance_fixture.attest_provenance(client, REPO, digest, predicate=predicate)   # type: ignore[arg-type]
    older = client.push_image(REPO, "b" * 12 + "-2.13", payload=b"b")
    provenance_fixture.attest_provenance(client, REPO, older)   # type: ignore[arg-type]   # pushed before: none
    candidates = [Candidate("a" * 12 + "-2.13", digest, {label_keys.OCI_CREATED: "2026-12-02T00:00:00Z"}),
                  Candidate("b" * 12 + "-2.13", older, {label_keys.OCI_CREATED: "2026-12-01T00:00:00Z"})]
    chosen = cache_sources.choose(client, client.host, REPO, candidates,  # type: ignore[arg-type]
                                  signing.trusted(roles=("builder",)), print)
    assert chosen == [f"{client.host}/{REPO}@{cache}", f"{client.host}/{REPO}@{older}"]


def test_a_release_date_no_source_date_epoch_can_come_from_is_refused_naming_it() -> None:
    """The InRelease Date's Unix time is the base's SOURCE_DATE_EPOCH: a Date an offset takes past year 9999 ended
    the base build in an OverflowError traceback, and one before 1970 became a negative SOURCE_DATE_EPOCH."""
    for said, why in ((b"Fri, 31 Dec 9999 23:59:59 -0500", "is past year 9999 in UTC"),
                      (b"Thu, 01 Jan 1960 00:00:00 UTC", "is before 1970")):
        with pytest.raises(FailedError) as caught:
            archive_state.read_release("u", lambda uri, said=said: b"Date: " + said + b"\n")
        assert str(caught.value) == f"u: not a Debian release file (its Date {said.decode()!r} {why})"
    [found, date] = archive_state.read_release("u", lambda uri: b"Date: Thu, 01 Jan 1970 00:00:00 UTC\n")
    assert found.date == "1970-01-01T00:00:00Z" and date.timestamp() == 0
