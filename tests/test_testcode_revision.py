"""Which revision's image-tests a verdict may have run: one rule for `buildtool release` and `buildtool verify`, the
revision the image's SIGNED provenance names (or the release commit, HEAD), never the dev tag's or `--from`'s.

Before, release took the release revision (the dev tag's commit, or --from) and verify the provenance's: someone with
push rights who points the dev tag of commit R at an image built (so its provenance says) at X made them disagree.
A verdict of X's image-tests was verified but refused by release; a verdict of R's image-tests (R on a branch HEAD
does not contain, never checked) was released with `--from R` but refused by verify. Both commands run here as
users run them (in-process CLI, a real git history in the fixture project, one in-memory registry)."""

from __future__ import annotations

import json
import subprocess
from functools import partial
from pathlib import Path

import pytest

from buildtool.contracts import label_keys
from buildtool.contracts.names import PROVENANCE_TYPE
from buildtool.imagebuild.cell_inputs import BaseInfo, cell_content_key
from buildtool.matrix.plan import Settings, plan_cell
from buildtool.registry.client import OCI_MANIFEST
from buildtool.release.testcode import known_code
from tests import signing
from tests.test_release_platforms import CPU, Dev

REGISTRY = "127.0.0.1:5999/t"


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.email=t@e", "-c", "user.name=t", *args], check=True,
                          capture_output=True, text=True, timeout=30).stdout.strip()


def code_at(root: Path, revision: str) -> str:
    [code] = known_code(root, [("r", revision)]).codes
    return code


def new_tests(root: Path, message: str) -> str:
    """Commit image-tests that differ from the parent's; the new commit, in full."""
    (root / "image-tests" / "common" / "test_added.py").write_text("def test_added():\n    pass\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", message)
    return git(root, "rev-parse", "HEAD")


def content_key(project: Path) -> str:
    """The content key `buildtool build` gives the CPU cell's image in the project's work tree (on the base the
    test images' labels name): what its image's label says when it was built there."""
    plan = plan_cell(CPU, Settings(registry=REGISTRY), "0" * 12)
    return cell_content_key(plan, project, BaseInfo(plan.base, signing.BASE_DIGEST))


def push(project: Path, tag_revision: str, built_at: str, ran: str, matrix_at: str = "",
         key: str | None = None) -> tuple[Dev, str]:
    """The dev tag of `tag_revision` pointed at an image whose signed provenance says it was built at `built_at`,
    with a passing verdict of image-tests `ran` (and of the matrix at `matrix_at`, default `built_at`); returns the
    registry and the dev image's reference. Its content key label is `key` (default: the cell's in the work tree,
    the same at `built_at` where the test changes no file of the cell)."""
    dev = Dev(CPU)
    dev.plan = plan_cell(CPU, Settings(registry=REGISTRY, release_registry=f"{REGISTRY}/rel"), tag_revision[:12],
                         "0.1.0")
    digest = dev.image("amd64", extra_labels={label_keys.CONTENT_KEY: content_key(project) if key is None else key})
    signing.attest_sbom(dev.client, dev.repo, digest)   # type: ignore[arg-type]
    signing.attach_provenance(dev.client, dev.repo, digest,   # type: ignore[arg-type]
                              signing.provenance(CPU, revision=built_at, root=project))
    body = signing.verdict(CPU, digest, test_code=ran,
                           matrix_digest=signing.committed_matrix(project, matrix_at or built_at))
    signing.attest(dev.client, dev.repo, digest, body)   # type: ignore[arg-type]
    dev.client.put_manifest(dev.repo, dev.plan.dev_tag, dev.client.get_manifest(dev.repo, digest)[0], OCI_MANIFEST)
    return dev, f"{dev.plan.dev_repo}:{dev.plan.dev_tag}"


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch, run_cli):  # type: ignore[no-untyped-def]
    """`release --dry-run --json` and `verify --json` of one image against `dev`'s registry, with the test key
    trusted; each gives (its exit code, the problems it names)."""
    from buildtool.attest import keys
    from buildtool.registry import client
    from buildtool.release import promote
    from buildtool.validate import collect

    monkeypatch.setenv("REGISTRY", REGISTRY)
    monkeypatch.setenv("RELEASE_REGISTRY", f"{REGISTRY}/rel")
    monkeypatch.delenv("BASE_MIRROR", raising=False)
    monkeypatch.setattr(keys, "load_trusted", lambda root, path=None: signing.trusted())
    # What pytest collects of the cell's groups there: the tests the verdicts made here list.
    monkeypatch.setattr(collect, "defined_tests", lambda cell, folder, code=None: {
        f"{g}/test_x.py::test_{g}": False for g in cell.tests})

    def run(dev: Dev, project: Path, reference: str, release_from: str) -> dict[str, tuple[int, list[str]]]:
        monkeypatch.setattr(client, "RegistryClient", lambda host, *args, **kwargs: dev.client)
        monkeypatch.setattr(promote, "release", partial(promote.release, client_for=lambda host: dev.client))
        matrix = str(project / "matrix.yaml")
        code, out, _ = run_cli("release", "--version", "0.1.0", "--from", release_from, "--framework", CPU.key,
                               "--dry-run", "--json", "--matrix", matrix)
        released = json.loads(out)["status"][CPU.key]["problems"]
        verify_code, verify_out, _ = run_cli("verify", reference, "--json", "--matrix", matrix)
        return {"release": (code, released), "verify": (verify_code, json.loads(verify_out)["problems"])}

    return run


def test_a_verdict_of_the_signed_revisions_image_tests_counts_for_release_as_for_verify(project: Path,
                                                                                         commands) -> None:  # type: ignore[no-untyped-def]
    """The dev tag of R (HEAD) names an image built at X, its ancestor, whose verdict ran X's image-tests: before,
    verify took it and release refused it; now both judge it by X, the revision the builder signed."""
    built = git(project, "rev-parse", "HEAD")
    tagged = new_tests(project, "other image-tests")
    assert code_at(project, built) != code_at(project, tagged)
    dev, reference = push(project, tagged, built, code_at(project, built))
    found = commands(dev, project, reference, tagged)
    assert found["release"] == found["verify"], found
    assert not any("the verdict ran image-tests" in p for p in found["release"][1]), found
    assert found["release"] == (0, []), found


@pytest.mark.parametrize("ran", ["the tag's", "neither"])
def test_a_verdict_of_the_tags_revision_image_tests_is_refused_by_release_as_by_verify(project: Path, commands,  # type: ignore[no-untyped-def]
                                                                                        ran: str) -> None:
    """The dev tag of R, a commit on a branch HEAD does not contain, names an image built at X (HEAD) whose verdict
    ran R's image-tests: before, `release --from R` released it (R's image-tests counted, R never checked) and verify
    refused it. Now both refuse, naming the image-tests and the revisions they compared with."""
    built = git(project, "rev-parse", "HEAD")
    git(project, "switch", "-q", "-c", "side")
    tagged = new_tests(project, "image-tests on a side branch")
    git(project, "switch", "-q", "-")
    ran_code = code_at(project, tagged) if ran == "the tag's" else "sha256:" + "7" * 64
    dev, reference = push(project, tagged, built, ran_code)
    found = commands(dev, project, reference, tagged)
    assert found["release"] == found["verify"], found
    code, problems = found["release"]
    assert code == 1
    said = f"the image's revision {built[:12]}: {code_at(project, built)}; the release commit {built[:12]}: " \
           f"{code_at(project, built)}"
    assert any(p.startswith(f"the verdict ran image-tests {ran_code}, which is neither image-tests at the image's "
                            f"revision nor at the release commit ({said})") for p in problems), problems


def _signed_revision(project: Path, attack: str) -> tuple[str, str, list[str]]:
    """(the revision the provenance names, the commit whose image-tests the verdict ran, what the refusal must say)
    for `attack` on the revision a provenance names (house rule: the new surface gets its attacker first)."""
    head = git(project, "rev-parse", "HEAD")
    if attack == "not-held":
        unknown = "f" * 40
        return unknown, head, [f"the provenance's revision {unknown} is not a commit git knows in {project}"]
    if attack == "not-an-ancestor":
        git(project, "switch", "-q", "-c", "side")
        side = new_tests(project, "image-tests on a side branch")
        git(project, "switch", "-q", "-")
        return side, side, [f"the provenance's revision {side[:12]} is neither the release commit {head[:12]} nor an "
                            "ancestor of it: release from a checkout that contains it"]
    older = head
    new_tests(project, "newer image-tests")
    if attack == "short":
        return older[:12], older, [f"the provenance's revision {older[:12]!r} is not a full commit (40 hex digits)"]
    assert attack == "uppercase"
    return older.upper(), older, [f"the provenance's revision {older.upper()!r} is not a full commit (40 hex digits)"]


@pytest.mark.parametrize("attack", ["not-held", "not-an-ancestor", "short", "uppercase"])
def test_a_provenance_naming_a_revision_release_may_not_take_is_refused_by_release_as_by_verify(
        project: Path, commands, attack: str) -> None:  # type: ignore[no-untyped-def]
    """The builder's key signs a provenance whose revision git does not hold, that HEAD does not contain, or that
    is a short or uppercase sha (git resolves both): the verdict ran the image-tests at the commit meant, yet
    release and verify both refuse, naming the revision; nothing else the provenance says is read first."""
    signed, ran_at, causes = _signed_revision(project, attack)
    head = git(project, "rev-parse", "HEAD")
    dev, reference = push(project, head, signed, code_at(project, ran_at), matrix_at=ran_at)
    found = commands(dev, project, reference, head)
    assert found["release"] == found["verify"], found
    code, problems = found["release"]
    assert code == 1
    for cause in causes:
        assert any(cause in p for p in problems), problems


def test_a_provenance_replayed_from_another_digest_names_no_revision_for_the_test_code(project: Path,
                                                                                        commands) -> None:  # type: ignore[no-untyped-def]
    """An older commit's provenance, signed for another image, attached to this one: it is no provenance of this
    digest, so its revision is not where the verdict's test code may come from (only the release commit is)."""
    built = git(project, "rev-parse", "HEAD")
    head = new_tests(project, "newer image-tests")
    dev = Dev(CPU)
    dev.plan = plan_cell(CPU, Settings(registry=REGISTRY, release_registry=f"{REGISTRY}/rel"), head[:12], "0.1.0")
    digest, other = dev.image("amd64"), dev.image("amd64", payload=b"another image built at the older commit")
    signing.attest_sbom(dev.client, dev.repo, digest)   # type: ignore[arg-type]
    replayed = signing.provenance_envelope(f"{dev.client.host}/{dev.repo}", other,
                                           signing.provenance(CPU, revision=built, root=project))
    signing.attach_raw(dev.client, dev.repo, digest, replayed, artifact_type=PROVENANCE_TYPE)  # type: ignore[arg-type]
    signing.attest(dev.client, dev.repo, digest, signing.verdict(  # type: ignore[arg-type]
        CPU, digest, test_code=code_at(project, built), matrix_digest=signing.committed_matrix(project, built)))
    dev.client.put_manifest(dev.repo, dev.plan.dev_tag, dev.client.get_manifest(dev.repo, digest)[0], OCI_MANIFEST)
    reference = f"{dev.plan.dev_repo}:{dev.plan.dev_tag}"
    found = commands(dev, project, reference, head)
    assert found["release"] == found["verify"], found
    code, problems = found["release"]
    assert code == 1
    assert any("has no valid provenance: no provenance verifies: " in p and f"replayed: signed for {other}" in p
               for p in problems), problems
    assert any("the image's revision: none (no valid provenance names one)" in p for p in problems), problems


def test_of_two_provenances_naming_different_revisions_the_newest_decides_for_release_as_for_verify(
        project: Path, commands) -> None:  # type: ignore[no-untyped-def]
    """Two signed provenances of one digest, at two commits: the one that finished last names the revision whose
    image-tests the verdict may have run, for release and verify alike (never the other)."""
    older = git(project, "rev-parse", "HEAD")
    newer = new_tests(project, "newer image-tests")
    (project / "image-tests" / "common" / "test_added_too.py").write_text("def test_added_too():\n    pass\n")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "the release commit's image-tests")
    newest_tests = git(project, "rev-parse", "HEAD")
    dev, reference = push(project, newest_tests, newer, code_at(project, older))
    own = dev.client.get_manifest(dev.repo, dev.plan.dev_tag)[2]
    prov = signing.provenance(CPU, revision=older, root=project)
    prov["runDetails"]["metadata"].update(startedOn="2025-01-01T00:00:00Z", finishedOn="2025-01-01T00:01:00Z")
    signing.attach_provenance(dev.client, dev.repo, own, prov)   # type: ignore[arg-type]
    found = commands(dev, project, reference, newest_tests)
    assert found["release"] == found["verify"], found
    code, problems = found["release"]
    assert code == 1
    assert any(p.startswith(f"the verdict ran image-tests {code_at(project, older)}, which is neither image-tests at "
                            f"the image's revision nor at the release commit (the image's revision {newer[:12]}")
               for p in problems), problems
