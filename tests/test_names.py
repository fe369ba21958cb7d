"""The name formats stages agree on (buildtool.contracts.names): the one place that spells them, so
the only tests that write a format out literally are these."""

from __future__ import annotations

from pathlib import Path

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


@pytest.mark.parametrize("tag", ["not-a-dev-tag", "build-1234-2.13", "-2.13", "2.13", "a b-2.13"])
def test_what_is_not_a_dev_tag_does_not_parse(tag: str) -> None:
    """Fail closed: no split at a guessed '-' (a custom revision needs the cell's version to split)."""
    assert names.parse_dev_tag(tag) is None
    if tag != "build-1234-2.13":
        assert names.parse_dev_tag(tag, "2.13") is None
    else:
        assert names.parse_dev_tag(tag, "2.13") == names.DevTag("build-1234", "2.13")


def test_a_dev_tag_prints_as_its_format() -> None:
    assert str(names.DevTag("0123456789ab", "2.13")) == names.dev_tag("0123456789ab", "2.13") == "0123456789ab-2.13"


@pytest.mark.parametrize(("template", "release"), [("{version}-{release}", "0.1.0"), ("r{release}-{version}", "1.0rc1"),
                                                   ("{version}", ""), ("latest", "")])
def test_a_release_tag_parses_back_to_what_made_it(template: str, release: str) -> None:
    tag = names.expand_tag(template, "2.13", release or "9.9.9")
    parsed = names.parse_release_tag(tag, template, "2.13")
    assert parsed == names.ReleaseTag(tag, template, "2.13", release)
    if "{version}" in template:
        assert names.parse_release_tag(tag, template, "9.99") is None    # another cell's version never matches


@pytest.mark.parametrize("tag", ["2.13", "2.13-", "2.130-0.1.0", "x2.13-0.1.0", "2.13-0.1.0 "])
def test_what_the_template_did_not_make_is_not_its_release_tag(tag: str) -> None:
    assert names.parse_release_tag(tag, "{version}-{release}", "2.13") is None


def test_a_malformed_release_template_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"unknown placeholder \{rel\} in tag template '\{version\}-\{rel\}'"):
        names.parse_release_tag("2.13-1", "{version}-{rel}", "2.13")


def test_there_is_one_tag_grammar() -> None:
    from buildtool.common import refs

    assert names.TAG_RE is refs.TAG_RE


@pytest.mark.parametrize(("tag", "ok"), [
    ("a", True), ("_a", True), ("A9_.-", True), ("x" * 128, True),
    ("x" * 129, False), ("", False), (".a", False), ("-a", False), ("a/b", False), ("a:b", False), ("a b", False),
    ("a+b", False), ("ä", False), ("a\n", False),
])
def test_the_tag_grammar_at_its_boundaries(tag: str, ok: bool) -> None:
    assert bool(names.TAG_RE.match(tag)) is ok


def test_a_verdict_pin_tag_parses_back_to_the_attestation_it_names() -> None:
    subject, attestation = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    tag = names.verdict_pin_tag(subject, attestation)
    assert names.parse_verdict_pin_tag(tag, subject) == "b" * 32
    assert names.parse_verdict_pin_tag(tag, "sha256:" + "c" * 64) is None          # another subject's pin


@pytest.mark.parametrize("suffix", ["", "b" * 31, "b" * 33, "B" * 32, "x" * 32])
def test_what_is_not_a_verdict_pin_tag_does_not_parse(suffix: str) -> None:
    """An empty or short name would match any attestation digest it is compared with."""
    subject = "sha256:" + "a" * 64
    tag = f"{names.referrers_tag(subject)}{names.VERDICT_PIN_INFIX}{suffix}"
    assert names.parse_verdict_pin_tag(tag, subject) is None


def test_validate_reads_pin_tags_through_the_parser() -> None:
    """A tag `sha256-<subject>.v-` (no name) pointed at any manifest was taken as a pin before: an empty
    name is a prefix of every digest. Now it is not a pin tag at all."""
    from buildtool.validate.verdicts import Findings, _pinned

    subject, attestation = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    good = names.verdict_pin_tag(subject, attestation)
    nameless = f"{names.referrers_tag(subject)}{names.VERDICT_PIN_INFIX}"
    digests = {good: attestation, nameless: "sha256:" + "e" * 64}

    class Client:
        def tags(self, repo: str) -> list[str]:
            return [good, nameless]

        def manifest_digest(self, repo: str, tag: str) -> str:
            return digests[tag]

    findings = Findings()
    assert _pinned(Client(), "r", subject, findings) == {good: attestation}  # type: ignore[arg-type]
    assert findings.overwritten == []


@pytest.mark.parametrize("revision", ["0123456789abcdef0123456789abcdef01234567",
                                      "0123456789abcdef0123456789abcdef01234567-dirty.deadbeef"])
def test_the_revision_label_is_the_full_commit(revision: str) -> None:
    assert names.check_full_revision(revision) == revision


@pytest.mark.parametrize("bad", ["0123456789ab", "0123456789ab-dirty.deadbeef", "nightly-42",
                                 "0123456789ABCDEF0123456789ABCDEF01234567",
                                 "0123456789abcdef0123456789abcdef01234567-dirty",
                                 "0123456789abcdef0123456789abcdef01234567-dirty.dead", ""])
def test_a_revision_label_that_is_not_the_full_commit_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"is not a full commit: the revision label is the 40-hex git sha"):
        names.check_full_revision(bad)


def test_a_revision_with_a_trailing_newline_is_refused_everywhere_it_is_read() -> None:
    """`$` matched before a final newline: `<sha>\\n` passed as a full revision (a label's value went into the
    provenance, and release then blamed git for not knowing the commit), as a dev tag's revision and in a dev tag."""
    from buildtool.release.ancestry import revision_problem

    full = "0123456789abcdef0123456789abcdef01234567"
    with pytest.raises(ValueError, match=r"is not a full commit"):
        names.check_full_revision(full + "\n")
    with pytest.raises(ValueError, match=r"cannot be part of an image tag"):
        names.check_revision("0123abcd\n")
    assert names.parse_dev_tag("0123abcd-2.13\n") is None
    assert names.GIT_REVISION_RE.match("0123abcd\n") is None
    assert "is not a full commit" in revision_problem(Path("/nonexistent"), full + "\n")
