"""The pure decisions of a release (buildtool.release.tag_plan), without a registry."""

from __future__ import annotations

import dataclasses

import pytest

from buildtool.common.errors import UserError
from buildtool.matrix.plan import CellPlan, Settings, plan_cell
from buildtool.release.model import ImageRelease, ReleaseReport, TagState
from buildtool.release.tag_plan import apply_tag_plan, check_plans, mount_outlook, settle_unpromoted, writes_needed
from tests.conftest import fixture_matrix

CPU = {c.key: c for c in fixture_matrix().cells}["pytorch-cpu:2.13"]
D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def plan(settings: Settings | None = None) -> CellPlan:
    return plan_cell(CPU, settings or Settings(), "abcdef123456", "0.1.0")


def item(status: str = "ready") -> ImageRelease:
    p = plan()
    return ImageRelease(cell=CPU.key, image=CPU.name, source=p.dev_ref, release_repo=p.release_repo, digest=D1,
                        status=status)


def test_check_plans_names_the_one_host() -> None:
    assert check_plans([plan(Settings(registry="reg:5000", release_registry="reg:5000"))]) == "reg:5000"


def test_check_plans_refuses_two_hosts() -> None:
    with pytest.raises(UserError, match="REGISTRY and RELEASE_REGISTRY are on different hosts"):
        check_plans([plan(Settings(registry="a:5000", release_registry="b:5000"))])


def test_check_plans_refuses_an_invalid_tag() -> None:
    bad = dataclasses.replace(plan(), moving_tags=("not a tag",))
    with pytest.raises(UserError, match="release tag 'not a tag' of pytorch-cpu:2.13 is not a valid tag"):
        check_plans([bad])


def test_apply_tag_plan_creates_on_an_empty_repository() -> None:
    it = item()
    apply_tag_plan(it, plan(), "0.1.0", False, TagState({}, [], previous={"release": "0.0.9"}))
    assert [t.action for t in it.tags] == ["create", "create", "create"]
    assert it.status == "ready" and it.previous == {"release": "0.0.9"} and writes_needed(it)


def test_apply_tag_plan_refuses_a_version_tag_on_another_digest() -> None:
    it = item()
    apply_tag_plan(it, plan(), "0.1.0", True, TagState({"2.13-0.1.0": D2}, ["2.13-0.1.0"]), with_previous=False)
    assert it.status == "refused" and "immutable" in it.problems[0] and it.previous is None


def test_a_rerun_writes_nothing() -> None:
    it = item()
    current = {"2.13-0.1.0": D1, "2.13": D1, "latest": D1}
    apply_tag_plan(it, plan(), "0.1.0", False, TagState(dict(current), list(current)))
    assert not writes_needed(it) and {t.action for t in it.tags} == {"exists"}


@pytest.mark.parametrize(("dry_run", "status"), [(True, "dry-run"), (False, "not attempted")])
def test_settle_unpromoted(dry_run: bool, status: str) -> None:
    report = ReleaseReport("0.1.0", "abcdef123456", [item(), item("refused")], dry_run)
    settle_unpromoted(report)
    assert [i.status for i in report.images] == [status, "refused"]


@pytest.mark.parametrize(("registry", "release_registry", "says"), [
    ("ghcr.io/team-a", "ghcr.io/team-b", "ghcr.io declines to mount blobs across owners (team-a -> team-b): they will "
                                         "be uploaded through this machine (1.50 GB)"),
    ("123456789012.dkr.ecr.eu-west-1.amazonaws.com/dev", "123456789012.dkr.ecr.eu-west-1.amazonaws.com/dev",
     "ECR mounts blobs only where blob mounting is turned on for the registry: otherwise they are uploaded through "
     "this machine (up to 1.50 GB)"),
    ("reg.example/dev", "reg.example/published", "the release repository is in another namespace (dev -> published): "
                                                 "where the registry declines to mount across namespaces"),
    ("reg.example/team", "reg.example/team", ""),
    ("ghcr.io/team-a", "ghcr.io/team-a", ""),
])
def test_the_dry_run_says_where_a_mount_may_be_declined(registry: str, release_registry: str, says: str) -> None:
    """Issue 53: a declined mount means an upload through this machine; the dry run says so where it is known
    (GHCR across owners) or likely (ECR, another namespace), and nothing where nothing suggests it."""
    outlook = mount_outlook(plan(Settings(registry=registry, release_registry=release_registry)), 1_500_000_000)
    assert outlook.startswith(says) if says else outlook == ""
