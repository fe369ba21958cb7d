"""Time `buildtool render` of the whole matrix against its one-second target.

Prints, side by side in one run, on a copy of what render reads (matrix, templates, image tests, the cells'
locks beside their Dockerfiles, docs/releases/):
- in process: the CLI's render command itself (buildtool.cli.generate.render: the matrix loaded, every
  Dockerfile, the catalogue and the CI workflows rendered, the changed files written), imports already done;
- CLI process: `python -m buildtool render --matrix ...`, the same command with the interpreter's start;
each from two states of the tree: every generated file removed first (it writes them all), and the tree already
rendered (it writes none). Runs interleaved, medians printed. A plain copy of the same committed files is the
floor of writing that many files by hand. Ratios, not seconds, are what to compare across machines.

    python bench/bench_render.py [--runs 5]
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from buildtool.cli import generate  # noqa: E402
from buildtool.cli.options import find_project  # noqa: E402
from buildtool.contracts.releases import RELEASES_DIR  # noqa: E402

TARGET_S = 1.0
READS = ("templates", "image-tests", "dockerfiles", RELEASES_DIR)   # what render reads besides matrix.yaml


def project_copy(dest: Path) -> Path:
    """What `buildtool render` reads, copied under DEST; returns the copy's matrix.yaml."""
    shutil.copy2(ROOT / "matrix.yaml", dest / "matrix.yaml")
    for folder in READS:
        if (ROOT / folder).is_dir():
            shutil.copytree(ROOT / folder, dest / folder)
    return dest / "matrix.yaml"


def generated(matrix: Path) -> list[str]:
    """Every file `buildtool render --matrix MATRIX` writes, relative to MATRIX's folder."""
    project = find_project(matrix)
    return sorted(generate.all_outputs(project, project.load()).files)


def remove_generated(matrix: Path, files: list[str]) -> None:
    for rel in files:
        (matrix.parent / rel).unlink(missing_ok=True)


def render_in_process(matrix: Path) -> None:
    """The CLI's render command, called here (its "wrote ..." lines swallowed)."""
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        generate.render(matrix=matrix, prune_stale=False)


def render_cli(matrix: Path) -> None:
    subprocess.run([sys.executable, "-m", "buildtool", "render", "--matrix", str(matrix)],
                   check=True, capture_output=True, timeout=60, cwd=ROOT)


ARMS: dict[str, Callable[[Path], None]] = {
    "in process (buildtool.cli.generate.render)": render_in_process,
    "CLI process (python -m buildtool render)": render_cli,
}


def timed(run: Callable[[Path], None], matrix: Path) -> float:
    start = time.perf_counter()
    run(matrix)
    return time.perf_counter() - start


def copy_files(files: list[str], dest: Path) -> None:
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if args.runs < 1:
        parser.exit(2, f"--runs {args.runs}: give 1 or more runs\n")
    with tempfile.TemporaryDirectory(prefix="bench-render-") as tmp:
        matrix = project_copy(Path(tmp))
        files = generated(matrix)
        committed = [rel for rel in files if (ROOT / rel).is_file()]
        fresh = {arm: f"{arm}, writes all {len(files)} files" for arm in ARMS}
        same = {arm: f"{arm}, tree up to date, writes none" for arm in ARMS}
        floor = f"cp of the {len(committed)} committed ones of those files (the floor)"
        figures: dict[str, list[float]] = {label: [] for label in (*fresh.values(), *same.values(), floor)}
        for _ in range(args.runs):   # interleaved: a machine whose load drifts weighs on every arm alike
            for arm, render in ARMS.items():
                remove_generated(matrix, files)
                figures[fresh[arm]].append(timed(render, matrix))
                missing = [rel for rel in files if not (matrix.parent / rel).is_file()]
                if missing:
                    raise SystemExit(f"bench: {arm} did not write {', '.join(missing)}")
                figures[same[arm]].append(timed(render, matrix))
            shutil.rmtree(Path(tmp, "copy"), ignore_errors=True)
            figures[floor].append(timed(partial(copy_files, committed), Path(tmp, "copy")))
        cells = len(find_project(matrix).load().cells)
    floor_s = statistics.median(figures[floor])
    print(f"buildtool render of {cells} cells: {len(files)} generated files (Dockerfiles, catalogue, CI workflows); "
          f"medians of {args.runs} runs each, interleaved")
    print(f"{'what':<78}{'seconds':>10}{'vs 1 s target':>16}{'vs cp':>10}")
    for label, times in figures.items():
        seconds = statistics.median(times)
        print(f"{label:<78}{seconds:>10.4f}{seconds / TARGET_S:>15.3f}x{seconds / floor_s:>9.1f}x")


if __name__ == "__main__":
    main()
