"""What the image really contains, as facts its labels and its matrix cell are checked against.

Argument: a JSON object {"module", "gpu_count_expr", "cuda_expr"} (the framework table's row).
Writes result.json: python, the framework's version and CUDA build, and the GPUs it sees. What needs no
import of the framework (packages, commands, variables) the tests read through testinfra's `host`.
"""

from __future__ import annotations

import importlib
import platform
import sys

from probe_io import error_line, result


def main() -> int:
    spec = __import__("json").loads(sys.argv[1])
    module_name = spec["module"]
    out = {"python": platform.python_version(), "executable": sys.executable}
    result(dict(out, stage="import"))  # what is known before the import (which may hang)
    try:
        module = importlib.import_module(module_name)
        out["framework_version"] = str(module.__version__)
    except BaseException as exc:  # noqa: BLE001 - reported, the test names it
        out["import_error"] = error_line(exc)
        result(out)
        return 0
    scope = {module_name: module}
    for key, expr in (("cuda_build", spec.get("cuda_expr") or "''"), ("gpu_count", spec.get("gpu_count_expr") or "0")):
        try:
            out[key] = eval(expr, scope)  # noqa: S307 - from the framework table
        except Exception as exc:  # noqa: BLE001
            out[key + "_error"] = error_line(exc)
    out["cuda_build"] = str(out.get("cuda_build") or "")
    result(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
