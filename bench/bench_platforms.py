"""The emulated arm64 platform beside the native amd64 one: build (cold and warm) and validation of the one
multi-platform CPU cell here, side by side in one run.

Each figure is a whole process, run RUNS times, median printed with every run:
- cold build: `docker build --platform P --no-cache` of the cell's one rendered Dockerfile (what `buildtool
  build` runs per platform), on P's base pinned by digest from the mirror's index, with the pip secrets;
- warm build: the same with BuildKit's cache (nothing changed: every step cached);
- validation: `buildtool validate DEV_REF --platform P --no-store` (the cell's image tests in P's image;
  arm64 runs under QEMU user emulation on an amd64 machine).
The ratio column is arm64 / amd64: how much slower the emulated platform is, which is what the matrix's
`validate.emulation_factor` must cover. Asserts nothing about time.

--before REV also builds the cell's Dockerfile as it was at commit REV (same context, same locks), cold,
each of its builds right after the same platform's build of the current Dockerfile: e.g. the commit before
native installs (installs under QEMU) beside the current Dockerfile (uv on the build machine; only apt, the
copy and a smoke import under QEMU). Each build is handed BUILD_BASE_IMAGE, this machine's image of the
base, which a Dockerfile without native stages ignores.

--emulated-installs builds, in the same way, the cell's Dockerfile rendered as a multi-platform cell was before
native installs (apt-get update, uv and the bytecode step all on the target platform: under QEMU for arm64),
for a cell that never had such a Dockerfile committed (pytorch-cuda was made multi-platform with native installs).

    BASE_MIRROR=127.0.0.1:5000 python bench/bench_platforms.py [--cell jax-cpu:0.10] [--runs 3]
        [--validate-runs 2] [--skip-cold] [--skip-warm] [--skip-validate] [--before REV | --emulated-installs]
Needs the engine, the local registry with the cell's bases (make bases) and, for validation, this
commit's dev image of the cell pushed (make push FRAMEWORK=jax-cpu).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_build import plain_docker_build  # noqa: E402
from buildtool.contracts import platforms  # noqa: E402
from buildtool.imagebuild import engine  # noqa: E402
from buildtool.imagebuild.builder import resolve_base  # noqa: E402
from buildtool.matrix.loader import load_matrix  # noqa: E402
from buildtool.matrix.plan import CellPlan, Settings, git_revision, plan_cell  # noqa: E402
from buildtool.matrix.schema import Cell, Matrix  # noqa: E402
from buildtool.render.dockerfiles import render_cell_dockerfile  # noqa: E402


def docker_build(dockerfile: Path, base: str, platform: str, tag: str, no_cache: bool, build_base: str,
                 context: Path | None = None) -> float:
    return plain_docker_build(dockerfile, tag, no_cache, base=base, platform=platform,
                              build_args={"BUILD_BASE_IMAGE": build_base}, context=context)


def dockerfile_at(rev: str, dockerfile: Path, out: Path) -> Path:
    """The cell's Dockerfile as committed at REV, written to OUT (built with today's context and locks)."""
    relative = dockerfile.relative_to(ROOT).as_posix()
    shown = subprocess.run(["git", "show", f"{rev}:{relative}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if shown.returncode != 0:
        raise SystemExit(f"git show {rev}:{relative} failed: {shown.stderr.strip()}")
    out.write_text(shown.stdout)
    return out


class EmulatedInstalls:
    """The cell as the templates saw a multi-platform cell before native installs (Cell.native_installs False:
    every install step on the target platform)."""

    native_installs = False

    def __init__(self, cell: Cell) -> None:
        self._cell = cell

    def __getattr__(self, name: str) -> object:
        return getattr(self._cell, name)


def emulated_installs_dockerfile(matrix: object, cell: Cell, out: Path) -> Path:
    out.write_text(render_cell_dockerfile(matrix, EmulatedInstalls(cell), ROOT / "templates", root=ROOT))  # type: ignore[arg-type]
    return out


def validate(ref: str, platform: str) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-platforms-reports-") as reports:   # the run's reports: not kept
        started = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "buildtool", "validate", ref, "--platform", platform,
                              "--no-store", "--reports", reports], cwd=ROOT, capture_output=True, text=True,
                             timeout=7200)
        elapsed = time.perf_counter() - started
    if run.returncode != 0:
        raise SystemExit(f"buildtool validate {ref} --platform {platform} failed:\n{run.stderr[-2000:]}")
    return elapsed


def tag(platform: str) -> str:
    """The engine tag of the bench's builds for PLATFORM (removed at the end)."""
    return f"bench-platforms:{platform.split('/')[1]}"


def row(name: str, figures: dict[str, list[float]], order: list[str]) -> None:
    medians = {p: statistics.median(figures[p]) for p in order}
    runs = "  ".join(f"{p.split('/')[1]}: " + ", ".join(f"{t:.1f}" for t in figures[p]) for p in order)
    ratio = medians[order[1]] / medians[order[0]] if medians[order[0]] else float("nan")
    print(f"{name:<44} {medians[order[0]]:>9.1f} {medians[order[1]]:>9.1f} {ratio:>8.2f}x   runs (s) {runs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cell", default="jax-cpu:0.10")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--validate-runs", type=int, default=2)
    parser.add_argument("--skip-cold", action="store_true")
    parser.add_argument("--skip-warm", action="store_true")
    parser.add_argument("--skip-validate", action="store_true")
    baseline = parser.add_mutually_exclusive_group()
    baseline.add_argument("--before", metavar="REV", help="also build the cell's Dockerfile of commit REV, cold")
    baseline.add_argument("--emulated-installs", action="store_true",
                          help="also build the cell's Dockerfile rendered with every install on the target, cold")
    args = parser.parse_args()
    for option, value in (("--runs", args.runs), ("--validate-runs", args.validate_runs)):
        if value < 1:
            parser.exit(2, f"{option} {value}: give 1 or more runs\n")
    matrix = load_matrix(ROOT / "matrix.yaml")
    cell = next((c for c in matrix.cells if c.key == args.cell), None)
    if cell is None:
        parser.exit(2, f"--cell {args.cell}: not a cell of matrix.yaml; name one built for two platforms "
                       "(e.g. jax-cpu:0.10)\n")
    if len(cell.platforms) < 2:
        parser.exit(2, f"{cell.key} is built for {', '.join(cell.platforms)} only\n")
    order = [platforms.host().name, *[p for p in cell.platforms if p != platforms.host().name]][:2]
    plan = plan_cell(cell, Settings.from_env(), git_revision(ROOT))
    bases = {}
    for platform in order:
        found = resolve_base(plan, platform)
        if found is None:
            raise SystemExit(f"no {platform} base for {cell.key}; run `make bases FRAMEWORK={cell.name} "
                             "BASE_MIRROR=127.0.0.1:5000`")
        bases[platform] = found.pinned
    try:
        figures(args, matrix, cell, order, plan, bases)
    finally:   # the images the builds tagged, whether the figures were printed or a build failed
        for p in order:
            engine.untag(tag(p))


def figures(args: argparse.Namespace, matrix: Matrix, cell: Cell, order: list[str], plan: CellPlan,
            bases: dict[str, str]) -> None:
    """Build (and validate) on each platform of ORDER; a row of figures each."""
    dockerfile = ROOT / cell.dockerfile
    print(f"{cell.key}: {order[0]} native, {order[1]} under QEMU; medians in seconds, whole processes")
    print(f"{'figure':<44} {order[0].split('/')[1]:>9} {order[1].split('/')[1]:>9} {'ratio':>9}")
    native = bases[order[0]]

    def build(p: str, no_cache: bool, file: Path = dockerfile) -> float:
        return docker_build(file, bases[p], p, tag(p), no_cache, native,
                            context=dockerfile.parent)

    if args.before or args.emulated_installs:
        # Interleaved (this Dockerfile, then the baseline, per platform and run), so a machine whose load drifts
        # during the run weighs on both alike.
        cold = {p: [] for p in order}
        before = {p: [] for p in order}
        with tempfile.TemporaryDirectory(prefix="bench-platforms-") as tmp:
            if args.before:
                old = dockerfile_at(args.before, dockerfile, Path(tmp) / "Dockerfile")
                label = f"cold build at {args.before[:12]} (--no-cache)"
            else:
                old = emulated_installs_dockerfile(matrix, cell, Path(tmp) / "Dockerfile")
                label = "cold build, installs emulated (--no-cache)"
            for _ in range(args.runs):
                for p in order:
                    cold[p].append(build(p, True))
                    before[p].append(build(p, True, old))
        row("cold build (docker build --no-cache)", cold, order)
        row(label, before, order)
    elif not args.skip_cold:
        cold = {p: [build(p, True) for _ in range(args.runs)] for p in order}
        row("cold build (docker build --no-cache)", cold, order)
    if not args.skip_warm:
        warm = {p: [] for p in order}
        for p in order:
            build(p, False)   # fills the cache
            warm[p] = [build(p, False) for _ in range(args.runs)]
        row("warm build (docker build, all steps cached)", warm, order)
    if not args.skip_validate:
        checks = {p: [validate(plan.dev_ref, p) for _ in range(args.validate_runs)] for p in order}
        row("validation (buildtool validate --platform)", checks, order)
    print(f"matrix validate.emulation_factor of {cell.key}: {cell.emulation_factor}")


if __name__ == "__main__":
    main()
