"""The writes of a release, under the lock: the in-registry copy (staging), tag writes compared
before and verified after, the read-back after a failure and the final re-check.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from buildtool.attest.referrers import Referrer
from buildtool.common.refs import split_repo_path
from buildtool.common.units import human_size
from buildtool.matrix.plan import CellPlan
from buildtool.registry.client import (
    INDEX_TYPES,
    RegistryClient,
    RegistryError,
    RegistryUnreachable,
)
from buildtool.release.model import ImageRelease, ReleaseOptions, ReleaseReport, TagAction
from buildtool.release.read import READ_THREADS, plan_item
from buildtool.release.repo_lock import RepoLock
from buildtool.release.tag_plan import writes_needed

log = logging.getLogger(__name__)


def _blobs(manifest: dict[str, Any]) -> list[str]:
    digests = [manifest["config"]["digest"]] if "config" in manifest else []
    return digests + [layer["digest"] for layer in manifest.get("layers", [])]


def copy_manifest(client: RegistryClient, src_repo: str, dst_repo: str, raw: bytes, media_type: str,
                  digest: str) -> dict[str, int]:
    """Make `digest` exist in dst_repo without tags: blobs mounted (uploaded where the registry declines a
    mount), children first, bytes unchanged. Returns the uploaded blobs and their sizes."""
    manifest = json.loads(raw)
    uploaded: dict[str, int] = {}
    if media_type in INDEX_TYPES:
        for child in manifest.get("manifests", []):
            child_raw, child_type, child_digest = client.get_manifest(src_repo, child["digest"])
            uploaded.update(copy_manifest(client, src_repo, dst_repo, child_raw, child_type, child_digest))
    sizes = {d["digest"]: int(d.get("size") or 0) for d in [manifest.get("config") or {}, *manifest.get("layers", [])]
             if "digest" in d}
    for blob in client.mount_blobs(dst_repo, _blobs(manifest), src_repo):
        uploaded[blob] = sizes.get(blob, 0)
    client.put_manifest(dst_repo, digest, raw, media_type)
    return uploaded


Staged = dict[str, list[Referrer]]     # platform manifest digest -> the artifacts attached to it


def stage(client: RegistryClient, item: ImageRelease, plan: CellPlan) -> Staged:
    """The writes of a promotion that need no lock, all by digest and untagged in the release repository: the
    image's manifests (copy_manifest; a declined mount is said in `item.transfer`) and each platform manifest's
    signed verdict, SBOM and provenance artifacts. Returns the artifacts of each platform manifest, for
    `promote` to list as referrers of that digest."""
    from buildtool.attest.bundles import beside
    from buildtool.attest.referrers import copy_artifact
    from buildtool.sbom.document import find_sbom

    _, src = split_repo_path(plan.dev_repo)
    _, dst = split_repo_path(plan.release_repo)
    uploaded = copy_manifest(client, src, dst, item._raw, item.media_type, item.digest)
    if uploaded:
        item.transfer.append(f"the registry declined to mount {len(uploaded)} blob(s) from {src}: uploaded "
                             f"{human_size(sum(uploaded.values()))} through this machine")
    # Users of the release repository can check the signed verdict and SBOM by digest there too (bytes
    # unchanged, so the signatures hold), and the plain SBOM travels with the image (release.package_changes).
    staged: Staged = {}
    for ev in item.evidence:
        signed = [a for a in (ev.attestation, ev.sbom_attestation, ev.provenance_artifact) if a is not None]
        # ...and the Sigstore bundles of those envelopes, for verifiers that read only that layout (issue 40).
        artifacts = [*signed, *beside(client, src, ev.digest, signed),
                     *[a for a in (find_sbom(client, src, ev.digest),) if a is not None]]
        for artifact in artifacts:
            copy_artifact(client, src, dst, artifact)
        staged[ev.digest] = artifacts
    return staged


def promote(client: RegistryClient, item: ImageRelease, plan: CellPlan, lock: RepoLock | None,
            staged: Staged | None = None) -> None:
    """Copy (unless `stage` already did: `staged`), list the artifacts, tag (compare before each
    write), verify. Raises RegistryError on a fault."""
    from buildtool.attest.referrers import add_referrers

    _, dst = split_repo_path(plan.release_repo)
    todo = [t for t in item.tags if t.action in ("create", "move")]
    if not todo:
        item.status = "unchanged"
        return
    artifacts = stage(client, item, plan) if staged is None else staged
    # Listed before any tag, so released tags have them. Under the repository lock no other
    # release writes this repository's referrers index.
    for digest, found in artifacts.items():
        add_referrers(client, dst, digest, found, exclusive=lock is not None)
    if lock is not None and not lock.still_held():
        raise RegistryError(f"lost the release lock of {dst} before tagging; nothing was tagged")
    # Version tags first, then the moving ones: a moving tag never names a release whose version
    # tag was not written. Within each group the tags are independent: compared and written side by side.
    for group in ([t for t in todo if not t.moving], [t for t in todo if t.moving]):
        if group and group[0].moving:
            # ...nor one whose version tag was written and then found elsewhere: read back before any moves.
            wrong = verify(client, item, moving=False)
            if wrong:
                raise RegistryError(f"{wrong[0]} after it was written; the moving tags "
                                    f"{', '.join(t.tag for t in group)} were not moved")
        if group:
            _write_tags(client, item, plan, dst, group)
    item.status = "promoted"


def _write_tags(client: RegistryClient, item: ImageRelease, plan: CellPlan, dst: str, group: list[TagAction]) -> None:
    def write(t: TagAction) -> None:
        now = client.manifest_digest(dst, t.tag)
        if now not in (t.current, item.digest):
            raise RegistryError(f"{plan.release_repo}:{t.tag} changed to {now} during the release")
        client.put_manifest(dst, t.tag, item._raw, item.media_type)

    with ThreadPoolExecutor(max_workers=len(group)) as pool:
        outcomes = [pool.submit(write, t) for t in group]
    for t, outcome in zip(group, outcomes, strict=True):
        if outcome.exception() is None:
            item.tags_made.append(t.tag)
    for outcome in outcomes:
        if outcome.exception() is not None:
            raise outcome.exception()  # type: ignore[misc]


def read_back(client: RegistryClient, item: ImageRelease) -> None:
    """After a failure, what the report says was made is what the registry holds: every tag this
    run meant to write is read again, and `tags_made` becomes those that name the image (a write
    whose answer was lost may have landed; one that was answered may since have been undone). Tags
    that cannot be read back are `tags_unknown`, never reported as made or as missing."""
    _, dst = split_repo_path(item.release_repo)
    meant = [t.tag for t in item.tags if t.action in ("create", "move")]
    try:
        found = _digests(client, dst, meant)
    except (RegistryError, RegistryUnreachable) as exc:
        item.tags_unknown = [t for t in meant if t not in item.tags_made]
        item.problems.append(f"could not read the tags back after the failure ({exc}); "
                             f"{', '.join(item.tags_unknown) or 'no tag'} unknown: list the tags of "
                             f"{item.release_repo}")
        return
    held = [t for t in meant if found[t] == item.digest]
    if held != item.tags_made:
        item.problems.append(f"read back after the failure: {item.release_repo} holds "
                             f"{', '.join(held) or 'none'} of {', '.join(meant)} on {item.digest}")
    item.tags_made, item.tags_unknown = held, []


def _digests(client: RegistryClient, repo: str, tags: list[str]) -> dict[str, str | None]:
    if len(tags) < 2:
        return {t: client.manifest_digest(repo, t) for t in tags}
    with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(tags))) as pool:
        return dict(zip(tags, pool.map(lambda t: client.manifest_digest(repo, t), tags), strict=True))


def verify(client: RegistryClient, item: ImageRelease, moving: bool = True) -> list[str]:
    """Every release tag of the item (only the version tags with `moving=False`) must resolve to
    exactly the source digest."""
    _, dst = split_repo_path(item.release_repo)
    checked = [t.tag for t in item.tags if t.action != "keep" and (moving or not t.moving)]
    return [f"{item.release_repo}:{tag} resolves to {got}, not {item.digest}" if got is not None
            else f"{item.release_repo}:{tag} is not in the registry (deleted?), not on {item.digest}"
            for tag, got in _digests(client, dst, checked).items() if got != item.digest]


def recheck(client: RegistryClient, items: list[ImageRelease]) -> None:
    """After the last write, under the lock: every tag this run wrote must still name its digest.
    A moving tag found elsewhere was moved by a late write (a request delivered after its client
    gave up, from this run or an earlier one): it is put back and reported. A version tag found
    elsewhere cannot be put back (it is immutable): the image is reported failed."""
    for item in items:
        if item.status != "promoted":
            continue
        _, dst = split_repo_path(item.release_repo)
        written = [t for t in item.tags if t.action in ("create", "move", "exists")]
        found = _digests(client, dst, [t.tag for t in written])
        for t in written:
            now = found[t.tag]
            if now == item.digest:
                continue
            if t.moving:
                client.put_manifest(dst, t.tag, item._raw, item.media_type)
                item.repaired.append(f"{t.tag} was moved to {now} after it was written (a late write); put back"
                                     if now is not None else f"{t.tag} was deleted after it was written; put back")
                log.warning("%s:%s was on %s after the release wrote it; put back on %s", item.release_repo, t.tag,
                            now, item.digest)
                again = client.manifest_digest(dst, t.tag)
                if again != item.digest:
                    item.status = "failed"
                    item.problems.append(f"{item.release_repo}:{t.tag} resolves to {again} even after it was put "
                                         f"back on {item.digest}")
            else:
                item.status = "failed"
                item.problems.append(f"{item.release_repo}:{t.tag} resolves to {now} after it was written, not "
                                     f"{item.digest}" if now is not None else
                                     f"{item.release_repo}:{t.tag} is not in the registry (deleted?) after it was "
                                     f"written, not on {item.digest}")


def promote_all(client: RegistryClient, report: ReleaseReport, plans: list[CellPlan],
                options: ReleaseOptions) -> None:
    pending = [(i, p) for i, p in zip(report.images, plans, strict=True) if writes_needed(i)]
    for item, _ in zip(report.images, plans, strict=True):
        if all(t.action in ("exists", "keep") for t in item.tags):
            item.status = "unchanged"     # idempotent re-run: nothing is written, not even a lock
    if not pending:
        return
    locks: list[RepoLock] = []
    failure: str = ""
    staged: dict[int, Staged | RegistryError | RegistryUnreachable] = {}

    def stage_for(repo: str) -> Callable[[], None]:
        """Each pending image of `repo` staged while its lock settles (an error is raised where the
        image is promoted, as if staging had happened there)."""
        def work() -> None:
            for item, p in pending:
                if split_repo_path(p.release_repo)[1] == repo:
                    try:
                        staged[id(item)] = stage(client, item, p)
                    except (RegistryError, RegistryUnreachable) as exc:
                        staged[id(item)] = exc
        return work

    try:
        for repo in sorted({split_repo_path(p.release_repo)[1] for _, p in pending}):   # sorted: no deadlock
            source = next(split_repo_path(p.dev_repo)[1] for _, p in pending
                          if split_repo_path(p.release_repo)[1] == repo)
            lock = RepoLock(client, repo, ttl_s=options.lock_ttl_s, wait_s=options.lock_wait_s,
                            settle_s=options.lock_settle_s, purpose=f"release {options.version}", blob_source=source)
            lock.acquire(while_settling=stage_for(repo))
            locks.append(lock)
        lock_of = {lk.repo: lk for lk in locks}
        for item, p in pending:
            if failure:
                item.status = "not attempted"
                continue
            # Re-read the tags under the lock: another release may have written since we looked.
            plan_item(client, item, p, options.version, options.force, with_previous=False)
            if item.problems:
                item.status = "refused"
                failure = f"{item.cell}: {item.problems[-1]}"
                continue
            try:
                done = staged.get(id(item))
                if isinstance(done, (RegistryError, RegistryUnreachable)):
                    raise done
                promote(client, item, p, lock_of[split_repo_path(p.release_repo)[1]], staged=done)
                wrong = verify(client, item, moving=False)   # moving tags: after the final re-check
            except (RegistryError, RegistryUnreachable) as exc:
                item.status = "failed"
                item.problems.append(str(exc))
                failure = str(exc)
                read_back(client, item)
                continue
            if wrong:
                item.status = "failed"
                item.problems += wrong
                failure = wrong[0]
                read_back(client, item)
        recheck(client, [i for i, _ in pending])   # every tag read once more, moving ones repaired
    except (RegistryError, RegistryUnreachable) as exc:
        for item, _ in pending:
            if item.status in ("ready", "pending"):
                item.status = "not attempted"
                item.problems.append(str(exc))
            if item.status != "not attempted" or item.tags_made:
                read_back(client, item)     # the re-check itself failed: say what is there, not what was meant
    finally:
        for lock in locks:
            try:
                lock.release()
            except (RegistryError, RegistryUnreachable) as exc:
                log.warning("could not release the lock of %s (%s); it expires in %.0fs or when this "
                            "process has ended", lock.repo, exc, lock.ttl_s)
