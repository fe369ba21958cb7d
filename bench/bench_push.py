"""Pushing a built image from the engine to a registry on loopback: the ways a user could do it, side by side.

Arms, each a whole process pushing the same image into an *empty* registry (a throwaway
docker-registry on 127.0.0.1:5055, its storage deleted before every push, so no blob is ever
already there and nothing is skipped by accident):

- engine:        `docker push` (what `buildtool build --push` does, through the Docker SDK: the engine
                 compresses each layer with gzip and uploads up to 5 layers at once);
- skopeo:        `skopeo copy docker-daemon:IMAGE docker://...` (reads the image from the engine's
                 `docker save` stream, compresses with containers/image's parallel gzip);
- skopeo-fast:   the same with `--dest-compress-level 1`.

Each push is checked: the registry must serve a manifest whose config is the engine's image id (the
same image, not a re-encoding of its config). Runs interleaved, medians printed; asserts nothing
about time.

    python bench/bench_push.py [IMAGE] [--runs 3]     # default: this commit's pytorch-cpu dev image
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from buildtool.common import docker_cli  # noqa: E402

PORT = 5055
HOST = f"127.0.0.1:{PORT}"
MANIFEST_TYPES = ", ".join(["application/vnd.docker.distribution.manifest.v2+json",
                            "application/vnd.oci.image.manifest.v1+json"])


def start_registry(storage: Path) -> subprocess.Popen[bytes]:
    config = storage.parent / "registry.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {storage}\n"
                      f"http:\n  addr: {HOST}\n")
    proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://{HOST}/v2/", timeout=1)
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the throwaway registry did not start on {HOST}")


def served_config(repo: str, tag: str) -> str:
    request = urllib.request.Request(f"http://{HOST}/v2/{repo}/manifests/{tag}", headers={"Accept": MANIFEST_TYPES})
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(json.load(response)["config"]["digest"])


def push(arm: str, image: str, repo: str, tag: str) -> float:
    target = f"{HOST}/{repo}:{tag}"
    if arm == "engine":
        subprocess.run(docker_cli.argv("tag", image, target), check=True)
        argv = docker_cli.argv("push", target)
    else:
        argv = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"docker-daemon:{image}", f"docker://{target}"]
        if arm == "skopeo-fast":
            argv[2:2] = ["--dest-compress-level", "1"]
    try:
        started = time.monotonic()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        seconds = time.monotonic() - started
    finally:
        if arm == "engine":   # however the push ended: a failed one left the tag in the engine
            removed = subprocess.run(docker_cli.argv("rmi", target), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
    if arm == "engine" and removed.returncode != 0:
        raise SystemExit(f"docker rmi {target} failed: {removed.stderr.strip()}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image", nargs="?")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.runs < 1:
        parser.exit(2, f"--runs {args.runs}: give 1 or more runs\n")
    image = args.image
    if not image:
        from buildtool.matrix.loader import load_matrix
        from buildtool.matrix.plan import Settings, git_revision, plan_cell

        cell = next(c for c in load_matrix(ROOT / "matrix.yaml").cells if c.key == "pytorch-cpu:2.13")
        image = plan_cell(cell, Settings.from_env(), git_revision(ROOT)).dev_ref
    inspect = subprocess.run(docker_cli.argv("image", "inspect", "-f", "{{.Id}} {{.Size}}", image), capture_output=True,
                             text=True)
    if inspect.returncode != 0:
        raise SystemExit(f"{image} is not in the engine: build it first (make build FRAMEWORK=pytorch-cpu)")
    image_id, size = inspect.stdout.split()
    arms = ("engine", "skopeo", "skopeo-fast")
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp:
        storage = Path(tmp, "storage")
        for run in range(1, args.runs + 1):
            for arm in arms:
                shutil.rmtree(storage, ignore_errors=True)
                storage.mkdir()
                registry = start_registry(storage)
                try:
                    seconds = push(arm, image, "bench/push", f"{arm}-{run}")
                    if served_config("bench/push", f"{arm}-{run}") != image_id:
                        raise SystemExit(f"{arm} pushed another config than the engine's image {image_id}")
                finally:
                    registry.terminate()
                    registry.wait()
                times[arm].append(seconds)
                print(f"run {run} {arm}: {seconds:.1f} s", file=sys.stderr)
    median = {arm: statistics.median(values) for arm, values in times.items()}
    print(f"\npush of {image} ({int(size) / 1e9:.2f} GB in the engine) to an empty registry on loopback: whole "
          f"processes, {args.runs} runs each, interleaved")
    for arm in arms:
        shown = ", ".join(f"{t:.1f}" for t in times[arm])
        print(f"  {arm:11}  median {median[arm]:6.1f} s  ({shown})  x{median[arm] / median['engine']:.2f} of engine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
