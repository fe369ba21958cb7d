"""Print what the image really contains, as `CONTENTS <json>`: Python, framework, packages, GPUs."""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import platform
import sys


def main() -> int:
    # The framework table's row (buildtool.contracts.frameworks): its module and how it counts GPUs.
    module_name, gpu_count_expr, packages = sys.argv[1], sys.argv[2], sys.argv[3:]
    out: dict[str, object] = {"python": platform.python_version(), "packages": {}}
    for name in packages:
        try:
            out["packages"][name] = md.version(name)  # type: ignore[index]
        except md.PackageNotFoundError:
            out["packages"][name] = None  # type: ignore[index]
    try:
        module = importlib.import_module(module_name)
        out["framework_version"] = module.__version__
        out["gpu_count"] = eval(gpu_count_expr, {module_name: module})  # noqa: S307 - from the framework table
    except Exception as exc:  # report, the test names it
        out["import_error"] = f"{type(exc).__name__}: {exc}"
    print("CONTENTS " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
