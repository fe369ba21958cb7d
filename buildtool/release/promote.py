"""Promote tested dev images to release tags, digest for digest, inside the registry.

For each chosen cell: find the dev image of the commit (`<name>-dev:<sha>-<version>`),
check the gates, then give the same digest its release tags in the release repository.
No layer data passes through this client: blobs are linked by cross-repository mounts
and only manifests (a few KB) are written. Multi-arch indexes are copied whole, child
manifests first, so the index digest is unchanged.

Gates (all images are gated before anything is written; one refusal promotes nothing):
- the digest has a verdict stored in the registry, result "passed", for this cell, with
  at least one passed test, and every skip is one the matrix allows (see `skip_allowed`) or
  one the releaser waived by name (`--accept-skip REGEX`, recorded in the notes; never for a
  GPU test on a GPU cell);
- no config of the image carries `io.dl-images.standin=true`, and its cell label (when
  present) names this cell;
- no immutable (version) tag exists on another digest; `--force` moves only tags the
  matrix declares as moving, and is needed only to move them to an older release.

Concurrency: distribution registries have no compare-and-swap on tags, so each release
repository gets a lock tag (`release-lock`, a small OCI artifact naming its holder and an
expiry) taken by write-then-read-back, and every tag is compared before it is written and
verified after. See `RepoLock`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

from buildtool.common.errors import UserError
from buildtool.common.refs import split_repo_path
from buildtool.contracts import label_keys, names, skips
from buildtool.matrix.plan import CellPlan, Settings, plan_cell
from buildtool.matrix.schema import Cell
from buildtool.registry.client import (
    EMPTY_JSON,
    EMPTY_JSON_TYPE,
    INDEX_TYPES,
    OCI_MANIFEST,
    NotFound,
    RegistryClient,
    RegistryError,
    RegistryUnreachable,
    sha256_digest,
)
from buildtool.release.packages import copy_sbom, package_section
from buildtool.validate.verdicts import load_verdict, verdict_tag

log = logging.getLogger(__name__)

LOCK_TAG = names.RELEASE_LOCK_TAG
LOCK_TYPE = names.RELEASE_LOCK_TYPE
_TAG_RE = names.TAG_RE


# -- input checks ------------------------------------------------------------------------------

def check_version(version: str) -> str:
    """A release version must order (PEP 440, e.g. 0.1.0) and be usable inside a tag."""
    try:
        Version(version)
    except InvalidVersion:
        raise UserError(f"--version {version!r} is not a version like 0.1.0") from None
    if not _TAG_RE.match(version):
        raise UserError(f"--version {version!r} cannot be part of a tag; use letters, digits, '.', '-', '_'")
    return version


# -- what a release of one image looks like ------------------------------------------------------

@dataclass
class TagAction:
    tag: str
    moving: bool
    current: str | None          # digest the tag points at now (None: absent)
    action: str = ""             # create | exists | move | keep
    note: str = ""


@dataclass
class Platform:
    platform: str                # os/arch[/variant], or "" for a single-arch image
    digest: str
    size: int                    # config + compressed layers, bytes
    labels: dict[str, str]


@dataclass
class ImageRelease:
    """One cell's promotion: gate results, tag plan and what happened."""

    cell: str
    image: str
    source: str                  # dev ref
    release_repo: str
    digest: str = ""
    media_type: str = ""
    platforms: list[Platform] = field(default_factory=list)
    verdict: dict[str, Any] | None = None
    verdict_ref: str = ""
    tags: list[TagAction] = field(default_factory=list)
    status: str = "pending"      # refused | ready | promoted | unchanged | failed | not attempted | dry-run
    problems: list[str] = field(default_factory=list)
    tags_made: list[str] = field(default_factory=list)
    previous: dict[str, Any] | None = None
    skips: list[dict[str, Any]] = field(default_factory=list)   # each skipped test and what accepted it
    packages: dict[str, Any] | None = None   # SBOM and package changes (release.packages)
    _raw: bytes = b""

    @property
    def size(self) -> int:
        return sum(p.size for p in self.platforms)

    @property
    def labels(self) -> dict[str, str]:
        return self.platforms[0].labels if self.platforms else {}

    def tag_refs(self) -> list[str]:
        return [f"{self.release_repo}:{t.tag}" for t in self.tags if t.action != "keep"]


@dataclass
class ReleaseReport:
    version: str
    revision: str
    images: list[ImageRelease]
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        return all(i.status in ("promoted", "unchanged", "dry-run") for i in self.images)

    @property
    def refused(self) -> list[ImageRelease]:
        return [i for i in self.images if i.status == "refused"]


# -- gates ---------------------------------------------------------------------------------------

def skip_judgement(cell: Cell, test: dict[str, Any]) -> skips.Judgement:
    """What the matrix says of a skipped test (buildtool.contracts.skips): its code's rule, checked
    against this cell; the skip's prose is never read."""
    return skips.judge(cell, str(test.get("skip_code") or ""), str(test.get("skip_subject") or ""))


def skip_allowed(cell: Cell, test: dict[str, Any]) -> bool:
    """A skipped test is acceptable only where the matrix says it cannot run on this cell (e.g.
    a GPU check on a cell with `run.gpus: none`; a GPU cell validated on a runner without GPUs
    has not been tested and is refused). Skips for the runner's or the commit's circumstances
    (an engine that refused a ulimit, a missing peer image) are refused: validate where the
    test can run, or waive a runner's limit by name."""
    return skip_judgement(cell, test) == "expected"


def waiver_for(cell: Cell, test: dict[str, Any], accept: tuple[str, ...]) -> str | None:
    """The `--accept-skip` pattern that waives this skip, if any: only codes the contract marks
    waivable (a runner's limits), never a GPU check of a GPU cell."""
    if skip_judgement(cell, test) != "waivable":
        return None
    reason = f"[{test.get('skip_code')}] {test.get('skip_reason') or ''}"
    return next((pattern for pattern in accept if re.search(pattern, reason)), None)


def verdict_problems(cell: Cell, digest: str, verdict: dict[str, Any] | None,
                     accept: tuple[str, ...] = ()) -> list[str]:
    """Why a verdict does not let `digest` be released as `cell` (empty: it does)."""
    if verdict is None:
        return [f"{digest} has no verdict in the registry; run `make validate FRAMEWORK={cell.key}` first"]
    problems = []
    if verdict.get("cell") != cell.key:
        problems.append(f"verdict of {digest} is for cell {verdict.get('cell')!r}, not {cell.key}")
    if verdict.get("result") != "passed":
        failed = [t.get("id") for t in verdict.get("tests", []) if t.get("result") == "failed"]
        problems.append(f"verdict of {digest} is {verdict.get('result')!r}"
                        + (f" (failed: {', '.join(map(str, failed[:3]))})" if failed else ""))
    tests = verdict.get("tests", [])
    if not any(t.get("result") == "passed" for t in tests):
        problems.append(f"verdict of {digest} has no passed test")
    for t in tests:
        if t.get("result") not in ("passed", "skipped", "failed"):
            problems.append(f"test {t.get('id')} has unknown result {t.get('result')!r}")
    bad_skips = [t for t in tests if t.get("result") == "skipped" and not skip_allowed(cell, t)
                 and waiver_for(cell, t, accept) is None]
    if bad_skips:
        shown = ", ".join(f"{t.get('id')} ({t.get('skip_reason') or 'no reason'})" for t in bad_skips[:3])
        more = f" and {len(bad_skips) - 3} more" if len(bad_skips) > 3 else ""
        problems.append(f"{len(bad_skips)} test(s) skipped where the matrix expects them to run: {shown}{more}; "
                        "validate on a runner that can run them (or waive a runner limit with --accept-skip)")
    return problems


def image_problems(cell: Cell, platforms: list[Platform]) -> list[str]:
    """Stand-in and cell-label gates on every platform's image config."""
    problems = []
    for p in platforms:
        where = f" ({p.platform})" if p.platform else ""
        if p.labels.get(label_keys.STANDIN, "").lower() == "true":
            problems.append(f"{p.digest}{where} is built on a stand-in base ({label_keys.STANDIN}=true); "
                            "stand-ins are test fixtures and are never released")
        labelled = p.labels.get(label_keys.CELL)
        if labelled is not None and labelled != cell.key:
            problems.append(f"{p.digest}{where} is labelled {label_keys.CELL}={labelled}, not {cell.key}")
    return problems


def release_number(tag: str, template: str, cell: Cell) -> Version | None:
    """The release a tag made from `template` names, e.g. `2.13-0.1.0` -> 0.1.0."""
    if "{release}" not in template:
        return None
    pattern = re.escape(template).replace(re.escape("{version}"), re.escape(cell.version))
    match = re.fullmatch(pattern.replace(re.escape("{release}"), "(?P<r>.+)"), tag)
    if not match:
        return None
    try:
        return Version(match.group("r"))
    except InvalidVersion:
        return None


def releases_in(tags: Iterable[str], cell: Cell) -> dict[Version, str]:
    """Release number -> tag, for every immutable tag of this cell in a tag list."""
    found: dict[Version, str] = {}
    for tag in tags:
        for template in cell.release_tags:
            number = release_number(tag, template, cell)
            if number is not None:
                found[number] = tag
    return found


def plan_tags(plan: CellPlan, digest: str, version: str, current: dict[str, str | None],
              existing_tags: list[str], force: bool) -> tuple[list[TagAction], list[str]]:
    """Decide per tag: create, exists (already there: no-op), move (moving tags), keep."""
    actions, problems = [], []
    newer = sorted(v for v in releases_in(existing_tags, plan.cell) if v > Version(version))
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


# -- the in-registry copy ------------------------------------------------------------------------

def _blobs(manifest: dict[str, Any]) -> list[str]:
    digests = [manifest["config"]["digest"]] if "config" in manifest else []
    return digests + [layer["digest"] for layer in manifest.get("layers", [])]


def copy_manifest(client: RegistryClient, src_repo: str, dst_repo: str, raw: bytes, media_type: str,
                  digest: str) -> None:
    """Make `digest` exist in dst_repo without tags: blobs mounted, children first, bytes unchanged."""
    manifest = json.loads(raw)
    if media_type in INDEX_TYPES:
        for child in manifest.get("manifests", []):
            child_raw, child_type, child_digest = client.get_manifest(src_repo, child["digest"])
            copy_manifest(client, src_repo, dst_repo, child_raw, child_type, child_digest)
    for blob in _blobs(manifest):
        if not client.mount_blob(dst_repo, blob, src_repo):
            # Moving the data through this client is exactly what release must not do.
            raise RegistryError(f"registry declined to mount {blob} from {src_repo} into {dst_repo}")
    client.put_manifest(dst_repo, digest, raw, media_type)


def read_platforms(client: RegistryClient, repo: str, raw: bytes, media_type: str) -> list[Platform]:
    """Size and labels of each platform image (config blobs are small; layers are not read)."""
    manifest = json.loads(raw)
    if media_type in INDEX_TYPES:
        out = []
        for child in manifest.get("manifests", []):
            plat = child.get("platform") or {}
            name = "/".join(x for x in (plat.get("os"), plat.get("architecture"), plat.get("variant")) if x)
            if name == "unknown/unknown":   # attestation manifests of BuildKit
                continue
            child_raw, child_type, child_digest = client.get_manifest(repo, child["digest"])
            for p in read_platforms(client, repo, child_raw, child_type):
                out.append(Platform(name, child_digest, p.size, p.labels))
        return out
    config = manifest.get("config", {})
    size = int(config.get("size", 0)) + sum(int(layer.get("size", 0)) for layer in manifest.get("layers", []))
    labels: dict[str, str] = {}
    if config.get("digest"):
        body = json.loads(client.get_blob(repo, config["digest"]))
        labels = (body.get("config") or {}).get("Labels") or {}
    return [Platform("", sha256_digest(raw), size, labels)]


# -- the lock ------------------------------------------------------------------------------------

_ACTIVE_TOKENS: set[str] = set()
_ACTIVE_GUARD = threading.Lock()


class LockBusy(RegistryError):
    pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RepoLock:
    """A per-repository lock held in the registry itself, for registries without tag CAS.

    Taking it: read `release-lock`; if a live holder has it, wait (up to `wait_s`); else write
    our own lock artifact (unique content: holder, token, expiry), wait `settle_s`, read it back:
    only if the tag still names our digest do we hold it (of several writers, the last one wins
    and every other one sees that). The lock is stale when it has expired (`ttl_s`), or when its
    holder is on this host and no longer running. It is released by writing a `released` record.
    It protects against concurrent releases that all use this tool; every tag is also compared
    before and verified after each write, so a writer that ignores the lock is detected, not hidden.
    """

    def __init__(self, client: RegistryClient, repo: str, *, ttl_s: float = 300.0, wait_s: float = 60.0,
                 settle_s: float | None = None, poll_s: float = 0.5, purpose: str = ""):
        self.client, self.repo = client, repo
        self.ttl_s, self.wait_s, self.settle_s, self.poll_s = ttl_s, wait_s, settle_s, poll_s
        self.purpose = purpose
        self.token = uuid.uuid4().hex
        self.digest = ""

    def _record(self, released: bool) -> bytes:
        annotations = {label_keys.LOCK_TOKEN: self.token, label_keys.LOCK_HOST: socket.gethostname(),
                       label_keys.LOCK_PID: str(os.getpid()), label_keys.LOCK_PURPOSE: self.purpose,
                       label_keys.LOCK_EXPIRES: f"{time.time() + self.ttl_s:.3f}",
                       label_keys.LOCK_RELEASED: "true" if released else "false"}
        empty = {"mediaType": EMPTY_JSON_TYPE, "digest": sha256_digest(EMPTY_JSON), "size": len(EMPTY_JSON)}
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": LOCK_TYPE,
                    "config": empty, "layers": [empty], "annotations": annotations}
        return json.dumps(manifest, sort_keys=True).encode()

    def _holder(self) -> tuple[str, dict[str, str]] | None:
        try:
            raw, _, digest = self.client.get_manifest(self.repo, LOCK_TAG)
        except NotFound:
            return None
        return digest, json.loads(raw).get("annotations", {})

    def _free(self, info: dict[str, str]) -> bool:
        if info.get(label_keys.LOCK_RELEASED) == "true":
            return True
        if float(info.get(label_keys.LOCK_EXPIRES, "0")) < time.time():
            return True
        if info.get(label_keys.LOCK_HOST) == socket.gethostname():
            pid = int(info.get(label_keys.LOCK_PID, "0") or 0)
            if pid != os.getpid():
                return not _pid_alive(pid)
            with _ACTIVE_GUARD:   # same process: stale unless that lock is still held here
                return info.get(label_keys.LOCK_TOKEN) not in _ACTIVE_TOKENS
        return False

    def acquire(self) -> None:
        self.client.put_blob(self.repo, EMPTY_JSON)
        deadline = time.monotonic() + self.wait_s
        with _ACTIVE_GUARD:
            _ACTIVE_TOKENS.add(self.token)
        try:
            while True:
                holder = self._holder()
                if holder is None or self._free(holder[1]):
                    body = self._record(released=False)
                    started = time.monotonic()
                    self.digest = self.client.put_manifest(self.repo, LOCK_TAG, body, OCI_MANIFEST)
                    # A contender that saw the lock free writes within about one round trip of its
                    # read; waiting several round trips lets that write land before we read back.
                    time.sleep(self.settle_s if self.settle_s is not None
                               else max(0.02, 5 * (time.monotonic() - started)))
                    now = self._holder()
                    if now is not None and now[0] == self.digest:
                        return
                    log.info("release lock of %s taken by another release; waiting", self.repo)
                elif time.monotonic() > deadline:
                    info = holder[1]
                    raise LockBusy(f"{self.repo} is being released by {info.get(label_keys.LOCK_HOST)} "
                                   f"pid {info.get(label_keys.LOCK_PID)} "
                                   f"({info.get(label_keys.LOCK_PURPOSE)}); retry when it has finished")
                time.sleep(self.poll_s)
        except BaseException:
            with _ACTIVE_GUARD:
                _ACTIVE_TOKENS.discard(self.token)
            raise

    def still_held(self) -> bool:
        holder = self._holder()
        return holder is not None and holder[0] == self.digest

    def release(self) -> None:
        try:
            if self.still_held():
                self.client.put_manifest(self.repo, LOCK_TAG, self._record(released=True), OCI_MANIFEST)
        finally:
            with _ACTIVE_GUARD:
                _ACTIVE_TOKENS.discard(self.token)


# -- the pipeline --------------------------------------------------------------------------------

def gather(client: RegistryClient, plan: CellPlan, accept: tuple[str, ...] = ()) -> ImageRelease:
    """Read-only: resolve the dev tag, load verdict and configs, apply the image gates."""
    _, dev_repo = split_repo_path(plan.dev_repo)
    item = ImageRelease(cell=plan.cell.key, image=plan.cell.name, source=plan.dev_ref, release_repo=plan.release_repo)
    try:
        raw, media_type, digest = client.get_manifest(dev_repo, plan.dev_tag)
    except NotFound:
        item.status = "refused"
        item.problems.append(f"no dev image {plan.dev_ref}; build and push it first "
                             f"(make push FRAMEWORK={plan.cell.key}) or pass --from <sha> of a built commit")
        return item
    item.digest, item.media_type, item._raw = digest, media_type, raw
    item.platforms = read_platforms(client, dev_repo, raw, media_type)
    vtag = verdict_tag(digest)
    before = client.manifest_digest(dev_repo, vtag)
    item.verdict = load_verdict(client, dev_repo, digest)
    if item.verdict is not None:
        if client.manifest_digest(dev_repo, vtag) != before:
            item.problems.append(f"the verdict of {digest} changed while it was read; re-run the release")
        item.verdict_ref = f"{plan.dev_repo}@{before}"
    item.problems += verdict_problems(plan.cell, digest, item.verdict, accept)
    if item.verdict is not None:
        for t in item.verdict.get("tests", []):
            if t.get("result") == "skipped":
                pattern = None if skip_allowed(plan.cell, t) else waiver_for(plan.cell, t, accept)
                item.skips.append({"id": t.get("id"), "reason": t.get("skip_reason"),
                                   "accepted_by": "matrix" if pattern is None else f"--accept-skip {pattern}"})
    item.problems += image_problems(plan.cell, item.platforms)
    item.status = "refused" if item.problems else "ready"
    return item


def _tag_state(client: RegistryClient, repo: str, plan: CellPlan) -> tuple[dict[str, str | None], list[str]]:
    tags = client.tags(repo)
    current = {t: (client.manifest_digest(repo, t) if t in tags else None)
               for t in (*plan.release_tags, *plan.moving_tags)}
    return current, tags


def plan_item(client: RegistryClient, item: ImageRelease, plan: CellPlan, version: str, force: bool,
              with_previous: bool = True) -> None:
    _, repo = split_repo_path(plan.release_repo)
    current, tags = _tag_state(client, repo, plan)
    item.tags, problems = plan_tags(plan, item.digest, version, current, tags, force)
    item.problems += problems
    if problems:
        item.status = "refused"
    if with_previous:
        item.previous = previous_release(client, repo, plan.cell, version, tags)


def previous_release(client: RegistryClient, repo: str, cell: Cell, version: str,
                     tags: list[str]) -> dict[str, Any] | None:
    """The newest earlier release of this cell in the release repository: tag, digest, size, labels."""
    older = {v: t for v, t in releases_in(tags, cell).items() if v < Version(version)}
    if not older:
        return None
    number = max(older)
    raw, media_type, digest = client.get_manifest(repo, older[number])
    platforms = read_platforms(client, repo, raw, media_type)
    return {"release": str(number), "tag": older[number], "digest": digest,
            "size": sum(p.size for p in platforms), "labels": platforms[0].labels if platforms else {}}


def promote(client: RegistryClient, item: ImageRelease, plan: CellPlan, lock: RepoLock | None,
            copy_verdict: bool = True) -> None:
    """Copy, tag (compare before each write), verify. Raises RegistryError on a fault."""
    _, src = split_repo_path(plan.dev_repo)
    _, dst = split_repo_path(plan.release_repo)
    todo = [t for t in item.tags if t.action in ("create", "move")]
    if not todo:
        item.status = "unchanged"
        return
    copy_manifest(client, src, dst, item._raw, item.media_type, item.digest)
    if copy_verdict and item.verdict_ref:
        # Users of the release repository can check the verdict by digest there too. Copied
        # before any tag, so a release whose tags are all in place has its verdict as well.
        vdigest = item.verdict_ref.rsplit("@", 1)[1]
        vraw, vtype, _ = client.get_manifest(src, vdigest)
        for blob in _blobs(json.loads(vraw)):
            if not client.mount_blob(dst, blob, src):
                raise RegistryError(f"registry declined to mount verdict blob {blob} into {dst}")
        client.put_manifest(dst, verdict_tag(item.digest), vraw, vtype)
    copy_sbom(client, src, dst, item.digest)   # the SBOM travels with the image (release.packages)
    for t in todo:
        if lock is not None and not lock.still_held():
            raise RegistryError(f"lost the release lock of {dst} before tagging {t.tag}; nothing more was tagged")
        now = client.manifest_digest(dst, t.tag)
        if now not in (t.current, item.digest):
            raise RegistryError(f"{plan.release_repo}:{t.tag} changed to {now} during the release")
        client.put_manifest(dst, t.tag, item._raw, item.media_type)
        item.tags_made.append(t.tag)
    item.status = "promoted"


def verify(client: RegistryClient, item: ImageRelease) -> list[str]:
    """Every release tag of the item must resolve to exactly the source digest."""
    _, dst = split_repo_path(item.release_repo)
    wrong = []
    for t in item.tags:
        if t.action == "keep":
            continue
        got = client.manifest_digest(dst, t.tag)
        if got != item.digest:
            wrong.append(f"{item.release_repo}:{t.tag} resolves to {got}, not {item.digest}")
    return wrong


@dataclass
class ReleaseOptions:
    version: str
    revision: str
    force: bool = False
    dry_run: bool = False
    lock_wait_s: float = 60.0
    lock_ttl_s: float = 300.0
    accept_skips: tuple[str, ...] = ()      # --accept-skip regexes: explicit, recorded waivers
    lock_settle_s: float | None = None     # None: adaptive, 5 lock-write round trips (at least 20 ms)


def release(cells: list[Cell], settings: Settings, options: ReleaseOptions,
            client_for: Callable[[str], RegistryClient] = RegistryClient) -> ReleaseReport:
    """Gate every image, then promote them all; the report says what was and was not done."""
    version = check_version(options.version)
    plans = [plan_cell(c, settings, options.revision, version) for c in cells]
    for p in plans:
        for tag in (*p.release_tags, *p.moving_tags):
            if not _TAG_RE.match(tag):
                raise UserError(f"release tag {tag!r} of {p.cell.key} is not a valid tag; fix matrix.yaml")
    hosts = {split_repo_path(p.dev_repo)[0] for p in plans} | {split_repo_path(p.release_repo)[0] for p in plans}
    if len(hosts) > 1:
        raise UserError(f"REGISTRY and RELEASE_REGISTRY are on different hosts ({', '.join(sorted(hosts))}); "
                        "an in-registry promotion needs one registry: point RELEASE_REGISTRY at the same host")
    client = client_for(hosts.pop())
    client.ping()
    report = ReleaseReport(version, options.revision, [], options.dry_run)
    for p in plans:
        report.images.append(gather(client, p, options.accept_skips))
    for item, p in zip(report.images, plans, strict=True):
        if item.status == "ready":
            plan_item(client, item, p, version, options.force)
            item.packages = package_section(client, item.digest, p.dev_repo, p.release_repo, item.previous)
    if report.refused or options.dry_run:
        for item in report.images:
            if item.status == "ready":
                item.status = "dry-run" if options.dry_run else "not attempted"
        return report
    _promote_all(client, report, plans, options)
    return report


def _promote_all(client: RegistryClient, report: ReleaseReport, plans: list[CellPlan],
                 options: ReleaseOptions) -> None:
    pending = [(i, p) for i, p in zip(report.images, plans, strict=True)
               if any(t.action in ("create", "move") for t in i.tags)]
    for item, _ in zip(report.images, plans, strict=True):
        if all(t.action in ("exists", "keep") for t in item.tags):
            item.status = "unchanged"     # idempotent re-run: nothing is written, not even a lock
    if not pending:
        return
    locks: list[RepoLock] = []
    failure: str = ""
    try:
        for repo in sorted({split_repo_path(p.release_repo)[1] for _, p in pending}):   # sorted: no deadlock
            lock = RepoLock(client, repo, ttl_s=options.lock_ttl_s, wait_s=options.lock_wait_s,
                            settle_s=options.lock_settle_s, purpose=f"release {options.version}")
            lock.acquire()
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
                promote(client, item, p, lock_of[split_repo_path(p.release_repo)[1]])
                wrong = verify(client, item)
            except (RegistryError, RegistryUnreachable) as exc:
                item.status = "failed"
                item.problems.append(str(exc))
                failure = str(exc)
                continue
            if wrong:
                item.status = "failed"
                item.problems += wrong
                failure = wrong[0]
    except (RegistryError, RegistryUnreachable) as exc:
        for item, _ in pending:
            if item.status in ("ready", "pending"):
                item.status = "not attempted"
                item.problems.append(str(exc))
    finally:
        for lock in locks:
            try:
                lock.release()
            except (RegistryError, RegistryUnreachable) as exc:
                log.warning("could not release the lock of %s (%s); it expires in %.0fs or when this "
                            "process has ended", lock.repo, exc, lock.ttl_s)
