"""The container really got what the run profile asks for: ulimits (memlock, stack, ...)."""

from __future__ import annotations

from harness import skip

from buildtool.contracts import skips

# bash `ulimit` option and the unit it reports in, per docker ulimit name (every name the matrix allows).
_ULIMIT = {"memlock": ("-l", 1024), "stack": ("-s", 1024), "nofile": ("-n", 1), "nproc": ("-u", 1),
           "core": ("-c", 1024), "fsize": ("-f", 1024), "cpu": ("-t", 1), "as": ("-v", 1024),
           "data": ("-d", 1024), "rss": ("-m", 1024), "rtprio": ("-r", 1), "sigpending": ("-i", 1)}



def test_ulimit(main, target, ulimit_name):
    """Parametrized by conftest over the profile's ulimits."""
    name = ulimit_name
    want = target["ulimits"][name]
    if name in target.get("ulimits_not_granted", []):
        skip(skips.ULIMIT_NOT_GRANTED, f"this runner's Docker engine cannot grant --ulimit {name}={want} (it refused "
             f"to start a container with it); the container ran with the engine's default, so {name} is not checked",
             subject=name)
    option, unit = _ULIMIT[name]
    got = main.exec(f"ulimit {option}", timeout=30).out.strip()
    expected = "unlimited" if want == -1 else str(want // unit)
    assert got == expected, f"ulimit {name} in the container is {got}, the run profile asks for {expected}"
