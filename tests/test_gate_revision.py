"""The dev tag `<name>-dev:<revision>-<version>` says which commit its image was built from, and so does the image's
signed provenance (buildDefinition.externalParameters.revision). Anyone with push rights to the dev repository can
copy the signed image of an older commit B under the dev tag of commit A: B is an ancestor of the release commit, so
its provenance passed release's revision check, and `release` of A shipped B's image. Release's gate and `verify`
(one gate) now refuse a provenance whose revision is not the dev tag's, naming both. In-memory registry."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from buildtool.contracts import label_keys
from buildtool.matrix.plan import Settings
from buildtool.release.chain import verify_reference
from buildtool.release.model import ReleaseOptions
from buildtool.release.promote import release
from tests import signing
from tests.gate_scenarios import scenario
from tests.test_gate_attacks import provenance_naming
from tests.test_release_platforms import CPU, MULTI, REVISION, Dev
from tests.test_release_platforms import labels as multi_labels
from tests.test_testcode_revision import code_at, commands, content_key, git, new_tests, push  # noqa: F401
from tests.test_verify_strict import checkout

ROOT = Path(__file__).resolve().parents[1]


def parent_commit() -> str:
    """HEAD's parent in full: an ancestor of the release commit, whose sources git holds (a revision release took)."""
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD~1"], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


@scenario("binding/an-older-commits-image-at-this-commits-dev-tag")
def older_image() -> Dev:
    return provenance_naming(parent_commit())


def release_dry_run(dev: Dev, revision: str = REVISION) -> tuple[str, list[str]]:
    """`buildtool release --dry-run --from REVISION` of the dev image's cell: its status and problems."""
    dev.client.ping = lambda: None   # type: ignore[attr-defined]
    options = ReleaseOptions("0.1.0", revision, dry_run=True, trusted=signing.trusted(),
                             known_code=signing.known_code(), source_check=signing.source_check(),
                             retag_check=signing.retag_check())
    settings = Settings(registry=f"{dev.client.host}/t", release_registry=f"{dev.client.host}/t/rel")
    [item] = release([dev.cell], settings, options, client_for=lambda host: dev.client,   # type: ignore[arg-type,return-value]
                     matrix_cells=[dev.cell]).images
    return item.status, item.problems


def test_an_older_commits_image_at_this_commits_dev_tag_is_refused_by_release_and_verify_naming_both() -> None:
    older = parent_commit()
    dev = older_image()
    digest = dev.client.manifest_digest(dev.repo, dev.plan.dev_tag)
    status, problems = release_dry_run(dev)
    cause = (f"{digest}: the dev tag names revision {REVISION}, but the signed provenance says the image was built "
             f"from {older[:12]} (the tag holds the first 12 hex digits of a commit, compared as a prefix): an image "
             "of another commit was put at this dev tag; build and push this commit's image, or release the commit "
             "it was built from; not the image `buildtool build` retags for an unchanged cell: it has no label "
             f"{label_keys.CONTENT_KEY}, so its content key cannot be compared with the cell's at {REVISION}")
    assert status == "refused" and problems == [cause], problems
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}",   # type: ignore[arg-type]
                             signing.trusted(), checkout(CPU))
    assert not found.ok and found.all_problems == [cause], found.all_problems


def test_the_same_image_at_its_own_commits_dev_tag_releases_and_verifies() -> None:
    older = parent_commit()
    dev = older_image()
    digest = dev.client.manifest_digest(dev.repo, dev.plan.dev_tag)
    own = f"{older[:12]}-{CPU.version}"
    dev.client.put_manifest(dev.repo, own, *dev.client.get_manifest(dev.repo, digest)[:2])
    status, problems = release_dry_run(dev, older[:12])
    assert status == "dry-run" and problems == [], problems
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{own}",   # type: ignore[arg-type]
                             signing.trusted(), checkout(CPU))
    assert found.ok and found.not_run == [], (found.problem, found.not_run)


def test_verify_by_digest_names_no_commit_and_says_the_comparison_did_not_run() -> None:
    dev = older_image()
    digest = dev.client.manifest_digest(dev.repo, dev.plan.dev_tag)
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}@{digest}",   # type: ignore[arg-type]
                             signing.trusted(), checkout(CPU))
    assert found.ok, found.problem
    assert found.not_run == ["the dev tag's revision against the provenance's: the image was not named by a dev tag "
                             f"of {CPU.key} (<name>-dev:<revision>-{CPU.version}), so it claims no commit"]


def test_the_tag_revision_is_compared_as_a_prefix_only_where_the_tag_holds_one() -> None:
    from buildtool.release.ancestry import tag_revision_problem

    full = "0123456789abcdef0123456789abcdef01234567"
    assert tag_revision_problem("0123456789ab", full) == ""
    assert tag_revision_problem(full, full) == ""
    assert tag_revision_problem("0123456789ab-dirty.0a1b2c3d", full + "-dirty.0a1b2c3d") == ""
    assert tag_revision_problem("nightly-42", full) == ""      # a name a pipeline gave: it names no commit
    other = "0123456789ab" + "f" * 28
    whole = tag_revision_problem(full, other)
    assert whole.startswith(f"the dev tag names revision {full}, but the signed provenance says the image was built "
                            "from 0123456789ab: ") and "prefix" not in whole
    assert "(the tag holds the first 12 hex digits" in tag_revision_problem("0123456789ac", full)
    assert "built from 0123456789ab-dirty.0a1b2c3d" in tag_revision_problem("0123456789ab", full + "-dirty.0a1b2c3d")
    assert tag_revision_problem("0123456789ab-dirty.0a1b2c3d", full) != ""


# -- `buildtool build`'s retag: an older commit's image at this commit's dev tag, the cell unchanged ---------------
# builder._registry_match puts commit B's image at commit A's dev tag when the cell's content key is unchanged (its
# provenance names B). Release and verify take it only where the image's content key (a label in its config, fixed
# by the digest the provenance signs) is the cell's at A, the checkout's HEAD. Real git history, in-process CLI.

def _change_the_dockerfile(project: Path) -> str:
    dockerfile = project / CPU.dockerfile
    dockerfile.write_text(dockerfile.read_text() + "RUN true\n")
    git(project, "commit", "-qam", "the cell's Dockerfile changed")
    return git(project, "rev-parse", "HEAD")


@pytest.mark.parametrize("between", ["the Dockerfile changed", "only image-tests changed"])
def test_an_older_commits_image_is_released_at_this_commits_dev_tag_only_with_the_cells_content_key(  # type: ignore[no-untyped-def]
        project: Path, commands, between: str) -> None:  # noqa: F811
    built, key = git(project, "rev-parse", "HEAD"), content_key(project)
    tagged = _change_the_dockerfile(project) if between == "the Dockerfile changed" else new_tests(project, "tests")
    dev, reference = push(project, tagged, built, code_at(project, built), key=key)
    found = commands(dev, project, reference, tagged)
    assert found["release"] == found["verify"], found
    if between == "only image-tests changed":
        assert found["release"] == (0, []), found
        return
    code, [problem] = found["release"]
    assert code == 1 and problem.endswith(
        f"an image of another commit was put at this dev tag; build and push this commit's image, or release the "
        f"commit it was built from; not the image `buildtool build` retags for an unchanged cell: its content key "
        f"{key} is not the cell's at {tagged[:12]} ({content_key(project)}): the cell changed between {built[:12]} "
        f"and {tagged[:12]}"), problem
    assert key != content_key(project)


def test_a_retag_is_not_taken_where_the_tags_commit_is_not_the_checkouts_head(  # type: ignore[no-untyped-def]
        project: Path, commands) -> None:  # noqa: F811
    """`release --from A` in a clone whose HEAD is a later commit: the cell's key at A is not what this checkout
    holds, so the retag cannot be confirmed; the refusal says to release from a clone of A."""
    built = git(project, "rev-parse", "HEAD")
    tagged = new_tests(project, "tests")
    head = _change_the_dockerfile(project)
    dev, reference = push(project, tagged, built, code_at(project, built))
    found = commands(dev, project, reference, tagged)
    assert found["release"] == found["verify"], found
    code, [problem] = found["release"]
    assert code == 1 and problem.endswith(
        f"not the image `buildtool build` retags for an unchanged cell: that cannot be confirmed from this checkout: "
        f"it needs the cell's content key at {tagged[:12]}, and the checkout's HEAD is {head[:12]}; release (or "
        f"verify) from a clone of {tagged[:12]}"), problem


def test_a_multi_platform_cells_retag_is_judged_by_that_platforms_key(project: Path) -> None:
    """The builder keys each platform image of a multi-platform cell on its own (cell_content_key with the
    platform): an arm64 image's key is refused as the amd64 image's."""
    from buildtool.imagebuild.cell_inputs import BaseInfo, cell_content_key
    from buildtool.matrix.plan import plan_cell
    from buildtool.release.ancestry import retag_problem

    built = git(project, "rev-parse", "HEAD")
    head = new_tests(project, "tests")
    plan = plan_cell(MULTI, Settings(registry="127.0.0.1:5999/t"), head[:12])
    arm = cell_content_key(plan, project, BaseInfo(plan.base, signing.BASE_DIGEST), "linux/arm64")
    labels = {**multi_labels(MULTI), label_keys.CONTENT_KEY: arm}
    assert retag_problem(project, plan, built, labels, "linux/arm64") == ""
    assert retag_problem(project, plan, built, labels, "linux/amd64").startswith(f"its content key {arm} is not ")
    assert retag_problem(project, plan, built, {**labels, label_keys.CONTENT_KEY: ""}, "linux/arm64") == (
        f"it has no label {label_keys.CONTENT_KEY}, so its content key cannot be compared with the cell's at "
        f"{head[:12]}")


def test_a_multi_platform_cells_retag_is_judged_with_the_build_base_its_label_names(project: Path) -> None:
    """A multi-platform cell's key covers the build machine's image of the base (its native stages run there): the
    retag check computes it with the build base the image's label names, and refuses the key with another one."""
    from buildtool.imagebuild.cell_inputs import BaseInfo, cell_content_key
    from buildtool.matrix.plan import plan_cell
    from buildtool.release.ancestry import retag_problem

    built = git(project, "rev-parse", "HEAD")
    head = new_tests(project, "tests")
    plan = plan_cell(MULTI, Settings(registry="127.0.0.1:5999/t"), head[:12])
    machine = BaseInfo(plan.base, "sha256:" + "e" * 64)
    arm = cell_content_key(plan, project, BaseInfo(plan.base, signing.BASE_DIGEST, build=machine), "linux/arm64")
    assert arm != cell_content_key(plan, project, BaseInfo(plan.base, signing.BASE_DIGEST), "linux/arm64")
    labels = {**multi_labels(MULTI), label_keys.CONTENT_KEY: arm, label_keys.BUILD_BASE_DIGEST: machine.digest}
    assert retag_problem(project, plan, built, labels, "linux/arm64") == ""
    other = {**labels, label_keys.BUILD_BASE_DIGEST: "sha256:" + "f" * 64}
    assert retag_problem(project, plan, built, other, "linux/arm64").startswith(f"its content key {arm} is not ")
