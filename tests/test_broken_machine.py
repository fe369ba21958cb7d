"""Commands on a broken machine: a home that cannot be written, a full disk, a registry or engine that is down or
never answers. Each is stood in for here (a path through a file, a write that raises ENOSPC, a socket that accepts
and never answers); each must end in one line naming what is wrong and what to do, and leave nothing behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from buildtool.attest import dsse
from buildtool.attest.keys import signing_key
from buildtool.attest.verdict_statement import SIGNING_KEY_ENV, dev_key_path
from buildtool.common.errors import UserError


def test_a_dev_key_that_cannot_be_made_is_one_line_naming_it(monkeypatch, tmp_path: Path) -> None:
    """XDG_CONFIG_HOME through a file (or read-only): validate and build --push, which make the dev key when none
    is there, ended in a NotADirectoryError/PermissionError traceback."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "file" / "config"))
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    with pytest.raises(UserError) as caught:
        signing_key(lambda _: None)
    message = str(caught.value)
    assert str(dev_key_path()) in message and "Not a directory" in message
    assert "XDG_CONFIG_HOME" in message and SIGNING_KEY_ENV in message and "\n" not in message


def test_a_dev_key_cut_short_by_a_full_disk_is_not_left_empty(monkeypatch, tmp_path: Path) -> None:
    """A full disk while the dev key was written ended in an OSError traceback and left an empty 0600 key file, which
    every later validate refused ('is not an unencrypted PEM private key'). Now one line, and no file."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    real = os.fdopen

    class Full:
        def __init__(self, fd: int, mode: str) -> None:
            self.handle = real(fd, mode)

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(dsse.os, "fdopen", Full)
    with pytest.raises(UserError) as caught:
        signing_key(lambda _: None)
    assert "No space left on device" in str(caught.value) and str(dev_key_path()) in str(caught.value)
    assert not dev_key_path().exists()
    monkeypatch.setattr(dsse.os, "fdopen", real)
    assert signing_key(lambda _: None).dev   # the next run makes the key
