"""NVIDIA's libraries a base promises (cuDNN, NCCL) and how the version a library reports compares.

NGC's release notes list the cuDNN and NCCL each container ships; the matrix records them per cell
(`libraries:`, with the page they come from) and image-tests/common/test_nvidia_libraries.py asks
each library in the image for its version (cudnnGetVersion, ncclGetVersion) and compares. Both
calls need no GPU, so the check runs on CPU runners too. They report major.minor.patch; a
promise's fourth part (cuDNN's build number, 9.7.0.66) is printed, not compared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Library:
    name: str        # the matrix key
    title: str       # how messages name it
    soname: str      # what a framework asks the dynamic loader for ({major}: the promise's major)
    # The in-image probe (image-tests/scripts/nvlibs.py) keeps its own version calls and file stems: scripts
    # inside images cannot import buildtool.


LIBRARIES: dict[str, Library] = {lib.name: lib for lib in (
    Library("cudnn", "cuDNN", "libcudnn.so.{major}"),
    Library("nccl", "NCCL", "libnccl.so.{major}"),
)}

# Matched whole (fullmatch): `$` would also match before a final newline, and \d any Unicode digit.
PROMISE_RE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(\.[0-9]+)?")


def parse_promise(text: str) -> tuple[int, int, int]:
    """`9.7.0.66` -> (9, 7, 0); anything else is a ValueError naming the form."""
    if not PROMISE_RE.fullmatch(text):
        raise ValueError(f"{text!r} is not a library version (MAJOR.MINOR.PATCH[.BUILD], e.g. 9.7.0.66)")
    major, minor, patch = (int(p) for p in text.split(".")[:3])
    return major, minor, patch


def decode(name: str, code: int) -> tuple[int, int, int]:
    """The (major, minor, patch) a library's version call returned as one integer.

    cuDNN 9 and NCCL from 2.9 on encode MAJOR*10000 + MINOR*100 + PATCH; cuDNN 8 and older NCCL
    encode MAJOR*1000 + MINOR*100 + PATCH (cudnn_version.h, nccl.h NCCL_VERSION)."""
    if name not in LIBRARIES:
        raise ValueError(f"unknown library {name!r}; known: {', '.join(LIBRARIES)}")
    if code <= 0:
        raise ValueError(f"{LIBRARIES[name].title} reported version code {code}")
    wide = code >= 90000 if name == "cudnn" else code >= 20900
    base = 10000 if wide else 1000
    return code // base, (code % base) // 100, code % 100


def problem(name: str, promised: str, code: int) -> str | None:
    """Why the library that reported `code` is not the `promised` one (None: it is)."""
    want = parse_promise(promised)
    have = decode(name, code)
    if have == want:
        return None
    title = LIBRARIES[name].title
    return (f"{title} {'.'.join(map(str, have))} in the image, the matrix records {title} {promised} "
            f"(compared: {'.'.join(map(str, want))})")


def soname(name: str, promised: str) -> str:
    return LIBRARIES[name].soname.format(major=parse_promise(promised)[0])
