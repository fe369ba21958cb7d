"""Site checks: a platform team's own image tests (its CA, its mounts, its packages) in a folder of its own,
run beside a cell's image-tests groups without editing image-tests/ (image-tests/README.md, "Site checks").

validate stages image-tests/ with the folder as one more group, named after the folder, and runs that tree
(`stage`): the site checks count in the verdict like the others, and its `test_code` is the hash of the staged
tree, which release computes the same way from git (a verdict that ran image-tests without the folder has
another test code and is refused as such).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

# The folder's name is its group in test ids and the verdict: a name image-tests could have for a group.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}\Z")


def problem(folder: Path, tests_dir: Path | None = None) -> str:
    """Why `folder` cannot be a site folder beside `tests_dir` ('' when it can)."""
    if not folder.is_dir():
        return f"no folder {folder}"
    if not NAME_RE.fullmatch(folder.name):
        return (f"the folder's name {folder.name!r} is its test group in the verdict: lower case letters, digits, "
                "- and _ (rename the folder)")
    if tests_dir is not None and (tests_dir / folder.name).exists():
        return (f"{folder.name!r} is already {tests_dir.name}/{folder.name}: the site folder's name is its test "
                "group, so it must be a name image-tests does not use (rename the folder)")
    if not any(folder.glob("test_*.py")):
        return f"{folder} holds no test_*.py: a site folder holds the site's checks"
    return ""


def stage(tests_dir: Path, site: Path, into: Path) -> Path:
    """image-tests with the site folder as its group `site.name`, copied to `into` (which must not exist): the
    tree a run with site checks runs, and whose hash is its test code. Files only (links are copied as the
    files they name), no bytecode caches."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(tests_dir, into, ignore=ignore)
    shutil.copytree(site, into / site.name, ignore=ignore)
    return into
