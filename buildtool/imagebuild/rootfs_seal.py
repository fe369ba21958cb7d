"""Make a bootstrapped (mmdebstrap) root file system give reproducible layers to the images built on it.

The container runtime bind-mounts /etc/hosts, /etc/resolv.conf and /etc/hostname into every
container, RUN steps of a build included. Where the image lacks one of them the runtime first
creates it as an empty mount point, which changes the mtime of /etc: the directory then lands
in that step's layer with the build's wall-clock time, so two cold builds of the same commit
differ in every layer. A base that ships all three (empty: the runtime supplies the real ones)
leaves /etc alone. mmdebstrap (like debootstrap) copies the build host's resolv.conf and hostname into the
tree, which also leaked the build machine into the base; they are replaced too.

Every mtime newer than the suite's InRelease date (the archive state the base was made from, its
SOURCE_DATE_EPOCH) is clamped to it: the files maintainer scripts wrote at build time, /etc and the
three files above among them.
"""

from __future__ import annotations

import os
from pathlib import Path

# Written by the runtime into every container; see the module docstring.
RUNTIME_FILES = ("etc/hosts", "etc/resolv.conf", "etc/hostname")
# Changes whenever what `buildtool bases` puts in a base changes, so that it knows that a base it finds in
# the registry was made by an older recipe and makes it again.
# 4: a -slim base keeps /usr/share/locale/locale.alias (its dpkg filter's path-include); 3: mmdebstrap with
# SOURCE_DATE_EPOCH at one archive state, written by base_index (issue 52); 2 (debootstrap): runtime files shipped,
# mtimes clamped to the Release date; 1 (no mark): neither.
RECIPE = "4"


def seal(rootfs: Path, epoch: int) -> None:
    """Ship the runtime's files (empty, root, 0644) and clamp every mtime to `epoch`."""
    for name in RUNTIME_FILES:
        path = rootfs / name
        path.unlink(missing_ok=True)
        path.write_bytes(b"")
        os.chown(path, 0, 0)
        path.chmod(0o644)
    for path in [*rootfs.rglob("*"), rootfs]:
        if path.lstat().st_mtime > epoch:
            os.utime(path, (epoch, epoch), follow_symlinks=False)
