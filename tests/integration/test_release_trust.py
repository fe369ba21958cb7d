"""Release against attacks on its evidence, in the real local registry: forged, replayed, tampered,
overwritten and untrusted verdicts, stand-ins relabelled, versions respelt, and a late tag write.

The attacker may push anything into the dev repository (that is all "push dev images" grants);
attacks are made with plain HTTP requests (`requests`, no buildtool code), as ORAS or any other
OCI client would push them. Each test shows the refusal and the message that names the cause.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import requests

from buildtool.attest.referrers import referrers
from buildtool.contracts import label_keys, names
from buildtool.contracts.names import ATTESTATION_TYPE, VERDICT_TYPE, referrers_tag, verdict_pin_tag, verdict_tag
from buildtool.registry.client import OCI_INDEX, OCI_MANIFEST, RegistryClient, sha256_digest
from tests import signing
from tests.faultproxy import FaultProxy
from tests.integration.test_release import CPU, FAST, HOST, NGC, Space, push_single, rev, upstream

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]


@pytest.fixture
def space() -> Space:
    return Space()


def refused(report, *words: str) -> str:  # noqa: ANN001
    """The image was refused and one problem names every word; returns that problem."""
    item = report.images[0]
    assert item.status == "refused", (item.status, item.problems)
    match = [p for p in item.problems if all(w in p for w in words)]
    assert match, item.problems
    return match[0]


def released(space: Space) -> list[str]:
    return space.client.tags(space.rel_repo(CPU))


# -- an independent client: what anyone with push access can do ----------------------------------

def oras_push(repo: str, subject: str, data: bytes, artifact_type: str, layer_type: str,
              tag: str | None = None, index: bool = True) -> str:
    """Push `data` as an artifact whose subject is `subject` (plain HTTP, as `oras attach` does)
    and, like oras on a registry without the referrers API, add it to the sha256-<hex> index."""
    base = f"http://{HOST}/v2/{repo}"

    def blob(body: bytes) -> str:
        digest = sha256_digest(body)
        start = requests.post(f"{base}/blobs/uploads/", timeout=10)
        location = start.headers["Location"]
        url = location if location.startswith("http") else f"http://{HOST}{location}"
        requests.put(url, params={"digest": digest}, data=body, timeout=10,
                     headers={"Content-Type": "application/octet-stream"}).raise_for_status()
        return digest

    head = requests.head(f"{base}/manifests/{subject}", timeout=10, headers={"Accept": OCI_MANIFEST})
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
                "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": blob(b"{}"), "size": 2},
                "layers": [{"mediaType": layer_type, "digest": blob(data), "size": len(data)}],
                "subject": {"mediaType": OCI_MANIFEST, "digest": subject,
                            "size": int(head.headers["Content-Length"])},
                "annotations": {label_keys.OCI_CREATED: "2099-01-01T00:00:00Z"}}
    raw = json.dumps(manifest).encode()
    digest = sha256_digest(raw)
    requests.put(f"{base}/manifests/{tag or digest}", data=raw, timeout=10,
                 headers={"Content-Type": OCI_MANIFEST}).raise_for_status()
    if index:
        got = requests.get(f"{base}/manifests/{referrers_tag(subject)}", timeout=10, headers={"Accept": OCI_INDEX})
        listing = got.json() if got.status_code == 200 else {"schemaVersion": 2, "mediaType": OCI_INDEX,
                                                            "manifests": []}
        listing["manifests"].append({"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw),
                                     "artifactType": artifact_type})
        put_index(repo, subject, listing)
    return digest


def put_index(repo: str, subject: str, listing: dict) -> None:
    requests.put(f"http://{HOST}/v2/{repo}/manifests/{referrers_tag(subject)}", data=json.dumps(listing), timeout=10,
                 headers={"Content-Type": OCI_INDEX}).raise_for_status()


def envelope_of(space: Space, repo: str, artifact: str) -> bytes:
    raw, _, _ = space.client.get_manifest(repo, artifact)
    return space.client.get_blob(repo, json.loads(raw)["layers"][0]["digest"])


# -- forged ----------------------------------------------------------------------------------------

def test_forged_verdict_pushed_as_the_old_verdict_tag_is_refused(space: Space) -> None:
    """Issue 11's attack: a passing verdict's JSON with digest changed, pushed as `sha256-<hex>.verdict`."""
    r = rev()
    digest = space.build(CPU, r, result=None)
    forged = json.dumps({"schema": 1, **signing.verdict(CPU, digest), "runner": {"hostname": "forged"}}).encode()
    oras_push(space.dev_repo(CPU), digest, forged, VERDICT_TYPE, VERDICT_TYPE, tag=verdict_tag(digest), index=False)
    report = space.release([CPU], r, "0.1.0")
    refused(report, "no valid verdict", "only an unsigned verdict")
    assert released(space) == []


@pytest.mark.parametrize(("artifact_type", "layer_type", "cause"), [
    (VERDICT_TYPE, VERDICT_TYPE, "unsigned: a plain verdict artifact"),
    (ATTESTATION_TYPE, "application/vnd.dsse.envelope.v1+json", "unsigned: not a DSSE envelope"),
])
def test_forged_verdict_attached_as_a_referrer_is_refused(space: Space, artifact_type: str, layer_type: str,
                                                          cause: str) -> None:
    r = rev()
    digest = space.build(CPU, r, result=None)
    oras_push(space.dev_repo(CPU), digest, json.dumps(signing.verdict(CPU, digest)).encode(), artifact_type,
              layer_type)
    refused(space.release([CPU], r, "0.1.0"), "no valid verdict", cause)
    assert released(space) == []


# -- replayed --------------------------------------------------------------------------------------

def test_valid_verdict_replayed_onto_another_digest_is_refused(space: Space) -> None:
    r1, r2 = rev(), rev()
    tested = space.build(CPU, r1)
    untested = space.build(CPU, r2, result=None)
    repo = space.dev_repo(CPU)
    [good] = referrers(space.client, repo, tested, ATTESTATION_TYPE)
    oras_push(repo, untested, envelope_of(space, repo, good.digest), ATTESTATION_TYPE,
              "application/vnd.dsse.envelope.v1+json")
    refused(space.release([CPU], r2, "0.1.0"), "no valid verdict", f"replayed: signed for {tested}, not for "
                                                                     f"{untested}")
    assert released(space) == []
    assert space.release([CPU], r1, "0.1.0").ok           # the verdict still counts for its own digest


# -- tampered --------------------------------------------------------------------------------------

def test_tampered_verdict_is_refused_and_the_valid_failing_one_still_counts(space: Space) -> None:
    r = rev()
    failing = [signing.result("common/test_x.py::test_a"), signing.result("pytorch/test_ddp.py::test_ddp", "failed")]
    digest = space.build(CPU, r, result="failed", tests=failing)
    repo = space.dev_repo(CPU)
    [real] = referrers(space.client, repo, digest, ATTESTATION_TYPE)
    edited = signing.tamper(envelope_of(space, repo, real.digest),
                            {"result": "passed", "started": "2099-01-01T00:00:00.000+00:00",
                             "tests": [dict(t, result="passed") for t in failing]})
    oras_push(repo, digest, edited, ATTESTATION_TYPE, "application/vnd.dsse.envelope.v1+json")
    report = space.release([CPU], r, "0.1.0")
    refused(report, "verdict of", "is 'failed'")
    assert any("wrongly signed" in i for i in report.images[0].ignored)
    assert released(space) == []


# -- untrusted -------------------------------------------------------------------------------------

def test_verdict_signed_by_an_untrusted_key_is_refused(space: Space) -> None:
    r = rev()
    digest = space.build(CPU, r, result=None)
    signing.attest(space.client, space.dev_repo(CPU), digest, signing.verdict(CPU, digest), key=signing.ATTACKER)
    refused(space.release([CPU], r, "0.1.0"), "no valid verdict", "untrusted key: signed by",
            signing.ATTACKER.keyid[:16])
    assert released(space) == []
    # Trusting that key (a reviewed change to config/trusted-keys.yaml) is what lets it through.
    assert space.release([CPU], r, "0.1.0", trusted=signing.trusted(signing.KEY, signing.ATTACKER)).ok


# -- schemas ---------------------------------------------------------------------------------------

def test_a_validly_signed_verdict_of_the_current_schema_releases_and_one_of_an_older_schema_is_refused(
        space: Space) -> None:
    """validate writes schema 6 (.../verdict/v6), naming the image's signed SBOM, its platform, the matrix and the
    library promises; a signed schema-3 verdict (from before verdicts named SBOMs) is no longer read, so it
    releases nothing, and it is retired (ignored): it does not block the newer verdict."""
    r = rev()
    digest = space.build(CPU, r, result=None)
    signing.attest(space.client, space.dev_repo(CPU), digest, signing.verdict(CPU, digest, schema=3))
    refused(space.release([CPU], r, "0.1.0"), "no valid verdict",
            "retired: the signed predicate: unsupported verdict schema 3 (this toolkit reads schemas 4, 5 and 6)")
    assert released(space) == []
    newer = signing.verdict(CPU, digest, started="2026-02-01T00:00:00.000+00:00")
    signing.attest(space.client, space.dev_repo(CPU), digest, newer)
    report = space.release([CPU], r, "0.1.0")
    assert report.ok, report.images[0].problems
    counted = report.images[0].evidence[0].verdict
    assert counted is not None and counted.schema_ == 6
    assert "2.13-0.1.0" in released(space)


@pytest.mark.parametrize(("change", "cause"), [
    ({"schema": 7}, "unsupported verdict schema 7 (this toolkit reads schemas 4, 5 and 6)"),
    ({"tests": None}, "`tests`: input should be a valid list"),
    ({"runner": {"gpus": []}}, "`runner.hostname` is missing"),
])
def test_a_validly_signed_verdict_that_does_not_parse_is_refused_naming_why(space: Space, change: dict,
                                                                           cause: str) -> None:
    """Signed by a trusted tester, about this digest, and not a verdict this toolkit reads: it blocks (issue 48),
    even beside a valid pass, naming why."""
    r = rev()
    digest = space.build(CPU, r)
    signing.attest(space.client, space.dev_repo(CPU), digest, {**signing.verdict(CPU, digest), **change})
    refused(space.release([CPU], r, "0.1.0"), "cannot be read or typed", "cannot be typed", cause)
    assert released(space) == []


# -- overwritten and append-only -------------------------------------------------------------------

def test_verdicts_are_append_only_and_the_newest_valid_one_counts(space: Space) -> None:
    r = rev()
    digest = space.build(CPU, r, result=None)
    repo = space.dev_repo(CPU)
    signing.attest(space.client, repo, digest, signing.verdict(CPU, digest, started="2026-01-01T00:00:00+00:00"))
    failed = signing.verdict(CPU, digest, "failed", started="2026-01-02T00:00:00+00:00")
    signing.attest(space.client, repo, digest, failed)
    assert len(referrers(space.client, repo, digest, ATTESTATION_TYPE)) == 2      # the pass is still there
    refused(space.release([CPU], r, "0.1.0"), "is 'failed'")                      # but the newer failure counts
    # A forged, newer "pass" (unsigned, or signed by an untrusted key) does not hide the failure.
    oras_push(repo, digest, json.dumps(signing.verdict(CPU, digest, started="2099-01-01T00:00:00+00:00")).encode(),
              ATTESTATION_TYPE, "application/vnd.dsse.envelope.v1+json")
    signing.attest(space.client, repo, digest, signing.verdict(CPU, digest, started="2099-01-01T00:00:00+00:00"),
                   key=signing.ATTACKER)
    report = space.release([CPU], r, "0.1.0")
    refused(report, "is 'failed'")
    assert len(report.images[0].ignored) == 2
    # A newer valid pass (a re-validation) is what releases it.
    signing.attest(space.client, repo, digest, signing.verdict(CPU, digest, started="2026-01-03T00:00:00+00:00"))
    assert space.release([CPU], r, "0.1.0").ok


def test_overwriting_the_referrers_index_does_not_hide_the_failing_verdict(space: Space) -> None:
    """Push access lets anyone rewrite the `sha256-<hex>` index; each verdict also has a tag named by
    its own digest, so dropping the newest failing verdict from the index does not bring back the pass."""
    r = rev()
    digest = space.build(CPU, r, result=None)
    repo = space.dev_repo(CPU)
    passed = signing.attest(space.client, repo, digest, signing.verdict(CPU, digest,
                                                                        started="2026-01-01T00:00:00+00:00"))
    signing.attest(space.client, repo, digest, signing.verdict(CPU, digest, "failed",
                                                               started="2026-01-02T00:00:00+00:00"))
    put_index(repo, digest, {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [passed.descriptor()]})
    assert [x.digest for x in referrers(space.client, repo, digest)] == [passed.digest]   # the index now lies
    refused(space.release([CPU], r, "0.1.0"), "is 'failed'")
    assert released(space) == []


def test_a_verdict_pin_tag_pointed_elsewhere_refuses_the_release(space: Space) -> None:
    r = rev()
    digest = space.build(CPU, r, result=None)
    repo = space.dev_repo(CPU)
    signing.attest(space.client, repo, digest, signing.verdict(CPU, digest, started="2026-01-01T00:00:00+00:00"))
    failing = signing.attest(space.client, repo, digest, signing.verdict(CPU, digest, "failed",
                                                                         started="2026-01-02T00:00:00+00:00"))
    # Overwrite the failing verdict: its pin tag now names a forged artifact, the index lists only the pass.
    forged = oras_push(repo, digest, b"{}", ATTESTATION_TYPE, "application/vnd.dsse.envelope.v1+json",
                       tag=verdict_pin_tag(digest, failing.digest), index=False)
    refused(space.release([CPU], r, "0.1.0"), "was overwritten in the registry", f"now names {forged}")
    assert released(space) == []


# -- stand-ins by provenance -----------------------------------------------------------------------

def test_relabelled_standin_is_refused_by_its_labels_base_and_layers(space: Space) -> None:
    """Issue 11's attack: the stand-in label set to false with its other stand-in labels left. And with every
    stand-in label removed: the base digest is the mirror's stand-in, and its layers are the image's first."""
    client = space.client
    mirror_repo = f"{space.prefix}/nvidia/pytorch"
    standin, _ = push_single(client, mirror_repo, "25.10-py3", {label_keys.STANDIN: "true"})
    space.settings = dataclasses.replace(space.settings, base_mirror=f"{HOST}/{space.prefix}")
    r1 = rev()
    space.build(NGC, r1, **{label_keys.STANDIN: "false",
                            label_keys.STANDIN_FOR: "nvcr.io/nvidia/pytorch:25.10-py3"})
    refused(space.release([NGC], r1, "0.1.0"), "stand-in labels", f"{label_keys.STANDIN}=false")
    r2 = rev()
    space.build(NGC, r2, **{label_keys.OCI_BASE_DIGEST: standin})
    refused(space.release([NGC], r2, "0.1.0"), f"is built on {standin}", "the stand-in")
    # No label at all: the image is the stand-in's layers plus one of its own.
    raw, _, _ = client.get_manifest(mirror_repo, standin)
    manifest = json.loads(raw)
    for blob in (manifest["config"]["digest"], manifest["layers"][0]["digest"]):
        client.mount_blob(space.dev_repo(NGC), blob, mirror_repo)
    extra, _ = push_single(client, space.dev_repo(NGC), None, {})
    extra_layer = json.loads(client.get_manifest(space.dev_repo(NGC), extra)[0])["layers"][0]
    labels = {label_keys.CELL: NGC.key, label_keys.OCI_BASE_NAME: NGC.base}
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": labels},
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    image = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
             "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                        "digest": client.put_blob(space.dev_repo(NGC), config), "size": len(config)},
             "layers": [manifest["layers"][0], extra_layer]}
    r3 = rev()
    on_standin = client.put_manifest(space.dev_repo(NGC), names.dev_tag(r3, NGC.version), json.dumps(image).encode(),
                                     OCI_MANIFEST)
    signing.attest(client, space.dev_repo(NGC), on_standin, signing.verdict(NGC, on_standin))
    refused(space.release([NGC], r3, "0.1.0"), "starts with the layers of the stand-in")
    assert space.client.tags(space.rel_repo(NGC)) == []


# -- versions ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("respelt", ["0.1.0.0", "0.1"])
def test_a_version_released_under_one_spelling_is_refused_under_another(space: Space, respelt: str) -> None:
    r1, r2 = rev(), rev()
    first = space.build(CPU, r1)
    assert space.release([CPU], r1, "0.1.0").ok
    space.build(CPU, r2)
    problem = refused(space.release([CPU], r2, respelt), "already exists as", "2.13-0.1.0")
    assert "same PEP 440 version" in problem
    assert space.release([CPU], r1, "v0.1.0").images[0].status == "unchanged"   # v0.1.0 is 0.1.0: already done
    assert space.resolve(CPU, "latest") == first and space.resolve(CPU, f"2.13-{respelt}") is None


# -- a late tag write ----------------------------------------------------------------------------------

class HookedClient(RegistryClient):
    """Runs `after(tag)` after each manifest write by tag."""

    def __init__(self, *args, after, **kw) -> None:  # noqa: ANN001, ANN002, ANN003
        super().__init__(*args, **kw)
        self.after = after

    def put_manifest(self, repo: str, ref: str, body: bytes, media_type: str) -> str:
        digest = super().put_manifest(repo, ref, body, media_type)
        self.after(ref)
        return digest


def test_a_late_write_of_an_older_release_is_repaired_by_the_final_recheck(space: Space) -> None:
    r1, r2 = rev(), rev()
    d1, d2 = space.build(CPU, r1), space.build(CPU, r2)
    with FaultProxy(upstream=upstream()) as proxy:
        # 0.1.0's first write of `latest` is held in the network; the client gives up (2 s) and retries.
        late = proxy.add(r"PUT .*/rel/pytorch-cpu/manifests/latest$", "late", stall_s=25)
        first = space.release([CPU], r1, "0.1.0", client=RegistryClient(proxy.address, retry=FAST))
        assert first.ok and space.resolve(CPU, "latest") == d1

        def deliver_the_late_write(tag: str) -> None:
            if tag == "latest" and not late.delivered.is_set():   # 0.2.0 has just written latest ...
                late.hold.set()                                   # ... and 0.1.0's old write lands now
                assert late.delivered.wait(20)

        second = space.release([CPU], r2, "0.2.0", client=HookedClient(HOST, retry=FAST, after=deliver_the_late_write))
    item = second.images[0]
    assert second.ok and item.repaired and f"moved to {d1}" in item.repaired[0], item.repaired
    assert space.resolve(CPU, "latest") == d2 and space.resolve(CPU, "2.13") == d2
    # A late write that lands after the run: re-running the newest release puts the moving tags back.
    raw, media_type, _ = space.client.get_manifest(space.rel_repo(CPU), d1)
    space.client.put_manifest(space.rel_repo(CPU), "latest", raw, media_type)
    again = space.release([CPU], r2, "0.2.0")
    assert again.ok and again.images[0].tags_made == ["latest"] and space.resolve(CPU, "latest") == d2
