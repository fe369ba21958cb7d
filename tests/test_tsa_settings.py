"""How the timestamp settings are read: DL_IMAGES_TSA_URL by one reader (buildtool.common.tsa), whichever command or
writer asks, and DL_IMAGES_TSA_CERTS likewise; empty is unset, white space only is refused naming the variable."""

from __future__ import annotations

import pytest

from buildtool.common import tsa
from buildtool.common.errors import UserError


@pytest.mark.parametrize("blank", [" ", "\t", "  \n"])
def test_a_tsa_setting_of_white_space_only_is_refused_naming_it_by_every_reader(run_cli, monkeypatch,
                                                                                blank: str) -> None:
    """Before, `--tsa`'s click envvar took "  " as a URL and refused it as `--tsa: ' ' is not an http(s) URL`
    (an option the user never gave), while the writers' reader (tsa.configured_url) stripped it and wrote bundles
    with no timestamp; DL_IMAGES_TSA_CERTS of white space read as unset, so readers asked for no timestamp. Now
    one reader decides: one line naming the variable, exit 2."""
    monkeypatch.setenv(tsa.TSA_URL_ENV, blank)
    said = f"{tsa.TSA_URL_ENV} is set to white space only: name a timestamp authority's URL"
    for command in (["build", "--framework", "pytorch-cpu"], ["validate", "x"]):
        code, _, err = run_cli(*command)
        assert code == 2 and err.strip().startswith(f"error: {said}") and err.count("\n") == 1, err
    with pytest.raises(UserError, match=f"^{said}"):
        tsa.configured_url()
    monkeypatch.delenv(tsa.TSA_URL_ENV)
    monkeypatch.setenv(tsa.TSA_CERTS_ENV, blank)
    with pytest.raises(UserError, match=f"^{tsa.TSA_CERTS_ENV} is set to white space only: name a PEM file"):
        tsa.configured_authority()


def test_an_empty_tsa_setting_is_unset_and_a_padded_one_is_read_alike_everywhere(run_cli, monkeypatch) -> None:
    monkeypatch.setenv(tsa.TSA_URL_ENV, "")
    monkeypatch.setenv(tsa.TSA_CERTS_ENV, "")
    assert tsa.configured_url() == "" and tsa.configured_authority() is None
    monkeypatch.setenv(tsa.TSA_URL_ENV, " https://tsa.example/tsr ")
    assert tsa.configured_url() == "https://tsa.example/tsr"
    code, _, err = run_cli("build", "--framework", "no-such-image")
    assert code == 2 and "unknown FRAMEWORK" in err and "TSA" not in err and "--tsa" not in err, err
