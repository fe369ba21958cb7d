"""The base step and the image digest on two fresh machines (issue 52): before and after the reproducible base.

Two machines are simulated one after the other (tests/fresh_machine.py: each its own empty dockerd, its own empty
registry on the same port, own config and cache folders, a clone of HEAD). On each, whole processes, timed:

- before: what made the Debian base until issue 52, as a user would run it: `debootstrap --variant=minbase
  bookworm DIR`, `tar -C DIR -c . | docker import - REF`, `docker push REF` (the engine dates the imported
  config by the wall clock);
- after:  `buildtool bases --framework pytorch-cpu:2.13` (mmdebstrap with SOURCE_DATE_EPOCH from the archive's
  InRelease, written to the registry by the toolkit);
- then `buildtool build --framework pytorch-cpu:2.13 --push` on the after base (skipped with --no-image).

Prints each machine's base step seconds and digests before and after, the ratio after/before, whether the two
machines' digests are equal, the archive state (InRelease sha256) each after base records, and the two pushed
image digests. Exits 1 when the after bases or the images differ while the archive state was the same; asserts
nothing about time. Everything the machines started is stopped and removed.

    python bench/bench_fresh_machines.py [--no-image]      # as root
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

from buildtool.common import docker_cli  # noqa: E402
from buildtool.common.net import free_port  # noqa: E402
from buildtool.contracts import label_keys  # noqa: E402
from tests.fresh_machine import CELL, FreshMachine, head_commit  # noqa: E402


def before_recipe(machine: FreshMachine) -> tuple[float, str]:
    """debootstrap, docker import, docker push, as one timed sequence: (seconds, the pushed digest)."""
    ref = f"{machine.registry}/before/debian:bookworm-slim"
    env = machine.env()
    with tempfile.TemporaryDirectory(prefix="bench-debootstrap-") as tmp:
        started = time.monotonic()
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", f"{tmp}/rootfs"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", f"{tmp}/rootfs", "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        try:
            subprocess.run(docker_cli.argv("import", "-", ref), stdin=tar.stdout, env=env, check=True,
                           stdout=subprocess.DEVNULL, timeout=900)
        finally:    # a failed import leaves no tar blocked on a pipe nobody reads
            tar.stdout.close()
            tar.wait(timeout=60)
        # An import reads whatever the stream held: a tar that failed half-way made a partial base, timed as one.
        if tar.returncode != 0:
            raise SystemExit(f"machine {machine.name}: tar of the debootstrap root failed (exit {tar.returncode}); "
                             "the before recipe is not timed")
        subprocess.run(docker_cli.argv("push", ref), env=env, check=True, stdout=subprocess.DEVNULL, timeout=900)
        seconds = time.monotonic() - started
    return seconds, machine.manifest_digest("before/debian", "bookworm-slim")


def one_machine(name: str, port: int, net: int, commit: str, image: bool) -> dict[str, object]:
    with FreshMachine(name, port, net) as machine:
        checkout = machine.checkout(commit)
        before_s, before = before_recipe(machine)
        print(f"machine {name}: before {before_s:.1f} s {before}", file=sys.stderr)
        after_s, after = machine.make_base(checkout)
        labels = machine.config("library/debian", after)["config"]["Labels"]   # type: ignore[index]
        print(f"machine {name}: after {after_s:.1f} s {after}", file=sys.stderr)
        found: dict[str, object] = {"before_s": before_s, "before": before, "after_s": after_s, "after": after,
                                    "archive": labels[label_keys.BASE_ARCHIVE]}
        if image:
            started = time.monotonic()
            found["image"] = machine.push_cell(checkout)["digest"]
            found["image_s"] = time.monotonic() - started
            print(f"machine {name}: {CELL} {found['image']} in {found['image_s']:.0f} s", file=sys.stderr)
        return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-image", action="store_true", help="only the base step")
    args = parser.parse_args()
    port, commit = free_port(), head_commit()     # one commit for both, whatever HEAD does meanwhile
    print(f"commit {commit}", file=sys.stderr)
    runs = {name: one_machine(name, port, net, commit, not args.no_image) for name, net in (("a", 249), ("b", 250))}
    a, b = runs["a"], runs["b"]
    print("| machine | base step before (debootstrap, import, push) | after (buildtool bases, mmdebstrap) | "
          "after/before | image |")
    print("|---|---|---|---|---|")
    for name, run in runs.items():
        ratio = float(run["after_s"]) / float(run["before_s"])   # type: ignore[arg-type]
        print(f"| {name} | {run['before_s']:.1f} s, {run['before']} | {run['after_s']:.1f} s, {run['after']} | "
              f"{ratio:.2f} | {run.get('image', 'not built')} |")
    before_median = statistics.median([float(r["before_s"]) for r in runs.values()])  # type: ignore[arg-type]
    after_median = statistics.median([float(r["after_s"]) for r in runs.values()])    # type: ignore[arg-type]
    print(f"base step, median of the two machines: before {before_median:.1f} s, after {after_median:.1f} s "
          f"(ratio {after_median / before_median:.2f})")
    print(f"archive state: {a['archive']}" + ("" if a["archive"] == b["archive"] else f" then {b['archive']}"))
    print(f"base digests equal: before {a['before'] == b['before']}, after {a['after'] == b['after']}")
    if "image" in a:
        print(f"{CELL} digests equal: {a['image'] == b['image']} ({a['image']}, {b['image']})")
    same_state = a["archive"] == b["archive"]
    return 1 if same_state and (a["after"] != b["after"] or a.get("image") != b.get("image")) else 0


if __name__ == "__main__":
    raise SystemExit(main())
