"""Benchmark `buildtool build` against what a user would otherwise run, side by side.

(a) Fresh CI runner: the registry already holds the cell's image (built at another commit);
    `buildtool build` of a new commit against a plain `docker build --no-cache` of the same
    Dockerfile (target: >= 20x faster: nothing rebuilt, nothing pulled).
(b) Warm no-op: `buildtool build` of an unchanged cell whose dev tag exists (target: < 1 s),
    next to a fully cached plain `docker build`.
(c) Each CPU cell built cold (`--force`, no cache): build time, image size, and the size of
    what is installed in it (file system content), so the overhead of layers is visible
    (target: image <= 15% above the installed size: no pip caches, no apt lists, no files
    duplicated across layers).

Each scenario runs --runs times (default 3; (a) at a new revision each run, the arms of (a) and (b)
interleaved); prints the medians of both arms side by side with their ratio, and each run's figures.
Everything runs in a registry namespace of its own (127.0.0.1:5000/bench-<random>), removed
at the end. Needs the engine and local registry (bash scripts/setup.sh). Run:
    python bench/bench_build.py [--cell pytorch-cpu:2.13] [--skip-cold] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from buildtool.imagebuild import engine  # noqa: E402
from buildtool.imagebuild.cell_inputs import scrub, secret_strings  # noqa: E402
from buildtool.imagebuild.pipconfig import HostPip, pip_secrets  # noqa: E402
from buildtool.matrix.loader import load_matrix  # noqa: E402
from buildtool.matrix.plan import mirror_base  # noqa: E402
from buildtool.matrix.schema import Cell, Matrix  # noqa: E402
from buildtool.registry.client import RegistryClient  # noqa: E402

LOCAL = "127.0.0.1:5000"


def buildtool(args: list[str], env: dict[str, str]) -> tuple[float, dict]:
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "buildtool", "build", "--json", *args], cwd=ROOT, text=True,
                         capture_output=True, env={**os.environ, **env}, timeout=3600)
    elapsed = time.perf_counter() - started
    if run.returncode != 0:
        raise SystemExit(f"buildtool build {' '.join(args)} failed:\n{run.stderr[-2000:]}")
    return elapsed, json.loads(run.stdout)["results"][0]


def plain_docker_build(dockerfile: Path, tag: str, no_cache: bool, *, base: str | None = None,
                       platform: str | None = None,
                       build_args: dict[str, str] | None = None, context: Path | None = None) -> float:
    """What a user would type (with the secrets pip needs here, and host networking), with the build
    client buildtool uses (DOCKER_CLIENT). BASE: the base by digest (default: the Dockerfile's, from the
    mirror); PLATFORM: `--platform`; the secrets are every one `buildtool build` hands a build (pip_secrets);
    BUILD_ARGS: more build args (BUILD_BASE_IMAGE of native installs); CONTEXT: the
    build context when the Dockerfile is elsewhere (default: its folder)."""
    base = base or mirror_base(dockerfile.read_text().split("ARG BASE_IMAGE=", 1)[1].split()[0], LOCAL)
    client = engine.resolve_build_client()
    host = HostPip.from_host()
    with pip_secrets(host) as pip:
        files = dict(pip.files)
        argv = [*client.argv, "--network", "host", *(["--platform", platform] if platform else []),
                "-f", str(dockerfile), "-t", tag, "--build-arg", f"BASE_IMAGE={base}", "--progress=plain"]
        for key, value in sorted((build_args or {}).items()):
            argv += ["--build-arg", f"{key}={value}"]
        argv += ["--no-cache"] if no_cache else []
        for sid, path in sorted(files.items()):
            argv += ["--secret", f"id={sid},src={path}"]
        started = time.perf_counter()
        # One stream, in order: --progress=plain writes the progress and the failing step's error on stderr.
        run = subprocess.run([*argv, str(context or dockerfile.parent)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=7200, env={**os.environ, **dict(client.env)})
        elapsed = time.perf_counter() - started
    if run.returncode != 0:   # its tail with the index credentials masked, as the builder masks its logs
        raise SystemExit(f"docker build{f' --platform {platform}' if platform else ''} failed:\n"
                         f"{scrub(run.stdout, secret_strings(host))[-2000:]}")
    return elapsed


def installed_sizes(ref: str) -> dict[str, int]:
    """Bytes of file content in the image's file system, and of caches that should not be there."""
    script = ("import os,sys\n"
              "def du(top):\n"
              "  total=0\n"
              "  for d,_,fs in os.walk(top):\n"
              "    for f in fs:\n"
              "      p=os.path.join(d,f)\n"
              "      if not os.path.islink(p):\n"
              "        try: total+=os.lstat(p).st_size\n"
              "        except OSError: pass\n"
              "  return total\n"
              "skip={'/proc','/sys','/dev'}\n"
              "print(sum(du(os.path.join('/',e)) for e in os.listdir('/') if os.path.join('/',e) not in skip\n"
              "          and not os.path.islink(os.path.join('/',e))),\n"
              "      du('/root/.cache/pip'), du('/var/lib/apt/lists'), du('/opt/venv'))\n")
    out = engine.run_output(ref, ["python", "-c", script], timeout=600).split()
    return {"fs": int(out[0]), "pip_cache": int(out[1]), "apt_lists": int(out[2]), "venv": int(out[3])}


def cleanup(namespace: str, local_tags: list[str]) -> None:
    for ref in local_tags:
        engine.untag(ref)
    for image in engine.sdk().images.list():
        for ref in image.tags:
            if ref.startswith(f"{LOCAL}/{namespace}/"):
                engine.untag(ref)
    registry = RegistryClient(LOCAL)
    # Every page of the catalogue (its `Link` headers): the registry is shared, the bench's repositories may
    # come after the first 1,000.
    repos = [repo for page in registry.pages("_catalog?n=1000", "") for repo in page.json().get("repositories") or []]
    for repo in repos:
        if repo.startswith(f"{namespace}/"):
            for tag in registry.tags(repo):
                digest = registry.manifest_digest(repo, tag)
                if digest:
                    registry.request("DELETE", f"{repo}/manifests/{digest}", ok=(202, 404), repo=repo)


def mb(size: int) -> str:
    return f"{size / 1e6:,.0f} MB"


def timed_build(args: list[str], env: dict[str, str], expected: str) -> float:
    """Seconds of one `buildtool build`, which must end as EXPECTED: another outcome is not the scenario's work."""
    seconds, result = buildtool(args, env)
    if result["result"] != expected:
        raise SystemExit(f"buildtool build {' '.join(args)} ended {result['result']!r}, not {expected!r}: "
                         "no figure is printed")
    return seconds


def row(label: str, ours: list[float], plain: list[float], target: str) -> None:
    """Medians of both arms side by side, their ratio, and each run's figures."""
    median_ours, median_plain = statistics.median(ours), statistics.median(plain)
    shown = f"buildtool {', '.join(f'{t:.2f}' for t in ours)}; docker build {', '.join(f'{t:.2f}' for t in plain)}"
    print(f"{label:58} {median_ours:9.2f}s {median_plain:12.2f}s {median_plain / median_ours:7.1f}x  {target}   "
          f"runs (s): {shown}")


def compare(cell: Cell, env: dict[str, str], namespace: str, runs: int) -> None:
    """(a) and (b): RUNS runs of each, the two arms interleaved so a machine whose load drifts weighs on both."""
    plain = f"{LOCAL}/{namespace}/plain"    # the plain builds' tags: cleanup() removes all of the namespace's
    dockerfile = ROOT / cell.dockerfile
    # The registry holds the image, built (or reused) at an earlier "commit".
    buildtool(["-f", cell.key, "--push", "--revision", "bench-earlier"], env)
    # (b)'s starting point, not timed: the dev tag of its commit exists, a plain build's steps are in the cache.
    buildtool(["-f", cell.key, "--revision", "bench-warm", "--push"], env)
    plain_docker_build(dockerfile, f"{plain}:warm", no_cache=False)
    times: dict[str, list[float]] = {"ours_a": [], "plain_a": [], "ours_b": [], "plain_b": []}
    for run in range(1, runs + 1):
        # (a) a new commit on a runner (a revision of its own each run): ours consults the registry first and
        # retags there; the plain build rebuilds every step.
        times["ours_a"].append(timed_build(["-f", cell.key, "--revision", f"bench-fresh-{run}"], env, "retagged"))
        times["plain_a"].append(plain_docker_build(dockerfile, f"{plain}:fresh-{run}", no_cache=True))
        # (b) warm no-op of the same cell and commit, against a fully cached plain build.
        times["ours_b"].append(timed_build(["-f", cell.key, "--revision", "bench-warm", "--push"], env, "up to date"))
        times["plain_b"].append(plain_docker_build(dockerfile, f"{plain}:warm", no_cache=False))
    print()
    print(f"medians of {runs} runs, whole processes (wall seconds): `buildtool build` against `docker build` of the "
          "same Dockerfile")
    print(f"{'scenario':58} {'buildtool':>10} {'docker build':>13} {'ratio':>8}  target")
    row(f"(a) fresh runner, image in registry ({cell.key})", times["ours_a"], times["plain_a"], ">= 20x")
    row(f"(b) warm no-op ({cell.key})", times["ours_b"], times["plain_b"], "buildtool < 1 s")


def cold_builds(matrix: Matrix, env: dict[str, str], runs: int, local_tags: list[str]) -> None:
    """(c): each CPU cell built cold RUNS times (`--force`, no cache); the median time, the last build's sizes."""
    print()
    print(f"{'(c) cold build':22} {'median s':>8} {'image':>10} {'installed':>10} {'overhead':>9} "
          f"{'base':>8} {'venv':>9} {'pip cache':>9} {'apt lists':>9}  target <= 15%   "
          f"(`buildtool build --force`, {runs} runs; sizes of the last)")
    for cpu in (c for c in matrix.cells if c.accelerator == "cpu"):
        seconds: list[float] = []
        ref = ""
        for _ in range(runs):
            if ref:
                engine.untag(ref)   # the previous run's image: each --force build leaves the last one untagged
            took, result = buildtool(["-f", cpu.key, "--force", "--revision", "bench-cold"], env)
            seconds.append(took)
            ref = result["ref"]
            local_tags.append(ref)
        size = int(engine.image_attrs(ref)["Size"])  # type: ignore[index]
        base = engine.image_attrs(mirror_base(cpu.base, LOCAL))
        base_size = int(base["Size"]) if base else 0
        sizes = installed_sizes(ref)
        overhead = size / sizes["fs"] - 1
        print(f"{cpu.key:22} {statistics.median(seconds):8.1f} {mb(size):>10} {mb(sizes['fs']):>10} "
              f"{overhead:8.1%} {mb(base_size):>8} {mb(sizes['venv']):>9} {mb(sizes['pip_cache']):>9} "
              f"{mb(sizes['apt_lists']):>9}   runs (s): {', '.join(f'{t:.1f}' for t in seconds)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cell", default="pytorch-cpu:2.13", help="cell for (a) and (b)")
    parser.add_argument("--skip-cold", action="store_true", help="skip (c), the cold builds of every CPU cell")
    parser.add_argument("--runs", type=int, default=3, help="runs of each scenario (medians shown)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.exit(2, f"--runs {args.runs}: give 1 or more runs\n")
    matrix = load_matrix(ROOT / "matrix.yaml", ROOT / "templates")
    cell = next((c for c in matrix.cells if c.key == args.cell), None)
    if cell is None:
        parser.exit(2, f"--cell {args.cell}: not a cell of matrix.yaml (cells: "
                       f"{', '.join(c.key for c in matrix.cells)})\n")
    namespace = f"bench-{secrets.token_hex(4)}"
    env = {"REGISTRY": f"{LOCAL}/{namespace}", "BASE_MIRROR": LOCAL}
    local_tags: list[str] = []
    print(f"engine: {engine.resolve_build_client().describe()}; registry namespace {LOCAL}/{namespace}")
    try:
        compare(cell, env, namespace, args.runs)
        if not args.skip_cold:
            cold_builds(matrix, env, args.runs, local_tags)
    finally:
        cleanup(namespace, local_tags)


if __name__ == "__main__":
    main()
