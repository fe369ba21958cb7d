"""The container really got what the run profile asks for: ulimits (memlock, stack, ...), as the kernel reports
them for a process of the image's user (/proc/self/limits, read through testinfra's `host`)."""

from __future__ import annotations

import pytest
from harness import skip

from buildtool.contracts import skips

pytestmark = pytest.mark.shared(why="reads the container's limits")

# --ulimit names -> the rows of /proc/self/limits (proc(5)); values in the units --ulimit takes.
ROWS = {"memlock": "Max locked memory", "stack": "Max stack size", "nofile": "Max open files",
        "nproc": "Max processes", "core": "Max core file size", "fsize": "Max file size", "cpu": "Max cpu time",
        "as": "Max address space", "data": "Max data size", "rss": "Max resident set",
        "rtprio": "Max realtime priority", "sigpending": "Max pending signals"}


@pytest.fixture(scope="module")
def limits(host) -> dict[str, tuple[int, int]]:
    """Row -> (soft, hard), -1 for unlimited, of the process that read them (a child of the image's shell)."""
    found = {}
    for line in host.file("/proc/self/limits").content_string.splitlines()[1:]:
        name, soft, hard = line[:26].strip(), *line[26:].split()[:2]
        found[name] = tuple(-1 if v == "unlimited" else int(v) for v in (soft, hard))
    return found


def _show(value: int) -> str:
    return "unlimited" if value == -1 else str(value)


def test_ulimit(target, ulimit_name, limits):
    """Parametrized by conftest over the profile's ulimits."""
    name = ulimit_name
    want = target["ulimits"][name]
    if name in target.get("ulimits_not_granted", []):
        skip(skips.ULIMIT_NOT_GRANTED, f"this runner's Docker engine cannot grant --ulimit {name}={want} (it refused "
             f"to start a container with it); the container ran with the engine's default, so {name} is not checked",
             subject=name)
    got = limits.get(ROWS.get(name, ""))
    assert got is not None, f"ulimit {name}: the kernel's /proc/self/limits has no row for it"
    soft, hard = got
    assert soft == want, (
        f"ulimit {name} in the container is {_show(soft)} (hard {_show(hard)}), the run profile asks "
        f"for {_show(want)} (--ulimit={name}={want})")
