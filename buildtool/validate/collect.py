"""The tests a cell's groups define in this checkout (`pytest --collect-only`), for the release gate.

Collection needs only the cell's ulimits (the one parametrised test); the image is never
started. The answer depends only on the image-tests code and those inputs, so it is cached
under ~/.cache/dl-images/defined-tests/ by their hash: a release pays for pytest once per
test-code version, not once per run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from buildtool.common.errors import FailedError, UserError
from buildtool.common.files import cache_root, write_atomic
from buildtool.contracts import frameworks
from buildtool.contracts.target import Expectations, FrameworkInfo, Target, write_target

if TYPE_CHECKING:
    from buildtool.matrix.schema import Cell

COLLECT_TIMEOUT_S = 300
PLUGIN = "buildtool.validate.collect_plugin"


def image_tests_hash(tests_dir: Path) -> str:
    """sha256 over image-tests/ (paths and bytes), or over the tree staged with a site folder
    (contracts.sitetests.stage): which test code produced a verdict."""
    digest = hashlib.sha256()
    for path in sorted(p for p in tests_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(tests_dir)).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"sha256:{digest.hexdigest()}"


def missing_groups(cell: Cell, tests_dir: Path, groups: tuple[str, ...] | None = None) -> list[str]:
    """The groups (default: the cell's, its site checks' included) that have no folder in `tests_dir`."""
    return [g for g in (cell.groups if groups is None else groups) if not (tests_dir / g).is_dir()]


def cell_groups(cell: Cell, tests_dir: Path, groups: tuple[str, ...] | None = None) -> list[str]:
    """The groups a run of the cell runs and collect collects, every one (default: the cell's image-tests groups
    and its site checks' group, contracts.sitetests); a group without its folder in `tests_dir` (image-tests, or
    the tree staged with the site folder) is an error naming it, never dropped."""
    missing = missing_groups(cell, tests_dir, groups)
    if missing:
        plural = "s" if len(missing) > 1 else ""
        raise UserError(f"{cell.key} names the test group{plural} {', '.join(missing)}, but there is no folder "
                        f"{', '.join(f'{tests_dir / g}/' for g in missing)}; every group a cell names is a folder "
                        "of image-tests")
    return list(cell.groups if groups is None else groups)


def framework_info(framework: frameworks.Framework) -> FrameworkInfo:
    """The framework's facts as the target file tells them to the image tests: its row's FrameworkInfo fields."""
    return FrameworkInfo.model_validate(framework, from_attributes=True)


def _target(cell: Cell) -> Target:
    """A target file good enough to collect with (nothing is run)."""
    info = framework_info(frameworks.get(cell.framework))
    return Target(image="collect-only", ref="collect-only", digest="", cell=cell.key, framework=cell.framework,
                  framework_info=info, accelerator=cell.accelerator, needs_gpu=cell.needs_gpu, run_flags=[],
                  ulimits=dict(cell.run.ulimits), shm_promised=cell.run.shm_size, shm_expected_bytes=0,
                  expect=Expectations(), run_id="collect-only")


def defined_tests(cell: Cell, tests_dir: Path, test_code: str | None = None) -> dict[str, bool]:
    """id -> marked gpu, for every test the cell's groups define in `tests_dir`."""
    groups = cell_groups(cell, tests_dir)
    code = test_code or image_tests_hash(tests_dir)
    key = hashlib.sha256(json.dumps([code, groups, sorted(dict(cell.run.ulimits))]).encode()).hexdigest()
    cached = cache_root() / "defined-tests" / f"{key}.json"
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return {str(k): bool(v) for k, v in json.loads(cached.read_text()).items()}
    with tempfile.TemporaryDirectory(prefix="buildtool-collect-") as tmp:
        target, out = Path(tmp) / "target.json", Path(tmp) / "defined.json"
        write_target(target, _target(cell))
        argv = [sys.executable, "-m", "pytest", *[str(tests_dir / g) for g in groups], "--rootdir", str(tests_dir),
                "-c", str(tests_dir / "pytest.ini"), "--collect-only", "-q", "-p", PLUGIN, "--defined-tests", str(out),
                "--target", str(target), "-p", "no:cacheprovider"]
        # The plugin comes from this very buildtool, wherever it is installed or checked out.
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root,
                                                                           os.environ.get("PYTHONPATH")]))}
        try:
            proc = subprocess.run(argv, cwd=tests_dir, capture_output=True, text=True, timeout=COLLECT_TIMEOUT_S,
                                  env=env)
        except subprocess.TimeoutExpired:
            raise FailedError(f"collecting the image tests of {cell.key} took over {COLLECT_TIMEOUT_S}s") from None
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            raise FailedError(f"cannot collect the image tests of {cell.key} (pytest exit {proc.returncode}): "
                              + " | ".join(tail))
        found = {str(d["id"]): bool(d["gpu"]) for d in json.loads(out.read_text())["defined"]}
    with contextlib.suppress(OSError):   # a cache that cannot be written only costs the next run a collection
        write_atomic(cached, json.dumps(found, sort_keys=True))
    return found
