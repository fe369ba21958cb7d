"""A fresh runner's rebuild after a one-package lock bump, beside a cold build and a warm engine's rebuild.

What a nightly on an ephemeral runner pays: its engine is empty (`docker system prune -af`), while the
registry holds the previous dev image of the cell. Three arms build the *same* change, the pytorch-cpu
tools lock with one package moved (tzdata, a different release from PyPI, hash-pinned), each a whole
`buildtool build --framework pytorch-cpu` process:

- cold:   empty engine, `--no-registry-cache` (what every build was before the registry cache);
- fresh:  empty engine, registry cache on (the default): unchanged layers come from the previous image;
- warm:   an engine that built the previous image itself (its build cache and uv cache are there);
- pull:   no build: `docker pull` of the previous image into an empty engine, the floor of the fresh
          arm (a runnable image needs every unchanged layer in the engine, however it is built).

After each fresh arm its image is pushed both ways `buildtool build --push` could (push_path): by the
engine, which skips the layers it pulled from the registry, and by skopeo, which cannot know them.

The engine is a private dockerd (its own data root and socket), wiped and restarted before each arm,
so the user's engine and images are never pruned. Builds do not push: each arm's result would
otherwise be found by content key by the next one. The previous image is built and pushed once, to a
namespace of its own in the local registry (its provenance signed with this machine's key, which a
loopback build trusts as a cache source); its tags and the pushes' are removed from the registry however
the bench ends. Every arm's image must have the same layers (diff IDs):
like for like, or the bench fails. Runs interleaved, medians printed; asserts nothing about time.

    python bench/bench_fresh_runner.py [--runs 3]     # as root, with the local registry up
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from buildtool.common import docker_cli  # noqa: E402
from buildtool.contracts import names  # noqa: E402
from buildtool.imagebuild.pipconfig import HostPip  # noqa: E402
from buildtool.registry.client import RegistryClient, RegistryError  # noqa: E402

CELL_LOCK = Path("dockerfiles/pytorch/pytorch-cpu/2.13/pylock.tools.toml")
BUMP = "tzdata"
BUMP_TO = "2025.2"            # the lock holds a newer release; any other release is a one-package bump
REGISTRY = "127.0.0.1:5000"
NAMESPACE = f"{REGISTRY}/bench-fresh-runner"
ENGINE = Path("/var/lib/dl-images-bench-engine")
SOCKET = "/run/dl-images-bench-engine.sock"
EXEC_ROOT = "/run/dl-images-bench-engine"
PIDFILE = "/run/dl-images-bench-engine.pid"
# A bridge of the bench engine's own. Not `--bridge=none`: a dockerd started with it deletes the host's
# docker0, and the user's engine then fails every container on its default network ("could not find
# bridge docker0") until it is restarted; that broke a test run here after a bench.
BRIDGE = "dl-bench0"
BRIDGE_ADDRESS = "172.31.254.1/24"


def engine_env() -> dict[str, str]:
    return {**os.environ, "DOCKER_HOST": f"unix://{SOCKET}", "REGISTRY": NAMESPACE, "BASE_MIRROR": REGISTRY}


_ENGINE: list[subprocess.Popen[bytes]] = []     # the private dockerd this process started


def own_bridge() -> None:
    """Create the bench engine's bridge (with an address: dockerd needs one on a bridge it is given)."""
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0:
        return
    for argv in (["ip", "link", "add", BRIDGE, "type", "bridge"], ["ip", "addr", "add", BRIDGE_ADDRESS, "dev", BRIDGE],
                 ["ip", "link", "set", BRIDGE, "up"]):
        subprocess.run(argv, check=True, capture_output=True)


def remove_bridge() -> None:
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def stop_engine() -> None:
    """Stop the private dockerd (this process's child: waited for, so it leaves no zombie)."""
    while _ENGINE:
        proc = _ENGINE.pop()
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def empty_engine() -> None:
    """Stop the private engine, delete everything it held, start it again: a runner's first boot."""
    stop_engine()
    shutil.rmtree(ENGINE, ignore_errors=True)
    ENGINE.mkdir(parents=True)
    own_bridge()
    log = open(ENGINE.parent / "dl-images-bench-engine.log", "ab")  # noqa: SIM115 - dockerd keeps it
    argv = ["dockerd", "--data-root", str(ENGINE), "--exec-root", EXEC_ROOT, "--pidfile", PIDFILE,
            "-H", f"unix://{SOCKET}", "--iptables=false", "--ip-forward=false", "--ip-masq=false", f"--bridge={BRIDGE}"]
    _ENGINE.append(subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True))
    for _ in range(120):
        if subprocess.run(docker_cli.argv("info"), env=engine_env(), capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    raise SystemExit("the bench engine did not start (see /var/lib/dl-images-bench-engine.log)")


def clone(dest: Path) -> None:
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)


def bump_lock(checkout: Path) -> str:
    """Move BUMP to BUMP_TO in the tools lock (its wheel's URL and sha256 as PyPI's JSON API lists them, as uv
    would write them), and commit it."""
    import requests

    found = requests.get(f"https://pypi.org/pypi/{BUMP}/{BUMP_TO}/json", timeout=30,
                         verify=HostPip.from_host().cert or True).json()
    wheel = next(u for u in found["urls"] if u["packagetype"] == "bdist_wheel")
    lock = checkout / CELL_LOCK
    entry = (f'[[packages]]\nname = "{BUMP}"\nversion = "{BUMP_TO}"\nwheels = [{{ url = "{wheel["url"]}", '
             f'hashes = {{ sha256 = "{wheel["digests"]["sha256"]}" }} }}]\n\n')
    text, count = re.subn(rf'(?ms)^\[\[packages\]\]\nname = "{BUMP}"\n.*?(?=^\[)', entry, lock.read_text())
    if count != 1:
        raise SystemExit(f"{CELL_LOCK} has no single {BUMP} entry to bump")
    lock.write_text(text)
    git = ["git", "-C", str(checkout), "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    subprocess.run([*git, "commit", "-qam", f"bench: {BUMP} {BUMP_TO}"], check=True)
    return subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def build(checkout: Path, *extra: str) -> tuple[float, list[str], str, dict[str, str]]:
    """One whole `buildtool build` process: (seconds, the image's diff IDs, its build log, its result)."""
    argv = [sys.executable, "-m", "buildtool", "build", "--framework", "pytorch-cpu", "--json", *extra]
    started = time.monotonic()
    run = subprocess.run(argv, cwd=checkout, env=engine_env(), capture_output=True, text=True)
    seconds = time.monotonic() - started
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(argv[2:])} failed in {checkout}:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    (result,) = json.loads(run.stdout)["results"]
    if result["result"] not in ("built", "pushed"):
        raise SystemExit(f"expected a build, got {result['result']}: {result['message']}")
    inspect = subprocess.run(docker_cli.argv("image", "inspect", "-f", "{{json .RootFS.Layers}}", result["ref"]),
                             env=engine_env(), capture_output=True, text=True, check=True)
    return seconds, json.loads(inspect.stdout), Path(result["log"]).read_text(errors="replace"), result


def push(via: str, ref: str, run: int) -> float:
    """Push the fresh arm's image to a repository beside the cell's (so no later arm finds it by content key)
    by the engine or by skopeo, as `buildtool build --push` would; whole process, seconds."""
    target = f"{NAMESPACE}/push-bench:{via}-{run}"
    subprocess.run(docker_cli.argv("tag", ref, target), env=engine_env(), check=True)
    argv = (docker_cli.argv("push", "-q", target) if via == "engine" else
            ["skopeo", "copy", "--quiet", "--src-daemon-host", f"unix://{SOCKET}", "--dest-tls-verify=false",
             f"docker-daemon:{target}", f"docker://{target}"])
    started = time.monotonic()
    subprocess.run(argv, env=engine_env(), check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def registry_repos() -> list[str]:
    """The repositories the bench writes in the local registry: the cell's dev repository and the pushes'."""
    namespace = NAMESPACE.removeprefix(f"{REGISTRY}/")
    return [names.dev_repo(namespace, "pytorch-cpu"), f"{namespace}/push-bench"]


def clean_registry(client: RegistryClient) -> None:
    """Untag every manifest of the bench's repositories (the registry's GC reclaims the blobs); a failure is said,
    and the rest cleaned all the same."""
    for repo in registry_repos():
        try:
            for digest in filter(None, {client.manifest_digest(repo, tag) for tag in client.tags(repo)}):
                client.request("DELETE", f"{repo}/manifests/{digest}", ok=(202, 404), repo=repo)
        except RegistryError as exc:
            print(f"cleanup of {REGISTRY}/{repo}: {exc}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.runs < 1:
        parser.exit(2, f"--runs {args.runs}: give 1 or more runs\n")
    if os.geteuid() != 0:
        raise SystemExit("run as root: the bench starts a private dockerd")
    times: dict[str, list[float]] = {"cold": [], "fresh": [], "warm": [], "pull": [], "push-engine": [],
                                     "push-skopeo": []}
    layers: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fresh-") as tmp:
        previous, change = Path(tmp, "previous"), Path(tmp, "change")
        clone(previous)
        clone(change)
        revision = bump_lock(change)
        print(f"previous: {ROOT.name} HEAD; change: {revision} ({BUMP} -> {BUMP_TO} in {CELL_LOCK})", file=sys.stderr)
        try:
            empty_engine()
            seconds, _, _, pushed = build(previous, "--push", "--force")   # last night's image, with its provenance
            pinned = f"{pushed['ref'].rpartition(':')[0]}@{pushed['digest']}"
            print(f"previous image built and pushed to {NAMESPACE} in {seconds:.1f} s", file=sys.stderr)
            for run in range(1, args.runs + 1):
                for arm in ("cold", "fresh", "warm", "pull"):
                    empty_engine()
                    if arm == "pull":    # the floor: the unchanged layers must reach the engine whatever builds
                        started = time.monotonic()
                        subprocess.run(docker_cli.argv("pull", "-q", pinned), env=engine_env(), check=True,
                                       stdout=subprocess.DEVNULL)
                        times[arm].append(time.monotonic() - started)
                        print(f"run {run} pull: {times[arm][-1]:.1f} s", file=sys.stderr)
                        continue
                    if arm == "warm":
                        build(previous, "--force")     # the runner built last night's image itself
                    seconds, diff_ids, log, built = build(change, *(["--no-registry-cache"] if arm == "cold" else []))
                    if arm == "fresh" and "importing cache manifest from" not in log:
                        raise SystemExit("the fresh runner's build imported no registry cache (see its log)")
                    if layers.setdefault("first", diff_ids) != diff_ids:
                        raise SystemExit(f"{arm} run {run} built other layers than the first arm: not like for like")
                    times[arm].append(seconds)
                    print(f"run {run} {arm}: {seconds:.1f} s", file=sys.stderr)
                    if arm == "fresh":
                        for via in (("engine", "skopeo") if run % 2 else ("skopeo", "engine")):
                            times[f"push-{via}"].append(push(via, built["ref"], run))
                            print(f"run {run} push-{via}: {times[f'push-{via}'][-1]:.1f} s", file=sys.stderr)
        finally:
            stop_engine()
            shutil.rmtree(ENGINE, ignore_errors=True)
            remove_bridge()
            clean_registry(RegistryClient(REGISTRY))   # the previous image and the pushes: the shared registry's
    median = {arm: statistics.median(values) for arm, values in times.items()}
    print(f"\npytorch-cpu rebuild after a one-package lock bump ({BUMP} -> {BUMP_TO}): whole `buildtool build` "
          f"processes, no push, {args.runs} runs each, interleaved")
    for arm, what in (("cold", "empty engine, no registry cache"), ("fresh", "empty engine, registry cache"),
                      ("warm", "engine that built the previous image"),
                      ("pull", "empty engine, `docker pull` of the previous image alone (no build)")):
        shown = ", ".join(f"{t:.1f}" for t in times[arm])
        print(f"  {arm:5}  median {median[arm]:6.1f} s  ({shown})  {what}")
    print(f"  fresh / warm = {median['fresh'] / median['warm']:.2f}x  (target <= 2x)")
    print(f"  cold / fresh = {median['cold'] / median['fresh']:.2f}x  (target >= 5x)")
    print(f"  fresh - pull = {median['fresh'] - median['pull']:.1f} s: the build itself once the layers are in")
    print(f"  push of the fresh arm's image, registry holding the previous one: engine median "
          f"{median['push-engine']:.1f} s ({', '.join(f'{t:.1f}' for t in times['push-engine'])}), skopeo median "
          f"{median['push-skopeo']:.1f} s ({', '.join(f'{t:.1f}' for t in times['push-skopeo'])})")
    print(f"  layers identical in every arm: {len(layers['first'])} diff IDs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
