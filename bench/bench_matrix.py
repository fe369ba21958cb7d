"""How fast a big or hostile matrix is answered: whole `buildtool` processes against the
loader the matrix used before (PyYAML's pure-Python composer, then a walk over the nodes that
expands every alias: a 5 MB matrix took 26 s, an alias bomb never finished).

Cases, each in a fresh temporary project (the real templates, a generated matrix):
- a valid 5 MB matrix (about 6,500 images, 13,000 cells), answered for one image:
  `buildtool plan -f pytorch-cpu`; and every cell as JSON (17 MB out): `buildtool plan --json`;
- the same matrix with a bad value on its last line: `buildtool check` (exit 2, one line);
- a YAML alias bomb ("billion laughs", a few hundred bytes): `buildtool check` (exit 2).
Against: the previous loader's parse of the same file alone, as a whole process (no checks,
no output; stopped after --limit seconds). Medians of --runs runs; ratios compare across machines.

    .venv/bin/python bench/bench_matrix.py [--runs 3] [--limit 60]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 2.0
IMAGE = """
  - name: img-{n}
    framework: pytorch
    accelerator: cpu
    template: images/pip.Dockerfile.j2
    base: docker.io/library/debian:bookworm-slim
    tests: [common, pytorch]
    use: PyTorch on CPU number {n} for laptops, CI and machines without a GPU or NGC access; same tools.
    run:
      gpus: none
    index:
      extra_urls: ["https://download.pytorch.org/whl/cpu"]
    packages:
      torch-tb-profiler: "0.4.3"
    versions:
      - version: "2.13"
        default: true
        framework_version: 2.13.0+cpu
        framework_requirements: ["torch==2.13.0+cpu"]
        release:
          moving: ["{{version}}", latest]
      - version: "2.12"
        framework_version: 2.12.0+cpu
        framework_requirements: ["torch==2.12.0+cpu"]
"""


def big_matrix(size: int) -> str:
    """The real matrix followed by generated images until it is `size` bytes."""
    parts = [(ROOT / "matrix.yaml").read_text()]
    total, n = len(parts[0]), 0
    while total < size:
        parts.append(IMAGE.format(n=n))
        total += len(parts[-1])
        n += 1
    return "".join(parts)


def alias_bomb() -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return "\n".join(lines) + "\n"


# The loader before this one (buildtool/matrix/yamlsource.py until issue 9), parse only.
PREVIOUS_LOADER = """
import sys, yaml
loader = yaml.SafeLoader("")
def convert(node):
    if isinstance(node, yaml.MappingNode):
        return {k.value: convert(v) for k, v in node.value}
    if isinstance(node, yaml.SequenceNode):
        return [convert(item) for item in node.value]
    return loader.construct_object(node, deep=True)
convert(yaml.compose(open(sys.argv[1], encoding="utf-8").read(), Loader=yaml.SafeLoader))
"""


def timed(argv: list[str], limit: float, cwd: Path) -> tuple[float, float, int | None, str]:
    """Wall and CPU seconds of one whole process, its exit code (None: stopped at `limit`) and the last line of
    its stderr. CPU time is what a busy shared machine distorts least."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return limit, limit, None, ""
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    said = proc.stderr.decode(errors="replace").strip().splitlines()
    return wall, cpu, proc.returncode, said[-1] if said else ""


def median_run(argv: list[str], runs: int, limit: float, cwd: Path,
               expect: tuple[int | None, ...]) -> tuple[float, float, int | None]:
    """Medians of `runs` runs, and the exit code (None when a run was stopped at `limit`). A run that ends
    otherwise than EXPECT says (a crash, a wrong answer) stops the bench: its time is not the case's."""
    results = [timed(argv, limit, cwd) for _ in range(runs)]
    for _, _, code, said in results:
        if code not in expect:
            shown = " or ".join("stopped" if c is None else f"exit {c}" for c in expect)
            raise SystemExit(f"bench: {' '.join(argv[1:])} ended with {'no exit' if code is None else f'exit {code}'}"
                             f" (expected {shown}): {said or 'no output'}; no figure is printed")
    code = None if any(r[2] is None for r in results) else results[-1][2]
    return (statistics.median(r[0] for r in results), statistics.median(r[1] for r in results), code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--limit", type=float, default=60.0, help="seconds before a run is stopped")
    args = parser.parse_args()
    if args.runs < 1:
        parser.exit(2, f"--runs {args.runs}: give 1 or more runs\n")
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-matrix-") as tmp:
        project = Path(tmp)
        shutil.copytree(ROOT / "templates", project / "templates")
        shutil.copytree(ROOT / "image-tests", project / "image-tests")   # the test groups cells name
        text = big_matrix(5_000_000)
        last = text.rindex('torch==2.12.0+cpu"')
        files = {
            "big.yaml": text,
            "bad.yaml": text[:last] + 'torch==2.12.0+cpu$(id)"' + text[last + len('torch==2.12.0+cpu"'):],
            "bomb.yaml": alias_bomb(),
        }
        for name, content in files.items():
            (project / name).write_text(content)
        revision = ["--revision", "0123456789ab"]
        cases = [
            ("5 MB matrix, plan of one image", "big.yaml", ["plan", "-f", "pytorch-cpu", *revision], 0),
            ("5 MB matrix, plan --json of all", "big.yaml", ["plan", "--json", *revision], 0),
            ("5 MB, bad value on the last line", "bad.yaml", ["check"], 2),
            (f"alias bomb ({len(files['bomb.yaml'])} bytes)", "bomb.yaml", ["check"], 2),
        ]
        (project / "previous_loader.py").write_text(PREVIOUS_LOADER)
        print(f"whole processes, median of {args.runs} (previous loader stopped at {args.limit:.0f} s); "
              "wall (CPU) seconds")
        print(f"{'case':<36}{'buildtool':>15}{'exit':>6}{'previous parse':>18}{'ratio':>8}{'vs 2 s':>8}")
        for label, name, command, want in cases:
            path = project / name
            wall, cpu, code = median_run([python, "-m", "buildtool", *command, "--matrix", str(path)], args.runs,
                                         args.limit, project, (want,))
            old_wall, old_cpu, old_code = median_run([python, str(project / "previous_loader.py"), str(path)],
                                                     args.runs, args.limit, project, (0, None))
            ours = f"{wall:.2f} ({cpu:.2f})"
            theirs = f"{old_wall:.2f} ({old_cpu:.2f})" if old_code is not None else f">{old_wall:.0f} (stopped)"
            ratio = f"{old_wall / wall:.1f}x" if old_code is not None else f">{old_wall / wall:.0f}x"
            print(f"{label:<36}{ours:>15}{code!s:>6}{theirs:>18}{ratio:>8}{wall / TARGET_S:>7.2f}x")

if __name__ == "__main__":
    main()
