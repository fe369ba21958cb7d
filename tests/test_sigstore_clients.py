"""The toolkit's Sigstore bundles as Sigstore's own clients read them (issue 52), each with the options it needs
for a keyed bundle without a transparency log (docs/release-trust.md, "Which Sigstore verifiers accept these
bundles"), and optional RFC 3161 timestamps from a timestamp authority on loopback (tests/tsa.py).

- sigstore-models (sigstore-python's pydantic models) parses them; without `tlogEntries` it refuses them
  (what an outside check found: the key is required there), so the writer's `tlogEntries: []` is what it reads.
- sigstore-protobuf-specs (betterproto) parses them, the timestamp's bytes included.
- sigstore-js (@sigstore/verify 4.x, tools/sigstore-verify) verifies them with the thresholds the top-level
  `sigstore.verify({tlogThreshold: 0})` gives its Verifier when a timestamp authority is trusted, and with
  every threshold 0 without one; without a timestamp it refuses with the outside check's own message.
- The toolkit's reader verifies the timestamp with the authority's certificates (DL_IMAGES_TSA_CERTS), and
  refuses one it cannot verify, naming why.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import warnings
from pathlib import Path

import pytest
from sigstore_models.bundle.v1 import Bundle as ModelsBundle

with warnings.catch_warnings():   # its generated models use a pydantic form pydantic 2.12 deprecates
    warnings.simplefilter("ignore", DeprecationWarning)
    from sigstore_protobuf_specs.dev.sigstore.bundle.v1 import Bundle as ProtobufBundle

from buildtool.attest import sigstore_bundle
from buildtool.attest.bundles import attach_bundle, timestamp_check
from buildtool.attest.keys import trusted_entry
from buildtool.attest.provenance_model import PREDICATE_TYPE
from buildtool.attest.provenance_store import find_provenance
from buildtool.common import tsa
from buildtool.common.errors import FailedError, UserError
from tests import bundle_check, signing
from tests.memregistry import MemRegistry
from tests.test_sigstore_bundle import only
from tests.test_verify import LABELS, REPO
from tests.tsa import LoopbackTsa
from tests.tuf_repo import TufRepository

DIGEST = "sha256:" + "1" * 64


@pytest.fixture
def authority(tmp_path: Path):
    with LoopbackTsa(tmp_path) as running:
        yield running


def _envelope() -> bytes:
    return signing.envelope("r", DIGEST, {"x": 1})


def _stamped(authority: LoopbackTsa) -> bytes:
    env = _envelope()
    return sigstore_bundle.bundle(env, [tsa.request_timestamp(authority.url, sigstore_bundle.signature_bytes(env))])


def test_sigstore_models_parses_the_bundle_and_needs_its_empty_transparency_log_list() -> None:
    data = sigstore_bundle.bundle(_envelope())
    parsed = ModelsBundle.model_validate_json(data)
    env = json.loads(_envelope())
    assert parsed.verification_material.public_key.hint == signing.KEY.keyid
    assert parsed.verification_material.tlog_entries == []
    assert parsed.dsse_envelope.payload_type == env["payloadType"]
    assert base64.b64encode(parsed.dsse_envelope.signatures[0].sig).decode() == env["signatures"][0]["sig"]
    # The fault an outside check found: the same bundle without the key does not parse.
    body = json.loads(data)
    del body["verificationMaterial"]["tlogEntries"]
    with pytest.raises(ValueError, match=r"verificationMaterial\.tlogEntries\n  Field required"):
        ModelsBundle.model_validate_json(json.dumps(body))


def test_sigstore_protobuf_specs_parses_the_bundle_and_its_timestamp(authority: LoopbackTsa) -> None:
    data = _stamped(authority)
    parsed = ProtobufBundle.from_dict(json.loads(data))
    material = parsed.verification_material
    assert parsed.media_type == sigstore_bundle.BUNDLE_MEDIA_TYPE
    assert material.public_key.hint == signing.KEY.keyid and material.tlog_entries == []
    [stamp] = material.timestamp_verification_data.rfc3161_timestamps
    written = json.loads(data)["verificationMaterial"]["timestampVerificationData"]["rfc3161Timestamps"][0]
    assert stamp.signed_timestamp == base64.b64decode(written["signedTimestamp"])
    assert ModelsBundle.model_validate_json(data).verification_material.timestamp_verification_data is not None


def test_a_timestamp_is_verified_with_the_authority_named_and_refused_without_it(
        authority: LoopbackTsa, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _stamped(authority)
    env = json.loads(_envelope())
    monkeypatch.setenv(tsa.TSA_CERTS_ENV, str(authority.certs))
    assert json.loads(sigstore_bundle.envelope(data, timestamp_check())) == env
    # No authority trusted: refused as before (issue 48), naming the timestamp and the setting.
    with pytest.raises(sigstore_bundle.BundleError, match="carries RFC 3161 timestamps.*DL_IMAGES_TSA_CERTS"):
        sigstore_bundle.envelope(data)
    # Another authority's certificates: the signature chain does not lead to them.
    with LoopbackTsa(tmp_path, "another TSA") as other:
        monkeypatch.setenv(tsa.TSA_CERTS_ENV, str(other.certs))
        with pytest.raises(sigstore_bundle.BundleError, match="timestamp 1 does not verify with the timestamp "
                                                              "authority of .*another-TSA.pem"):
            sigstore_bundle.envelope(data, timestamp_check())
    # A timestamp over another signature (moved from another bundle): the imprint is not this signature's.
    monkeypatch.setenv(tsa.TSA_CERTS_ENV, str(authority.certs))
    body = json.loads(data)
    moved = json.loads(_stamped(authority))["verificationMaterial"]["timestampVerificationData"]
    env2 = json.loads(signing.envelope("r", DIGEST, {"x": 2}))
    body.update(dsseEnvelope=env2)
    body["verificationMaterial"]["timestampVerificationData"] = moved
    with pytest.raises(sigstore_bundle.BundleError, match="Mismatch between messages"):
        sigstore_bundle.envelope(json.dumps(body).encode(), timestamp_check())


def test_push_with_a_tsa_stamps_each_bundle_and_readers_verify_it(
        authority: LoopbackTsa, monkeypatch: pytest.MonkeyPatch) -> None:
    client = MemRegistry()
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    monkeypatch.setenv(tsa.TSA_URL_ENV, authority.url)
    from tests.test_sigstore_bundle import with_provenance_bundle
    with_provenance_bundle(client, digest)
    assert authority.requests == 1
    only(client, digest)    # the bundle is all a reader finds
    monkeypatch.delenv(tsa.TSA_URL_ENV)
    found = find_provenance(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    assert found.provenance is None and "carries RFC 3161 timestamps" in found.rejected[0][1]
    monkeypatch.setenv(tsa.TSA_CERTS_ENV, str(authority.certs))
    found = find_provenance(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    assert found.provenance is not None, found.rejected


NO_TIMESTAMP = ("unverifiable: the Sigstore bundle carries no RFC 3161 timestamp, and DL_IMAGES_TSA_CERTS names a "
                "timestamp authority to trust: each bundle must carry its timestamp (write it with --tsa URL), or "
                "unset DL_IMAGES_TSA_CERTS")


@pytest.mark.parametrize("material", [None, {}, {"rfc3161Timestamps": []}])
def test_with_a_timestamp_authority_trusted_a_bundle_without_a_timestamp_is_refused_naming_it(
        authority: LoopbackTsa, monkeypatch: pytest.MonkeyPatch, material: dict[str, object] | None) -> None:
    """A reader told to trust an authority (DL_IMAGES_TSA_CERTS) took a bundle no authority dated, where sigstore-js
    with that authority trusted (timestamp threshold 1) refuses it: "expected 1 timestamps, got 0"."""
    body = json.loads(_stamped(authority))
    if material is None:
        del body["verificationMaterial"]["timestampVerificationData"]
    else:
        body["verificationMaterial"]["timestampVerificationData"] = material
    data = json.dumps(body).encode()
    assert json.loads(sigstore_bundle.envelope(data)) == json.loads(_envelope())    # no authority trusted: as before
    monkeypatch.setenv(tsa.TSA_CERTS_ENV, str(authority.certs))
    with pytest.raises(sigstore_bundle.BundleError) as refused:
        sigstore_bundle.envelope(data, timestamp_check())
    assert str(refused.value) == NO_TIMESTAMP


def test_with_a_timestamp_authority_trusted_release_readers_refuse_a_bundle_pushed_without_tsa(
        authority: LoopbackTsa, monkeypatch: pytest.MonkeyPatch) -> None:
    client = MemRegistry()
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    from tests.test_sigstore_bundle import with_provenance_bundle
    with_provenance_bundle(client, digest)    # no DL_IMAGES_TSA_URL: no timestamp
    only(client, digest)    # the bundle is all a reader finds
    assert find_provenance(client, REPO, digest, signing.trusted()).provenance is not None  # type: ignore[arg-type]
    monkeypatch.setenv(tsa.TSA_CERTS_ENV, str(authority.certs))
    found = find_provenance(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    assert found.provenance is None and [why for _, why in found.rejected] == [NO_TIMESTAMP], found.rejected


def test_a_tsa_setting_that_names_no_authority_or_one_that_does_not_answer_fails_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    client = MemRegistry()
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    for bad, cause in (("ftp://tsa.example/", r"not an http\(s\) URL"), ("https://u:p@tsa.example/", "credentials")):
        monkeypatch.setenv(tsa.TSA_URL_ENV, bad)
        with pytest.raises(UserError, match=f"DL_IMAGES_TSA_URL: .*{cause}"):
            attach_bundle(client, REPO, digest, _envelope(), PREDICATE_TYPE)   # type: ignore[arg-type]
    monkeypatch.setenv(tsa.TSA_URL_ENV, "http://127.0.0.1:9/tsr")
    with pytest.raises(FailedError, match="timestamp authority http://127.0.0.1:9/tsr cannot be reached"):
        attach_bundle(client, REPO, digest, _envelope(), PREDICATE_TYPE)   # type: ignore[arg-type]


# -- sigstore-js --------------------------------------------------------------------------------------------

def _keys(folder: Path) -> Path:
    path = folder / "trusted-keys.yaml"
    path.write_text("keys:\n" + trusted_entry("builder", signing.KEY.public(), ("builder",)))
    return path


@pytest.mark.sigstore_js
def test_sigstore_js_verifies_a_timestamped_bundle_with_the_authority_trusted(
        authority: LoopbackTsa, tmp_path: Path) -> None:
    keys = _keys(tmp_path)
    stamped, plain = tmp_path / "stamped.json", tmp_path / "plain.json"
    stamped.write_bytes(_stamped(authority))
    plain.write_bytes(sigstore_bundle.bundle(_envelope()))
    # With the loopback authority trusted, the Verifier's default timestamp threshold (1): what
    # sigstore.verify() demands. The plain bundle is refused with the message the outside check saw.
    rc, outs = bundle_check.run_verifier(keys, "builder", DIGEST, stamped, plain, tsa_certs=authority.certs)
    assert rc == 1 and outs[0]["verified"] is True, outs
    assert (outs[1]["verified"], outs[1]["code"], outs[1]["reason"]) == (
        False, "TIMESTAMP_ERROR", "expected 1 timestamps, got 0"), outs
    # Without an authority (every threshold 0): the plain bundle verifies; the stamped one is refused, its
    # timestamp being by an authority nobody trusts.
    rc, outs = bundle_check.run_verifier(keys, "builder", DIGEST, plain, stamped)
    assert rc == 1 and outs[0]["verified"] is True, outs
    assert (outs[1]["code"], outs[1]["reason"]) == ("TIMESTAMP_ERROR", "timestamp could not be verified"), outs
    # Another authority trusted: this timestamp is not its.
    with LoopbackTsa(tmp_path, "another TSA") as other:
        rc, [out] = bundle_check.run_verifier(keys, "builder", DIGEST, stamped, tsa_certs=other.certs)
    assert rc == 1 and (out["code"], out["reason"]) == ("TIMESTAMP_ERROR", "timestamp could not be verified"), out
    # The signature still decides: one payload byte changed is refused even with a good timestamp.
    rc, [out] = bundle_check.run_verifier(keys, "builder", DIGEST, bundle_check.one_byte_changed(stamped),
                                          tsa_certs=authority.certs)
    assert rc == 1 and out["code"] == "SIGNATURE_ERROR", out


@pytest.mark.sigstore_js
def test_sigstore_js_verifier_refuses_an_older_node(tmp_path: Path) -> None:
    """@sigstore/verify 4.x needs Node >= 22.22.2: the script refuses another Node rather than run unsupported."""
    fake = tmp_path / "versions.js"
    fake.write_text("Object.defineProperty(process.versions, 'node', {value: '20.20.2'});\n")
    done = subprocess.run([str(bundle_check.NODE), "-r", str(fake), str(bundle_check.VERIFIER / "verify.js"),
                           "--keys", str(_keys(tmp_path)), "x.json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Node 20.20.2 is older than @sigstore/verify 4.x needs (22.22.2)" in done.stderr


def test_the_tsa_option_is_the_setting_only_while_its_command_runs(monkeypatch: pytest.MonkeyPatch,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    """`--tsa URL` (build, validate) sets DL_IMAGES_TSA_URL for the command and gives the setting back after."""
    monkeypatch.delenv(tsa.TSA_URL_ENV, raising=False)
    with tsa.using("http://127.0.0.1:1/tsr"):
        assert tsa.configured_url() == "http://127.0.0.1:1/tsr"
    assert tsa.configured_url() == ""
    monkeypatch.setenv(tsa.TSA_URL_ENV, "https://tsa.example/tsr")
    with tsa.using(None):
        assert tsa.configured_url() == "https://tsa.example/tsr"
    from buildtool.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["build", "--tsa", "https://user:s3cr3t@tsa.example/tsr", "--framework", "pytorch-cpu"])
    assert exited.value.code == 2
    err = capfd.readouterr().err
    assert "--tsa: 'https://tsa.example/tsr' carries credentials" in err and "s3cr3t" not in err, err


def _top_level(repo: TufRepository, cache: Path, key: Path, bundle: Path) -> dict:
    done = subprocess.run([str(bundle_check.NODE), str(Path(__file__).parent / "sigstore_top_level.js"), repo.url,
                           str(repo.root), str(cache), str(key), str(bundle)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NODE_PATH": str(bundle_check.VERIFIER / "node_modules")})
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


@pytest.mark.sigstore_js
def test_sigstore_js_top_level_verify_passes_with_a_loopback_tsa_and_refuses_a_bundle_without_a_timestamp(
        authority: LoopbackTsa, tmp_path: Path) -> None:
    """The outside check's own call, sigstore-js's `sigstore.verify(bundle, {keySelector, tlogThreshold: 0})`,
    with its trusted root fetched by TUF (a repository of the test's own on loopback, tests/tuf_repo.py) that
    names the loopback timestamp authority: a bundle written with `--tsa` verifies; one without a timestamp is
    refused with the message the outside check saw."""
    from cryptography.hazmat.primitives.serialization import Encoding

    chain = [{"rawBytes": base64.b64encode(c.public_bytes(Encoding.DER)).decode()}
             for c in (authority.leaf, authority.root)]
    trusted_root = {"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1", "tlogs": [],
                    "certificateAuthorities": [], "ctlogs": [],
                    "timestampAuthorities": [{"subject": {"organization": "dl-images tests",
                                                          "commonName": "loopback TSA"}, "uri": authority.url,
                                              "certChain": {"certificates": chain},
                                              "validFor": {"start": "2020-01-01T00:00:00Z"}}]}
    key = tmp_path / "builder.pub"
    key.write_text(signing.KEY.public().pem)
    stamped, plain = tmp_path / "stamped.json", tmp_path / "plain.json"
    stamped.write_bytes(_stamped(authority))
    plain.write_bytes(sigstore_bundle.bundle(_envelope()))
    with TufRepository(tmp_path / "tuf", trusted_root) as repo:
        assert _top_level(repo, tmp_path / "cache", key, stamped) == {"verified": True}
        assert _top_level(repo, tmp_path / "cache", key, plain) == {
            "verified": False, "code": "TIMESTAMP_ERROR", "reason": "expected 1 timestamps, got 0"}
        changed = bundle_check.one_byte_changed(stamped)
        assert _top_level(repo, tmp_path / "cache", key, changed)["code"] == "SIGNATURE_ERROR"
