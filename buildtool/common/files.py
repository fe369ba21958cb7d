"""Atomic file writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from pathlib import Path


def xdg_home(variable: str, default: str) -> Path:
    """$XDG_CONFIG_HOME or $XDG_CACHE_HOME as the XDG spec reads it: a relative path is invalid and ignored (the
    dev signing key would otherwise land in whatever folder the command ran in), as an unset or empty one is."""
    value = os.environ.get(variable, "")
    return Path(value) if os.path.isabs(value) else Path.home() / default


def cache_root() -> Path:
    """Where the toolkit keeps what it can always recompute (matrix snapshots, compiled templates)."""
    return xdg_home("XDG_CACHE_HOME", ".cache") / "dl-images"


def _umask() -> int:
    """The process's umask, read from /proc without setting it (os.umask changes it for every thread meanwhile);
    without /proc, set and restored, to 077 meanwhile: a file another thread makes then is private, not wider."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def write_atomic(path: Path, data: str | bytes, mode: int | None = None) -> None:
    """Write `data` to a temporary file beside `path`, then rename it into place. `mode`: the file's permissions;
    by default those of the file it replaces (a private 0600 file stays private, a script keeps its x bit, as
    writing it in place would keep them), else what open() would give a new file under the umask."""
    if mode is None:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except OSError:
            mode = 0o666 & ~_umask()
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
    # Bytes against the UTF-8 write_atomic writes: a file that is not UTF-8 (a lock saved in another encoding) is
    # replaced, not a UnicodeDecodeError, and the locale's encoding decides nothing.
    changed = [path for path, text in files.items() if not (path.is_file() and path.read_bytes() == text.encode())]
    for path in changed:
        write_atomic(path, files[path])
    return changed


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, hex (read in blocks)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
