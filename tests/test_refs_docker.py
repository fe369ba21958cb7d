"""References are normalised as Docker normalises them (issue 51): the toolkit's parser against docker-image-py, a
port of distribution's reference package (ParseNormalizedNamed), on a table of references users write. Before,
`index.docker.io/ubuntu:22.04` was repository `ubuntu` on Docker Hub, which has no such repository; Docker's rules
give `docker.io/library/ubuntu`. Both accept the same references, and agree on registry, repository, tag and
digest; what distribution refuses, the toolkit refuses too."""

from __future__ import annotations

import pytest
from docker_image import reference as distribution

from buildtool.common.refs import ReferenceError, api_host, is_docker_hub, parse_reference

D = "sha256:" + "a" * 64

TABLE = [
    # Docker Hub spellings
    "ubuntu", "ubuntu:22.04", "library/ubuntu", "docker.io/ubuntu", "docker.io/library/ubuntu:22.04",
    "index.docker.io/ubuntu:22.04", "index.docker.io/library/ubuntu", "index.docker.io/team/app:1",
    "nvidia/cuda:12.4.1-base-ubuntu22.04", "docker.io/nvidia/cuda", f"ubuntu@{D}", f"ubuntu:22.04@{D}",
    # other registries, ports, paths
    "nvcr.io/nvidia/pytorch:25.10-py3", "ghcr.io/org/team/image:v1", "quay.io/a/b", "gcr.io/p/x/y/z:tag",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com/app:latest", "registry.example.com:5000/team/app",
    "127.0.0.1:5000/pytorch-cpu-dev:abc-2.13", f"127.0.0.1:5000/p@{D}", "localhost/app", "localhost:5000/a/b:1",
    "my-registry/app",   # no '.', ':' or localhost: a path on Docker Hub, as Docker reads it
    # IPv6
    "[::1]:5000/app:1", f"[2001:db8::1]:5000/team/app@{D}", "[::1]/app",
    # separators and case
    "a/b__c/d-e.f:tag_1", "a.b/c", "A.example.com/x",
    "Upper/app",   # an upper-case first part is a registry host to distribution (splitDockerDomain), not a refusal
    # refused by both
    "ubuntu:", "ubuntu:-x", "a//b", "ubuntu@sha256:abc", "UBUNTU", "/ubuntu", "ubuntu/",
    "a/b:" + "t" * 129, "ubu ntu",
    "[::ffff:1.2.3.4]/a", "[::ffff:127.0.0.1]:5000/a:1",   # IPv4-mapped IPv6: distribution's ipv6address is hex and ':'
    "[fd00:1:2::3%eth0]:5000/a",   # a zone: refused by both
]


def distribution_parse(text: str) -> tuple[str, str, str, str] | None:
    """(registry, repository, tag, digest) as distribution normalises `text`; None when it refuses it."""
    try:
        ref = distribution.Reference.parse_normalized_named(text)
    except Exception:   # noqa: BLE001 (docker-image-py raises its own error classes, and ValueError)
        return None
    repo = ref.repository
    return repo["domain"], repo["path"], ref["tag"] or "", ref["digest"] or ""


def toolkit_parse(text: str) -> tuple[str, str, str, str] | None:
    try:
        ref = parse_reference(text)
    except ReferenceError:
        return None
    return ref.registry, ref.repository, ref.tag, ref.digest


def test_the_table_is_at_least_thirty_references_with_refusals() -> None:
    assert len(TABLE) >= 30 and sum(distribution_parse(t) is None for t in TABLE) >= 8


@pytest.mark.parametrize("text", TABLE)
def test_normalised_as_distribution_normalises(text: str) -> None:
    assert toolkit_parse(text) == distribution_parse(text)


def test_index_docker_io_is_docker_hub_with_library() -> None:
    assert toolkit_parse("index.docker.io/ubuntu:22.04") == ("docker.io", "library/ubuntu", "22.04", "")


@pytest.mark.parametrize(("host", "api"), [("docker.io", "registry-1.docker.io"),
                                           ("index.docker.io", "registry-1.docker.io"),
                                           ("registry-1.docker.io", "registry-1.docker.io"),
                                           ("nvcr.io", "nvcr.io"), ("127.0.0.1:5000", "127.0.0.1:5000")])
def test_one_map_of_docker_hubs_hosts(host: str, api: str) -> None:
    assert api_host(host) == api and is_docker_hub(host) == (api == "registry-1.docker.io")


@pytest.mark.parametrize("digest", ["sha512:" + "a" * 64, "sha384:" + "a" * 64, "sha384:" + "A" * 96,
                                    "sha512:" + "F" * 128, "md5:" + "a" * 32, "foo:" + "a" * 32,
                                    "Foo+bar:" + "a" * 32, "sha384:" + "a" * 96, "sha512:" + "b" * 128])
def test_a_digest_is_taken_as_distribution_takes_it(digest: str) -> None:
    """The toolkit took any `algorithm:hex` of 32 or more digits: `img@sha512:<64 hex>` or `img@md5:...` was a
    reference, which distribution (digest.Parse: sha256, sha384, sha512 at their lengths, lower case) refuses and
    no registry can serve; the command went on to ask for it. Both take and refuse the same digests now."""
    for text in (f"ubuntu@{digest}", f"127.0.0.1:5000/team/app:1@{digest}"):
        assert toolkit_parse(text) == distribution_parse(text), text
    refused = distribution_parse(f"ubuntu@{digest}") is None
    if refused:
        with pytest.raises(ReferenceError, match="digest") as caught:
            parse_reference(f"ubuntu@{digest}")
        assert "credentials" not in str(caught.value)


@pytest.mark.parametrize("text", ["a" * 64, "0123456789abcdef" * 4])
def test_an_image_id_is_refused_as_distribution_refuses_it(text: str) -> None:
    """64 hex digits were Docker Hub's `library/<hex>` to the toolkit, while docker takes them for a local image's ID
    (distribution's ParseNormalizedNamed refuses them as a name): the toolkit asked Docker Hub for one image where
    docker runs another. Refused now, saying why; with a tag, or under a path, both still take it as a name."""
    assert distribution_parse(text) is None
    with pytest.raises(ReferenceError, match="is an image ID") as caught:
        parse_reference(text)
    assert "\n" not in str(caught.value)
    for named in (f"{text}:1", f"team/{text}", f"{text[:63]}"):
        assert toolkit_parse(named) == distribution_parse(named) is not None, named
