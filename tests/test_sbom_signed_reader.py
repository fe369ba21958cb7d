"""`buildtool sbom` and `buildtool diff` show the SBOM a trusted builder signed, and refuse a plain SBOM that
is another document (issue 37: an SBOM with openssl removed and a fake package added was printed and diffed
without a word) or an SBOM nobody trusted signed. In-memory registry, the commands in-process."""

from __future__ import annotations

import json

import pytest

from buildtool.cli import main
from buildtool.sbom.document import store_sbom
from tests import signing
from tests.memregistry import MemRegistry

REPO = "team/pytorch-cpu"


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> MemRegistry:
    client = MemRegistry()
    # image_diff first: patching it imports it, and an import after the registry client's patch would bind the
    # stand-in for good (its teardown restores what it found), failing whichever test of diff runs next.
    monkeypatch.setattr("buildtool.imagebuild.image_diff.RegistryClient", lambda host, **kw: client)
    monkeypatch.setattr("buildtool.registry.client.RegistryClient", lambda host, **kw: client)
    monkeypatch.setattr("buildtool.cli.contents.sbom_trust", lambda host: signing.trusted(roles=("builder",)))
    return client


def run(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
        raise SystemExit(0)
    out = capsys.readouterr()
    return int(exit_info.value.code or 0), out.out, out.err


def forged(digest: str) -> dict:
    document = signing.minimal_sbom(digest)
    document["components"] = [{"type": "library", "name": "totally-not-a-backdoor", "version": "1.0",
                               "bom-ref": "pkg:pypi/totally-not-a-backdoor@1.0",
                               "purl": "pkg:pypi/totally-not-a-backdoor@1.0"}]   # p0, p1 gone
    return document


def test_sbom_prints_the_signed_document(registry: MemRegistry, capsys: pytest.CaptureFixture) -> None:
    digest = registry.push_image(REPO, "a")
    signing.attest_sbom(registry, REPO, digest)   # type: ignore[arg-type]
    code, out, err = run(capsys, "sbom", f"{registry.host}/{REPO}:a")
    assert code == 0, err
    assert json.loads(out) == signing.minimal_sbom(digest)


def test_sbom_and_diff_refuse_a_plain_sbom_that_is_not_the_signed_one(registry: MemRegistry,
                                                                      capsys: pytest.CaptureFixture) -> None:
    before, after = registry.push_image(REPO, "a"), registry.push_image(REPO, "b", b"other")
    signing.attest_sbom(registry, REPO, before)   # type: ignore[arg-type]
    signing.attest_sbom(registry, REPO, after)   # type: ignore[arg-type]
    store_sbom(registry, REPO, after, forged(after))   # type: ignore[arg-type]   # the newest plain one
    code, out, err = run(capsys, "sbom", f"{registry.host}/{REPO}:b")
    assert code == 1 and out == "" and f"the plain SBOM of {after}" in err and "someone rewrote it" in err
    code, out, err = run(capsys, "diff", f"{registry.host}/{REPO}:a", f"{registry.host}/{REPO}:b")
    assert code == 1 and "totally-not-a-backdoor" not in out and "someone rewrote it" in err


def test_sbom_refuses_an_sbom_no_trusted_builder_signed(registry: MemRegistry, capsys: pytest.CaptureFixture) -> None:
    digest = registry.push_image(REPO, "a")
    store_sbom(registry, REPO, digest, forged(digest))   # type: ignore[arg-type]
    code, out, err = run(capsys, "sbom", f"{registry.host}/{REPO}:a")
    assert code == 1 and out == "" and f"{digest} has no SBOM signed by a trusted builder" in err
    signing.attest_sbom(registry, REPO, digest, key=signing.ATTACKER, plain=False)   # type: ignore[arg-type]
    code, out, err = run(capsys, "sbom", f"{registry.host}/{REPO}:a")
    assert code == 1 and "untrusted key" in err
