"""Promote tested dev images to release tags, digest for digest, inside the registry.

For each chosen cell: find the dev image of the commit (`<name>-dev:<sha>-<version>`),
check the gates (buildtool.release.gates), then give the same digest its release tags in the
release repository. No layer data passes through this client: blobs are linked by
cross-repository mounts and only manifests (a few KB) are written. Multi-arch indexes are
copied whole, child manifests first, so the index digest is unchanged. The verdict that let
the image through (a signed attestation) is attached to the same digest in the release repository.

All images are gated before anything is written; one refusal promotes nothing. Version tags
are immutable (never moved, not even with --force); `--force` moves only the matrix's moving
tags, and is needed only to move them to an older release.

Concurrency: distribution registries have no compare-and-swap on tags, so each release
repository gets a lock tag (`release-lock`, a small OCI artifact naming its holder and an
expiry) taken by write-then-read-back, and every tag is compared before it is written and
verified after. See `RepoLock`. A write that reaches the registry late (a request the network
held after this client gave up on it) is caught by a final re-check of every tag after the
last write, still under the lock: a moving tag found elsewhere is put back (and reported).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from buildtool.common.errors import UserError
from buildtool.common.refs import split_repo, split_repo_path
from buildtool.contracts import label_keys, names
from buildtool.contracts.verdict import Verdict
from buildtool.matrix.plan import CellPlan, Settings, mirror_base, plan_cell
from buildtool.registry.client import (
    EMPTY_JSON,
    EMPTY_JSON_TYPE,
    INDEX_TYPES,
    OCI_MANIFEST,
    NotFound,
    RegistryClient,
    RegistryError,
    RegistryUnreachable,
    RetryPolicy,
    sha256_digest,
)
from buildtool.registry.referrers import Referrer
from buildtool.release.gates import (
    Platform,
    StandIns,
    check_version,
    image_problems,
    skip_allowed,
    verdict_problems,
    waiver_for,
)
from buildtool.release.packages import package_section
from buildtool.release.testcode import KnownCode
from buildtool.validate.keys import TrustedKeys

if TYPE_CHECKING:
    from buildtool.matrix.schema import Cell

log = logging.getLogger(__name__)

READ_THREADS = 8
LOCK_TAG = names.RELEASE_LOCK_TAG
LOCK_TYPE = names.RELEASE_LOCK_TYPE
_TAG_RE = names.TAG_RE

__all__ = ["ImageRelease", "Platform", "ReleaseOptions", "ReleaseReport", "RepoLock", "TagAction", "check_version",
           "release"]


# -- what a release of one image looks like ------------------------------------------------------

@dataclass
class TagAction:
    tag: str
    moving: bool
    current: str | None          # digest the tag points at now (None: absent)
    action: str = ""             # create | exists | move | keep | refuse
    note: str = ""


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
    verdict: Verdict | None = None    # the counting verdict, typed (parsed where it was read)
    verdict_ref: str = ""        # <dev repo>@<attestation digest>
    attestation: Referrer | None = None
    signer: str = ""             # key id (and name) that signed the verdict
    ignored: list[str] = field(default_factory=list)    # attestations that did not verify, and why
    notes: list[str] = field(default_factory=list)      # facts worth a line in the release notes
    tags: list[TagAction] = field(default_factory=list)
    status: str = "pending"      # refused | ready | promoted | unchanged | failed | not attempted | dry-run
    problems: list[str] = field(default_factory=list)
    tags_made: list[str] = field(default_factory=list)
    # After a failure, tags whose write got no answer and that could not be read back: unknown.
    tags_unknown: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)   # moving tags put back by the final re-check
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


# -- tags ----------------------------------------------------------------------------------------

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
    spelt = {}
    for tag in existing_tags:
        for template in plan.cell.release_tags:
            number = release_number(tag, template, plan.cell)
            if number is not None:
                spelt[tag] = number
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
    client.mount_blobs(dst_repo, _blobs(manifest), src_repo)
    client.put_manifest(dst_repo, digest, raw, media_type)


def _platform_name(descriptor: dict[str, Any]) -> str:
    plat = descriptor.get("platform") or {}
    return "/".join(x for x in (plat.get("os"), plat.get("architecture"), plat.get("variant")) if x)


def _config_labels(client: RegistryClient, repo: str, manifest: dict[str, Any]) -> dict[str, str]:
    config = manifest.get("config", {})
    if not config.get("digest"):
        return {}
    body = json.loads(client.get_blob(repo, config["digest"]))
    return dict((body.get("config") or {}).get("Labels") or {})


def read_platforms(client: RegistryClient, repo: str, raw: bytes, media_type: str) -> list[Platform]:
    """Size, labels and layers of each platform image (config blobs are small; layers are not read),
    and the labels of the base each names by digest, where that base is in the same registry."""
    manifest = json.loads(raw)
    if media_type in INDEX_TYPES:
        out = []
        for child in manifest.get("manifests", []):
            name = _platform_name(child)
            if name == "unknown/unknown":   # attestation manifests of BuildKit
                continue
            child_raw, child_type, child_digest = client.get_manifest(repo, child["digest"])
            for p in read_platforms(client, repo, child_raw, child_type):
                out.append(Platform(name, child_digest, p.size, p.labels, p.layers, p.base_labels))
        return out
    config = manifest.get("config", {})
    layers = tuple(str(layer.get("digest")) for layer in manifest.get("layers", []))
    size = int(config.get("size", 0)) + sum(int(layer.get("size", 0)) for layer in manifest.get("layers", []))
    labels = _config_labels(client, repo, manifest)
    return [Platform("", sha256_digest(raw), size, labels, layers, _base_labels(client, labels))]


def _base_labels(client: RegistryClient, labels: dict[str, str]) -> dict[str, str] | None:
    """The labels of the base image the labels name (by digest, in the repository of the base the
    build pulled), when that repository is in this registry; None when it cannot be found here."""
    digest, ref = labels.get(label_keys.OCI_BASE_DIGEST, ""), labels.get(label_keys.BASE_REF, "")
    if not digest.startswith("sha256:") or not ref:
        return None
    try:
        host, repo, _ = split_repo(ref)
    except ValueError:
        return None
    if host != client.host:
        return None
    try:
        raw, media_type, _ = client.get_manifest(repo, digest)
        manifest = json.loads(raw)
        if media_type in INDEX_TYPES:
            child = next((m for m in manifest.get("manifests", []) if _platform_name(m) != "unknown/unknown"), None)
            if child is None:
                return {}
            manifest = json.loads(client.get_manifest(repo, child["digest"])[0])
        return _config_labels(client, repo, manifest)
    except NotFound:
        return None


def read_standins(client: RegistryClient, settings: Settings, cells: Sequence[Cell]) -> tuple[StandIns, list[str]]:
    """The stand-in bases of the mirror (BASE_MIRROR, or the registry released into when unset):
    digests and layer lists of every upstream base the matrix gives a stand-in for. Returns them
    and the problems reading them (a mirror that cannot be read cannot vouch for provenance)."""
    found, problems = StandIns(), []
    mirror = settings.base_mirror or client.host
    for cell in cells:
        if cell.standin is None:
            continue
        ref = mirror_base(cell.base, mirror)
        if ref == cell.base:
            continue   # BASE_MIRROR maps other upstreams only: this base has no mirror to hold a stand-in
        try:
            host, repo, tag = split_repo(ref)
        except ValueError:
            continue
        if host != client.host and not settings.base_mirror:
            continue
        reader = client if host == client.host else RegistryClient(host, retry=RetryPolicy(attempts=2, timeout=10))
        try:
            raw, media_type, digest = reader.get_manifest(repo, tag)
        except NotFound:
            continue
        except (RegistryError, RegistryUnreachable) as exc:
            problems.append(f"cannot read the stand-in {ref} to check provenance ({exc})")
            continue
        manifest = json.loads(raw)
        found.add(ref, digest, [str(layer.get("digest")) for layer in manifest.get("layers", [])])
        if media_type in INDEX_TYPES:
            for child in manifest.get("manifests", []):
                child_raw, _, child_digest = reader.get_manifest(repo, child["digest"])
                layers = [str(layer.get("digest")) for layer in json.loads(child_raw).get("layers", [])]
                found.add(ref, child_digest, layers)
    return found, problems


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
                 settle_s: float | None = None, poll_s: float = 0.5, purpose: str = "", blob_source: str = ""):
        self.client, self.repo = client, repo
        self.ttl_s, self.wait_s, self.settle_s, self.poll_s = ttl_s, wait_s, settle_s, poll_s
        self.purpose = purpose
        self.blob_source = blob_source   # a repository likely to hold the empty blob: mounted, not uploaded
        self.token = os.urandom(16).hex()   # not uuid: importing it costs more than a lock round trip
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

    def acquire(self, while_settling: Callable[[], None] | None = None) -> None:
        """Take the lock. `while_settling` runs (once) in the settle wait after our lock write: work
        that needs no lock (content-addressed, untagged writes) done there costs no time of its own."""
        empty = sha256_digest(EMPTY_JSON)
        if not (self.blob_source and self.client.mount_blob(self.repo, empty, self.blob_source)):
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
                    written = time.monotonic()
                    settle = self.settle_s if self.settle_s is not None else max(0.02, 5 * (written - started))
                    if while_settling is not None:
                        work, while_settling = while_settling, None
                        work()
                    time.sleep(max(0.0, written + settle - time.monotonic()))
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
    # Keys whose verdicts count (none: nothing passes); a Future when they are still being read
    # (buildtool.cli.release_run reads them while the first registry requests are on their way).
    trusted: TrustedKeys | Future[TrustedKeys] = field(default_factory=TrustedKeys)
    # The image-tests code a verdict may have run (buildtool.release.testcode: image-tests as committed
    # at the image's revision and at the release commit); None: nothing to compare with, so no verdict counts.
    known_code: KnownCode | Future[KnownCode] | None = None

    def trusted_keys(self) -> TrustedKeys:
        return self.trusted.result() if isinstance(self.trusted, Future) else self.trusted

    def test_code(self) -> KnownCode | None:
        return self.known_code.result() if isinstance(self.known_code, Future) else self.known_code


def _gate_verdict(client: RegistryClient, item: ImageRelease, plan: CellPlan, dev_repo: str,
                  options: ReleaseOptions) -> None:
    from buildtool.validate.verdicts import find_verdicts

    trusted = options.trusted_keys()
    findings = find_verdicts(client, dev_repo, item.digest, trusted, plan.cell.key)
    item.ignored = [f"{r.artifact}: {r.reason}" for r in findings.rejected]
    if findings.overwritten:
        item.problems.append(f"a verdict of {item.digest} was overwritten in the registry "
                             f"({'; '.join(findings.overwritten)}): the registry was tampered with; find out who "
                             "wrote it, then validate the image again")
    chosen = findings.chosen
    if chosen is None:
        if findings.rejected or findings.legacy:
            item.problems.append(f"{item.digest} has no valid verdict: {findings.why_none(trusted)}")
        else:
            item.problems.append(f"{item.digest} has no verdict in the registry; run `make validate "
                                 f"FRAMEWORK={plan.cell.key}` first")
        return
    item.verdict, item.attestation = chosen.verdict, chosen.referrer
    item.verdict_ref = f"{plan.dev_repo}@{chosen.artifact}"
    item.signer = trusted.describe(chosen.keyid)
    if chosen.keyid in trusted.dev:
        item.notes.append(f"verdict signed by this machine's local dev key {item.signer} (--trust-local-key)")
    local = None
    known, code = options.test_code(), chosen.verdict.test_code
    if known is None:
        item.problems.append("no image-tests code to compare the verdict's with (release reads image-tests from "
                             "the git checkout it runs in)")
    elif code not in known.codes:
        item.problems.append(f"the verdict ran image-tests {code or '(none)'}, which is neither image-tests at the "
                             f"image's revision nor at the release commit ({known.describe()}); test code that git "
                             "does not hold at either proves nothing: validate again with committed image-tests")
    else:
        where, folder = known.codes[code]
        item.notes.append(f"verdict ran {where} ({code})")
        if folder is not None:
            from buildtool.validate.collect import defined_tests, missing_groups

            # The gate compares with the cell's groups, all of them: a folder that lacks one is a refusal.
            missing = missing_groups(plan.cell, folder)
            for group in missing:
                item.problems.append(f"{where} has no folder {folder / group}/ for the group {group} of "
                                     f"{plan.cell.key}: no verdict of that test code can have run it")
            if not missing:
                local = defined_tests(plan.cell, folder, code)
    item.problems += verdict_problems(plan.cell, item.digest, chosen.verdict, options.accept_skips, local)
    for t in chosen.verdict.tests:
        if t.result == "skipped":
            pattern = None if skip_allowed(plan.cell, t, local) else waiver_for(plan.cell, t, options.accept_skips,
                                                                                 local)
            item.skips.append({"id": t.id, "reason": t.skip_reason,
                               "accepted_by": "matrix" if pattern is None else f"--accept-skip {pattern}"})


def gather(client: RegistryClient, plan: CellPlan, options: ReleaseOptions,
           standins: StandIns | None = None, image_gate: bool = True) -> ImageRelease:
    """Read-only: resolve the dev tag, verify the verdict, read the configs, apply the gates
    (the image's provenance gate too, unless the caller applies it: `image_gate=False`)."""
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
    with ThreadPoolExecutor(max_workers=1) as side:    # configs and the verdict are read side by side
        platforms = side.submit(read_platforms, client, dev_repo, raw, media_type)
        _gate_verdict(client, item, plan, dev_repo, options)
        item.platforms = platforms.result()
    if image_gate:
        item.problems += image_problems(plan.cell, item.platforms, standins)
    item.status = "refused" if item.problems else "ready"
    return item


def _tag_state(client: RegistryClient, repo: str, plan: CellPlan) -> tuple[dict[str, str | None], list[str]]:
    tags = client.tags(repo)
    current = {t: (client.manifest_digest(repo, t) if t in tags else None)
               for t in (*plan.release_tags, *plan.moving_tags)}
    return current, tags


@dataclass
class TagState:
    current: dict[str, str | None]
    tags: list[str]
    previous: dict[str, Any] | None = None


def read_tag_state(client: RegistryClient, plan: CellPlan, version: str, with_previous: bool = True) -> TagState:
    """The release repository's tags of this cell now, and its previous release."""
    _, repo = split_repo_path(plan.release_repo)
    current, tags = _tag_state(client, repo, plan)
    state = TagState(current, tags)
    if with_previous:
        state.previous = previous_release(client, repo, plan.cell, version, tags)
    return state


def plan_item(client: RegistryClient, item: ImageRelease, plan: CellPlan, version: str, force: bool,
              with_previous: bool = True, state: TagState | None = None) -> None:
    state = state or read_tag_state(client, plan, version, with_previous)
    item.tags, problems = plan_tags(plan, item.digest, version, state.current, state.tags, force)
    item.problems += problems
    if problems:
        item.status = "refused"
    if with_previous:
        item.previous = state.previous


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


def stage(client: RegistryClient, item: ImageRelease, plan: CellPlan) -> list[Referrer]:
    """The writes of a promotion that need no lock: the image's manifests (children first, blobs
    mounted) and its signed verdict and SBOM artifacts, all by digest and untagged in the release
    repository. Returns the artifacts, for `promote` to list as referrers of the image."""
    from buildtool.registry.referrers import copy_artifact
    from buildtool.registry.sbom import find_sbom

    _, src = split_repo_path(plan.dev_repo)
    _, dst = split_repo_path(plan.release_repo)
    copy_manifest(client, src, dst, item._raw, item.media_type, item.digest)
    # Users of the release repository can check the signed verdict by digest there too (bytes
    # unchanged, so the signature holds), and the SBOM travels with the image (release.packages).
    artifacts = [a for a in (item.attestation, find_sbom(client, src, item.digest)) if a is not None]
    for artifact in artifacts:
        copy_artifact(client, src, dst, artifact)
    return artifacts


def promote(client: RegistryClient, item: ImageRelease, plan: CellPlan, lock: RepoLock | None,
            staged: list[Referrer] | None = None) -> None:
    """Copy (unless `stage` already did: `staged`), list the artifacts, tag (compare before each
    write), verify. Raises RegistryError on a fault."""
    from buildtool.registry.referrers import add_referrers

    _, dst = split_repo_path(plan.release_repo)
    todo = [t for t in item.tags if t.action in ("create", "move")]
    if not todo:
        item.status = "unchanged"
        return
    artifacts = stage(client, item, plan) if staged is None else staged
    # Listed before any tag, so released tags have them. Under the repository lock no other
    # release writes this repository's referrers index.
    add_referrers(client, dst, item.digest, artifacts, exclusive=lock is not None)
    if lock is not None and not lock.still_held():
        raise RegistryError(f"lost the release lock of {dst} before tagging; nothing was tagged")
    # Version tags first, then the moving ones: a moving tag never names a release whose version
    # tag was not written. Within each group the tags are independent: compared and written side by side.
    for group in ([t for t in todo if not t.moving], [t for t in todo if t.moving]):
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
    """What each tag names now, read side by side."""
    if len(tags) < 2:
        return {t: client.manifest_digest(repo, t) for t in tags}
    with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(tags))) as pool:
        return dict(zip(tags, pool.map(lambda t: client.manifest_digest(repo, t), tags), strict=True))


def verify(client: RegistryClient, item: ImageRelease, moving: bool = True) -> list[str]:
    """Every release tag of the item (only the version tags with `moving=False`) must resolve to
    exactly the source digest."""
    _, dst = split_repo_path(item.release_repo)
    checked = [t.tag for t in item.tags if t.action != "keep" and (moving or not t.moving)]
    return [f"{item.release_repo}:{tag} resolves to {got}, not {item.digest}"
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
                item.repaired.append(f"{t.tag} was moved to {now} after it was written (a late write); put back")
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
                                     f"{item.digest}")


def release(cells: list[Cell], settings: Settings, options: ReleaseOptions,
            client_for: Callable[[str], RegistryClient] = RegistryClient,
            matrix_cells: Sequence[Cell] | None = None) -> ReleaseReport:
    """Gate every image, then promote them all; the report says what was and was not done.
    `matrix_cells`: every cell of the matrix (its stand-ins are checked), default `cells`."""
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
    # Everything before the first write is reads: done side by side (stand-ins, each image and its
    # verdict, each release repository's tags, the SBOMs), then judged in matrix order.
    with ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="release-read") as pool:
        standins_job = pool.submit(read_standins, client, settings, matrix_cells or cells)
        items = [pool.submit(gather, client, p, options, None, False) for p in plans]
        states = [pool.submit(read_tag_state, client, p, version) for p in plans]
        standins, standin_problems = standins_job.result()
        sboms = []
        for job, state, p in zip(items, states, plans, strict=True):
            item = job.result()
            if item.digest:
                item.problems += image_problems(p.cell, item.platforms, standins) + standin_problems
                item.status = "refused" if item.problems else "ready"
            if item.status == "ready":
                plan_item(client, item, p, version, options.force, state=state.result())
                sboms.append((item, pool.submit(package_section, client, item.digest, p.dev_repo, p.release_repo,
                                                item.previous)))
            report.images.append(item)
        for item, section in sboms:
            item.packages = section.result()
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
    staged: dict[int, list[Referrer] | RegistryError | RegistryUnreachable] = {}

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
