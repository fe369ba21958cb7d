"""A timestamp authority's URL may carry a secret (userinfo, a query token): no message shows it, whichever
way the URL is bad (common.urls.shown_url)."""

from __future__ import annotations

import pytest

from buildtool.common import tsa
from buildtool.common.errors import FailedError, UserError
from buildtool.common.urls import shown_url


def test_a_password_beside_a_bad_port_is_masked_in_the_refusal(run_cli, monkeypatch):
    """public_url cannot parse port 99999, and the refusal showed the URL as given, password and all."""
    code, out, err = run_cli("validate", "--tsa", "https://user:hunter2@tsa.example:99999/tsr", "x")
    assert code == 2 and "hunter2" not in err
    assert "--tsa: 'https://****@tsa.example:99999/tsr' carries credentials" in err, err
    monkeypatch.setenv(tsa.TSA_URL_ENV, "https://user:hunter2@tsa.example:99999/tsr")
    with pytest.raises(UserError) as refused:
        tsa.configured_url()
    assert "hunter2" not in str(refused.value) and "'https://****@tsa.example:99999/tsr'" in str(refused.value)


def test_a_token_in_the_query_never_reaches_the_failure(monkeypatch):
    monkeypatch.setenv(tsa.TSA_URL_ENV, "http://127.0.0.1:1/tsr?token=SECRET#frag")
    with pytest.raises(FailedError) as failed:
        tsa.request_timestamp(tsa.configured_url(), b"x")
    assert str(failed.value) == "the timestamp authority http://127.0.0.1:1/tsr cannot be reached (ConnectionError)"


@pytest.mark.parametrize(("url", "shown"), [
    ("https://tsa.example/tsr?token=s", "https://tsa.example/tsr"),
    ("https://u:p@tsa.example:99999/tsr?t=s", "https://****@tsa.example:99999/tsr"),
    ("tsa.example/tsr?token=s#x", "tsa.example/tsr"),
    ("https://TOKEN@[::1/tsr", "https://****@[::1/tsr"),
])
def test_shown_url_keeps_no_secret(url: str, shown: str):
    assert shown_url(url) == shown




@pytest.mark.parametrize(("url", "shown"), [
    ("https://user:abc/def==@tsa.example/tsr", "https://tsa.example/tsr"),
    ("https://user:abc/def==@tsa.example:99999/tsr", "https://****@tsa.example:99999/tsr"),
    ("https://user:ab?cd@tsa.example/tsr", "https://tsa.example/tsr"),
    ("https://tok#en@tsa.example/tsr", "https://tsa.example/tsr"),
    ("user:secret@tsa.example/tsr", "****@tsa.example/tsr"),
])
def test_a_secret_with_a_slash_question_mark_or_hash_is_masked_whole(url: str, shown: str):
    """A password with an unescaped `/`, `?` or `#` ends the authority early for a URL parser: the mask stopped
    there and a message showed the password whole (`https://user:abc/def==@...`) or in part (`https://user:ab`)."""
    assert shown_url(url) == shown


def test_a_tsa_url_whose_password_holds_a_slash_never_reaches_the_failure(monkeypatch):
    """`user:abc/def==@host` passes url_problem (a URL parser reads the host `user`); the failure named the URL
    as given, password and all."""
    monkeypatch.setenv(tsa.TSA_URL_ENV, "http://user:abc/def==@127.0.0.1:1/tsr")
    with pytest.raises(FailedError) as failed:
        tsa.request_timestamp(tsa.configured_url(), b"x")
    assert "abc" not in str(failed.value) and str(failed.value).startswith("the timestamp authority "
                                                                           "http://127.0.0.1:1/tsr "), failed.value
