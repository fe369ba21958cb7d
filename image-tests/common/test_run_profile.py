"""The container really got what the run profile asks for: ulimits (memlock, stack, ...), read
as numbers from the kernel by a process of the image's user (scripts/limits.py), not from a shell."""

from __future__ import annotations

import pytest
from harness import skip

from buildtool.contracts import skips

pytestmark = pytest.mark.shared(why="reads the container's limits")


def _show(value: int) -> str:
    return "unlimited" if value == -1 else str(value)


def test_ulimit(main, target, ulimit_name, limits):
    """Parametrized by conftest over the profile's ulimits."""
    name = ulimit_name
    want = target["ulimits"][name]
    if name in target.get("ulimits_not_granted", []):
        skip(skips.ULIMIT_NOT_GRANTED, f"this runner's Docker engine cannot grant --ulimit {name}={want} (it refused "
             f"to start a container with it); the container ran with the engine's default, so {name} is not checked",
             subject=name)
    got = limits["limits"].get(name)
    assert got is not None, f"ulimit {name}: this kernel or Python has no such limit to read"
    assert got["soft"] == want, (
        f"ulimit {name} in the container is {_show(got['soft'])} (hard {_show(got['hard'])}), the run profile asks "
        f"for {_show(want)} (--ulimit={name}={want})")
