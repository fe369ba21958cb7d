"""Time `buildtool render` of the whole matrix against its one-second target.

Prints, side by side in one run: the in-process render of every cell (what `make render`
spends rendering), the full CLI process (interpreter start included), and a plain
`cp` of the same committed files (the floor of writing that many files by hand).
Ratios, not seconds, are what to compare across machines.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from buildtool.matrix.loader import load_matrix  # noqa: E402
from buildtool.render.catalogue import catalogue_outputs  # noqa: E402
from buildtool.render.dockerfiles import render_outputs, write_outputs  # noqa: E402

TARGET_S = 1.0


def _median(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("matrix.yaml",):
            shutil.copy2(ROOT / name, root / name)
        shutil.copytree(ROOT / "templates", root / "templates")
        shutil.copytree(ROOT / "image-tests", root / "image-tests")   # the test groups cells name

        def render_in_process() -> None:
            matrix = load_matrix(root / "matrix.yaml", root / "templates")
            for rel in list(root.glob("dockerfiles")):
                shutil.rmtree(rel)
            write_outputs(root, render_outputs(matrix, root / "templates", extras=(catalogue_outputs,)))

        def render_cli() -> None:
            subprocess.run([sys.executable, "-m", "buildtool", "render", "--matrix", str(root / "matrix.yaml")],
                           check=True, capture_output=True, timeout=60, cwd=ROOT)

        def copy_files() -> None:
            shutil.rmtree(root / "copy", ignore_errors=True)
            shutil.copytree(ROOT / "dockerfiles", root / "copy")

        cells = len(load_matrix(root / "matrix.yaml", root / "templates").cells)
        in_process = _median(render_in_process, 20)
        cli = _median(render_cli, 5)
        copy = _median(copy_files, 20)
    print(f"render of {cells} cells + catalogue (median)")
    print(f"{'what':<34}{'seconds':>10}{'vs 1 s target':>16}{'vs cp':>10}")
    for label, seconds in (("buildtool render (in process)", in_process), ("buildtool render (CLI process)", cli),
                           ("cp -r dockerfiles/ (floor)", copy)):
        print(f"{label:<34}{seconds:>10.4f}{seconds / TARGET_S:>15.3f}x{seconds / copy:>9.1f}x")


if __name__ == "__main__":
    main()
