"""What a cold page cache costs the first import of each CPU image's framework, side by side with
the same import warm: the case a fresh GPU runner that just pulled its image is in, and why a
fixed 60 s bound on an import failed healthy images (issue 27).

Each round, per image: drop the page cache (`sync; echo 3 > /proc/sys/vm/drop_caches`, root only),
then the same whole process twice: `docker run --rm IMAGE python3 warm_import.py '["MODULE"]'`
(image-tests/scripts/warm_import.py, which times the import alone and reads /proc/self/io),
first cold, then at once warm. Prints, per image, the medians over --runs rounds of the whole
`docker run` process and of the import alone, cold and warm, the ratio cold/warm, and the bytes
the cold import read from storage. Asserts nothing about time.

    .venv/bin/python bench/bench_cold_import.py     # this commit's pytorch-cpu and tensorflow-cpu dev images
    .venv/bin/python bench/bench_cold_import.py --runs 3 IMAGE=MODULE [IMAGE=MODULE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from buildtool.common import docker_cli  # noqa: E402
from buildtool.contracts import frameworks  # noqa: E402
from buildtool.matrix.loader import load_matrix  # noqa: E402
from buildtool.matrix.plan import Settings, git_revision, plan_cell  # noqa: E402

SCRIPTS = REPO / "image-tests" / "scripts"
CELLS = ("pytorch-cpu:2.13", "tensorflow-cpu:2.21")


def default_images() -> list[tuple[str, str]]:
    matrix = load_matrix(REPO / "matrix.yaml", REPO / "templates")
    revision = git_revision(REPO)
    return [(plan_cell(c, Settings.from_env(), revision).dev_ref, frameworks.get(c.framework).module)
            for c in matrix.cells if c.key in CELLS]


def drop_caches() -> None:
    subprocess.run(["sync"], check=True, timeout=300)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def one_import(image: str, module: str) -> tuple[float, dict]:
    """(seconds of the whole `docker run`, what warm_import.py recorded for the import)."""
    docker = docker_cli.client()  # the client validate uses (DOCKER_CLIENT), chosen before the clock starts
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as out:
        os.chmod(out, 0o1777)
        started = time.monotonic()
        proc = subprocess.run([docker, "run", "--rm", "--network", "none", "-v", f"{SCRIPTS}:/imagetests:ro",
                               "-v", f"{out}:/out", "-e", "IMAGETEST_OUT=/out", image, "python3",
                               "/imagetests/warm_import.py", json.dumps([module])],
                              capture_output=True, text=True, timeout=900)
        whole = time.monotonic() - started
        if proc.returncode != 0:
            raise SystemExit(f"bench: `docker run {image}` failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
        found = json.loads((Path(out) / "result.json").read_text())["imports"][0]
    if found["error"]:
        raise SystemExit(f"bench: import {module} failed in {image}: {found['error']}")
    return whole, found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("images", nargs="*", help="IMAGE=MODULE (default: this commit's CPU dev images)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.exit(2, f"--runs {args.runs}: give 1 or more runs\n")
    given = [(i, *i.partition("=")) for i in args.images]
    for text, image, equals, module in given:
        if not (image and equals and module):
            parser.exit(2, f"{text}: give IMAGE=MODULE (the image, and the module to import in it)\n")
    if os.geteuid() != 0:
        print("bench: dropping the page cache needs root", file=sys.stderr)
        return 2
    images = [(image, module) for _, image, _, module in given] if given else default_images()
    print(f"{'image':<58} {'':5} {'docker run (whole)':>19} {'import alone':>13} {'read from disk':>15}")
    for image, module in images:
        rows: dict[str, list[tuple[float, dict]]] = {"cold": [], "warm": []}
        for _ in range(args.runs):
            drop_caches()
            rows["cold"].append(one_import(image, module))
            rows["warm"].append(one_import(image, module))
        medians = {}
        for kind, runs in rows.items():
            whole = statistics.median(r[0] for r in runs)
            alone = statistics.median(r[1]["seconds"] for r in runs)
            read = statistics.median(r[1]["read_bytes"] for r in runs)
            medians[kind] = (whole, alone)
            print(f"{image[-58:]:<58} {kind:5} {whole:>17.1f} s {alone:>11.1f} s {read / 1e6:>12.0f} MB")
        print(f"{'':58} {'ratio':5} {medians['cold'][0] / medians['warm'][0]:>17.1f} x "
              f"{medians['cold'][1] / medians['warm'][1]:>11.1f} x   (cold / warm, medians of {args.runs} rounds: "
              f"import {module} in a new container)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
