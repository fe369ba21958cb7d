"""SLSA provenance through the real local registry (issue 25): what a push attaches (verified with PyNaCl,
not buildtool's DSSE code), that a no-op push keeps it, that a push without its key fails before building,
and what release refuses: no provenance, an untrusted or tester-only key on it, a builder-only key on the
verdict, a stand-in base, a provenance replayed from another digest, a revision the release commit does
not contain. Each refusal names its cause. Tiny hand-pushed images: no image is built here."""

from __future__ import annotations

import subprocess
import uuid
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import pytest

from buildtool.attest import intoto
from buildtool.attest.provenance_store import find_provenance
from buildtool.attest.referrers import fetch, referrers
from buildtool.common.errors import UserError
from buildtool.contracts import label_keys
from buildtool.contracts.names import PROVENANCE_TYPE
from buildtool.imagebuild.builder import Builder, BuildOptions, CellResult
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.plan import Settings, full_revision, git_revision, plan_cell
from buildtool.release.ancestry import source_problems
from buildtool.release.notes import build_manifest, render_notes
from tests import signing
from tests.integration.test_release import CPU, HOST, Space, commit_of, labels_for, push_single, rev
from tests.test_provenance import _nacl_open

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]

ROOT = Path(__file__).resolve().parents[2]


def refused(report, *words: str) -> str:  # noqa: ANN001
    item = report.images[0]
    assert item.status == "refused", (item.status, item.problems)
    match = [p for p in item.problems if all(w in p for w in words)]
    assert match, item.problems
    return match[0]


# -- the push -------------------------------------------------------------------------------------

def _pushed(space: Space, folder: Path, drop: str = "") -> tuple[Builder, object, CellResult]:
    """A tiny image pushed under the cell's dev tag, labelled as `buildtool build` labels it, and a push
    Builder for it (the real matrix and locks of this checkout)."""
    matrix = load_matrix(ROOT / "matrix.yaml", ROOT / "templates")
    cell = next(c for c in matrix.cells if c.key == CPU.key)
    revision = git_revision(ROOT)
    settings = Settings(registry=f"{HOST}/{space.prefix}", release_registry=f"{HOST}/{space.prefix}/rel")
    plan = plan_cell(cell, settings, revision)
    labels = {**labels_for(cell), label_keys.OCI_REVISION: full_revision(ROOT, revision),
              label_keys.OCI_SOURCE: matrix.source}
    labels.pop(drop, None)
    digest, _ = push_single(space.client, space.dev_repo(cell), plan.dev_tag, labels)
    builder = Builder(ROOT, matrix.source, settings, revision,
                      BuildOptions(push=True, builder_key=lambda: signing.KEY, matrix=ROOT / "matrix.yaml"), print)
    builder._key = signing.KEY
    builder._pushed[digest] = (build_record(folder), "", ())    # as if this run had built and pushed it
    return builder, plan, CellResult(cell=cell.key, result="pushed", ref=plan.dev_ref, digest=digest)


def build_record(folder: Path) -> Path:
    """A build's log and engine.build's record beside it (its apt step read Debian's bookworm release file,
    which the provenance fetches from the archive)."""
    import json

    from buildtool.imagebuild.engine import facts_path

    log = folder / "pytorch-cpu-2.13.log"
    log.write_text("#5 0.180 Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]\n")
    facts_path(log).write_text(json.dumps({
        "image": "sha256:" + "4" * 64, "build_args": {"BASE_IMAGE": f"base@{signing.BASE_DIGEST}"},
        "secrets": ["pip.conf"], "network": "host", "buildkit": "classic", "cache_from": [], "no_cache": False,
        "platform": "", "started": int(datetime.now(UTC).timestamp()),
        "package_indexes": [{"url": "https://pypi.org/simple", "role": "index-url"}]}))
    return log


def test_a_push_attaches_a_provenance_that_pynacl_verifies_and_a_no_op_push_keeps_it(tmp_path: Path) -> None:
    space = Space()
    builder, plan, result = _pushed(space, tmp_path)
    repo = space.dev_repo(CPU)
    began = datetime.now(UTC)
    result.provenance = builder._ensure_provenance(plan, plan.dev_ref, result.digest, began, datetime.now(UTC))
    [ref] = referrers(space.client, repo, result.digest, PROVENANCE_TYPE)
    assert result.provenance == ref.digest
    assert ref.annotations[intoto.PREDICATE_ANNOTATION] == "https://slsa.dev/provenance/v1"
    [payload] = fetch(space.client, repo, ref, result.digest)
    assert payload.media_type == "application/vnd.dsse.envelope.v1+json"
    statement = _nacl_open(payload.data, signing.KEY.public().pem)
    assert statement["subject"][0]["digest"] == {"sha256": result.digest.partition(":")[2]}
    definition = statement["predicate"]["buildDefinition"]
    params = definition["externalParameters"]
    assert params["cell"] == CPU.key and params["revision"] == full_revision(ROOT, git_revision(ROOT))
    assert params["platform"] == "linux/amd64" and params["dockerfile"] == CPU.dockerfile
    assert params["packageIndexes"] == [{"url": "https://pypi.org/simple", "role": "index-url"}]
    assert definition["buildType"].endswith("#cell-build-v3") and isinstance(params["createdEpoch"], int)
    deps = {d["name"]: d for d in definition["resolvedDependencies"]}
    assert deps["base"]["digest"] == {"sha256": signing.BASE_DIGEST.partition(":")[2]}
    assert deps["base"]["annotations"]["standin"] is False
    assert {"tool:docker-client", "tool:docker-engine", "tool:buildtool", "tool:uv"} <= set(deps)
    assert deps["source"]["digest"] == {"gitCommit": params["revision"].partition("-dirty.")[0]}
    archive = deps["apt-archive:http://deb.debian.org/debian/dists/bookworm/InRelease"]
    assert len(archive["digest"]["sha256"]) == 64 and archive["annotations"]["date"].endswith("Z")
    assert [d["name"] for d in definition["resolvedDependencies"]
            if not (d.get("uri") or d.get("digest") or d.get("content"))] == []
    assert any(name.startswith("lock:") for name in deps)
    # A no-op push (the same digest again) keeps the provenance this key signed: nothing new attached.
    result.provenance = builder._ensure_provenance(plan, plan.dev_ref, result.digest, began, datetime.now(UTC))
    assert [r.digest for r in referrers(space.client, repo, result.digest, PROVENANCE_TYPE)] == [ref.digest]


def test_a_push_replaces_nothing_and_adds_its_own_beside_an_attackers_provenance(tmp_path: Path) -> None:
    space = Space()
    builder, plan, result = _pushed(space, tmp_path)
    repo = space.dev_repo(CPU)
    forged = signing.attach_provenance(space.client, repo, result.digest, signing.provenance(CPU), signing.ATTACKER)
    now = datetime.now(UTC)
    result.provenance = builder._ensure_provenance(plan, plan.dev_ref, result.digest, now, now)
    assert result.provenance and result.provenance != forged.digest
    found = find_provenance(space.client, repo, result.digest, signing.trusted())
    assert found.artifact == result.provenance and found.keyid == signing.KEY.keyid
    assert found.rejected == [(forged.digest, f"untrusted key: signed by {signing.ATTACKER.keyid[:16]}, which is not "
                                              "a trusted key")]


def test_a_push_whose_builder_key_cannot_be_read_fails_before_building_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from buildtool.attest.keys import BUILDER, signing_key

    missing = tmp_path / "builder.pem"
    monkeypatch.setenv("DL_IMAGES_BUILDER_KEY", str(missing))
    settings = Settings(registry=f"{HOST}/t-prov-{uuid.uuid4().hex[:8]}")
    builder = Builder(ROOT, "", settings, git_revision(ROOT),
                      BuildOptions(push=True, builder_key=lambda: signing_key(print, role=BUILDER).key), print)
    with pytest.raises(UserError, match=rf"\$DL_IMAGES_BUILDER_KEY names {missing}, which cannot be read"):
        builder.run([])
    no_key = Builder(ROOT, "", settings, git_revision(ROOT), BuildOptions(push=True), print)
    with pytest.raises(UserError, match="--push signs each image's provenance and SBOM, and no builder key was given"):
        no_key.run([])


def test_a_push_that_cannot_state_the_base_fails_the_cell_naming_the_cause(tmp_path: Path) -> None:
    """No silent gap: an image whose labels name no base digest gets no provenance, and the push says why."""
    from buildtool.common.errors import FailedError

    space = Space()
    builder, plan, result = _pushed(space, tmp_path, drop=label_keys.OCI_BASE_DIGEST)
    with pytest.raises(FailedError, match=r"^provenance of .*pytorch-cpu-dev:.*names no base by name and sha256 "):
        builder._ensure_provenance(plan, plan.dev_ref, result.digest, datetime.now(UTC), datetime.now(UTC))
    assert referrers(space.client, space.dev_repo(CPU), result.digest, PROVENANCE_TYPE) == []


# -- release --------------------------------------------------------------------------------------

def test_release_with_a_valid_provenance_says_who_built_it_and_copies_the_provenance() -> None:
    space = Space()
    r = signing.head_commit()[:12]   # built at HEAD: the provenance names the dev tag's commit, which is HEAD here
    digest = space.build(CPU, r)
    report = space.release([CPU], r, "0.1.0")
    item = report.images[0]
    assert report.ok, item.problems
    assert item.evidence[0].builder_signer == f"{signing.KEY.keyid[:16]} (test runner)"
    built = build_manifest(report)["images"][0]["provenance"]
    assert built["builder"] == "https://ci.example.invalid/runs/1" and built["revision"] == signing.head_commit()
    assert built["signed_by"] == item.evidence[0].builder_signer
    notes = render_notes(build_manifest(report))
    assert (f"- Built by: `https://ci.example.invalid/runs/1` from revision `{signing.head_commit()}` on base "
            f"`{CPU.base}@{signing.BASE_DIGEST}`") in notes, notes
    [copied] = referrers(space.client, space.rel_repo(CPU), digest, PROVENANCE_TYPE)
    artifact = item.evidence[0].provenance_artifact
    assert artifact is not None and copied.digest == artifact.digest


def test_release_without_a_provenance_is_refused() -> None:
    space = Space()
    r = rev()
    digest = space.build(CPU, r, provenance=False)
    refused(space.release([CPU], r, "0.1.0"), f"{digest} has no valid provenance: no provenance attached")


def test_release_with_a_provenance_signed_by_an_untrusted_key_is_refused() -> None:
    space = Space()
    r = rev()
    digest = space.build(CPU, r, provenance=False)
    signing.attach_provenance(space.client, space.dev_repo(CPU), digest, signing.provenance(CPU), signing.ATTACKER)
    refused(space.release([CPU], r, "0.1.0"), "no valid provenance",
            f"untrusted key: signed by {signing.ATTACKER.keyid[:16]}")


def test_release_with_a_provenance_signed_by_a_key_trusted_only_as_tester_is_refused() -> None:
    space = Space()
    r = rev()
    space.build(CPU, r)
    report = space.release([CPU], r, "0.1.0", trusted=signing.trusted(roles=("tester",)))
    refused(report, "no valid provenance", f"signed by {signing.KEY.keyid[:16]} (test runner), trusted as tester, "
                                           "not as builder")


def test_release_with_a_verdict_signed_by_a_key_trusted_only_as_builder_is_refused() -> None:
    space = Space()
    r = rev()
    space.build(CPU, r)
    report = space.release([CPU], r, "0.1.0", trusted=signing.trusted(roles=("builder",)))
    refused(report, "no valid verdict", f"signed by {signing.KEY.keyid[:16]} (test runner), trusted as builder, "
                                        "not as tester")


def test_release_with_a_provenance_naming_a_stand_in_base_is_refused() -> None:
    space = Space()
    r = rev()
    digest = space.build(CPU, r, provenance=False)
    signing.attach_provenance(space.client, space.dev_repo(CPU), digest,
                              signing.provenance(CPU, standin=True, revision=commit_of(r)))
    refused(space.release([CPU], r, "0.1.0"), f"the provenance of {digest} names a stand-in base")


def test_release_with_a_provenance_replayed_from_another_digest_is_refused() -> None:
    space = Space()
    r = rev()
    repo = space.dev_repo(CPU)
    other = space.build(CPU, rev())
    digest = space.build(CPU, r, provenance=False)
    # The other image's valid provenance, bytes unchanged, attached to this digest (anyone may push).
    [ref] = referrers(space.client, repo, other, PROVENANCE_TYPE)
    [payload] = fetch(space.client, repo, ref, other)
    signing.attach_raw(space.client, repo, digest, payload.data, artifact_type=PROVENANCE_TYPE)
    refused(space.release([CPU], r, "0.1.0"), "no valid provenance", f"replayed: signed for {other}, not for {digest}")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.email=t@example.org", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True, timeout=30).stdout.strip()


def test_release_of_an_image_built_from_a_revision_the_release_commit_does_not_contain_is_refused(
        tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q", "-b", "main")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "one")
    _git(tmp_path, "checkout", "-q", "-b", "side")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "unreviewed")
    side = _git(tmp_path, "rev-parse", "HEAD")
    _git(tmp_path, "checkout", "-q", "main")
    head = _git(tmp_path, "rev-parse", "HEAD")
    space = Space()
    r = rev()
    digest = space.build(CPU, r, provenance=False)
    signing.attach_provenance(space.client, space.dev_repo(CPU), digest, signing.provenance(CPU, revision=side))
    report = space.release([CPU], r, "0.1.0", source_check=partial(source_problems, tmp_path))
    refused(report, f"the provenance's revision {side[:12]} is neither the release commit {head[:12]} nor an "
                    "ancestor of it")
