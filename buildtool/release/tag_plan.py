"""Pure decisions of a release: which release a tag names, and per tag what to do (create, exists,
move, keep, refuse), from what was read. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from buildtool.common.errors import UserError
from buildtool.common.refs import split_repo_path
from buildtool.common.units import human_size
from buildtool.contracts import names
from buildtool.matrix.plan import CellPlan
from buildtool.release.model import ImageRelease, ReleaseReport, TagAction, TagState

if TYPE_CHECKING:
    from buildtool.matrix.schema import Cell


def release_number(tag: str, template: str, cell: Cell) -> Version | None:
    """The release a tag made from `template` names, e.g. `2.13-0.1.0` -> 0.1.0."""
    parsed = names.parse_release_tag(tag, template, cell.version)
    if parsed is None or not parsed.release:
        return None
    try:
        return Version(parsed.release)
    except InvalidVersion:
        return None


def releases_in(tags: Iterable[str], cell: Cell) -> dict[Version, str]:
    """Release number -> tag, for every immutable tag of this cell in a tag list."""
    return {number: tag for tag in tags for template in cell.release_tags
            if (number := release_number(tag, template, cell)) is not None}


def plan_tags(plan: CellPlan, digest: str, version: str, current: dict[str, str | None],
              existing_tags: list[str], force: bool) -> tuple[list[TagAction], list[str]]:
    """Decide per tag: create, exists (already there: no-op), move (moving tags), keep."""
    actions, problems = [], []
    spelt = {tag: number for tag in existing_tags for template in plan.cell.release_tags
             if (number := release_number(tag, template, plan.cell)) is not None}
    same = sorted(tag for tag, number in spelt.items() if number == Version(version)
                  and tag not in plan.release_tags)
    if same:
        problems.append(f"release {version} of {plan.cell.key} already exists as {plan.release_repo}:{same[0]} "
                        f"(the same PEP 440 version, spelt otherwise); one release has one spelling: use its "
                        "spelling, or a new --version")
    newer = sorted(v for v in spelt.values() if v > Version(version))
    for tag in plan.release_tags:
        action = TagAction(tag, False, current.get(tag))
        if action.current is None:
            action.action = "create"
        elif action.current == digest:
            action.action = "exists"
        else:
            action.action = "refuse"
            problems.append(f"{plan.release_repo}:{tag} already exists on {action.current}; version tags are "
                            f"immutable (never moved, not even with --force); release a new --version")
        actions.append(action)
    for tag in plan.moving_tags:
        if tag in plan.release_tags:
            continue
        action = TagAction(tag, True, current.get(tag))
        if action.current == digest:
            action.action = "exists"
        elif action.current is not None and newer and not force:
            action.action = "keep"
            action.note = f"stays on release {newer[-1]} (newer); --force moves it back"
        else:
            action.action = "create" if action.current is None else "move"
        actions.append(action)
    return actions, problems


def check_plans(plans: list[CellPlan]) -> str:
    """Every release tag is a valid tag, and every image is promoted inside one registry: its host.
    Raises UserError otherwise."""
    for p in plans:
        for tag in (*p.release_tags, *p.moving_tags):
            if not names.TAG_RE.match(tag):
                raise UserError(f"release tag {tag!r} of {p.cell.key} is not a valid tag; fix matrix.yaml")
    hosts = {split_repo_path(p.dev_repo)[0] for p in plans} | {split_repo_path(p.release_repo)[0] for p in plans}
    if len(hosts) > 1:
        raise UserError(f"REGISTRY and RELEASE_REGISTRY are on different hosts ({', '.join(sorted(hosts))}); "
                        "an in-registry promotion needs one registry: point RELEASE_REGISTRY at the same host")
    return hosts.pop()


def apply_tag_plan(item: ImageRelease, plan: CellPlan, version: str, force: bool, state: TagState,
                   with_previous: bool = True) -> None:
    item.tags, problems = plan_tags(plan, item.digest, version, state.current, state.tags, force)
    item.problems += problems
    if problems:
        item.status = "refused"
    if with_previous:
        item.previous = state.previous


_ECR = re.compile(r"^[0-9]{12}\.dkr\.ecr(-fips)?\.[a-z0-9-]+\.amazonaws\.com(\.cn)?(:443)?\Z")


def mount_outlook(plan: CellPlan, size: int) -> str:
    """What a dry run can say before any write about moving the image's blobs into the release repository:
    they are mounted, but a registry may decline a mount (202), and then they are uploaded through this
    machine. Said where it is known or likely: GHCR across owners, ECR (it mounts only with blob mounting
    turned on, and only blobs an image of the source references), any registry across namespaces (per-namespace
    permissions: Docker Hub, Quay, Harbor projects). "" where nothing suggests it."""
    host, src = split_repo_path(plan.dev_repo)
    _, dst = split_repo_path(plan.release_repo)
    src_ns, dst_ns = src.split("/", 1)[0], dst.split("/", 1)[0]
    amount = human_size(size, missing="the image's blobs")
    if host.lower() == "ghcr.io" and src_ns.lower() != dst_ns.lower():
        return (f"ghcr.io declines to mount blobs across owners ({src_ns} -> {dst_ns}): they will be uploaded "
                f"through this machine ({amount})")
    if _ECR.match(host.lower()):
        return (f"ECR mounts blobs only where blob mounting is turned on for the registry: otherwise they are "
                f"uploaded through this machine (up to {amount})")
    if src_ns != dst_ns:
        return (f"the release repository is in another namespace ({src_ns} -> {dst_ns}): where the registry declines "
                f"to mount across namespaces, the blobs are uploaded through this machine (up to {amount})")
    return ""


def writes_needed(item: ImageRelease) -> bool:
    """Whether promoting `item` writes any tag (else it is unchanged: not even a lock is taken)."""
    return any(t.action in ("create", "move") for t in item.tags)


def settle_unpromoted(report: ReleaseReport) -> None:
    """When nothing is promoted (a refusal, or a dry run), what each image that passed its gates is."""
    for item in report.images:
        if item.status == "ready":
            item.status = "dry-run" if report.dry_run else "not attempted"
