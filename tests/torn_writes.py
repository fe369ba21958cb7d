"""A write cut short midway (a full disk, a kill): while `torn_writes` is active, every file opened for writing
(after the first `after`, written whole) takes the first half of what it is given, then the write raises ENOSPC. A
file written in place is left cut short; one written atomically (common.files.write_atomic) is left as it was."""

from __future__ import annotations

import builtins
import errno
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


class _Torn:
    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def write(self, data: Any) -> int:
        self._handle.write(data[: len(data) // 2])
        self._handle.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __enter__(self) -> _Torn:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()


@contextmanager
def torn_writes(monkeypatch: pytest.MonkeyPatch, after: int = 0) -> Iterator[None]:
    real = io.open
    whole = [after]

    def opened(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real(file, mode, *args, **kwargs)
        if not set(mode) & set("wax+"):
            return handle
        whole[0] -= 1
        return handle if whole[0] >= 0 else _Torn(handle)

    with monkeypatch.context() as patch:
        patch.setattr(io, "open", opened)          # Path.open, Path.write_text, os.fdopen
        patch.setattr(builtins, "open", opened)
        yield
