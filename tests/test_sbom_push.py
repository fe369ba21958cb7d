"""Push attaches the SBOM twice, plain (for scanners) and signed by the builder key; a push again keeps both,
and puts back a plain SBOM someone rewrote (no engine: the probe and the labels are stand-ins)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from buildtool.attest import referrers as referrers_module
from buildtool.attest.referrers import referrers
from buildtool.common.errors import FailedError
from buildtool.contracts.names import SBOM_ATTESTATION_TYPE, SBOM_TYPE
from buildtool.imagebuild import contents
from buildtool.imagebuild.builder import Builder, BuildOptions
from buildtool.sbom import document as sbom
from buildtool.sbom.signing import find_sbom_attestation, plain_sbom_problem, sbom_digest
from tests import sbom_probe, signing
from tests.memregistry import MemRegistry

REPO = "team/pytorch-cpu-dev"


@pytest.fixture
def pushed(monkeypatch: pytest.MonkeyPatch) -> tuple[MemRegistry, str]:
    # Each artifact created a second after the one before (their `created` annotation orders them), not
    # whatever second this machine's clock says.
    seconds = iter(range(1_800_000_000, 1_800_001_000))
    real = time.gmtime
    monkeypatch.setattr(referrers_module.time, "gmtime", lambda *_: real(next(seconds)))
    monkeypatch.setattr(contents.engine, "image_labels", lambda ref: {})
    monkeypatch.setattr(contents, "probe", lambda root, ref: sbom_probe.probe())
    client = MemRegistry()
    return client, client.push_image(REPO, "abc-2.13")


def attach(client: MemRegistry, digest: str) -> str:
    return contents.attach_sbom(Path("."), client, REPO, digest, "local:tag",  # type: ignore[arg-type]
                                contents.LockedContents({}, indexes=sbom_probe.INDEXES), signing.KEY)


def listed(client: MemRegistry, digest: str) -> tuple[int, int]:
    return (len(referrers(client, REPO, digest, SBOM_TYPE)),   # type: ignore[arg-type]
            len(referrers(client, REPO, digest, SBOM_ATTESTATION_TYPE)))   # type: ignore[arg-type]


def test_push_attaches_the_plain_and_the_signed_sbom_the_same_document(pushed) -> None:  # noqa: ANN001
    client, digest = pushed
    plain = attach(client, digest)
    document, artifact = sbom.load_sbom(client, REPO, digest)   # type: ignore[arg-type, misc]
    found = find_sbom_attestation(client, REPO, digest, signing.trusted(roles=("builder",)))   # type: ignore[arg-type]
    assert artifact == plain and found.document == document and found.signer == signing.KEY.keyid
    assert listed(client, digest) == (1, 1)
    assert attach(client, digest) == plain and listed(client, digest) == (1, 1)    # kept, nothing added


def test_a_push_again_puts_back_a_plain_sbom_someone_rewrote(pushed) -> None:  # noqa: ANN001
    client, digest = pushed
    attach(client, digest)
    signed = find_sbom_attestation(client, REPO, digest, signing.trusted()).digest   # type: ignore[arg-type]
    sbom.store_sbom(client, REPO, digest, signing.minimal_sbom(digest, 0))   # type: ignore[arg-type]
    assert "someone rewrote it" in plain_sbom_problem(client, REPO, digest, signed)   # type: ignore[arg-type]
    attach(client, digest)
    assert plain_sbom_problem(client, REPO, digest, signed) == ""   # type: ignore[arg-type]
    assert listed(client, digest) == (3, 1)      # the signed one kept: the same document
    assert sbom_digest(sbom.load_sbom(client, REPO, digest)[0]) == signed   # type: ignore[arg-type, index]


def test_a_push_without_a_builder_key_fails_naming_it() -> None:
    fake = SimpleNamespace(options=BuildOptions(push=True), registry=MemRegistry(), _key=None)
    plan = SimpleNamespace(dev_ref="127.0.0.1:5999/team/pytorch-cpu-dev:abc-2.13")
    result = SimpleNamespace(digest="sha256:" + "1" * 64, sbom="")
    with pytest.raises(FailedError, match="signs the image's SBOM with the builder key, and none was read"):
        Builder._ensure_sbom(fake, plan, plan.dev_ref, result.digest, "linux/amd64")   # type: ignore[arg-type]


def test_a_push_run_without_a_builder_key_is_refused_before_anything_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    from buildtool.common.errors import UserError
    from buildtool.imagebuild import builder
    from buildtool.matrix.plan import Settings

    monkeypatch.setattr(builder.engine, "sdk", lambda: None)
    monkeypatch.setattr(builder.RegistryClient, "ping", lambda self: None)
    monkeypatch.setattr(builder.Builder, "resolve_bases", lambda self, plans: pytest.fail("got past the key check"))
    run = Builder(Path(__file__).resolve().parents[1], "matrix.yaml", Settings(), "nightly-1",
                  BuildOptions(push=True), print)
    with pytest.raises(UserError, match="--push signs each image's provenance and SBOM, and no builder key was given"):
        run.run([])
    keyed = Builder(Path(__file__).resolve().parents[1], "matrix.yaml", Settings(), "nightly-1",
                    BuildOptions(push=True, builder_key=lambda: signing.KEY), print)
    with pytest.raises(pytest.fail.Exception):
        keyed.run([])
    assert keyed._key == signing.KEY


def _reused(monkeypatch: pytest.MonkeyPatch, pull) -> tuple:  # noqa: ANN001
    """A push that reused an image by content key: in the registry, not in this engine's store."""
    from buildtool.imagebuild import publishing as builder

    calls: list = []
    monkeypatch.setattr(builder.engine, "image_attrs", lambda ref: None)
    monkeypatch.setattr(builder.engine, "pull", pull)
    monkeypatch.setattr(builder.engine, "tag", lambda image, ref: calls.append(("tag", image, ref)))
    monkeypatch.setattr(builder, "attach_sbom", lambda root, client, repo, digest, ref, *rest: calls.append(
        ("sbom", digest, ref)) or "sha256:" + "5" * 64)
    monkeypatch.setattr(builder, "read_locks", lambda root, cell, platform: {})
    monkeypatch.setattr(builder.aptlock, "read_hashes", lambda root, cell, platform: {})
    fake = SimpleNamespace(options=BuildOptions(push=True), registry=MemRegistry(), _key=signing.KEY, root=Path("."),
                           _host_pip=object(), log=print, progress=SimpleNamespace(update=lambda *a: None))
    plan = SimpleNamespace(dev_ref="127.0.0.1:5999/team/pytorch-cpu-dev:abc-2.13",
                           cell=SimpleNamespace(key="pytorch-cpu:2.13", index_url="", extra_index_urls=(),
                                                multi_platform=False))
    result = SimpleNamespace(digest="sha256:" + "1" * 64, sbom="")
    return fake, plan, calls, result


def test_an_image_reused_from_the_registry_is_pulled_by_digest_to_make_its_signed_sbom(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A dev image built before SBOMs were signed (or by another builder key), reused by content key on a
    machine that never held it: its SBOM is made from the image pulled by the pushed digest, not refused."""
    pulled: list[str] = []
    fake, plan, calls, result = _reused(monkeypatch, pulled.append)
    result.sbom = Builder._ensure_sbom(fake, plan, plan.dev_ref, result.digest, "linux/amd64")   # type: ignore[arg-type]
    pinned = "127.0.0.1:5999/team/pytorch-cpu-dev@sha256:" + "1" * 64
    assert pulled == [pinned]
    assert calls == [("tag", pinned, plan.dev_ref), ("sbom", result.digest, plan.dev_ref)]
    assert result.sbom == "sha256:" + "5" * 64


def test_a_reused_image_that_cannot_be_pulled_fails_naming_the_pull(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(ref: str) -> None:
        raise RuntimeError(f"pull of {ref} failed: manifest unknown")

    fake, plan, calls, result = _reused(monkeypatch, refuse)
    with pytest.raises(FailedError, match="pulling it to make one failed .pull of .* manifest unknown.; rebuild"):
        Builder._ensure_sbom(fake, plan, plan.dev_ref, result.digest, "linux/amd64")   # type: ignore[arg-type]
    assert calls == []
