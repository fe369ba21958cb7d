"""Every package the cell's locks installed is in the image at its locked version.

The image's own `pip list` (testinfra's `host`, conftest's pip_packages) lists every distribution in the image;
the locked set comes from the image's label_keys.PACKAGES label, which `buildtool build` writes from the
locks the image was built with. A package removed, replaced or changed after the build (pip in
a derived image, a hand-edited container committed as an image) fails here, named. A second probe
(scripts/pip_check.py, a program) runs `pip check` there: a requirement of an installed package that is missing or
at a version it does not accept fails, named as pip names it.
"""

from __future__ import annotations

import pytest
from harness import skip
from infra import normalized

from buildtool.contracts import label_keys, skips

pytestmark = pytest.mark.shared(why="lists packages, runs pip check")


def test_locked_packages_installed_at_their_versions(pip_packages, target):
    locked = target["expect"].get("locked")
    if locked is None:
        # A skip the release gate refuses: such an image is never released.
        skip(skips.NO_LOCK_LABEL, f"the image has no {label_keys.PACKAGES} label, so nothing says what its locks "
             "installed; build it with `buildtool build` (which writes it from the cell's locks)")
    assert locked, f"the image's {label_keys.PACKAGES} label lists no package"
    wrong = {name: (version, pip_packages.get(normalized(name))) for name, version in locked.items()
             if pip_packages.get(normalized(name)) != version}
    assert not wrong, f"{len(wrong)} of {len(locked)} locked packages differ: " + "; ".join(
        f"{name}: locked {want}, image has {have or 'nothing installed'}"
        for name, (want, have) in sorted(wrong.items()))


def test_installed_requirements_are_met(main):
    """`pip check` in the image: every installed distribution's requirements are installed at versions it
    accepts. The lock check above proves each locked package is there; this one proves the locks were a
    whole resolution (a package deleted from a lock by hand leaves its dependents broken: sympy without
    mpmath)."""
    found = main.result("pip_check.py", step="run pip check in the image")
    assert not found["error"], found["error"]
    problems = found["problems"]
    assert not problems, (f"pip check (pip {found['pip']}) finds {len(problems)} broken requirement(s): "
                          + "; ".join(problems))
