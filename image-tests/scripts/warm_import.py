"""The first import of the framework in a new container, and of what TensorBoard loads at start,
timed: how long each took and how much it read from storage, the cost of a cold page cache.

Argument: a JSON list of what to import: module names, or "tensorboard_plugins" for every
TensorBoard plugin entry point (what `tensorboard` loads when it starts). Writes result.json
after each one, so a later one that hangs still leaves the earlier ones recorded:
{"imports": [{"module", "seconds", "read_bytes", "rchar", "error"}]}. An import that fails is
recorded, not raised: the tests that need the module name the failure.
"""

from __future__ import annotations

import importlib
import json
import sys
import time

from probe_io import error_line, result


def io_counters() -> dict:
    try:
        with open("/proc/self/io") as fh:
            return {k.strip(): int(v) for k, v in (line.split(":", 1) for line in fh if ":" in line)}
    except (OSError, ValueError):
        return {}


def load_plugins() -> None:
    import importlib.metadata as md

    found = md.entry_points()
    group = found.select(group="tensorboard_plugins") if hasattr(found, "select") \
        else found.get("tensorboard_plugins", [])
    for entry in group:
        entry.load()


def main() -> int:
    done = []
    for name in json.loads(sys.argv[1]):
        before, started = io_counters(), time.monotonic()
        entry = {"module": name, "seconds": 0.0, "read_bytes": 0, "rchar": 0, "error": ""}
        try:
            load_plugins() if name == "tensorboard_plugins" else importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - recorded; the tests that need it name it
            entry["error"] = error_line(exc)
        after = io_counters()
        entry.update(seconds=round(time.monotonic() - started, 3),
                     read_bytes=after.get("read_bytes", 0) - before.get("read_bytes", 0),
                     rchar=after.get("rchar", 0) - before.get("rchar", 0))
        done.append(entry)
        result({"imports": done})
    return 0


if __name__ == "__main__":
    sys.exit(main())
