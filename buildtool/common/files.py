"""Atomic file writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """Where the toolkit keeps what it can always recompute (matrix snapshots, compiled templates)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dl-images"


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write `data` to a temporary file beside `path`, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_changed(files: dict[Path, str]) -> list[Path]:
    """write_atomic of each file (path -> text) whose text is not that already; returns those written."""
    changed = [path for path, text in files.items() if not (path.is_file() and path.read_text() == text)]
    for path in changed:
        write_atomic(path, files[path])
    return changed


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, hex (read in blocks)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
