"""What a clone git refuses to read, or a shallow one, means to the command that asked: one line naming what to do.

git exits 128 in a repository owned by another user ("detected dubious ownership", its safe.directory check) and
in a shallow clone (CI checkouts fetch one commit by default) an older commit is unknown and no ancestry can be
told. Readers of git ask here before they call a failed answer "not a git checkout", "not a commit" or "not an
ancestor".
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

_DUBIOUS = re.compile(r"detected dubious ownership in repository at '([^'\n]*)'")


def refusal(root: Path, stderr: str | bytes) -> str:
    """Why git refused to read `root` at all, as one line naming the fix ("" when git's `stderr` says no such)."""
    text = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
    found = _DUBIOUS.search(text)
    if found is None:
        return ""
    where = found.group(1) or str(root)
    return (f"git refuses to read {where}: it is owned by another user (detected dubious ownership); run as its "
            f"owner, or trust it: git config --global --add safe.directory {where}")


def shallow(root: Path) -> str:
    """A parenthesis naming the fix when `root` is a shallow clone, for a "not a commit" message; "" when not."""
    try:
        proc = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-shallow-repository"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if proc.stdout.strip() != "true":
        return ""
    return (f" ({root} is a shallow clone, which holds only the newest commits; fetch the history: "
            "git fetch --unshallow)")
