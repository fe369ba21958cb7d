"""Signed verdicts without a registry: DSSE, the in-toto statement, keys, and which verdict counts."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest

from buildtool.attest.dsse import EnvelopeError, generate, load_private, load_public, open_envelope, pae
from buildtool.attest.keys import load_trusted, signing_key, trusted_entry
from buildtool.attest.referrers import Payload, Referrer
from buildtool.attest.verdict_statement import StatementError, read_statement, statement, verdict_predicate
from buildtool.common.errors import UserError
from buildtool.contracts.verdict import parse_verdict
from buildtool.validate.verdicts import Findings, Found, Untyped, _verify
from tests.conftest import fixture_matrix
from tests.signing import ATTACKER, KEY, envelope, tamper, trusted, verdict

REPO = Path(__file__).resolve().parent.parent
CPU = next(c for c in fixture_matrix().cells if c.key == "pytorch-cpu:2.13")
D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
DSSE = "application/vnd.dsse.envelope.v1+json"


def check(data: bytes, digest: str = D1, keys=None, cell: str | None = CPU.key):  # noqa: ANN001, ANN201
    """What _verify says of one envelope: (verdict, key id), or why it does not count; for a trusted statement
    about this digest that does not parse (which blocks: tests/test_gate_reading.py), the cause."""
    outcome = _verify([Payload(DSSE, data)], digest, keys or trusted(), cell)
    return outcome.cause if isinstance(outcome, Untyped) else outcome


def test_pae_is_dsse_v1() -> None:
    assert pae("a/b", b"hello") == b"DSSEv1 3 a/b 5 hello"


def test_a_signed_verdict_verifies_and_names_its_key() -> None:
    body = verdict(CPU, D1)
    verdict_back, keyid = check(envelope("reg/pytorch-cpu-dev", D1, body))
    assert verdict_back == parse_verdict(body, "x") and keyid == KEY.keyid
    assert verdict_back.schema_ == 6 and verdict_back.to_json() == {**body, **verdict_back.to_json()}


@pytest.mark.parametrize("schema", [4, 5])
def test_a_signed_verdict_of_the_current_schema_and_of_the_one_before_verifies(schema: int) -> None:
    """Validate writes schema 5 (predicateType .../verdict/v5); a signed schema-4 verdict (.../verdict/v4),
    as validate wrote them before (naming no platform), still verifies."""
    body = verdict(CPU, D1, schema=schema)
    signed = envelope("r", D1, body)
    predicate_type = json.loads(base64.b64decode(json.loads(signed)["payload"]))["predicateType"]
    assert predicate_type == f"https://github.com/dl-images/dl-images/attestations/verdict/v{schema}"
    found, _ = check(signed)
    assert found.schema_ == schema and found.result == "passed" and found.cell == CPU.key


@pytest.mark.parametrize(("schema", "predicate", "cause"), [
    (7, 7, "unsupported verdict schema 7 (this toolkit reads schemas 4, 5 and 6)"),
    (3, 3, "unsupported verdict schema 3 (this toolkit reads schemas 4, 5 and 6)"),   # no longer read, signed or not
    (2, 2, "unsupported verdict schema 2"),
    (6.0, 6, "unsupported verdict schema 6.0"),   # a float equal to a schema is no schema number (was read as 6)
    (5, 4, "mismatched: predicateType https://github.com/dl-images/dl-images/attestations/verdict/v4 carries a "
           "schema-5 verdict"),
    (4, 5, "carries a schema-4 verdict"),
    (5, 9, "verdict/v9 carries a schema-5 verdict"),
])
def test_a_signed_verdict_of_an_unknown_schema_or_under_another_predicate_type_is_refused(
        schema: int, predicate: int, cause: str) -> None:
    body = verdict(CPU, D1, schema=schema)
    statement_body = json.loads(statement("r", D1, body))
    statement_body["predicateType"] = verdict_predicate(predicate)
    payload = json.dumps(statement_body, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(StatementError) as info:
        read_statement(payload, D1)
    assert cause in str(info.value)


@pytest.mark.parametrize(("make", "cause"), [
    # forged: a hand-made verdict, no envelope at all (what an ORAS push of a JSON file gives)
    (lambda: json.dumps(verdict(CPU, D1)).encode(), "unsigned: not a DSSE envelope"),
    # an envelope with its signatures stripped
    (lambda: json.dumps({**json.loads(envelope("r", D1, verdict(CPU, D1))), "signatures": []}).encode(),
     "unsigned: the envelope carries no signature"),
    # tampered: a failing verdict edited to `passed`, the old signature kept
    (lambda: tamper(envelope("r", D1, verdict(CPU, D1, "failed")), {"result": "passed"}), "wrongly signed"),
    # wrongly signed: the attacker's signature under the trusted key's id
    (lambda: json.dumps({**json.loads(envelope("r", D1, verdict(CPU, D1), ATTACKER)),
                         "signatures": [{"keyid": KEY.keyid, "sig": json.loads(envelope(
                             "r", D1, verdict(CPU, D1), ATTACKER))["signatures"][0]["sig"]}]}).encode(),
     "wrongly signed"),
    # untrusted: properly signed, by a key the repository does not list
    # (its id names no key: the attacker's key is made afresh each run, and ids must agree across xdist workers)
    pytest.param(lambda: envelope("r", D1, verdict(CPU, D1), ATTACKER),
                 "untrusted key: signed by " + ATTACKER.keyid[:16], id="untrusted-key"),
    # replayed: a valid verdict of another digest attached to this one
    (lambda: envelope("r", D2, verdict(CPU, D2)), f"replayed: signed for {D2}, not for {D1}"),
    # mismatched: a statement about this digest carrying another digest's verdict
    (lambda: envelope("r", D1, verdict(CPU, D2)), f"mismatched: the verdict inside names {D2}"),
    # another cell's verdict of the same digest
    (lambda: envelope("r", D1, verdict(CPU, D1, cell="pytorch-cuda:2.13")), "mismatched: the verdict is for cell"),
])
def test_each_bad_attestation_is_refused_naming_the_cause(make, cause: str) -> None:  # noqa: ANN001
    outcome = check(make())
    assert isinstance(outcome, str) and cause in outcome, outcome


def test_statement_subject_is_checked() -> None:
    payload = statement("r", D1, verdict(CPU, D1))
    assert read_statement(payload, D1).digest == D1
    with pytest.raises(StatementError, match="replayed"):
        read_statement(payload, D2)
    wrong_type = json.loads(payload)
    wrong_type["predicateType"] = "https://slsa.dev/provenance/v1"
    with pytest.raises(StatementError, match="not a verdict"):
        read_statement(json.dumps(wrong_type).encode(), D1)


def test_open_envelope_rejects_garbage() -> None:
    for data in (b"\xff", b"[]", b'{"payloadType": "x", "payload": "!!", "signatures": [{"keyid": "k"}]}'):
        with pytest.raises(EnvelopeError):
            open_envelope(data, trusted().keys)


def _url_safe(data: bytes, padded: bool) -> bytes:
    """The envelope with its payload and signatures in URL-safe base64 (padded or not): the same bytes signed."""
    env = json.loads(data)

    def again(text: str) -> str:
        out = base64.urlsafe_b64encode(base64.b64decode(text)).decode()
        return out if padded else out.rstrip("=")

    env["payload"] = again(env["payload"])
    env["signatures"] = [{**s, "sig": again(s["sig"])} for s in env["signatures"]]
    return json.dumps(env, sort_keys=True).encode()


def _odd_verdict() -> bytes:
    """A verdict envelope whose payload's standard base64 holds `+`, `/` and padding (its runner's name does that)."""
    body = verdict(CPU, D1)
    body["runner"]["hostname"] = "ci??????>>>>>>"
    data = envelope("r", D1, body)
    assert {"+", "/", "="} <= set(json.loads(data)["payload"])
    return data


@pytest.mark.parametrize("padded", [True, False])
def test_an_envelope_in_url_safe_base64_opens_and_one_in_neither_is_refused_naming_it(padded: bool) -> None:
    """DSSE (envelope.md v1.0.0) allows standard or URL-safe base64; before, a URL-safe payload was refused as
    "not base64", so another signer's valid envelope did not count."""
    honest = _odd_verdict()
    url_safe = _url_safe(honest, padded)
    assert url_safe != honest and "-" in json.loads(url_safe)["payload"]
    assert open_envelope(url_safe, trusted().keys) == open_envelope(honest, trusted().keys)
    verdict_back, keyid = check(url_safe)
    assert keyid == KEY.keyid and verdict_back.runner.hostname == "ci??????>>>>>>"
    # Both alphabets in one string is neither encoding.
    env = json.loads(url_safe)
    env["payload"] = env["payload"].replace("-", "+", 1)
    with pytest.raises(EnvelopeError, match=r"^malformed: the payload is neither standard nor URL-safe base64$"):
        open_envelope(json.dumps(env).encode(), trusted().keys)


def test_one_envelope_in_both_encodings_counts_once() -> None:
    """An attacker who may push attaches a copy of one signed verdict re-encoded in the other base64 alphabet
    (unpadded): before, its text differed, so it could count as a second verdict of the same signature."""
    from buildtool.attest.bundles import same_envelope
    from buildtool.validate.verdicts import find_verdicts
    from tests.memregistry import MemRegistry
    from tests.signing import attach_raw

    honest = _odd_verdict()
    copies = [_url_safe(honest, padded) for padded in (True, False)]
    # The one signature repeated in the other encoding, in one envelope: still that envelope.
    env = json.loads(honest)
    env["signatures"] += json.loads(copies[1])["signatures"]
    repeated = json.dumps(env).encode()
    assert open_envelope(repeated, trusted().keys).keyid == KEY.keyid
    assert len({same_envelope([Payload(DSSE, data)]) for data in [honest, *copies, repeated]}) == 1
    client = MemRegistry()
    digest = client.push_image("pytorch-cpu", "2.13-dev")
    body = verdict(CPU, digest)
    body["runner"]["hostname"] = "ci??????>>>>>>"
    honest = envelope("r", digest, body)
    env = json.loads(honest)
    env["signatures"] += json.loads(_url_safe(honest, False))["signatures"]
    for data in [honest, _url_safe(honest, True), _url_safe(honest, False), json.dumps(env).encode()]:
        attach_raw(client, "pytorch-cpu", digest, data)  # type: ignore[arg-type]
    findings = find_verdicts(client, "pytorch-cpu", digest, trusted())  # type: ignore[arg-type]
    assert len(findings.found) == 1 and not findings.rejected, (findings.found, findings.rejected)


def test_an_untrusted_key_id_is_shown_without_its_control_characters() -> None:
    """An envelope anyone may push names its key id: a line break or terminal escape in it went into the one-line
    refusal as it was, so it broke the line, or rewrote the terminal's (CI log's) line, where verify prints it."""
    keyid = "\x1b[2K\rok\nverified"
    data = json.dumps({"payloadType": "x", "payload": "eA==", "signatures": [{"keyid": keyid, "sig": "AA=="}]})
    with pytest.raises(EnvelopeError) as refused:
        open_envelope(data.encode(), trusted().keys)
    said = str(refused.value)
    assert said.isprintable() and "untrusted key: signed by '\\x1b[2K\\rok\\nverified'" in said, said


def test_a_tampered_envelope_that_also_names_a_key_of_another_role_says_it_is_tampered() -> None:
    """A verdict whose payload was changed after the tester signed it, with a second signature claiming a builder key,
    was refused (by open_signed and the verdict reader) as "trusted as builder, not as tester": the role of a key
    whose claim was never checked, not the tester signature that does not verify."""
    from buildtool.attest.attested import open_signed
    from buildtool.attest.intoto import DSSE_MEDIA_TYPE
    from buildtool.attest.verdict_statement import VERDICT_PREDICATE

    builder = generate()
    keys = trusted(KEY, roles=("tester",))
    keys.keys[builder.keyid] = builder.public()
    keys.roles[builder.keyid] = frozenset({"builder"})
    env = json.loads(envelope("r", D1, verdict(CPU, D1)))
    env["payload"] = base64.b64encode(base64.b64decode(env["payload"]).replace(b"passed", b"failed")).decode()
    env["signatures"].append({"keyid": builder.keyid, "sig": "AA=="})
    payloads = [Payload(DSSE_MEDIA_TYPE, json.dumps(env).encode())]
    cause = (f"wrongly signed: the signature of trusted key {KEY.keyid[:16]} does not verify (payload tampered with, "
             "or signed by another key under that id)")
    assert open_signed(payloads, D1, VERDICT_PREDICATE, keys.for_role("tester"), keys, "tester") == cause
    assert _verify(payloads, D1, keys, CPU.key) == cause     # the verdict reader release and verify run


def test_an_envelope_of_many_untrusted_signatures_is_refused_in_a_short_line() -> None:
    """An envelope anyone may push listed every untrusted signer in the refusal, each time it was named: ten thousand
    signatures made one line of some 180 kB in verify's output, release's report and CI's log."""
    signatures = [{"keyid": f"k{n % 5000}", "sig": "AA=="} for n in range(10000)]
    data = json.dumps({"payloadType": "x", "payload": "eA==", "signatures": signatures}).encode()
    with pytest.raises(EnvelopeError) as refused:
        open_envelope(data, trusted().keys)
    assert str(refused.value) == "untrusted key: signed by k0, k1, k2 and 4997 more, which is not a trusted key"


# -- which verdict counts ------------------------------------------------------------------------

def found(started: str, outcome: str, artifact: str) -> Found:
    return Found(artifact, parse_verdict(verdict(CPU, D1, outcome, started=started), "x"), KEY.keyid,
                 Referrer(artifact, "t", 1))


def test_the_newest_valid_verdict_counts_by_its_signed_time() -> None:
    older_pass = found("2026-01-01T10:00:00.000+00:00", "passed", "sha256:b")
    newer_fail = found("2026-01-02T10:00:00.000+00:00", "failed", "sha256:a")
    assert Findings(found=[older_pass, newer_fail]).chosen is newer_fail
    assert Findings(found=[newer_fail, older_pass]).chosen is newer_fail
    # Same second, other time zone spelling: compared as times, not strings.
    utc = found("2026-01-02T10:00:00.000+00:00", "passed", "sha256:x")
    later_in_cet = found("2026-01-02T11:00:01.000+01:00", "failed", "sha256:y")
    assert Findings(found=[utc, later_in_cet]).chosen is later_in_cet


# -- keys ------------------------------------------------------------------------------------------

def test_dev_key_is_made_once_owner_only_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("DL_IMAGES_SIGNING_KEY", raising=False)
    said: list[str] = []
    first = signing_key(said.append)
    again = signing_key(said.append)
    path = tmp_path / "dl-images/dev-signing-key.pem"
    assert first.dev and first.key.keyid == again.key.keyid and len(said) == 1 and "--trust-local-key" in said[0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_signing_key_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("DL_IMAGES_SIGNING_KEY", KEY.pem.decode())
    assert signing_key(print).key.keyid == KEY.keyid and not (tmp_path / "dl-images").exists()
    (tmp_path / "k.pem").write_bytes(KEY.pem)
    monkeypatch.setenv("DL_IMAGES_SIGNING_KEY", str(tmp_path / "k.pem"))
    assert signing_key(print).key.keyid == KEY.keyid
    for bad, message in ((str(tmp_path / "missing.pem"), "cannot be read"), ("-----BEGIN nonsense", "not an")):
        monkeypatch.setenv("DL_IMAGES_SIGNING_KEY", bad)
        with pytest.raises(UserError, match=message):
            signing_key(print)


@pytest.mark.parametrize("role", ["tester", "builder"])
def test_a_signing_key_variable_that_is_no_pem_text_is_never_echoed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     role: str) -> None:
    """PEM in quotes (a .env file's), base64 of the PEM (how CI secrets are often kept), or the DER's base64 are
    taken as paths: the refusal named that "path", the private key itself, in a message CI logs."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    variable = "DL_IMAGES_SIGNING_KEY" if role == "tester" else "DL_IMAGES_BUILDER_KEY"
    der = KEY.pem.decode().split("-----")[2].strip()
    for value in (f'"{KEY.pem.decode()}"', base64.b64encode(KEY.pem).decode(), der, "'" + KEY.pem.decode().strip()):
        monkeypatch.setenv(variable, value)
        with pytest.raises(UserError) as refused:
            signing_key(print, role=role)
        said = str(refused.value)
        assert f"${variable} is neither PEM text nor a file that can be read" in said, said
        assert der[:24] not in said and base64.b64encode(KEY.pem).decode()[:24] not in said, said


def test_a_base64_key_that_starts_with_a_slash_is_never_echoed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Raw key material in base64 may start with `/` and hold no other: it read as a file right under `/`, whose
    folder exists, so the refusal named the "path", the key itself (found by the attest hunt)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    raw = "/" + base64.b64encode(bytes(range(1, 33))).decode().replace("/", "A")[1:]
    monkeypatch.setenv("DL_IMAGES_SIGNING_KEY", raw)
    with pytest.raises(UserError) as refused:
        signing_key(print)
    said = str(refused.value)
    assert "$DL_IMAGES_SIGNING_KEY is neither PEM text nor a file that can be read" in said and raw[1:20] not in said
    monkeypatch.setenv("DL_IMAGES_SIGNING_KEY", "/missing-key.pem")      # a file name under / is still shown
    with pytest.raises(UserError, match="names /missing-key.pem, which cannot be read"):
        signing_key(print)


def test_a_signing_key_path_under_an_unknown_users_home_is_one_line(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A key variable naming ~someone/key.pem for a user this machine does not have ended the command in pathlib's
    RuntimeError traceback ('Could not determine home directory'), not the refusal of a key that cannot be read."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("DL_IMAGES_SIGNING_KEY", "~no-such-user-dl-images/key.pem")
    with pytest.raises(UserError, match=r"\$DL_IMAGES_SIGNING_KEY .*\(No such file or directory\); set it to the PEM"):
        signing_key(print)


def test_trusted_keys_file_round_trip_and_bad_input(tmp_path: Path) -> None:
    assert load_trusted(tmp_path).keys == {}                          # no file: nobody is trusted
    (tmp_path / "config").mkdir()
    path = tmp_path / "config/trusted-keys.yaml"
    path.write_text("keys:\n" + trusted_entry("ci", KEY.public()))
    loaded = load_trusted(tmp_path)
    assert list(loaded.keys) == [KEY.keyid] and loaded.describe(KEY.keyid).endswith("(ci)")
    for text, message in (("keys: 3\n", "trusted-keys.yaml:1: expected only `keys:`"),
                          ("keys: [{name: x}]\n", "yaml:1: keys\\[0\\] needs name and public_key"),
                          ("keys: [{name: x, roles: [tester], public_key: nope}]\n",
                               "yaml:1 keys\\[0\\] is not a PEM public key"),
                          ("{", "yaml:2: YAML syntax")):
        path.write_text(text)
        with pytest.raises(UserError, match=message):
            load_trusted(tmp_path)


def test_key_files_load_only_ed25519(tmp_path: Path) -> None:
    key = generate()
    assert load_private(key.pem, "x").keyid == key.keyid == load_public(key.public().pem, "y").keyid
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    other = ec.generate_private_key(ec.SECP256R1()).private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    with pytest.raises(EnvelopeError, match="not an Ed25519 key"):
        load_private(other, "ec.pem")
    assert base64.b64decode(json.loads(envelope("r", D1, verdict(CPU, D1)))["payload"])


def test_a_private_key_and_the_signing_key_holding_it_never_show_the_key_in_their_repr(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """PrivateKey's repr (a dataclass's, of every field) held the PEM: a log line, a traceback's locals or an error
    that showed a SigningKey printed the private key itself."""
    monkeypatch.setenv("DL_IMAGES_BUILDER_KEY", KEY.pem.decode())
    found = signing_key(print, role="builder")
    body = KEY.pem.decode().split("-----")[2].strip()
    for shown in (repr(KEY), repr(found), repr(load_private(KEY.pem, "x")), str(found)):
        assert body[:16] not in shown and KEY.keyid in shown, shown
    assert found.key.pem.strip() == KEY.pem.strip() and found.key.keyid == KEY.keyid


@pytest.mark.parametrize(("change", "cause"), [
    ({"tests": "all good"}, "`tests`: input should be a valid list"),
    ({"defined_tests": [1, 2]}, "`defined_tests[0]`: input should be a valid string (got int '1')"),
    ({"selection": None}, "`selection`: input should be a valid dictionary or instance of Selection"),
    ({"groups": "common"}, "`groups`: input should be a valid list"),
    ({"started": None}, "`started`: input should be a valid string"),
    ({"runner": {"hostname": "ci", "gpus": [{"index": "0"}]}}, "`runner.gpus[0].name` is missing"),
    ({"verdict_by": "me"}, "`verdict_by` is not a field of this schema"),
])
def test_a_signed_but_malformed_verdict_is_refused_naming_the_field(change: dict, cause: str) -> None:
    body = dict(verdict(CPU, D1), **change)
    outcome = check(envelope("r", D1, body))
    assert isinstance(outcome, str), outcome
    assert outcome.startswith("the signed predicate: malformed schema-6 verdict: "), outcome
    assert cause in outcome, outcome


def _with_junk_signature(data: bytes, first: bool = False) -> bytes:
    """A copy of a signed envelope with one more signature, by a key id nobody trusts."""
    env = json.loads(data)
    junk = {"keyid": ATTACKER.keyid, "sig": base64.b64encode(b"junk" * 16).decode()}
    env["signatures"] = [junk, *env["signatures"]] if first else [*env["signatures"], junk]
    return json.dumps(env).encode()


def test_a_copy_of_a_signed_verdict_with_a_junk_signature_counts_once_and_hides_nothing() -> None:
    """An attacker who may push attaches a copy of a signed verdict with an extra signature of an untrusted key id:
    before, its text differed from the original's, so the one signed verdict was found twice."""
    from buildtool.validate.verdicts import find_verdicts
    from tests.memregistry import MemRegistry
    from tests.signing import attach_raw

    client = MemRegistry()
    digest = client.push_image("pytorch-cpu", "2.13-dev")
    honest = envelope("r", digest, verdict(CPU, digest))
    # Listed before the original: a copy whose only signature is junk must not hide the original either.
    only_junk = json.loads(_with_junk_signature(honest, first=True))
    only_junk["signatures"] = only_junk["signatures"][:1]
    for data in [json.dumps(only_junk).encode(), _with_junk_signature(honest), _with_junk_signature(honest, True),
                 honest]:
        attach_raw(client, "pytorch-cpu", digest, data)  # type: ignore[arg-type]
    findings = find_verdicts(client, "pytorch-cpu", digest, trusted())  # type: ignore[arg-type]
    assert len(findings.found) == 1, findings.found
    assert [r.reason.split(":")[0] for r in findings.rejected] == ["untrusted key"], findings.rejected


def test_a_copy_of_a_signed_provenance_with_a_junk_signature_is_read_once() -> None:
    """each_signed (the provenance's and the SBOM attestation's reader) yielded a copy of a signed attestation with an
    extra untrusted signature as a second attestation of its own."""
    from buildtool.attest.attested import each_signed
    from buildtool.attest.provenance_model import PREDICATE_TYPE
    from buildtool.attest.trust import BUILDER
    from buildtool.contracts.names import PROVENANCE_TYPE
    from tests.memregistry import MemRegistry
    from tests.signing import attach_raw, provenance, provenance_envelope

    client = MemRegistry()
    digest = client.push_image("pytorch-cpu", "2.13-dev")
    honest = provenance_envelope("r", digest, provenance(CPU))
    for data in [honest, _with_junk_signature(honest)]:
        attach_raw(client, "pytorch-cpu", digest, data, PROVENANCE_TYPE)  # type: ignore[arg-type]
    keys = trusted()
    read = list(each_signed(client, "pytorch-cpu", digest, PROVENANCE_TYPE, PREDICATE_TYPE,  # type: ignore[arg-type]
                            keys.for_role(BUILDER), keys, BUILDER))
    assert [isinstance(outcome, tuple) for _, outcome in read] == [True], read


def test_signature_entries_that_read_alike_are_one_in_the_canonical_envelope() -> None:
    """dsse.canonical kept a signature entry twice when a copy wrote it with a null key id for a missing one, or with
    a field open_envelope does not read: the same envelope then had two texts."""
    from buildtool.attest.bundles import same_envelope

    honest = json.loads(envelope("r", D1, verdict(CPU, D1)))
    entry = honest["signatures"][0]
    nameless = {**honest, "signatures": [{"sig": entry["sig"]}]}
    variants = [{**honest, "signatures": [entry, {**entry, "note": "x"}]},
                {**honest, "signatures": [{**entry, "note": "x"}]}]
    texts = {same_envelope([Payload(DSSE, json.dumps(env).encode())]) for env in [honest, *variants]}
    assert len(texts) == 1, texts
    assert same_envelope([Payload(DSSE, json.dumps(nameless).encode())]) == same_envelope(
        [Payload(DSSE, json.dumps({**nameless, "signatures": [{"keyid": None, "sig": entry["sig"]}]}).encode())])


def test_an_envelope_with_more_signatures_than_the_bound_is_refused_before_any_is_verified() -> None:
    """Before, open_envelope verified every signature a trusted key id claimed, however many: a copy of a verdict
    carrying 400,000 junk signatures under the trusted key's id (a 64 MiB layer) cost a reader minutes of CPU each.
    Untrusted key ids cost no verification and stay unbounded (an existing test reads 10,000 of them)."""
    from buildtool.attest import dsse

    bound = getattr(dsse, "MAX_SIGNATURES", 16)
    honest = json.loads(envelope("r", D1, verdict(CPU, D1)))
    junk = {"keyid": KEY.keyid, "sig": base64.b64encode(b"junk" * 16).decode()}
    many = {**honest, "signatures": [junk] * bound + honest["signatures"]}
    with pytest.raises(EnvelopeError) as refused:
        open_envelope(json.dumps(many).encode(), trusted().keys)
    assert str(refused.value) == (f"malformed: the envelope carries {bound + 1} signatures under trusted key ids, "
                                  f"more than the {bound} a DSSE envelope of this toolkit's signers may carry")
    few = {**honest, "signatures": [junk] * (bound - 1) + honest["signatures"]}
    assert open_envelope(json.dumps(few).encode(), trusted().keys).keyid == KEY.keyid


def test_values_of_a_signed_statement_are_shown_bounded_on_one_line() -> None:
    """Before, the reasons a signed statement is refused put its values into the message whole (its _type,
    predicateType, subject digests, the verdict's digest, the envelope's payloadType): a megabyte string with newlines
    (a trusted key signs whatever its holder gives it) made a megabyte, many-line reason."""
    from buildtool.attest import attested, intoto
    from buildtool.attest.dsse import sign_envelope

    long = "sha256:" + "x" * 1_000_000 + "\nrelease: ok"
    base = json.loads(statement("r", D1, verdict(CPU, D1)))

    def verdict_reason(**change: object) -> str:
        with pytest.raises(StatementError) as caught:
            read_statement(json.dumps({**base, **change}).encode(), D1)
        return str(caught.value)

    with pytest.raises(intoto.StatementError) as caught:
        intoto.read_statement(json.dumps({**base, "predicateType": long}).encode(), D1, "https://cyclonedx.org/bom")
    signed = json.dumps(sign_envelope(KEY, long, b"{}")).encode()
    reasons = [verdict_reason(_type=long), verdict_reason(predicateType=long), str(caught.value),
               verdict_reason(subject=[{"name": "r", "digest": {"sha256": long}}] * 1000),
               verdict_reason(predicate={**base["predicate"], "digest": long}),
               attested.open_signed([Payload(DSSE, signed)], D1, "x", trusted().keys, None, "builder")]
    for reason in reasons:
        assert isinstance(reason, str) and "\n" not in reason and len(reason) < 600, reason[:200]
    named = f"sha256:{long}"      # a subject digest as the reader names it: algorithm:value
    assert reasons[3] == (f"replayed: signed for {ascii(named[:80])}... ({len(named)} characters), "
                          f"{ascii(named[:80])}... ({len(named)} characters), {ascii(named[:80])}... ({len(named)} "
                          f"characters) and 997 more, not for {D1}")
