"""On a loopback registry, a refusal that --trust-local-key would cure names this machine's dev key and the flag
(issue 50): the verdict, the provenance and the SBOM attestation a developer's push and validate signed with it.
Elsewhere, and for any other key, the refusal stays what it was. In-memory registries."""

from __future__ import annotations

from pathlib import Path

import pytest

from buildtool.attest.dsse import short
from buildtool.attest.keys import signing_key
from buildtool.cli import main
from buildtool.cli.release_run import _trusted_keys
from buildtool.validate.verdicts import find_verdicts
from tests import provenance_fixture, signing
from tests.conftest import fixture_matrix
from tests.memregistry import MemRegistry
from tests.test_verify import LABELS

REPO = "team/pytorch-cpu-dev"
CPU = next(c for c in fixture_matrix().cells if c.key == "pytorch-cpu:2.13")


def offered(keyid: str) -> str:
    return (f"untrusted key: signed by this machine's dev key {short(keyid)}, which is not a trusted key; on a "
            "loopback registry pass --trust-local-key")


def developers_image(client: MemRegistry, key=None) -> str:  # noqa: ANN001
    """What `make push validate` leaves on a developer's machine: all three signed with the dev key."""
    key = key or signing_key(print).key
    digest = client.push_image(REPO, "t", labels=LABELS)
    provenance_fixture.attest_provenance(client, REPO, digest, key=key)   # type: ignore[arg-type]
    sbom = signing.attest_sbom(client, REPO, digest, key=key)   # type: ignore[arg-type]
    signing.attest(client, REPO, digest, signing.verdict(CPU, digest, sbom=sbom), key)   # type: ignore[arg-type]
    return digest


@pytest.fixture
def verify(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]):  # noqa: ANN201
    keys = tmp_path / "trusted-keys.yaml"
    keys.write_text("keys: []\n")
    monkeypatch.chdir(tmp_path)     # no checkout: the chain only

    def run(client: MemRegistry, *args: str) -> tuple[int, str]:
        monkeypatch.setattr("buildtool.registry.client.RegistryClient", lambda host, **kw: client)
        with pytest.raises(SystemExit) as exit_info:
            main(["verify", f"{client.host}/{REPO}:t", *args, "--keys", str(keys)])
        return int(exit_info.value.code or 0), capsys.readouterr().out
    return run


def test_verify_on_a_loopback_registry_offers_the_dev_key_by_name_in_each_refusal(verify) -> None:  # noqa: ANN001
    client = MemRegistry("127.0.0.1:5000")
    developers_image(client)
    code, out = verify(client)
    keyid = signing_key(print).key.keyid
    problems = [line for line in out.splitlines() if line.startswith(("problem", "result"))]
    assert code == 1 and problems, out
    assert all(offered(keyid) in line for line in problems), problems
    # The flag it names cures it: the chain verifies (no checkout here, so release's gate is named as not run).
    code, out = verify(client, "--trust-local-key")
    assert code == 0 and out.splitlines()[-1] == "result  verified (without release's gate: see `not run`)", out


def test_elsewhere_or_for_another_key_nothing_is_offered(verify) -> None:  # noqa: ANN001
    remote = MemRegistry("registry.example.com")
    developers_image(remote)
    code, out = verify(remote)
    assert code == 1 and "which is not a trusted key" in out and "this machine's dev key" not in out, out
    assert "--trust-local-key" not in out
    local = MemRegistry("127.0.0.1:5000")
    developers_image(local, signing.ATTACKER)
    code, out = verify(local)
    assert code == 1 and "which is not a trusted key" in out and "this machine's dev key" not in out, out


def test_release_offers_the_dev_key_only_for_loopback_registries(tmp_path: Path) -> None:
    dev = signing_key(print).key
    client = MemRegistry("127.0.0.1:5000")
    digest = developers_image(client, dev)
    trusted = _trusted_keys(tmp_path, trust_local_key=False, loopback=True)
    assert trusted.offered_dev == dev.keyid
    found = find_verdicts(client, REPO, digest, trusted, CPU.key)   # type: ignore[arg-type]
    assert found.chosen is None and found.why_none(trusted).endswith(offered(dev.keyid))
    assert _trusted_keys(tmp_path, trust_local_key=False, loopback=False).offered_dev == ""
    assert _trusted_keys(tmp_path, trust_local_key=True, loopback=True).untrusted_hint(dev.keyid) == ""
