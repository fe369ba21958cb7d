"""Which cuDNN and NCCL the image's framework gets, and the version each one reports.

Argument: a JSON object {"module": the framework's module, "libraries": {name: soname}} (name:
cudnn or nccl; soname: what a framework asks the dynamic loader for, libcudnn.so.9).
Imports the framework first, so the libraries it links are loaded; then, per library, takes the
file this process already has mapped (/proc/self/maps), else the one the dynamic loader gives for
the soname (where a framework that opens it later, at its first GPU call, gets it from), and
calls its version function: cudnnGetVersion(), ncclGetVersion(&v). Neither needs a GPU.
Writes result.json: {"import_error"?, "libraries": {name: {"path", "code"} or {"missing": why}}}.
Standard library, Python 3.8 syntax.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import sys

from probe_io import error_line, result

STEMS = {"cudnn": "libcudnn.so", "nccl": "libnccl.so"}


def mapped(stem: str) -> str | None:
    """The file of this process's mappings whose name starts with `stem` (libcudnn.so.9.7.0)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            path = parts[5].strip() if len(parts) == 6 else ""
            if path.rsplit("/", 1)[-1].startswith(stem):
                return path
    return None


def version_code(name: str, lib: ctypes.CDLL) -> int:
    if name == "cudnn":
        call = lib.cudnnGetVersion
        call.restype = ctypes.c_size_t
        call.argtypes = []
        return int(call())
    value = ctypes.c_int(0)
    call = lib.ncclGetVersion
    call.restype = ctypes.c_int
    status = call(ctypes.byref(value))
    if status != 0:
        raise RuntimeError(f"ncclGetVersion returned status {status}")
    return int(value.value)


def main() -> int:
    spec = json.loads(sys.argv[1])
    out: dict = {"libraries": {}}
    try:
        importlib.import_module(spec["module"])
    except BaseException as exc:  # noqa: BLE001 - reported; the libraries are still looked up
        out["import_error"] = error_line(exc)
    for name, soname in spec["libraries"].items():
        path = mapped(STEMS[name])
        try:
            lib = ctypes.CDLL(path or soname)
        except OSError as exc:
            out["libraries"][name] = {"missing": f"the dynamic loader finds no {soname} ({error_line(exc)})"}
            continue
        if path is None:
            path = mapped(STEMS[name]) or soname   # where the loader found it, now that it is mapped
        try:
            out["libraries"][name] = {"path": path, "code": version_code(name, lib)}
        except (AttributeError, RuntimeError) as exc:
            out["libraries"][name] = {"missing": f"{path} does not report a version ({error_line(exc)})"}
    result(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
