"""The per-repository release lock, held in the registry itself (a `release-lock` tag) for
registries without tag compare-and-swap. See `RepoLock`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime

from buildtool.common.processes import pid_alive
from buildtool.common.refs import shown_plain
from buildtool.contracts import label_keys, names
from buildtool.registry import answers
from buildtool.registry.client import (
    EMPTY_JSON,
    EMPTY_JSON_TYPE,
    MANIFEST_TYPES,
    MAX_MANIFEST_BYTES,
    OCI_MANIFEST,
    RegistryClient,
    RegistryError,
    sha256_digest,
)

log = logging.getLogger(__name__)

LOCK_TAG = names.RELEASE_LOCK_TAG


_ACTIVE_TOKENS: set[str] = set()
_ACTIVE_GUARD = threading.Lock()


_ACCEPT = {"Accept": ", ".join(MANIFEST_TYPES)}
_WORD = re.compile(r"\S+")
# The fields a record must have: what each must be, in words and as a pattern (the purpose is words for a message
# only, and may be missing).
_FIELDS = {label_keys.LOCK_TOKEN: ("a token", _WORD), label_keys.LOCK_HOST: ("a host name", _WORD),
           label_keys.LOCK_PID: ("a process id (a positive whole number)", re.compile(r"[1-9][0-9]{0,9}")),
           label_keys.LOCK_EXPIRES: ("a Unix time (seconds, like 1767225600.250)",
                                     re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")),
           label_keys.LOCK_RELEASED: ('"true" or "false"', re.compile("true|false"))}


class LockBusy(RegistryError):
    pass


class LockUnreadable(RegistryError):
    """The lock record cannot be read. It counts as held (fail closed): taking it over could interleave two
    releases; the message says how to remove it."""


class RepoLock:
    """A per-repository lock held in the registry itself, for registries without tag CAS.

    Taking it: read `release-lock`; if a live holder has it, wait (up to `wait_s`); else write
    our own lock artifact (unique content: holder, token, expiry), wait `settle_s`, read it back:
    only if the tag still names our digest do we hold it (of several writers, the last one wins
    and every other one sees that). The lock is stale when it has expired (`ttl_s`, by the registry's
    clock), or when its holder is on this host and no longer running; a record that cannot be read is
    held. It is released by writing a `released` record.
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

    def _record(self, released: bool, now: float | None = None) -> bytes:
        """`now`: the registry's time (see _read), which the expiry counts from; this machine's clock where none is
        given."""
        annotations = {label_keys.LOCK_TOKEN: self.token, label_keys.LOCK_HOST: socket.gethostname(),
                       label_keys.LOCK_PID: str(os.getpid()), label_keys.LOCK_PURPOSE: self.purpose,
                       label_keys.LOCK_EXPIRES: f"{(time.time() if now is None else now) + self.ttl_s:.3f}",
                       label_keys.LOCK_RELEASED: "true" if released else "false"}
        empty = {"mediaType": EMPTY_JSON_TYPE, "digest": sha256_digest(EMPTY_JSON), "size": len(EMPTY_JSON)}
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": names.RELEASE_LOCK_TYPE,
                    "config": empty, "layers": [empty], "annotations": annotations}
        return json.dumps(manifest, sort_keys=True).encode()

    def _unreadable(self, what: str) -> LockUnreadable:
        tag = f"{self.client.host}/{self.repo}:{LOCK_TAG}"
        return LockUnreadable(f"release lock {tag}: {what}; a lock that cannot be read counts as held: once no "
                              f"release of {self.repo} is running, remove it (skopeo delete docker://{tag}) and "
                              "release again")

    def _read(self) -> tuple[tuple[str, dict[str, str]] | None, float]:
        """The record the lock tag names (its digest and annotations; None when there is none) and the registry's
        time of that answer (its Date): expiries are written and judged by the registry's clock, one for every
        release, so a machine whose clock is ahead does not take a live lock as expired. Read to MAX_MANIFEST_BYTES,
        as every manifest is."""
        whole = answers.WholeBody(MAX_MANIFEST_BYTES, lambda size: self._unreadable(
            f"its manifest is {size}, over the {MAX_MANIFEST_BYTES}-byte limit on a manifest; not read further"))
        response = self.client.request("GET", f"{self.repo}/manifests/{LOCK_TAG}", ok=(200, 404), repo=self.repo,
                                       headers=_ACCEPT, sink=whole)
        date = response.headers.get("Date") or ""
        try:
            now = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            raise RegistryError(f"registry {self.client.host} answered {self.repo}:{LOCK_TAG} with the Date "
                                f"{date[:60]!r}, not an HTTP date: the release lock's expiry is judged by the "
                                "registry's clock; is a proxy in front of it dropping the header?") from None
        if response.status_code == 404:
            return None, now
        body = whole.data
        problem = answers.manifest_problem(body)
        if problem:
            raise self._unreadable(f"it is no manifest ({problem})")
        annotations = json.loads(body).get("annotations")
        if annotations is None:
            raise self._unreadable("it has no annotations, so no holder, expiry or release state")
        return (sha256_digest(body), annotations), now

    def _holder(self) -> tuple[str, dict[str, str]] | None:
        return self._read()[0]

    def _checked(self, info: dict[str, str]) -> None:
        """LockUnreadable naming the first field of the record that is missing or not what it must be."""
        for key, (wanted, pattern) in _FIELDS.items():
            value = info.get(key)
            if value is None:
                raise self._unreadable(f"its record has no {key} annotation, which must be {wanted}")
            if not pattern.fullmatch(value):
                raise self._unreadable(f"its {key} is {value[:60]!r}, not {wanted}")

    def _free(self, info: dict[str, str], now: float | None = None) -> bool:
        """Whether the lock `info` records may be taken. `now`: the registry's time (see _read); this machine's
        clock where none is given."""
        self._checked(info)
        if info[label_keys.LOCK_RELEASED] == "true":
            return True
        if float(info[label_keys.LOCK_EXPIRES]) < (time.time() if now is None else now):
            return True
        if info[label_keys.LOCK_HOST] == socket.gethostname():
            pid = int(info[label_keys.LOCK_PID])
            if pid != os.getpid():
                return not pid_alive(pid)
            with _ACTIVE_GUARD:   # same process: stale unless that lock is still held here
                return info[label_keys.LOCK_TOKEN] not in _ACTIVE_TOKENS
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
                holder, registry_now = self._read()
                if holder is None or self._free(holder[1], registry_now):
                    body = self._record(released=False, now=registry_now)
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
                    raise LockBusy(f"{self.repo} is being released by {shown_plain(info.get(label_keys.LOCK_HOST))} "
                                   f"pid {info.get(label_keys.LOCK_PID)} "
                                   f"({shown_plain(info.get(label_keys.LOCK_PURPOSE))}); retry when it has finished")
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
            holder, registry_now = self._read()
            if holder is not None and holder[0] == self.digest:
                self.client.put_manifest(self.repo, LOCK_TAG, self._record(released=True, now=registry_now),
                                         OCI_MANIFEST)
        finally:
            with _ACTIVE_GUARD:
                _ACTIVE_TOKENS.discard(self.token)
