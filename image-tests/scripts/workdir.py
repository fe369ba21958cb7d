"""Who the image runs as and whether that user can write where training writes.

Run as the image's default user in its working directory (as `docker run IMAGE` would).
Writes result.json: uid, gid, user name, cwd, HOME, and per place (the working directory, the
temporary directory, HOME) whether a file could be created, written, synced and removed there,
with the error (a PermissionError names its path) when not.
"""

from __future__ import annotations

import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's folder out
from probe_io import error_line, result  # noqa: E402


def try_write(folder: str) -> dict:
    path = os.path.join(folder, f".imagetest-write-{uuid.uuid4().hex[:8]}")
    try:
        with open(path, "wb") as fh:
            fh.write(b"x" * 4096)
            fh.flush()
            os.fsync(fh.fileno())
        os.remove(path)
        return {"path": folder, "ok": True}
    except OSError as exc:
        return {"path": folder, "ok": False, "error": error_line(exc)}


def main() -> int:
    try:
        import pwd

        name = pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, ImportError):
        name = ""
    cwd = os.getcwd()
    tmp = os.environ.get("TMPDIR") or "/tmp"
    home = os.environ.get("HOME") or ""
    result({"uid": os.getuid(), "gid": os.getgid(), "user": name, "cwd": cwd, "home": home,
            "workdir": try_write(cwd), "tmp": try_write(tmp), "home_write": try_write(home) if home else None})
    return 0


if __name__ == "__main__":
    sys.exit(main())
