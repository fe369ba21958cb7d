"""Make a debootstrapped root file system give reproducible layers to the images built on it.

The container runtime bind-mounts /etc/hosts, /etc/resolv.conf and /etc/hostname into every
container, RUN steps of a build included. Where the image lacks one of them the runtime first
creates it as an empty mount point, which changes the mtime of /etc: the directory then lands
in that step's layer with the build's wall-clock time, so two cold builds of the same commit
differ in every layer. A base that ships all three (empty: the runtime supplies the real ones)
leaves /etc alone. debootstrap copies the build host's resolv.conf and hostname into the tree,
which also leaked the build machine into the base; they are replaced too.

Every mtime newer than the suite's Release date (the archive state debootstrap installed from,
recorded in the tree itself) is clamped to it, as SOURCE_DATE_EPOCH does elsewhere: the files
debootstrap wrote at build time, /etc and the three files above among them.
"""

from __future__ import annotations

import os
from email.utils import parsedate_to_datetime
from pathlib import Path

from buildtool.common.errors import FailedError

# Written by the runtime into every container; see the module docstring.
RUNTIME_FILES = ("etc/hosts", "etc/resolv.conf", "etc/hostname")
# Changes whenever what `_debootstrap` puts in a base changes, so `buildtool bases` knows that a
# base it finds in the registry was made by an older recipe and makes it again.
RECIPE = "2"  # 2: runtime files shipped, mtimes clamped to the Release date; 1 (no mark): neither


def release_epoch(rootfs: Path, suite: str) -> int:
    """The Date of the suite's Release file that debootstrap left in the apt lists, as Unix time."""
    found = sorted((rootfs / "var/lib/apt/lists").glob(f"*_dists_{suite}_Release"))
    if len(found) != 1:
        raise FailedError(f"debootstrap left {len(found)} Release files for {suite} in "
                          f"{rootfs}/var/lib/apt/lists (want exactly one): cannot date the base")
    for line in found[0].read_text(errors="replace").splitlines():
        if line.startswith("Date:"):
            try:
                return int(parsedate_to_datetime(line.partition(":")[2].strip()).timestamp())
            except (TypeError, ValueError):
                raise FailedError(f"{found[0]}: unparseable {line!r}") from None
    raise FailedError(f"{found[0]}: no Date field: cannot date the base")


def seal(rootfs: Path, epoch: int) -> None:
    """Ship the runtime's files (empty, root, 0644) and clamp every mtime to `epoch`."""
    for name in RUNTIME_FILES:
        path = rootfs / name
        if path.is_symlink() or path.exists():
            path.unlink()
        path.write_bytes(b"")
        os.chown(path, 0, 0)
        path.chmod(0o644)
    for folder, dirs, files in os.walk(rootfs):
        for name in [*dirs, *files]:
            _clamp(Path(folder) / name, epoch)
    _clamp(rootfs, epoch)


def _clamp(path: Path, epoch: int) -> None:
    if path.lstat().st_mtime > epoch:
        os.utime(path, (epoch, epoch), follow_symlinks=False)
