"""A matrix URL that carries a secret (userinfo, a token with an unescaped `/`, a query or a fragment) is refused, and
the refusal, which reaches the terminal and CI's log, names the URL without it (matrix.values._url_of)."""

from __future__ import annotations

import pytest

from buildtool.matrix import values


@pytest.mark.parametrize(("check", "text", "shown", "why"), [
    (values.source_url, "https://x-access-token:ghs_s3cr3t@github.com/dl-images/dl-images",
     "https://github.com/dl-images/dl-images", "carries credentials"),
    (values.index_url, "https://s3cr3t@pypi.example.org/simple", "https://pypi.example.org/simple",
     "carries credentials"),
    (values.index_url, "https://user:ab/s3cr3t@pypi.example.org/simple", "https://pypi.example.org/simple",
     "carries credentials"),
    (values.index_url, "https://tok/s3cr3t@pypi.example.org/simple", "https://pypi.example.org/simple",
     "carries credentials"),
    (values.index_url, "ftp://user:s3cr3t@pypi.example.org/simple", "ftp://pypi.example.org/simple",
     "carries credentials"),
    (values.index_url, "https://pypi.example.org/simple?token=s3cr3t", "https://pypi.example.org/simple",
     "contains '?'"),
    (values.index_url, "https://pypi.example.org/simple#s3cr3t", "https://pypi.example.org/simple",
     "contains '#'"),
])
def test_a_refused_url_never_shows_its_secret(check, text: str, shown: str, why: str) -> None:
    """The refusal quoted the URL as written: `'https://user:secret@host/...' carries credentials` printed the
    token it refused; a token after an unescaped `/` (`https://tok/s3cr3t@host`) was not even refused (a URL parser
    reads host `tok`), and went on into the SBOM's purls and the provenance."""
    with pytest.raises(ValueError) as refused:
        check(text)
    said = str(refused.value)
    assert "s3cr3t" not in said, said
    assert said.startswith(f"{shown!r} {why}"), said


def test_an_at_sign_in_a_file_urls_path_is_still_a_path() -> None:
    assert values.index_url("file:///opt/wheels@2/simple") == "file:///opt/wheels@2/simple"
