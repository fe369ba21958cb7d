"""Validation time per CPU image, split across checks, side by side with what a user would
otherwise run: the same probes as one `docker run --rm` each (a fresh container per check,
no shared fixtures), in the same process on the same machine.

    python bench/bench_validate.py --jobs IMAGE [RUNS]   # serial (--jobs 1) against concurrent (--jobs 2)
    python bench/bench_validate.py --images BEFORE AFTER [RUNS]   # an earlier build of the cell against this one
    python bench/bench_validate.py                  # this commit's dev images, else the test fixtures
    python bench/bench_validate.py IMAGE [IMAGE...]

`--jobs`: whole `buildtool validate IMAGE --no-store` processes, the arms interleaved (serial, concurrent,
serial, ...) so a noisy machine's load falls on both; medians and their ratio.
`--images`: the same whole processes, three arms interleaved: BEFORE serial (how a validation ran before
this work: the image without bytecode, one test at a time), AFTER serial (what the image's bytecode
saves) and AFTER with the default two workers; medians, and each AFTER arm's ratio to BEFORE.
Prints a table; asserts nothing about time (the target: a CPU image validated in < 90 s).
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "integration"))

from buildtool.common import docker_cli  # noqa: E402
from buildtool.contracts import label_keys  # noqa: E402
from buildtool.matrix.loader import load_matrix  # noqa: E402
from buildtool.matrix.plan import Settings, git_revision, plan_cell  # noqa: E402
from buildtool.validate.runner import Options, probe_flags, resolve, run_flags, validate_image  # noqa: E402

sys.path.insert(0, str(REPO / "image-tests"))
from harness import scripts_for  # noqa: E402  (the folder image-tests mounts: common + the framework's scripts)

# The checks the by-hand baseline also runs (pytest -k expressions).
SAME_CHECKS = {"pytorch": "test_contents or test_shm or test_ddp or (test_profiler and not empty and not cuda)",
               "tensorflow": "test_contents or test_shm or test_tensorboard"}


def default_images(matrix) -> list[str]:
    from buildtool.cli.validate import _exists

    revision = git_revision(REPO)
    refs = [plan_cell(c, Settings.from_env(), revision).dev_ref for c in matrix.cells
            if c.key in ("pytorch-cpu:2.13", "tensorflow-cpu:2.21")]
    if all(_exists(r) for r in refs):
        return refs
    import fixture_images

    print("(no dev images of this commit in the registry: using the test fixture images)", file=sys.stderr)
    return [fixture_images.ensure("pytorch"), fixture_images.ensure("tensorflow")]


def manual_baseline(image: str, framework: str, flags: list[str]) -> tuple[float, dict[str, float]]:
    """The checks as a user would run them by hand: one fresh container per check."""
    py = "python3 /imagetests/"
    docker = docker_cli.client()  # the client validate uses (DOCKER_CLIENT), chosen before the clock starts

    def contents(module: str, *packages: str) -> str:
        spec = {"module": module, "gpu_count_expr": "0", "packages": list(packages)}
        return f"{py}contents.py {shlex.quote(json.dumps(spec))}"

    if framework == "pytorch":
        checks = {
            "contents": contents("torch", "tensorboard", "torch-tb-profiler"),
            "shm": f"df -B1 /dev/shm && {py}shm_workers.py torch",
            "ddp": "torchrun --standalone --nproc-per-node 2 /imagetests/ddp_train.py",
            "profiler": f"{py}torch_profile.py /tmp/p run1 && {py}tb_query.py --logdir /tmp/p --mode profiler "
                        "--run run1",
        }
    else:
        checks = {
            "contents": contents("tensorflow", "tensorboard"),
            "shm": f"df -B1 /dev/shm && {py}shm_workers.py python",
            "tensorboard": f"{py}tf_write.py /tmp/t train && {py}tb_query.py --logdir /tmp/t --mode scalars "
                           "--run train --tag loss",
        }
    split = {}
    for name, cmd in checks.items():
        start = time.monotonic()
        ran = subprocess.run([docker, "run", "--rm", "--network", "host", *flags, "-v",
                              f"{scripts_for(framework)}:/imagetests:ro",
                              image, "bash", "-c", cmd], capture_output=True, text=True, timeout=900, check=False)
        split[name] = time.monotonic() - start
        # A check that failed (no image, a missing tool, a probe's error) took the time of its failure, not of the
        # check: that figure is no baseline.
        if ran.returncode != 0:
            said = (ran.stderr or ran.stdout).strip().splitlines()
            raise SystemExit(f"bench: the by-hand {name} check failed in {image} (exit {ran.returncode}) after "
                             f"{split[name]:.1f} s: {said[-1] if said else 'no output'}; no baseline is printed")
    return sum(split.values()), split


def probe_cpu_s(reports: str) -> float:
    """CPU seconds of every probe of the latest run (their supervisors' exit records; validate keeps only
    the latest run's probes)."""
    records = {p.resolve() for p in Path(reports).glob("*/*/probes/**/exit.json")}
    return sum(float(json.loads(p.read_text()).get("cpu_s") or 0) for p in records)


def validate_process(image: str, jobs: int, reports: str) -> tuple[float, str]:
    """Seconds of one whole `buildtool validate` process, and its verdict's result. A process that gave no verdict
    (an image it could not find, bad input, a crash) stops the bench: its time is not a validation's."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "buildtool", "validate", image, "--no-store", "--json", "--jobs",
                           str(jobs), "--reports", reports], cwd=REPO, capture_output=True, text=True, timeout=1800,
                          check=False)
    seconds = time.monotonic() - start
    try:
        result = str(json.loads(proc.stdout)[0]["result"])
    except (ValueError, IndexError, KeyError, TypeError):
        said = proc.stderr.strip().splitlines()
        raise SystemExit(f"bench: buildtool validate {image} --jobs {jobs} gave no verdict (exit {proc.returncode}) "
                         f"after {seconds:.1f} s: {said[-1] if said else 'no output'}; no figure is printed") from None
    return seconds, result


def compare_jobs(image: str, runs: int) -> int:
    times: dict[int, list[float]] = {1: [], 2: []}
    cpu: dict[int, list[float]] = {1: [], 2: []}
    print(f"{os.cpu_count()} cores; other load on the machine shows in the load average before each run", flush=True)
    with tempfile.TemporaryDirectory() as reports:
        for n in range(runs):
            for jobs in (1, 2):
                load = os.getloadavg()[0]
                seconds, result = validate_process(image, jobs, reports)
                times[jobs].append(seconds)
                cpu[jobs].append(probe_cpu_s(reports))
                print(f"run {n + 1}: buildtool validate --jobs {jobs} (whole process, {result}): {seconds:.1f} s; "
                      f"its probes' CPU {cpu[jobs][-1]:.1f} s; load average before {load:.2f}", flush=True)
    serial, concurrent = statistics.median(times[1]), statistics.median(times[2])
    print(f"median of {runs}, whole `buildtool validate {image} --no-store` process (wall seconds):")
    print(f"  before: --jobs 1 (serial)      {serial:7.1f} s   probes' CPU {statistics.median(cpu[1]):6.1f} s")
    print(f"  after:  --jobs 2 (concurrent)  {concurrent:7.1f} s   probes' CPU {statistics.median(cpu[2]):6.1f} s")
    print(f"  ratio after/before (wall): {concurrent / serial:.2f}")
    return 0


def compare_images(before: str, after: str, runs: int) -> int:
    arms = [("before", before, 1), ("after", after, 1), ("after", after, 2)]
    times: dict[int, list[float]] = {i: [] for i in range(len(arms))}
    cpu: dict[int, list[float]] = {i: [] for i in range(len(arms))}
    results: dict[int, list[str]] = {i: [] for i in range(len(arms))}
    print(f"{os.cpu_count()} cores; other load on the machine shows in the load average before each run", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        for n in range(runs):
            for i, (name, image, jobs) in enumerate(arms):
                load = os.getloadavg()[0]
                reports = f"{scratch}/run-{n}-arm-{i}"   # its own, so the probes' CPU is this run's alone
                seconds, result = validate_process(image, jobs, reports)
                times[i].append(seconds)
                cpu[i].append(probe_cpu_s(reports))
                results[i].append(result)
                print(f"run {n + 1}: {name} {image} --jobs {jobs} (whole process, {result}): {seconds:.1f} s; "
                      f"its probes' CPU {cpu[i][-1]:.1f} s; load average before {load:.2f}", flush=True)
    base = statistics.median(times[0])
    print(f"median of {runs}, whole `buildtool validate IMAGE --no-store --jobs N` process (wall seconds):")
    for i, (name, image, jobs) in enumerate(arms):
        median = statistics.median(times[i])
        print(f"  {name:<6} --jobs {jobs}  {median:7.1f} s   probes' CPU {statistics.median(cpu[i]):6.1f} s   "
              f"ratio to before {median / base:.2f}   ({image}; {', '.join(sorted(set(results[i])))})")
    return 0


# The comparisons' arguments before RUNS, as the usage names them.
COMPARED = {"--images": ("BEFORE", "AFTER"), "--jobs": ("IMAGE",)}


def main(argv: list[str]) -> int:
    if argv[:1] and argv[0] in COMPARED:
        names, given = COMPARED[argv[0]], argv[1:]
        runs = given[len(names)] if len(given) > len(names) else "3"
        if len(given) not in (len(names), len(names) + 1) or not runs.isdigit() or int(runs) < 1:
            print(f"{shlex.join(argv)}: give {argv[0]} {' '.join(names)} [RUNS], RUNS 1 or more", file=sys.stderr)
            return 2
        if argv[0] == "--images":
            return compare_images(given[0], given[1], int(runs))
        return compare_jobs(given[0], int(runs))
    matrix = load_matrix(REPO / "matrix.yaml", REPO / "templates")
    images = argv or default_images(matrix)
    rows = []
    frameworks = {}
    for image in images:
        labels = resolve(image, lambda line: None).labels
        frameworks[image] = next(c.framework for c in matrix.cells if c.key == labels.get(label_keys.CELL))
    with tempfile.TemporaryDirectory() as reports:
        for image in images:
            peers = {fw: ref for ref, fw in frameworks.items() if fw != frameworks[image]}
            start = time.monotonic()
            verdict = validate_image(image, matrix, REPO, Options(store=False, reports=Path(reports), peers=peers),
                                     log=lambda line: None)
            total = time.monotonic() - start
            start = time.monotonic()
            validate_image(image, matrix, REPO, Options(store=False, reports=Path(reports),
                                                        select=SAME_CHECKS[frameworks[image]]), log=lambda line: None)
            same = time.monotonic() - start
            by_check: dict[str, float] = defaultdict(float)
            for test in verdict["tests"]:
                by_check[test["id"].split("::")[0].removeprefix("image-tests/")] += test["duration_s"]
            resolved = resolve(image, lambda line: None)
            cell = next(c for c in matrix.cells if c.key == verdict["cell"])
            flags, _ = probe_flags(resolved.run_ref, run_flags(cell, resolved.labels, [], print), print)
            manual_total, manual = manual_baseline(resolved.run_ref, cell.framework, flags)
            rows.append((image, verdict, total, by_check, manual_total, manual, same))

    for image, verdict, total, by_check, manual_total, manual, same in rows:
        counts = {k: sum(t["result"] == k for t in verdict["tests"]) for k in ("passed", "failed", "skipped")}
        print(f"\n{image}  ({verdict['cell']}, {verdict['result']}: {counts['passed']} passed, "
              f"{counts['failed']} failed, {counts['skipped']} skipped)")
        print(f"  buildtool validate, all groups        {total:7.1f} s   (target < 90 s)")
        for name, seconds in sorted(by_check.items(), key=lambda kv: -kv[1]):
            print(f"    {name:<36}{seconds:7.1f} s")
        print(f"  by hand: the same probes, one docker run each {manual_total:5.1f} s")
        for name, seconds in manual.items():
            print(f"    {name:<36}{seconds:7.1f} s")
        print(f"  buildtool validate, only those checks  {same:7.1f} s")
        print(f"  ratio validate / by hand, same checks: {same / manual_total:.2f}; "
              f"all groups / by hand: {total / manual_total:.2f} (rendezvous, cross-framework, timeouts on top)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
