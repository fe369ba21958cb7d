"""Which of the locked packages' Python files have no valid bytecode: every process of the image would
compile them again on import (`import torch` took 3.7-4.0 s without bytecode, 1.7-1.9 s with, here).

Argument: a JSON list of distribution names (the packages the cell's locks installed). For each .py file a
distribution's RECORD lists, the file `importlib.util.cache_from_source` names must exist and be valid for
the source as it is now, as the import system judges it (PEP 552): the magic number of this Python, and for
a hash-based file the source's hash, for a timestamp-based one the source's mtime and size. A file this
Python cannot compile (a module written for a newer Python, never importable here) needs none: the first
CONFIRM files without valid bytecode are compiled here to tell them apart, the rest are counted as they
are (an image where more than CONFIRM files lack it fails anyway, and compiling all of torch's 8000
files to count them exactly would cost a failing validation half a minute).
Writes result.json: {"checked": N, "missing": [paths], "stale": [paths], "distributions_missing": [names]}.
Standard library only.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import struct
import sys

from probe_io import result

CONFIRM = 50


def _valid(source: str, cached: str) -> bool | None:
    """True: valid bytecode; False: a file that does not match the source; None: no file."""
    try:
        with open(cached, "rb") as fh:
            header = fh.read(16)
    except OSError:
        return None
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return False
    flags = struct.unpack("<I", header[4:8])[0]
    if flags & 0b1:      # hash-based
        with open(source, "rb") as fh:
            return header[8:16] == importlib.util.source_hash(fh.read())
    st = os.stat(source)
    return struct.unpack("<II", header[8:16]) == (int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF)


def _compiles(source: str) -> bool:
    try:
        with open(source, "rb") as fh:
            compile(fh.read(), source, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def main() -> int:
    names = json.loads(sys.argv[1])
    out: dict[str, object] = {"checked": 0, "missing": [], "stale": [], "distributions_missing": []}
    confirmed = 0   # files without valid bytecode looked at so far
    for name in names:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            out["distributions_missing"].append(name)  # type: ignore[union-attr]
            continue
        for file in dist.files or ():
            if file.suffix != ".py":
                continue
            source = str(file.locate())
            if not os.path.isfile(source):
                continue
            out["checked"] += 1  # type: ignore[operator]
            state = _valid(source, importlib.util.cache_from_source(source))
            if state is True:
                continue
            confirmed += 1
            if confirmed <= CONFIRM and not _compiles(source):
                continue
            out["missing" if state is None else "stale"].append(source)  # type: ignore[union-attr]
    result(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
