"""A timestamp authority's URL may carry a secret (userinfo, a query token): no message shows it, whichever
way the URL is bad (common.urls.shown_url)."""

from __future__ import annotations

import re

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
    """`user:abc/def==@host`: a URL parser reads the host `user` (port `abc`); the failure named the URL as given,
    password and all. url_problem now refuses it up front as carrying credentials (an `@`), never showing them."""
    monkeypatch.setenv(tsa.TSA_URL_ENV, "http://user:abc/def==@127.0.0.1:1/tsr")
    with pytest.raises(UserError) as refused:
        tsa.configured_url()
    assert "abc" not in str(refused.value) and str(refused.value) == (
        f"{tsa.TSA_URL_ENV}: 'http://127.0.0.1:1/tsr' carries credentials: name the timestamp authority without them")


@pytest.mark.parametrize("port", ["99999", "abc", "0", "+80", "-1"])
def test_a_tsa_url_with_a_bad_port_is_refused_naming_it(run_cli, monkeypatch, port: str):
    """url_problem read the host alone: a port past 65535 or not a number passed, and urllib raised at the first
    request (a traceback); port 0 connected nowhere."""
    url = f"https://tsa.example:{port}/tsr"
    assert tsa.url_problem(url).startswith("has a bad port: name a port from 1 to 65535")
    code, _, err = run_cli("validate", "--tsa", url, "x")
    assert code == 2 and f"--tsa: {url!r} has a bad port" in err, err
    monkeypatch.setenv(tsa.TSA_URL_ENV, url)
    with pytest.raises(UserError, match=f"{tsa.TSA_URL_ENV}: '{re.escape(url)}' has a bad port"):
        tsa.configured_url()


@pytest.mark.parametrize("url", ["https://tsa.example:8443/tsr", "http://tsa.example/tsr", "https://[::1]:1/tsr"])
def test_a_tsa_url_with_a_good_port_or_none_passes(url: str):
    assert tsa.url_problem(url) == ""


def test_an_at_sign_past_the_scheme_is_refused_as_credentials():
    """`https://tok/en@host`: a URL parser reads host `tok` and no credentials, and the URL passed url_problem."""
    assert tsa.url_problem("https://tok/en@tsa.example/tsr") == "carries credentials: name the timestamp authority " \
                                                              "without them"
