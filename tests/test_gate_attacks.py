"""The release gate's newer surfaces, attacked as someone with push rights to the registry or one runner's signing
key (house rule: a new surface of the release gate gets its attacker first): the one-GPU pairing's companion, the
version tags read back before the moving tags move, the provenance's times, overwritten verdict pins. Each attack
is shown refused with its cause, by `release` and `verify` alike (the fixtures registered here run through both
in tests/test_gate_agreement.py). In-memory registry (tests/memregistry.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

import tests.test_gate_pairing as pairing
from buildtool.attest import provenance_store
from buildtool.release.chain import verify_reference
from buildtool.validate import verdict_choice
from tests import signing
from tests.gate_scenarios import same_clock, scenario
from tests.test_release_platforms import CPU, REVISION, Dev
from tests.test_verify_strict import checkout, single

FUTURE = "2099-01-01T00:00:00Z"
NOT_HELD = "f" * 40      # a commit no clone holds


def _dated(dev: Dev, digest: str, finished: str, revision: str = "") -> None:
    """Another signed provenance of `digest`, by the trusted builder key, that finished at `finished`."""
    prov = signing.provenance(dev.cell, platform="linux/amd64", **({"revision": revision} if revision else {}))
    prov["runDetails"]["metadata"].update(startedOn=finished, finishedOn=finished)
    signing.attach_provenance(dev.client, dev.repo, digest, prov)   # type: ignore[arg-type]


def future_provenance(revision: str = NOT_HELD, alone: bool = False) -> tuple[Dev, str]:
    """A validated image whose builder also signed a provenance dated 2099 (its clock ahead, or its key held by
    an attacker), naming `revision`; `alone`: that provenance is the image's only one."""
    dev = Dev(CPU)
    if alone:
        digest = dev.image("amd64")
        signing.attest_sbom(dev.client, dev.repo, digest)   # type: ignore[arg-type]
        signing.attest(dev.client, dev.repo, digest, signing.verdict(CPU, digest, platform="linux/amd64"))  # type: ignore[arg-type]
    else:
        digest = dev.validated("amd64")
    _dated(dev, digest, FUTURE, revision)
    single(dev, digest)
    return dev, digest


def provenance_naming(revision: str) -> Dev:
    """A validated image whose only provenance names `revision` (the release commit spelt another way)."""
    dev = Dev(CPU)
    digest = dev.image("amd64")
    signing.attest_sbom(dev.client, dev.repo, digest)   # type: ignore[arg-type]
    signing.attach_provenance(dev.client, dev.repo, digest,   # type: ignore[arg-type]
                              signing.provenance(CPU, platform="linux/amd64", revision=revision))
    signing.attest(dev.client, dev.repo, digest, signing.verdict(CPU, digest, platform="linux/amd64"))  # type: ignore[arg-type]
    single(dev, digest)
    return dev


SPELT = {"short": lambda: signing.head_commit()[:12], "uppercase": lambda: signing.head_commit().upper(),
         "not-held": lambda: NOT_HELD}
for _name, _revision in SPELT.items():
    scenario(f"binding/a-provenance-naming-a-{_name}-revision")(lambda spelt=_revision: provenance_naming(spelt()))


@pytest.mark.parametrize(("revision", "cause"), [
    (lambda: signing.head_commit()[:12], "is not a full commit (40 hex digits)"),
    (lambda: signing.head_commit().upper(), "is not a full commit (40 hex digits)"),
    (lambda: NOT_HELD, "is not a commit git knows in"),
], ids=["short", "uppercase", "not-held"])
def test_a_provenance_naming_the_release_commit_spelt_otherwise_is_refused_naming_its_revision(
        revision: Any, cause: str) -> None:
    """git resolves a short or an uppercase sha to the release commit; release takes only the full lowercase one,
    and says which it got (tests/test_testcode_revision.py runs the same attacks in a git history of their own)."""
    named = revision()
    problems = both(provenance_naming(named))
    assert any(p.endswith(f"the provenance's revision {named!r} {cause}") or f"revision {named} {cause}" in p
               for p in problems), problems


scenario("binding/a-future-dated-provenance-beside-the-honest-one")(lambda: future_provenance()[0])
scenario("binding/only-a-future-dated-provenance")(lambda: future_provenance(signing.head_commit(), alone=True)[0])


def both(dev: Dev) -> list[str]:
    """release's gate and verify (in the project) on the dev image: one answer, returned."""
    item = dev.gather()
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}",   # type: ignore[arg-type]
                             signing.trusted(), checkout(dev.cell))
    assert same_clock(found.problems) == same_clock(item.problems), (found.problems, item.problems)
    assert found.ok == (item.status == "ready")
    return item.problems


# -- provenance times (attest/provenance_store.py) ---------------------------------------------------------------

def test_the_provenance_clock_skew_is_the_verdicts() -> None:
    """attest may not import validate (tests/test_architecture.py): the two limits are kept equal here."""
    assert provenance_store.CLOCK_SKEW_S == verdict_choice.CLOCK_SKEW_S


def test_a_future_dated_provenance_is_refused_naming_its_time_and_the_honest_one_counts() -> None:
    """Before: of two valid provenances the one that finished last counted, so one dated 2099 won over every
    provenance the builder would ever sign for the digest (here it named a commit no clone holds, and refused the
    image). As with verdicts (CLOCK_SKEW_S), one dated more than 300 s after the reader's clock cannot be placed."""
    dev, digest = future_provenance()
    problems = both(dev)
    assert problems == [], problems
    item = dev.gather()
    assert item.evidence[0].provenance is not None
    assert item.evidence[0].provenance.buildDefinition.externalParameters.revision == signing.head_commit()
    assert any(f"it finished at {FUTURE}, more than 300 s after this machine's clock" in i for i in item.ignored), \
        item.ignored


def test_an_image_whose_only_provenance_is_future_dated_is_refused_naming_why() -> None:
    dev, digest = future_provenance(signing.head_commit(), alone=True)
    problems = both(dev)
    assert any(p.startswith(f"{digest} has no valid provenance: no provenance verifies: ")
               and f"it finished at {FUTURE}, more than 300 s after this machine's clock" in p
               for p in problems), problems


def test_a_provenance_within_the_skew_of_the_readers_clock_still_counts() -> None:
    """A builder whose clock is a little ahead (within CLOCK_SKEW_S) is not refused, and its provenance, the
    newest, counts."""
    dev = Dev(CPU)
    digest = dev.validated("amd64")
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    _dated(dev, digest, soon)
    found = provenance_store.find_provenance(dev.client, dev.repo, digest, signing.trusted())   # type: ignore[arg-type]
    assert found.provenance is not None and not found.rejected, found.rejected
    assert found.provenance.runDetails.metadata.finishedOn == soon


def test_the_readers_clock_is_the_one_given() -> None:
    dev, digest = future_provenance(signing.head_commit(), alone=True)
    later = dt.datetime(2099, 1, 1, tzinfo=dt.UTC)
    found = provenance_store.find_provenance(dev.client, dev.repo, digest, signing.trusted(),  # type: ignore[arg-type]
                                             now=later)
    assert found.provenance is not None, found.rejected


# -- the one-GPU pairing's companion (release/gather.py _companion_binding, validate/verdict_choice.py) ----------

BUILDER_ONLY = signing.generate()     # a build job's key: trusted as builder, not as tester
OTHER_DIGEST = "sha256:" + "9" * 64


def _trusted_with_a_builder() -> Any:
    keys = signing.trusted()
    extra = signing.trusted(BUILDER_ONLY, roles=("builder",))
    keys.keys.update(extra.keys)
    keys.names.update({k: "build jobs" for k in extra.keys})
    keys.roles.update(extra.roles)
    return keys


def companion(attack: str) -> Dev:
    """A pytorch-cuda image validated on a one-GPU runner; its multi-GPU companion, as `attack` makes it."""
    dev = Dev(pairing.CUDA)
    digest = dev.image("amd64")
    dev.evidence(digest, "linux/amd64", verdict=False)
    signing.attest(dev.client, dev.repo, digest,   # type: ignore[arg-type]
                   pairing.body(digest, 1, busbw="skipped", started=pairing.ONE_AT))
    multi = pairing.body(digest, 2, busbw="passed", started=pairing.MULTI_AT, selected=True)
    host, repo = f"{dev.client.host}/{dev.repo}", dev.repo
    if attack == "of-another-digest":          # another image's companion, its envelope attached to this digest
        other = pairing.body(OTHER_DIGEST, 2, busbw="passed", started=pairing.MULTI_AT, selected=True)
        signing.attach_raw(dev.client, repo, digest, signing.envelope(host, OTHER_DIGEST, other))  # type: ignore[arg-type]
    elif attack == "carrying-another-digests-verdict":   # a statement about this digest, the verdict of another
        other = pairing.body(OTHER_DIGEST, 2, busbw="passed", started=pairing.MULTI_AT, selected=True)
        signing.attach_raw(dev.client, repo, digest, signing.envelope(host, digest, other))  # type: ignore[arg-type]
    elif attack == "of-another-platform":
        signing.attest(dev.client, repo, digest, {**multi, "platform": "linux/arm64"})  # type: ignore[arg-type]
    elif attack == "of-another-cell":
        signing.attest(dev.client, repo, digest, {**multi, "cell": "pytorch-cpu:2.13"})  # type: ignore[arg-type]
    elif attack == "replayed-after-a-newer-failure":     # the old pass attached again, as a new artifact
        data = signing.envelope(host, digest, multi)
        signing.attach_raw(dev.client, repo, digest, data)   # type: ignore[arg-type]
        failed = pairing.body(digest, 2, busbw="failed", started=pairing.LATER, selected=True)
        signing.attest(dev.client, repo, digest, failed)   # type: ignore[arg-type]
        signing.attach_raw(dev.client, repo, digest, data)   # type: ignore[arg-type]
    elif attack == "signed-by-a-builder-key":
        signing.attach_raw(dev.client, repo, digest,   # type: ignore[arg-type]
                           signing.envelope(host, digest, multi, BUILDER_ONLY))
    elif attack == "whose-busbw-test-was-skipped":
        skipped = pairing.body(digest, 2, busbw="skipped", started=pairing.MULTI_AT, selected=True)
        skipped["tests"][-1].update(skip_code="no-peer-image", skip_reason="skipped", result="skipped")
        signing.attest(dev.client, repo, digest, skipped)   # type: ignore[arg-type]
    elif attack == "that-never-ran-the-busbw-test":
        signing.attest(dev.client, repo, digest,   # type: ignore[arg-type]
                       {**multi, "tests": [signing.result(pairing.OTHERS[0])], "figures": {},
                        "selection": {"expression": "test_common", "deselected": pairing.OTHERS[1:] + [pairing.BUSBW]}})
    else:
        raise AssertionError(attack)
    single(dev, digest)
    return dev


ATTACKS = {
    "of-another-digest": f"replayed: signed for {OTHER_DIGEST}",
    "carrying-another-digests-verdict": "mismatched",
    "of-another-platform": "it ran on linux/arm64, not linux/amd64",
    "of-another-cell": "mismatched: the verdict is for cell 'pytorch-cpu:2.13', not pytorch-cuda:2.13",
    "replayed-after-a-newer-failure": f"{pairing.BUSBW} failed",
    "signed-by-a-builder-key": "trusted as builder, not as tester",
    "whose-busbw-test-was-skipped": f"it did not pass {pairing.BUSBW} skipped",
    "that-never-ran-the-busbw-test": f"it did not pass {pairing.BUSBW} not run",
}
for _attack in ATTACKS:
    scenario(f"pairing/a-companion-{_attack}")(lambda attack=_attack: companion(attack))


def both_trusting_a_builder(dev: Dev) -> tuple[list[str], list[str]]:
    """As `both`, with a build job's key trusted as builder too: (problems, ignored)."""
    from buildtool.release.gather import gather
    from buildtool.release.model import ReleaseOptions

    trusted = _trusted_with_a_builder()
    options = ReleaseOptions("0.1.0", "r", trusted=trusted, known_code=signing.known_code(),
                             source_check=signing.source_check())
    item = gather(dev.client, dev.plan, options)   # type: ignore[arg-type]
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}",   # type: ignore[arg-type]
                             trusted, checkout(dev.cell))
    assert found.problems == item.problems and not found.ok, (found.problems, item.problems)
    return item.problems, item.ignored


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_companion_that_is_not_this_images_multi_gpu_run_completes_nothing(attack: str) -> None:
    """The one-GPU verdict's skipped multi-GPU checks stay skipped (the refusal names the verdict it lacks) and the
    reason the offered companion did not count is named: among the ignored attestations (what does not verify or
    is of another cell), in the refusal (what verified but cannot pair), or as the newer failure that counts."""
    dev = companion(attack)
    problems, ignored = both_trusting_a_builder(dev)
    cause = ATTACKS[attack]
    if attack == "replayed-after-a-newer-failure":
        assert any(p.startswith(f"verdict of {dev.client.get_manifest(dev.repo, dev.plan.dev_tag)[2]} is 'failed' "
                                f"(failed: {pairing.BUSBW})") for p in problems), problems
        return
    pairing.one_gpu_refusal(problems, "release also needs")
    assert any(cause in p for p in problems + ignored), (problems, ignored)


# -- version tags read back before the moving tags move (release/execute.py) --------------------------------------

class Registry:
    """The dev image's registry, answering as `answer` says: (repo, tag, nth read of that tag) -> the digest to
    answer, or None to answer truly; `after_put` runs after each tag write (repo, tag)."""

    def __init__(self, dev: Dev) -> None:
        self.dev, self.reads = dev, {}
        self.answer: Any = lambda repo, tag, n: None
        self.after_put: Any = lambda repo, tag: None

    def install(self) -> Any:
        client: Any = self.dev.client
        read, put = client.manifest_digest, client.put_manifest

        def manifest_digest(repo: str, ref: str) -> str | None:
            self.reads[(repo, ref)] = n = self.reads.get((repo, ref), 0) + 1
            lie = self.answer(repo, ref, n)
            return read(repo, ref) if lie is None else lie

        def put_manifest(repo: str, ref: str, body: bytes, kind: str) -> str:
            written = put(repo, ref, body, kind)
            self.after_put(repo, ref)
            return written

        client.manifest_digest, client.put_manifest = manifest_digest, put_manifest
        client.ping, client.mount_blob = lambda: None, lambda *_: True
        return client


def releasing() -> tuple[Dev, str, str, Registry]:
    """A validated pytorch-cpu image, the moving tags on a previous release; (dev, its digest, the release
    repository, the registry to script)."""
    from buildtool.common.refs import split_repo_path

    dev = Dev(CPU)
    digest = dev.validated("amd64")
    single(dev, digest)
    _, rel = split_repo_path(dev.plan.release_repo)
    before = dev.image("amd64", payload=b"the previous release")
    before_raw, before_type, _ = dev.client.get_manifest(dev.repo, before)
    for tag in dev.plan.moving_tags:
        dev.client.put_manifest(rel, tag, before_raw, before_type)
    return dev, digest, rel, Registry(dev)


def run_release(dev: Dev, registry: Registry) -> Any:
    from buildtool.matrix.plan import Settings
    from buildtool.release.model import ReleaseOptions
    from buildtool.release.promote import release

    client = registry.install()
    options = ReleaseOptions("0.1.0", REVISION, trusted=signing.trusted(), known_code=signing.known_code(),
                             source_check=signing.source_check(), lock_settle_s=0)
    settings = Settings(registry=f"{dev.client.host}/t", release_registry=f"{dev.client.host}/t/rel")
    [item] = release([CPU], settings, options, client_for=lambda host: client, matrix_cells=[CPU]).images
    return item


def test_a_version_tag_read_back_elsewhere_only_the_second_time_fails_the_image_naming_it() -> None:
    """The registry answers the first read-back of the version tag with the image, the second with another digest:
    the image is failed naming the tag and what it resolved to (the moving tags moved after the first, which held);
    what the report lists as made is what the registry holds when read again."""
    dev, digest, rel, registry = releasing()
    [version] = dev.plan.release_tags
    other = "sha256:" + "4" * 64
    written: dict[str, int] = {}

    def write(repo: str, tag: str) -> None:
        if (repo, tag) == (rel, version):
            written[tag] = registry.reads[(rel, version)]     # the reads of it before its write
    registry.after_put = write
    registry.answer = lambda repo, tag, n: (other if (repo, tag) == (rel, version) and version in written
                                            and n == written[version] + 2 else None)
    item = run_release(dev, registry)
    assert item.status == "failed", item.problems
    assert item.problems[0] == f"{dev.plan.release_repo}:{version} resolves to {other}, not {digest}", item.problems
    assert registry.reads[(rel, version)] > written[version] + 2   # read again: the report says what is there
    assert sorted(item.tags_made) == sorted([version, *dev.plan.moving_tags])


def test_a_version_tag_deleted_between_its_write_and_its_read_back_leaves_the_moving_tags_where_they_were() -> None:
    """Someone who may delete removes the version tag right after release wrote it: the read-back says it is not
    in the registry (before: 'resolves to None'), and no moving tag moved."""
    dev, digest, rel, registry = releasing()
    [version] = dev.plan.release_tags
    before = {tag: dev.client.manifest_digest(rel, tag) for tag in dev.plan.moving_tags}

    def delete(repo: str, tag: str) -> None:
        if (repo, tag) == (rel, version):
            del dev.client.manifests[(rel, version)]
    registry.after_put = delete
    item = run_release(dev, registry)
    assert item.status == "failed", item.problems
    assert item.problems[0] == (f"{dev.plan.release_repo}:{version} is not in the registry (deleted?), not on "
                                f"{digest} after it was written; the moving tags "
                                f"{', '.join(dev.plan.moving_tags)} were not moved"), item.problems
    assert {tag: dev.client.manifest_digest(rel, tag) for tag in dev.plan.moving_tags} == before
    assert item.tags_made == []


def test_a_moving_tag_deleted_after_its_write_is_put_back_and_said_so() -> None:
    """A late delete of a moving tag, found by the final re-check: put back, and the notes say it was deleted
    (before: 'was moved to None')."""
    dev, digest, rel, registry = releasing()
    latest = dev.plan.moving_tags[-1]
    deleted: list[str] = []

    def delete(repo: str, tag: str) -> None:
        if (repo, tag) == (rel, latest) and not deleted:
            deleted.append(tag)
            del dev.client.manifests[(rel, latest)]
    registry.after_put = delete
    item = run_release(dev, registry)
    assert item.status == "promoted", item.problems
    assert item.repaired == [f"{latest} was deleted after it was written; put back"]
    assert dev.client.manifest_digest(rel, latest) == digest


def test_a_version_tag_deleted_once_the_moving_tags_moved_fails_the_image_naming_it() -> None:
    dev, digest, rel, registry = releasing()
    [version] = dev.plan.release_tags

    def delete(repo: str, tag: str) -> None:
        if (repo, tag) == (rel, dev.plan.moving_tags[-1]) and (rel, version) in dev.client.manifests:
            del dev.client.manifests[(rel, version)]
    registry.after_put = delete
    item = run_release(dev, registry)
    assert item.status == "failed", item.problems
    assert item.problems[0] == f"{dev.plan.release_repo}:{version} is not in the registry (deleted?), not on {digest}"
    assert version not in item.tags_made and sorted(item.tags_made) == sorted(dev.plan.moving_tags)


# -- overwritten and unresolvable verdict pins (validate/verdicts.py Findings.tampered, _pinned) ------------------

def failure_hidden_from_the_index() -> tuple[Dev, str, str]:
    """A pass, then a newer failure; the failure (and its bundle) dropped from the `sha256-<hex>` fallback index,
    as anyone who may push can: only its pin tag still names it. (dev, digest, the failure's pin tag)."""
    from buildtool.contracts.names import verdict_pin_tag
    from tests.test_gate_reading import failure_entries, image_with_pass_then_failure, rewrite_index

    dev = image_with_pass_then_failure()
    digest, failure = dev.digest, dev.failure   # type: ignore[attr-defined]
    dropped = failure_entries(dev, digest, failure)
    rewrite_index(dev, digest, lambda ms: ms.__setitem__(slice(None), [m for m in ms if m["digest"] not in dropped]))
    dev.pin = verdict_pin_tag(digest, failure)   # type: ignore[attr-defined]
    return dev, digest, dev.pin   # type: ignore[attr-defined]


@scenario("reading/the-failures-pin-overwritten")
def pin_overwritten() -> Dev:
    dev, digest, tag = failure_hidden_from_the_index()
    other = dev.image("amd64", payload=b"anything")
    dev.client.put_manifest(dev.repo, tag, dev.client.get_manifest(dev.repo, other)[0], "application/vnd.oci."
                                                                                           "image.manifest.v1+json")
    dev.other = other   # type: ignore[attr-defined]
    return dev


@scenario("reading/the-failures-pin-listed-but-not-there")
def pin_unresolvable() -> Dev:
    """The failure's pin tag is listed, but the registry answers 404 for it (its manifest deleted, the tag left
    listed; or a registry that lists what it cannot serve)."""
    dev, digest, tag = failure_hidden_from_the_index()
    client: Any = dev.client
    read = client.manifest_digest
    client.manifest_digest = lambda repo, ref: None if ref == tag else read(repo, ref)
    return dev


def test_an_overwritten_pin_refuses_the_image_in_release_and_report_alike() -> None:
    """The failure hidden from the index and its pin tag pointed elsewhere: release (and verify) and the nightly
    report refuse with the one text Findings.tampered gives, never the older pass."""
    from buildtool.report import fetch
    from buildtool.validate.verdicts import find_verdicts

    dev = pin_overwritten()
    digest, tag, other = dev.digest, dev.pin, dev.other   # type: ignore[attr-defined]
    tampered = find_verdicts(dev.client, dev.repo, digest, signing.trusted(), CPU.key).tampered(digest)  # type: ignore[arg-type]
    assert tampered == (f"a verdict of {digest} was overwritten in the registry ({tag} now names {other}): the "
                        "registry was tampered with; find out who wrote it, then validate the image again")
    assert tampered in both(dev)
    ref = f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}"
    source = fetch._Source(dev.client, CPU.key, ref, dev.repo, signing.trusted())   # type: ignore[arg-type]
    record = fetch._image_record(source, digest, dev.client.get_manifest(dev.repo, digest)[0], want="", in_index=False)
    assert record["missing"] is True and record["reason"].endswith(tampered), record


def test_a_pin_tag_listed_but_not_in_the_registry_blocks() -> None:
    """Before: a listed pin tag that the registry answered 404 for was passed over, so with the failure dropped from
    the index the older pass was released. What is pinned and not in the registry may be a verdict: it blocks, in
    release, verify, the report and reuse alike (all read Findings.blocking)."""
    dev = pin_unresolvable()
    digest, tag = dev.digest, dev.pin   # type: ignore[attr-defined]
    problems = both(dev)
    assert (f"a verdict of {digest} cannot be read or typed: the verdict pin tag {tag} is listed, but the registry "
            "has no manifest for it: it may name a verdict nobody can read") in problems, problems
