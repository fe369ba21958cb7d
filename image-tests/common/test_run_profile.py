"""The container really got what the run profile asks for: ulimits (memlock, stack, ...)."""

from __future__ import annotations

import pytest

# bash `ulimit` option and the unit it reports in, per docker ulimit name.
_ULIMIT = {"memlock": ("-l", 1024), "stack": ("-s", 1024), "nofile": ("-n", 1), "nproc": ("-u", 1),
           "core": ("-c", 1024), "fsize": ("-f", 1024)}



def test_ulimit(main, target, ulimit_name):
    """Parametrized by conftest over the profile's ulimits."""
    name = ulimit_name
    want = target["ulimits"][name]
    if name not in _ULIMIT:
        pytest.skip(f"no shell probe for the {name} ulimit")
    if name in target.get("ulimits_not_granted", []):
        pytest.skip(f"this runner's Docker engine cannot grant --ulimit {name}={want} (it refused to start a "
                    f"container with it); the container ran with the engine's default, so {name} is not checked")
    option, unit = _ULIMIT[name]
    got = main.exec(f"ulimit {option}", timeout=30).out.strip()
    expected = "unlimited" if want == -1 else str(want // unit)
    assert got == expected, f"ulimit {name} in the container is {got}, the run profile asks for {expected}"
