"""Issue 48, the registry reading: with push rights alone (no key, no delete), an older pass must never release
while a newer failure of the same digest exists. The audit's attacks, each run against release's gate (gather)
and `verify` (the same reading, buildtool.validate.verdicts), each failing on the code before issue 48:

(a) relabelling the failure's entry in the `sha256-<hex>` fallback index (its artifactType, or its bundle's
    predicate-type annotation): verdicts are typed by their own manifest, read by digest, never by the listing;
(b) reordering the fallback index, or rewriting its `created` annotations: only signed times order verdicts;
(c) listing a copy of the failure's envelope first: the copy carries the same signed time, so de-duplication
    erases nothing that decides.
And what cannot be read or typed blocks: a pinned verdict that is gone, a trusted tester's statement about the
digest that does not parse. In-memory registry (tests/memregistry.py): anyone holding it can do what anyone
with push access can.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from buildtool.attest.referrers import Payload, attach
from buildtool.attest.sigstore_bundle import BUNDLE_MEDIA_TYPE, PREDICATE_TYPE_ANNOTATION
from buildtool.contracts.label_keys import ARTIFACT_CREATED, VERDICT_RESULT
from buildtool.contracts.names import ATTESTATION_TYPE, referrers_tag
from buildtool.registry.client import OCI_INDEX
from buildtool.release.chain import Verification, verify_reference
from tests import signing
from tests.gate_scenarios import scenario
from tests.test_release_platforms import CPU, Dev
from tests.test_verify_strict import checkout, single

FAIL_AT, PASS_AT = "2026-01-01T10:00:00.000+00:00", "2026-01-01T10:01:00.000+00:00"


def runner(hostname: str) -> dict[str, Any]:
    return {"hostname": hostname, "gpu_runner": False, "gpus": [], "driver": "", "cuda_driver": "", "gpu_problem": ""}


def image_with_pass_then_failure() -> Dev:
    """A single-platform dev image validated on two runners: runner-b's pass was uploaded first, runner-a's failure
    after it. runner-a signed its failure a minute before runner-b signed the pass: within what two runners'
    clocks may differ (verdict_choice.CLOCK_SKEW_S), so nothing shows the failure ran before the pass, and the
    failure counts. Before issue 48 it counted because it was uploaded after (index position, `created`)."""
    dev = Dev(CPU)
    digest = dev.image("amd64")
    dev.evidence(digest, "linux/amd64", started=PASS_AT, runner=runner("runner-b"))
    failed = [signing.result(f"{g}/test_x.py::test_{g}", "failed" if g == CPU.tests[-1] else "passed")
              for g in CPU.tests]
    body = signing.verdict(CPU, digest, "failed", platform="linux/amd64", tests=failed, started=FAIL_AT,
                           runner=runner("runner-a"))
    dev.failure = signing.attest(dev.client, dev.repo, digest, body).digest   # type: ignore[arg-type,attr-defined]
    single(dev, digest)
    dev.digest = digest   # type: ignore[attr-defined]
    return dev


def failure_entries(dev: Dev, digest: str, failure: str) -> set[str]:
    """The failure's artifact and its Sigstore bundle (the same envelope), as listed."""
    from buildtool.attest.sigstore_bundle import envelope as bundle_envelope

    own = json.loads(dev.client.get_manifest(dev.repo, failure)[0])
    wanted = json.loads(dev.client.get_blob(dev.repo, own["layers"][0]["digest"]))
    found = {failure}
    for d in index(dev, digest)["manifests"]:
        if d.get("artifactType") == BUNDLE_MEDIA_TYPE:
            layer = json.loads(dev.client.get_manifest(dev.repo, d["digest"])[0])["layers"][0]["digest"]
            if json.loads(bundle_envelope(dev.client.get_blob(dev.repo, layer))) == wanted:
                found.add(d["digest"])
    assert len(found) == 2
    return found


def index(dev: Dev, digest: str) -> dict[str, Any]:
    return json.loads(dev.client.get_manifest(dev.repo, referrers_tag(digest))[0])


def rewrite_index(dev: Dev, digest: str, change) -> None:  # noqa: ANN001
    body = index(dev, digest)
    change(body["manifests"])
    dev.client.put_manifest(dev.repo, referrers_tag(digest), json.dumps(body).encode(), OCI_INDEX)


def both(dev: Dev) -> tuple[list[str], Verification]:
    """Release's gate and verify, on the dev image, with the same keys."""
    item = dev.gather()
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}",   # type: ignore[arg-type]
                             signing.trusted(), checkout(dev.cell))
    return item.problems, found


def assert_the_failure_counts(dev: Dev) -> None:
    digest = dev.digest   # type: ignore[attr-defined]
    problems, found = both(dev)
    failed = f"verdict of {digest} is 'failed' (failed: {CPU.tests[-1]}/test_x.py::test_{CPU.tests[-1]})"
    assert failed in problems, problems
    assert not found.ok and found.problems == problems, (found.problem, found.problems)


@scenario("reading/pass-then-failure")
def untouched() -> Dev:
    return image_with_pass_then_failure()


def test_untouched_the_newer_failure_counts() -> None:
    assert_the_failure_counts(untouched())


def relabelled(relabel: Any) -> Dev:
    dev = image_with_pass_then_failure()
    entries = failure_entries(dev, dev.digest, dev.failure)   # type: ignore[attr-defined]
    rewrite_index(dev, dev.digest, lambda ms: [relabel(d) for d in ms if d["digest"] in entries])  # type: ignore[attr-defined]
    return dev


def as_sbom(d: dict[str, Any]) -> None:
    d.update(artifactType="application/vnd.cyclonedx+json")


def as_sbom_bundle(d: dict[str, Any]) -> None:
    d.update(artifactType=BUNDLE_MEDIA_TYPE, annotations={PREDICATE_TYPE_ANNOTATION: "https://cyclonedx.org/bom"})


scenario("reading/failure-relabelled-artifactType")(lambda: relabelled(as_sbom))
scenario("reading/failure-relabelled-as-another-bundle")(lambda: relabelled(as_sbom_bundle))


@pytest.mark.parametrize("relabel", [as_sbom, as_sbom_bundle], ids=["artifactType", "as-a-bundle-of-another-predicate"])
def test_a_relabelled_failure_in_the_fallback_index_still_counts(relabel) -> None:  # noqa: ANN001
    """(a) Before: a pinned verdict that was listed was read by its listing; relabelled (its artifact and its
    bundle), it was skipped and the older pass released."""
    assert_the_failure_counts(relabelled(relabel))


@scenario("reading/failure-only-as-a-relabelled-bundle")
def only_a_relabelled_bundle() -> Dev:
    dev = image_with_pass_then_failure()
    digest, failure = dev.digest, dev.failure   # type: ignore[attr-defined]
    (bundle,) = failure_entries(dev, digest, failure) - {failure}
    for key in [k for k in dev.client.manifests if k[0] == dev.repo and k[1].endswith(failure.partition(":")[2][:32])]:
        del dev.client.manifests[key]           # its pin tag (a registry admin could; the bundle stays)

    def change(ms: list[dict[str, Any]]) -> None:
        ms[:] = [d for d in ms if d["digest"] != failure]
        for d in ms:
            if d["digest"] == bundle:
                d["annotations"][PREDICATE_TYPE_ANNOTATION] = "https://cyclonedx.org/bom"
    rewrite_index(dev, digest, change)
    return dev


def test_a_relabelled_failure_bundle_still_counts_when_only_bundles_carry_it() -> None:
    """(a) The failure's bundle relabelled in the index, its own artifact unlisted and unpinned: the bundle's own
    manifest says what it is."""
    assert_the_failure_counts(only_a_relabelled_bundle())


@scenario("reading/index-reordered-and-created-rewritten")
def reordered() -> Dev:
    dev = image_with_pass_then_failure()
    entries = failure_entries(dev, dev.digest, dev.failure)   # type: ignore[attr-defined]

    def rewrite(ms: list[dict[str, Any]]) -> None:
        ms.sort(key=lambda d: d["digest"] not in entries)
        for d in ms:
            if d["digest"] in entries:
                d.setdefault("annotations", {})[ARTIFACT_CREATED] = "1999-01-01T00:00:00Z"
    rewrite_index(dev, dev.digest, rewrite)   # type: ignore[attr-defined]
    return dev


def test_reordering_the_index_and_rewriting_created_does_not_let_the_older_pass_count() -> None:
    """(b) Before: "uploaded after" rested on the index position and the `created` annotations, both the pusher's."""
    assert_the_failure_counts(reordered())


@scenario("reading/a-copy-of-the-failure-listed-first")
def copy_first() -> Dev:
    dev = image_with_pass_then_failure()
    digest, failure = dev.digest, dev.failure   # type: ignore[attr-defined]
    raw = json.loads(dev.client.get_manifest(dev.repo, failure)[0])
    envelope = dev.client.get_blob(dev.repo, raw["layers"][0]["digest"])
    copy = attach(dev.client, dev.repo, digest, ATTESTATION_TYPE,   # type: ignore[arg-type]
                  [Payload("application/vnd.dsse.envelope.v1+json", envelope, "copy")])

    def first(ms: list[dict[str, Any]]) -> None:
        ms.sort(key=lambda d: d["digest"] != copy.digest)
        ms[0]["annotations"][ARTIFACT_CREATED] = "1999-01-01T00:00:00Z"
    rewrite_index(dev, digest, first)
    for key in [k for k in dev.client.manifests if k[0] == dev.repo and k[1].endswith(failure.partition(":")[2][:32])]:
        del dev.client.manifests[key]           # the genuine one's pin: the copy is what is read first either way
    assert index(dev, digest)["manifests"][0]["digest"] == copy.digest
    return dev


def test_a_copy_of_the_failure_listed_first_does_not_erase_it() -> None:
    """(c) Before: de-duplication kept the copy's place in the list (first, `created` long ago) and erased the
    genuine later one, so the failure no longer came after the pass."""
    assert_the_failure_counts(copy_first())


@scenario("reading/a-pass-rewrapped-to-win-a-tie")
def rewrapped_tie() -> Dev:
    dev = Dev(CPU)
    digest = dev.image("amd64")
    body = signing.verdict(CPU, digest, "failed", platform="linux/amd64", started=FAIL_AT,
                           tests=[signing.result(f"{g}/test_x.py::test_{g}", "failed") for g in CPU.tests])
    signing.attest(dev.client, dev.repo, digest, body)   # type: ignore[arg-type]
    dev.evidence(digest, "linux/amd64", started=FAIL_AT)
    single(dev, digest)
    passes = [d for d in index(dev, digest)["manifests"]
              if (d.get("annotations") or {}).get(VERDICT_RESULT) == "passed"]
    raw = json.loads(dev.client.get_manifest(dev.repo, passes[0]["digest"])[0])
    envelope = dev.client.get_blob(dev.repo, raw["layers"][0]["digest"])
    for n in range(8):      # wrappers with many digests: whichever is the largest, the failure counts
        attach(dev.client, dev.repo, digest, ATTESTATION_TYPE,   # type: ignore[arg-type]
               [Payload("application/vnd.dsse.envelope.v1+json", envelope, f"rewrap-{n}")])
    dev.digest = digest   # type: ignore[attr-defined]
    return dev


def test_a_pass_rewrapped_to_win_a_tie_does_not_beat_a_failure_of_the_same_time() -> None:
    """A pass and a failure with the same signed time, from the same runner, the failure uploaded first: the
    failure counts, whatever the artifacts' digests. Before, the larger artifact digest won the tie, and
    re-wrapping the pass until its digest was the larger made it win."""
    dev = rewrapped_tie()
    problems, found = both(dev)
    assert any(p.startswith(f"verdict of {dev.digest} is 'failed'") for p in problems), problems  # type: ignore[attr-defined]
    assert not found.ok and found.problems == problems


@scenario("reading/a-pass-signed-later-on-the-same-runner")
def same_runner_pass_later() -> Dev:
    dev = Dev(CPU)
    digest = dev.image("amd64")
    dev.evidence(digest, "linux/amd64", started=PASS_AT)
    body = signing.verdict(CPU, digest, "failed", platform="linux/amd64", started=FAIL_AT,
                           tests=[signing.result(f"{g}/test_x.py::test_{g}", "failed") for g in CPU.tests])
    signing.attest(dev.client, dev.repo, digest, body)   # type: ignore[arg-type]
    single(dev, digest)
    dev.digest = digest   # type: ignore[attr-defined]
    return dev


def test_a_pass_signed_later_on_the_same_runner_counts_however_the_index_is_ordered() -> None:
    """The rule's other side: on one runner (one clock) a pass signed after a failure counts, in any index order."""
    dev = same_runner_pass_later()
    for order in (lambda ms: None, lambda ms: ms.reverse()):
        rewrite_index(dev, dev.digest, order)   # type: ignore[attr-defined]
        problems, found = both(dev)
        assert problems == [] and found.ok, (problems, found.problem)


@scenario("reading/a-pinned-verdict-that-cannot-be-read")
def unreadable_pin() -> Dev:
    dev = Dev(CPU)
    digest = dev.image("amd64")
    dev.evidence(digest, "linux/amd64", started=PASS_AT)
    body = signing.verdict(CPU, digest, "failed", platform="linux/amd64", started=FAIL_AT)
    failure = signing.attest(dev.client, dev.repo, digest, body).digest   # type: ignore[arg-type]
    single(dev, digest)
    layer = json.loads(dev.client.get_manifest(dev.repo, failure)[0])["layers"][0]["digest"]
    del dev.client.blobs[layer]
    dev.digest, dev.failure = digest, failure   # type: ignore[attr-defined]
    return dev


def test_a_pinned_verdict_that_cannot_be_read_blocks() -> None:
    """A verdict pin names an artifact whose payload is gone (a registry that lost a blob): release and verify
    refuse naming it, rather than decide without it."""
    dev = unreadable_pin()
    problems, found = both(dev)
    assert any(p.startswith(f"a verdict of {dev.digest} cannot be read or typed: verdict attestation "  # type: ignore[attr-defined]
                            f"{dev.failure} cannot be read") for p in problems), problems  # type: ignore[attr-defined]
    assert not found.ok and found.problems == problems


GHOST = "sha256:" + "9" * 64


@scenario("reading/a-listed-artifact-that-is-not-there")
def ghost_listed() -> Dev:
    dev = Dev(CPU)
    single(dev, digest := dev.validated("amd64"))
    rewrite_index(dev, digest, lambda ms: ms.append({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                                     "digest": GHOST, "size": 10, "artifactType": "x"}))
    dev.digest = digest   # type: ignore[attr-defined]
    return dev


def test_a_listed_artifact_that_is_not_there_blocks() -> None:
    dev = ghost_listed()
    problems, found = both(dev)
    assert f"a verdict of {dev.digest} cannot be read or typed: {GHOST}, listed, is not in the registry: it may " \
           "be a verdict nobody can read" in problems, problems   # type: ignore[attr-defined]
    assert not found.ok and found.problems == problems


@scenario("reading/a-trusted-statement-that-cannot-be-typed")
def untyped() -> Dev:
    dev = Dev(CPU)
    single(dev, digest := dev.validated("amd64", started=FAIL_AT))
    future = signing.verdict(CPU, digest, "failed", platform="linux/amd64", started=FAIL_AT)
    future["schema"] = 99
    signing.attest(dev.client, dev.repo, digest, future)   # type: ignore[arg-type]
    return dev


def test_a_trusted_statement_that_cannot_be_typed_blocks() -> None:
    """A trusted tester signed a statement about this digest this toolkit cannot read (a verdict schema it does
    not know): it blocks an older pass instead of being skipped as if it were forged."""
    problems, found = both(untyped())
    assert any("cannot be typed: the signed predicate: unsupported verdict schema 99" in p
               and "a verdict this toolkit cannot read blocks" in p for p in problems), problems
    assert not found.ok and found.problems == problems


@scenario("reading/an-untrusted-failure")
def untrusted_failure() -> Dev:
    dev = Dev(CPU)
    single(dev, digest := dev.validated("amd64", started=PASS_AT))
    body = signing.verdict(CPU, digest, "failed", platform="linux/amd64", started=FAIL_AT)
    signing.attest(dev.client, dev.repo, digest, body, key=signing.ATTACKER)   # type: ignore[arg-type]
    return dev


def test_an_untrusted_verdict_never_blocks() -> None:
    """What anyone can push (a verdict signed by a key nobody trusts) is ignored, never a refusal."""
    problems, found = both(untrusted_failure())
    assert problems == [] and found.ok, (problems, found.problem)


@scenario("reading/a-newer-failure-of-another-cell")
def other_cells_failure() -> Dev:
    dev = Dev(CPU)
    single(dev, digest := dev.validated("amd64", started=FAIL_AT))
    other = signing.verdict(CPU, digest, "failed", platform="linux/amd64", started=PASS_AT, cell="tensorflow-cpu:2.21")
    signing.attest(dev.client, dev.repo, digest, other)   # type: ignore[arg-type]
    return dev


def test_a_newer_failure_recorded_under_another_cell_decides_neither() -> None:
    """Before issue 48 verify read every cell's verdicts and let a newer failure of another cell decide, while
    release (which filters by the cell it releases) released: verify now reads the verdicts of the image's cell
    only, as release does, and both agree."""
    dev = other_cells_failure()
    problems, found = both(dev)
    assert problems == [] and found.ok, (problems, found.problem)
    assert any("mismatched: the verdict is for cell 'tensorflow-cpu:2.21', not pytorch-cpu:2.13" in i
               for i in dev.gather().evidence[0].ignored)
