"""The limits a process in the container really gets: rlimits (soft and hard, as numbers, -1 for
unlimited) and /dev/shm (mounted? size and free bytes). Runs with `python3 -I -S`: nothing but
the standard library, nothing the image's site adds."""

from __future__ import annotations

import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's folder out
from probe_io import result  # noqa: E402

NAMES = {"memlock": "RLIMIT_MEMLOCK", "stack": "RLIMIT_STACK", "nofile": "RLIMIT_NOFILE", "nproc": "RLIMIT_NPROC",
         "core": "RLIMIT_CORE", "fsize": "RLIMIT_FSIZE", "cpu": "RLIMIT_CPU", "as": "RLIMIT_AS",
         "data": "RLIMIT_DATA", "rss": "RLIMIT_RSS", "rtprio": "RLIMIT_RTPRIO", "sigpending": "RLIMIT_SIGPENDING"}


def _value(v: int) -> int:
    return -1 if v == resource.RLIM_INFINITY else int(v)


def main() -> int:
    limits = {}
    for name, attr in NAMES.items():
        if hasattr(resource, attr):
            soft, hard = resource.getrlimit(getattr(resource, attr))
            limits[name] = {"soft": _value(soft), "hard": _value(hard)}
    shm = {"mounted": False}
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 4 and fields[4] == "/dev/shm":
                    shm.update(mounted=True, fstype=line.split(" - ", 1)[1].split()[0])
    except OSError:
        pass
    if os.path.isdir("/dev/shm"):
        st = os.statvfs("/dev/shm")
        shm.update(size=st.f_blocks * st.f_frsize, free=st.f_bavail * st.f_frsize)
    result({"limits": limits, "shm": shm})
    return 0


if __name__ == "__main__":
    sys.exit(main())
