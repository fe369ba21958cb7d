"""The name formats stages agree on (buildtool.contracts.names): the one place that spells them, so
the only tests that write a format out literally are these."""

from __future__ import annotations

import pytest

from buildtool.contracts import names


def test_dev_image_is_named_by_revision_and_cell_version() -> None:
    assert names.dev_repo("127.0.0.1:5000/", "pytorch-cpu") == "127.0.0.1:5000/pytorch-cpu-dev"
    assert names.dev_tag("0123456789ab", "2.13") == "0123456789ab-2.13"
    assert names.release_repo("reg.example/ml", "pytorch-cpu") == "reg.example/ml/pytorch-cpu"


@pytest.mark.parametrize("revision", ["0123456789ab", "0123456789ab-dirty.deadbeef", "build-1234"])
@pytest.mark.parametrize("version", ["2.13", "25.10", "2.13-rc1"])
def test_a_dev_tag_parses_back_to_what_made_it(revision: str, version: str) -> None:
    tag = names.dev_tag(revision, version)
    assert names.parse_dev_tag(tag, version) == names.DevTag(revision, version)
    assert names.parse_dev_tag(tag, "9.99") is None                   # another cell's version never matches
    if revision != "build-1234":                                        # a git revision splits without help
        assert names.parse_dev_tag(tag) == names.DevTag(revision, version)


def test_the_dev_repository_names_its_image() -> None:
    assert names.image_of_repo_path("team/pytorch-cpu-dev") == "pytorch-cpu"
    assert names.image_of_repo_path(names.dev_repo("h:1/x", "tensorflow-cpu").split("/", 1)[1]) == "tensorflow-cpu"


@pytest.mark.parametrize("bad", ["a b", "-x", "x/y", "$(id)", ""])
def test_a_revision_that_cannot_be_in_a_tag_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="cannot be part of an image tag"):
        names.check_revision(bad)
