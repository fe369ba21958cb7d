"""Whether the revision a provenance says an image was built from may be released from this checkout:
the release commit (HEAD of the clone release runs in) or an ancestor of it, committed, known to git.

An image built from uncommitted changes, or from a branch the release commit does not contain, is
code nobody reviewed into what is released; a commit git does not know cannot be checked at all.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from buildtool.contracts.names import FULL_REVISION_RE

GIT_TIMEOUT_S = 60


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                          check=False)


def revision_problem(root: Path, revision: str, release: str = "HEAD") -> str:
    """Why `revision` (a provenance's full revision) is not the release commit or its ancestor; "" when it is."""
    if not FULL_REVISION_RE.match(revision):
        return f"the provenance's revision {revision!r} is not a full commit (40 hex digits)"
    if "-dirty." in revision:
        return (f"built from uncommitted changes (revision {revision}): only committed work is released; "
                "commit, then build and validate again")
    head = _git(root, "rev-parse", "--verify", "--quiet", f"{release}^{{commit}}")
    if head.returncode != 0:
        return f"{root} has no release commit {release} to compare the provenance's revision with"
    known = _git(root, "cat-file", "-e", f"{revision}^{{commit}}")
    if known.returncode != 0:
        return (f"the provenance's revision {revision} is not a commit git knows in {root}; fetch it, or release "
                "from the clone that holds it")
    ancestor = _git(root, "merge-base", "--is-ancestor", revision, head.stdout.strip())
    if ancestor.returncode == 1:
        return (f"the provenance's revision {revision[:12]} is neither the release commit {head.stdout.strip()[:12]} "
                "nor an ancestor of it: release from a checkout that contains it")
    if ancestor.returncode != 0:
        return f"git merge-base --is-ancestor {revision[:12]} failed: {ancestor.stderr.strip()[:200]}"
    return ""
