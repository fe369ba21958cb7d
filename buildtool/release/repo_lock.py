"""The per-repository release lock, held in the registry itself (a `release-lock` tag) for
registries without tag compare-and-swap. See `RepoLock`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from buildtool.common.processes import pid_alive
from buildtool.contracts import label_keys, names
from buildtool.registry.client import (
    EMPTY_JSON,
    EMPTY_JSON_TYPE,
    OCI_MANIFEST,
    NotFound,
    RegistryClient,
    RegistryError,
    sha256_digest,
)

log = logging.getLogger(__name__)

LOCK_TAG = names.RELEASE_LOCK_TAG


_ACTIVE_TOKENS: set[str] = set()
_ACTIVE_GUARD = threading.Lock()


class LockBusy(RegistryError):
    pass


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
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": names.RELEASE_LOCK_TYPE,
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
                return not pid_alive(pid)
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
