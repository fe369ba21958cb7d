"""The release lock kept in the registry (buildtool.release.repo_lock): a record that cannot be read, and whose
clock its expiry is judged by. Against a stand-in registry client; tests/integration/test_release.py takes it on a
real registry."""

from __future__ import annotations

import json
import re
import time
import types
from email.utils import formatdate
from typing import Any

import pytest

from buildtool.contracts import label_keys
from buildtool.registry.client import OCI_MANIFEST, NotFound, RegistryError, sha256_digest
from buildtool.release import repo_lock
from buildtool.release.repo_lock import LOCK_TAG, LockBusy, RepoLock

HOST = "registry.example:5000"
TAG = f"{HOST}/rel/cpu:{LOCK_TAG}"


class Registry:
    """The lock tag's manifest, answered as a registry does, with its own clock in the Date header."""

    def __init__(self, body: bytes | None, clock_offset: float = 0.0, date: bool = True) -> None:
        self.host, self.body, self.offset, self.date = HOST, body, clock_offset, date
        self.puts: list[bytes] = []

    def _answer(self, status: int, content: bytes, sink: Any = None) -> Any:
        """As the transport answers: a body the `sink` takes is written to it in chunks, and is not the content."""
        headers = {"Date": formatdate(time.time() + self.offset, usegmt=True)} if self.date else {}
        write = sink(status, headers) if sink is not None else None
        if write is not None:
            for start in range(0, len(content), 1 << 16):
                write(content[start:start + (1 << 16)])
            content = b""
        return types.SimpleNamespace(status_code=status, headers=headers, content=content)

    def request(self, method: str, path: str, *, ok: tuple[int, ...] = (200,), sink: Any = None, **_: Any) -> Any:
        assert (method, path) == ("GET", f"rel/cpu/manifests/{LOCK_TAG}")
        if self.body is None:
            if 404 in ok:
                return self._answer(404, b"", sink)
            raise NotFound(path)
        return self._answer(200, self.body, sink)

    def get_manifest(self, repo: str, ref: str) -> tuple[bytes, str, str]:   # the read before the fix
        if self.body is None:
            raise NotFound(ref)
        return self.body, OCI_MANIFEST, sha256_digest(self.body)

    def put_manifest(self, repo: str, ref: str, body: bytes, media_type: str) -> str:
        self.puts.append(body)
        self.body = body
        return sha256_digest(body)

    def put_blob(self, repo: str, data: bytes) -> str:
        return sha256_digest(data)

    def mount_blob(self, *_: Any) -> str:
        return ""


def record(drop: str = "", **fields: str) -> bytes:
    notes = {label_keys.LOCK_TOKEN: "abc", label_keys.LOCK_HOST: "another-machine", label_keys.LOCK_PID: "4242",
             label_keys.LOCK_PURPOSE: "release 0.1.0", label_keys.LOCK_EXPIRES: f"{time.time() + 200:.3f}",
             label_keys.LOCK_RELEASED: "false"}
    notes.update({getattr(label_keys, k): v for k, v in fields.items()})
    notes.pop(getattr(label_keys, drop, ""), None)
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "annotations": notes}).encode()


def lock(registry: Registry) -> RepoLock:
    return RepoLock(registry, "rel/cpu", wait_s=0, settle_s=0, poll_s=0, purpose="release 0.2.0")  # type: ignore[arg-type]


@pytest.mark.parametrize(("body", "named"), [
    (record(LOCK_EXPIRES="soon"), label_keys.LOCK_EXPIRES),
    (record(LOCK_EXPIRES="nan"), label_keys.LOCK_EXPIRES),
    (record(LOCK_EXPIRES="inf"), label_keys.LOCK_EXPIRES),
    (record(LOCK_PID="abc"), label_keys.LOCK_PID),
    (record(LOCK_PID="-1"), label_keys.LOCK_PID),
    (record(LOCK_RELEASED="maybe"), label_keys.LOCK_RELEASED),
    (record(drop="LOCK_EXPIRES"), label_keys.LOCK_EXPIRES),
    (record(drop="LOCK_PID"), label_keys.LOCK_PID),
    (record(drop="LOCK_HOST"), label_keys.LOCK_HOST),
    (json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST}).encode(), "no annotations"),
    (b"[1, 2]", "not an object"),
    (json.dumps({"schemaVersion": 2, "annotations": ["x"]}).encode(), "annotations"),
    (b"{not json", "not JSON"),
], ids=["expires-word", "expires-nan", "expires-inf", "pid-word", "pid-negative", "released-word", "no-expires",
        "no-pid", "no-host", "no-annotations", "not-an-object", "annotations-a-list", "not-json"])
def test_a_lock_record_that_cannot_be_read_is_held_and_one_line_naming_tag_and_field(body: bytes, named: str) -> None:
    registry = Registry(body)
    with pytest.raises(RegistryError) as caught:
        lock(registry).acquire()
    message = str(caught.value)
    assert "\n" not in message and TAG in message and named in message, message
    assert "counts as held" in message and f"skopeo delete docker://{TAG}" in message, message
    assert registry.puts == [] and registry.body == body          # not taken over


def test_a_readable_record_still_decides_as_before() -> None:
    held = Registry(record())
    with pytest.raises(LockBusy, match="another-machine pid 4242"):
        lock(held).acquire()
    assert held.puts == []
    for free in (record(LOCK_RELEASED="true"), record(LOCK_EXPIRES=f"{time.time() - 1:.3f}"), None):
        registry = Registry(free)
        taken = lock(registry)
        taken.acquire()
        assert registry.puts and taken.still_held()
        taken.release()
        assert json.loads(registry.body or b"")["annotations"][label_keys.LOCK_RELEASED] == "true"


def test_a_clock_far_ahead_does_not_take_a_live_lock_and_the_expiry_counts_from_the_registrys_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = time.time
    ahead = types.SimpleNamespace(time=lambda: real() + 3600, monotonic=time.monotonic, sleep=time.sleep)
    monkeypatch.setattr(repo_lock, "time", ahead)
    live = Registry(record())                     # another machine's lock, 200 s left by the registry's clock
    with pytest.raises(LockBusy):
        lock(live).acquire()
    assert live.puts == []
    # A clock far behind writes an expiry the registry's clock reads as ttl_s away, not already past.
    behind = types.SimpleNamespace(time=lambda: real() - 3600, monotonic=time.monotonic, sleep=time.sleep)
    monkeypatch.setattr(repo_lock, "time", behind)
    registry = Registry(None)
    lock(registry).acquire()
    expires = float(json.loads(registry.puts[0])["annotations"][label_keys.LOCK_EXPIRES])
    assert abs(expires - (real() + 300)) < 5


def test_an_answer_without_a_date_is_one_line() -> None:
    registry = Registry(record(), date=False)
    with pytest.raises(RegistryError, match=f"registry {HOST} answered rel/cpu:{LOCK_TAG} with the Date ''") as caught:
        lock(registry).acquire()
    assert "\n" not in str(caught.value) and registry.puts == []


def test_a_lock_manifest_over_the_manifest_limit_is_refused_and_not_read_past_it() -> None:
    """Before, the lock's manifest was read to the client's 64 MiB answer limit, not the 4 MiB one on every other
    manifest read: anyone who may push could make every release read 64 MiB for the lock."""
    from buildtool.registry.client import MAX_MANIFEST_BYTES

    body = json.dumps({"schemaVersion": 2, "annotations": {"x": "y" * MAX_MANIFEST_BYTES}}).encode()
    registry = Registry(body)
    with pytest.raises(RegistryError) as caught:
        lock(registry).acquire()
    message = str(caught.value)
    assert re.fullmatch(rf"release lock {re.escape(TAG)}: its manifest is at least \d+ bytes, over the "
                        rf"{MAX_MANIFEST_BYTES}-byte limit on a manifest; not read further; a lock that cannot be "
                        "read counts as held: .*", message), message
    assert int(re.search(r"at least (\d+) bytes", message).group(1)) <= MAX_MANIFEST_BYTES + (1 << 16)  # type: ignore[union-attr]
    assert registry.puts == [] and registry.body == body          # not taken over


def test_a_record_of_this_host_with_a_pid_no_process_can_have_is_stale_not_a_traceback() -> None:
    """Before, a record of this host whose pid (up to 10 digits, as the record may hold) is past what the system's
    pid type holds stopped every release with an OverflowError traceback from pid_alive's os.kill; no process can
    have that id, so the lock is stale and is taken, as one whose holder has ended."""
    import socket

    registry = Registry(record(LOCK_HOST=socket.gethostname(), LOCK_PID="9999999999"))
    taken = lock(registry)
    taken.acquire()
    assert registry.puts and taken.still_held()


def test_a_busy_lock_names_its_holder_bounded_on_one_line() -> None:
    """Before, LockBusy put the record's host and purpose into its message whole: anyone who may push could write a
    live lock whose purpose (or host) is megabytes with newlines, and every release waiting on it said that."""
    purpose = "release 9.9\n" + "x" * 3_000_000
    registry = Registry(record(LOCK_HOST="h" * 100_000, LOCK_PURPOSE=purpose))
    with pytest.raises(LockBusy) as caught:
        lock(registry).acquire()
    assert str(caught.value) == (f"rel/cpu is being released by {ascii('h' * 80)}... (100000 characters) pid 4242 "
                                 f"({ascii(purpose[:80])}... ({len(purpose)} characters)); retry when it has finished")
