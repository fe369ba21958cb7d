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


def test_a_push_with_tsa_certs_and_no_authority_to_ask_is_refused_before_anything_is_written(
        run_cli, monkeypatch, tmp_path) -> None:
    """DL_IMAGES_TSA_CERTS set and no DL_IMAGES_TSA_URL: every push wrote Sigstore bundles with no RFC 3161 timestamp,
    which release and verify then refuse (they ask every bundle for one with the certificates set), and each re-push
    added another (ensure_bundle cannot read the last as one already there). Now build --push, validate's store and
    attach_bundle refuse first, with one line naming both variables; a build that pushes nothing, and a push that
    names an authority (--tsa or the variable), are not refused."""
    from buildtool.attest.bundles import attach_bundle
    from tests import signing
    from tests.memregistry import MemRegistry

    certs = tmp_path / "tsa.pem"
    certs.write_text("")
    monkeypatch.delenv(tsa.TSA_URL_ENV, raising=False)
    monkeypatch.setenv(tsa.TSA_CERTS_ENV, str(certs))
    said = (f"{tsa.TSA_CERTS_ENV} names a timestamp authority to trust, and neither {tsa.TSA_URL_ENV} nor --tsa "
            "names one to ask")
    code, _, err = run_cli("build", "--push", "--framework", "no-such-image")
    assert code == 2 and err.startswith(f"error: {said}") and f"set {tsa.TSA_URL_ENV}" in err, err
    assert f"unset {tsa.TSA_CERTS_ENV}" in err and err.count("\n") == 1, err
    client = MemRegistry()
    digest = client.push_image("team/x", "t")
    held = (dict(client.manifests), dict(client.blobs))
    with pytest.raises(UserError, match=f"^{said}"):
        attach_bundle(client, "team/x", digest, signing.envelope("r", digest, {"x": 1}),  # type: ignore[arg-type]
                      "https://slsa.dev/provenance/v1")
    assert (client.manifests, client.blobs) == held          # nothing written
    for args in (["build", "--framework", "no-such-image"],
                 ["build", "--push", "--tsa", "https://tsa.example/tsr", "--framework", "no-such-image"]):
        code, _, err = run_cli(*args)
        assert code == 2 and "unknown FRAMEWORK" in err and "TSA" not in err, err
    tsa.check_writer("https://tsa.example/tsr", writes=True)
    monkeypatch.setenv(tsa.TSA_URL_ENV, "https://tsa.example/tsr")
    tsa.check_writer(None, writes=True)


def test_validate_that_would_store_a_verdict_with_tsa_certs_and_no_authority_is_refused_before_the_tests(
        monkeypatch, tmp_path) -> None:
    """The verdict validate stores is published as a Sigstore bundle too: refused before the tests run (as a bad
    signing key is), not after them with the verdict half written."""
    import dataclasses

    from buildtool.validate import runner
    from buildtool.validate.options import Options
    from buildtool.validate.probe import Inventory
    from tests.test_validate_reports_lock import IMAGE, MATRIX, REPO

    monkeypatch.delenv(tsa.TSA_URL_ENV, raising=False)
    monkeypatch.setenv(tsa.TSA_CERTS_ENV, str(tmp_path / "tsa.pem"))
    image = dataclasses.replace(IMAGE, host="127.0.0.1:5999", repo="pytorch-cpu-dev")
    monkeypatch.setattr(runner, "gpu_inventory", lambda: Inventory([], problem="nvidia-smi not found"))
    monkeypatch.setattr(runner, "resolve", lambda *_a, **_k: image)
    monkeypatch.setattr("buildtool.attest.keys.signing_key", lambda *_a, **_k: object())
    monkeypatch.setattr("buildtool.validate.sbomref.verdict_sbom", lambda *_a: ("", "no registry"))
    monkeypatch.setattr(runner, "probe_flags", lambda _image, flags, *_a, **_k: (flags, []))
    monkeypatch.setattr(runner, "label_checks", lambda *_a: [])
    monkeypatch.setattr(runner, "_run", lambda *_a: pytest.fail("the tests ran"))
    options = Options(store=True, rerun=True, reports=tmp_path / "reports")
    with pytest.raises(UserError, match=f"^{tsa.TSA_CERTS_ENV} names a timestamp authority to trust, and neither"):
        runner.validate_image(image.ref, MATRIX, REPO, options, print)
    assert not (tmp_path / "reports").exists()
