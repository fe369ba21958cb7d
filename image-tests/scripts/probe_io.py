"""What every probe script shares: where its structured result goes, and how an error is told.

A probe writes JSON files into $IMAGETEST_OUT (a host folder the supervisor names); the test
reads them. Printed output is for people only. Standard library, Python 3.8 syntax.
"""

from __future__ import annotations

import contextlib
import json
import os
import traceback


def out_dir() -> str:
    return os.environ.get("IMAGETEST_OUT") or "."


def write(name: str, data: object) -> str:
    """Write `data` as JSON to OUT/name (atomically: a reader never sees half a file)."""
    path = os.path.join(out_dir(), name)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except BaseException:   # a value JSON cannot hold, a full disk: no half-written file left for the test
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def result(data: object) -> str:
    return write("result.json", data)


def error_line(exc: BaseException) -> str:
    """`Type: first line of the message` (a PermissionError names its path this way)."""
    text = str(exc).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def where(exc: BaseException) -> str:
    """The innermost frame of `exc` as file:line (function)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno} ({frame.name})"
