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

Everything runs in a registry namespace of its own (127.0.0.1:5000/bench-<random>), removed
at the end. Needs the engine and local registry (bash scripts/setup.sh). Run:
    python bench/bench_build.py [--cell pytorch-cpu:2.13] [--skip-cold]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from buildtool.imagebuild import engine  # noqa: E402
from buildtool.imagebuild.pipconfig import pip_secrets  # noqa: E402
from buildtool.matrix.loader import load_matrix  # noqa: E402
from buildtool.matrix.plan import mirror_base  # noqa: E402
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
    with pip_secrets() as pip:
        files = dict(pip.files)
        argv = [*client.argv, "--network", "host", *(["--platform", platform] if platform else []),
                "-f", str(dockerfile), "-t", tag, "--build-arg", f"BASE_IMAGE={base}", "--progress=plain"]
        for key, value in sorted((build_args or {}).items()):
            argv += ["--build-arg", f"{key}={value}"]
        argv += ["--no-cache"] if no_cache else []
        for sid, path in sorted(files.items()):
            argv += ["--secret", f"id={sid},src={path}"]
        started = time.perf_counter()
        run = subprocess.run([*argv, str(context or dockerfile.parent)], capture_output=True, text=True, timeout=7200,
                             env={**os.environ, **dict(client.env)})
        elapsed = time.perf_counter() - started
    if run.returncode != 0:
        raise SystemExit(f"docker build{f' --platform {platform}' if platform else ''} failed:\n"
                         f"{run.stdout[-2000:]}")
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
    for repo in registry.request("GET", "_catalog?n=1000").json().get("repositories") or []:
        if repo.startswith(f"{namespace}/"):
            for tag in registry.tags(repo):
                digest = registry.manifest_digest(repo, tag)
                if digest:
                    registry.request("DELETE", f"{repo}/manifests/{digest}", ok=(202, 404), repo=repo)


def mb(size: int) -> str:
    return f"{size / 1e6:,.0f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cell", default="pytorch-cpu:2.13", help="cell for (a) and (b)")
    parser.add_argument("--skip-cold", action="store_true", help="skip (c), the cold builds of every CPU cell")
    args = parser.parse_args()
    matrix = load_matrix(ROOT / "matrix.yaml", ROOT / "templates")
    cell = next((c for c in matrix.cells if c.key == args.cell), None)
    if cell is None:
        raise SystemExit(f"unknown cell {args.cell}")
    namespace = f"bench-{secrets.token_hex(4)}"
    env = {"REGISTRY": f"{LOCAL}/{namespace}", "BASE_MIRROR": LOCAL}
    plain_tag = f"{LOCAL}/{namespace}/plain:{secrets.token_hex(4)}"
    local_tags = [plain_tag]
    print(f"engine: {engine.resolve_build_client().describe()}; registry namespace {LOCAL}/{namespace}")
    try:
        # The registry holds the image, built (or reused) at an earlier "commit".
        buildtool(["-f", cell.key, "--push", "--revision", "bench-earlier"], env)
        # (a) a new commit on a runner: ours consults the registry first and retags there.
        ours_a, result_a = buildtool(["-f", cell.key, "--revision", "bench-fresh"], env)
        assert result_a["result"] == "retagged", result_a
        plain_a = plain_docker_build(ROOT / cell.dockerfile, plain_tag, no_cache=True)
        # (b) warm no-op of the same cell and commit, against a fully cached plain build.
        buildtool(["-f", cell.key, "--revision", "bench-warm", "--push"], env)
        ours_b, result_b = buildtool(["-f", cell.key, "--revision", "bench-warm", "--push"], env)
        assert result_b["result"] == "up to date", result_b
        plain_b = plain_docker_build(ROOT / cell.dockerfile, plain_tag, no_cache=False)
        print()
        print(f"{'scenario':58} {'buildtool':>10} {'docker build':>13} {'ratio':>8}  target")
        print(f"{'(a) fresh runner, image in registry (' + cell.key + ')':58} {ours_a:9.2f}s {plain_a:12.2f}s "
              f"{plain_a / ours_a:7.1f}x  >= 20x")
        print(f"{'(b) warm no-op (' + cell.key + ')':58} {ours_b:9.2f}s {plain_b:12.2f}s "
              f"{plain_b / ours_b:7.1f}x  buildtool < 1 s")
        if args.skip_cold:
            return
        print()
        print(f"{'(c) cold build':22} {'seconds':>8} {'image':>10} {'installed':>10} {'overhead':>9} "
              f"{'base':>8} {'venv':>9} {'pip cache':>9} {'apt lists':>9}  target <= 15%")
        for cpu in (c for c in matrix.cells if c.accelerator == "cpu"):
            seconds, result = buildtool(["-f", cpu.key, "--force", "--revision", "bench-cold"], env)
            ref = result["ref"]
            local_tags.append(ref)
            size = int(engine.image_attrs(ref)["Size"])  # type: ignore[index]
            base = engine.image_attrs(mirror_base(cpu.base, LOCAL))
            base_size = int(base["Size"]) if base else 0
            sizes = installed_sizes(ref)
            overhead = size / sizes["fs"] - 1
            print(f"{cpu.key:22} {seconds:8.1f} {mb(size):>10} {mb(sizes['fs']):>10} {overhead:8.1%} "
                  f"{mb(base_size):>8} {mb(sizes['venv']):>9} {mb(sizes['pip_cache']):>9} "
                  f"{mb(sizes['apt_lists']):>9}")
    finally:
        cleanup(namespace, local_tags)


if __name__ == "__main__":
    main()
