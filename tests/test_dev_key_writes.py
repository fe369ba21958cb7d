"""The local dev signing key that validate makes when there is none: whole or not there, never half a key that a
second validate reads (and is told to remove) or that a run interrupted while writing it leaves behind."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from buildtool.attest import dsse
from buildtool.attest.keys import signing_key
from buildtool.attest.verdict_statement import DEV_KEY_FILE, SIGNING_KEY_ENV, dev_key_path


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    assert dev_key_path() == tmp_path / "config" / DEV_KEY_FILE


class _Cut(io.BytesIO):
    """A key file whose write is interrupted (Ctrl-C) before any byte lands."""

    def write(self, data: object) -> int:
        raise KeyboardInterrupt


def test_an_interrupted_dev_key_write_leaves_no_key_and_the_next_run_makes_one(monkeypatch: pytest.MonkeyPatch) -> None:
    real_fdopen = dsse.os.fdopen
    monkeypatch.setattr(dsse.os, "fdopen", lambda fd, *_a, **_k: (real_fdopen(fd, "wb").close(), _Cut())[1])
    with pytest.raises(KeyboardInterrupt):
        signing_key(lambda _line: None)
    assert not dev_key_path().exists()
    assert sorted(p.name for p in dev_key_path().parent.iterdir()) == []
    monkeypatch.setattr(dsse.os, "fdopen", real_fdopen)
    made = signing_key(lambda _line: None)      # was: "... is not a PEM ...; remove it to have a new dev key made"
    assert made.dev and dev_key_path().read_bytes() == made.key.pem


def test_a_second_run_while_the_first_writes_the_dev_key_uses_a_whole_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two validates on a machine without a dev key: the second must never read the first's key half written."""
    seen: list[object] = []
    started: list[bool] = []
    real_fdopen = dsse.os.fdopen

    def fdopen(fd: int, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        handle = real_fdopen(fd, *args, **kwargs)  # type: ignore[arg-type]
        if not started:    # the other validate starts now, between the key file's creation and its bytes
            started.append(True)
            seen.append(signing_key(lambda _line: None))
        return handle
    monkeypatch.setattr(dsse.os, "fdopen", fdopen)
    first = signing_key(lambda _line: None)
    [second] = seen
    assert first.key.pem == second.key.pem == dev_key_path().read_bytes()   # type: ignore[attr-defined]
    assert [p.name for p in dev_key_path().parent.iterdir()] == [dev_key_path().name]
