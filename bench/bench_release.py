"""Promote one CPU image three ways, side by side: `buildtool release`, `skopeo copy`, and
`docker pull` + `tag` + `push`; time and bytes moved each, at two image sizes.

    python3 bench/bench_release.py [--sizes 16,1500] [--repeat 3] [--registry 127.0.0.1:5000] [--docker /usr/bin/docker]

Each size gets its own CPU image (a `docker import` of a tarball: random bytes, plus the
torch CPU wheel from /opt/wheels for the big one, labelled as cell pytorch-cpu:2.13), pushed
under a throwaway `t-bench-<random>/` prefix and removed from the local engine so every pull
is cold. Bytes are counted by a TCP proxy (tests/faultproxy.py, tcp mode) that every client
goes through. The bench image has no image tests, so a verdict marked "bench fixture" is
stored for it in the bench prefix: this measures promotion mechanics, not validation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from buildtool.contracts import label_keys  # noqa: E402
from buildtool.matrix.plan import Settings  # noqa: E402
from buildtool.matrix.schema import load_matrix  # noqa: E402
from buildtool.registry.client import RegistryClient, RegistryError  # noqa: E402
from buildtool.release.promote import ReleaseOptions, release  # noqa: E402
from buildtool.validate.verdicts import store_verdict  # noqa: E402
from tests.faultproxy import FaultProxy  # noqa: E402

WHEELS = Path("/opt/wheels")
TIMEOUT = 900


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:3])} failed: {result.stderr.strip()[-400:]}")
    return result


def make_image(docker: str, ref: str, size_mb: int, cell_key: str, labels: dict[str, str], work: Path) -> None:
    """A CPU image of about size_mb MB: incompressible random bytes, plus the torch wheel when big enough."""
    tar_path = work / "rootfs.tar"
    with tarfile.open(tar_path, "w") as tar:
        left = size_mb << 20
        wheel = next(iter(sorted(WHEELS.glob("torch-*.whl"))), None) if WHEELS.is_dir() else None
        if wheel is not None and wheel.stat().st_size < left:
            tar.add(wheel, arcname=f"opt/{wheel.name}")
            left -= wheel.stat().st_size
        payload = work / "payload.bin"
        with payload.open("wb") as handle:
            while left > 0:
                chunk = min(left, 8 << 20)
                handle.write(os.urandom(chunk))
                left -= chunk
        tar.add(payload, arcname="opt/payload.bin")
    changes = [f"LABEL {k}={v}" for k, v in {**labels, label_keys.CELL: cell_key}.items()]
    argv = [docker, "import"]
    for change in changes:
        argv += ["--change", change]
    run([*argv, str(tar_path), ref])
    tar_path.unlink()


def measure(proxy: FaultProxy, action) -> tuple[float, int]:  # noqa: ANN001
    before = proxy.bytes_to_client + proxy.bytes_to_upstream
    start = time.perf_counter()
    action()
    return time.perf_counter() - start, proxy.bytes_to_client + proxy.bytes_to_upstream - before


def bench_size(args: argparse.Namespace, proxy: FaultProxy, size_mb: int, cell) -> list[dict]:  # noqa: ANN001
    prefix = f"t-bench-{uuid.uuid4().hex[:8]}"
    revision = uuid.uuid4().hex[:12]
    dev_repo = f"{prefix}/{cell.name}-dev"
    dev_tag = f"{revision}-{cell.version}"
    direct = f"{args.registry}/{dev_repo}:{dev_tag}"
    client = RegistryClient(args.registry)
    with tempfile.TemporaryDirectory() as tmp:
        make_image(args.docker, direct, size_mb, cell.key,
                   {label_keys.FRAMEWORK_VERSION: cell.framework_version}, Path(tmp))
    try:
        run([args.docker, "push", direct])
    finally:
        run([args.docker, "rmi", direct])       # cold pulls below: the engine does not hold the layers
    digest = client.manifest_digest(dev_repo, dev_tag)
    raw, _, _ = client.get_manifest(dev_repo, dev_tag)
    image_bytes = sum(layer["size"] for layer in json.loads(raw)["layers"])
    store_verdict(client, dev_repo, digest, {
        "schema": 1, "digest": digest, "image": direct, "cell": cell.key, "result": "passed",
        "started": "", "duration_s": 0.0, "test_code": "", "runner": {"hostname": "bench fixture", "gpus": []},
        "tests": [{"id": "bench/fixture", "group": "common", "result": "passed", "duration_s": 0.0,
                   "message": "bench fixture: promotion mechanics only, not an image test", "skip_reason": ""}],
        "figures": {}})
    via = proxy.address
    src = f"{via}/{dev_repo}:{dev_tag}"
    tag = f"{cell.version}-0.1.0"
    time.sleep(2)   # let the registry settle after the setup push (the measured runs start equal)

    def ours(dst_repo: str) -> None:
        settings = Settings(registry=f"{via}/{prefix}", release_registry=f"{via}/{dst_repo.rsplit('/', 1)[0]}")
        report = release([cell], settings, ReleaseOptions("0.1.0", revision))
        if not report.ok:
            raise SystemExit(f"release failed: {report.images[0].problems}")

    def skopeo(dst_repo: str) -> None:
        run(["timeout", str(TIMEOUT), args.skopeo, "copy", "--preserve-digests", "--src-tls-verify=false",
             "--dest-tls-verify=false", f"docker://{src}", f"docker://{via}/{dst_repo}:{tag}"])

    def docker_way(dst_repo: str) -> None:
        dst = f"{via}/{dst_repo}:{tag}"
        try:
            run([args.docker, "pull", "-q", src])
            run([args.docker, "tag", src, dst])
            run([args.docker, "push", dst])
        finally:   # cold again for the next repetition; these are the bench's own tags
            subprocess.run([args.docker, "rmi", src, dst], capture_output=True, timeout=120)

    methods = [("buildtool release (3 tags + verdict)", "rel-buildtool", ours),
               ("skopeo copy --preserve-digests (1 tag)", "rel-skopeo", skopeo),
               ("docker pull + tag + push (1 tag)", "rel-docker", docker_way)]
    rows, made = [], [dev_repo]
    for name, folder, action in methods:
        times, moved, kept = [], [], True
        for i in range(args.repeat):   # each repetition into a fresh repository
            dst_repo = f"{prefix}/{folder}-{i}/{cell.name}"
            made.append(dst_repo)
            seconds, nbytes = measure(proxy, lambda a=action, d=dst_repo: a(d))
            times.append(seconds)
            moved.append(nbytes)
            kept = kept and client.manifest_digest(dst_repo, tag) == digest
        rows.append({"size_mb": image_bytes / 1e6, "method": name, "seconds": statistics.median(times),
                     "runs": times, "moved": moved, "bytes": statistics.median(moved), "digest_kept": kept})
        if action is skopeo:
            # skopeo's blob-info cache learns where blobs live on its first copy and mounts them on
            # later ones; the first copy is what a fresh CI runner sees, so show it on its own too.
            rows.append({"size_mb": image_bytes / 1e6, "method": "skopeo copy, first copy (cold cache)",
                         "seconds": times[0], "runs": times[:1], "moved": moved[:1], "bytes": moved[0],
                         "digest_kept": kept})
    cleanup(client, made)
    return rows


def cleanup(client: RegistryClient, repos: list[str]) -> None:
    """Untag what the bench made (its own t-bench prefix); the registry's GC reclaims the blobs."""
    for repo in repos:
        digests = {client.manifest_digest(repo, tag) for tag in client.tags(repo)}
        for digest in filter(None, digests):
            try:
                client.request("DELETE", f"{repo}/manifests/{digest}", ok=(202, 404), repo=repo)
            except RegistryError as exc:
                print(f"cleanup of {repo}: {exc}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,1500", help="image sizes in MB, comma separated")
    parser.add_argument("--registry", default=os.environ.get("REGISTRY", "127.0.0.1:5000"))
    parser.add_argument("--docker", default="/usr/bin/docker")
    parser.add_argument("--skopeo", default="skopeo")
    parser.add_argument("--repeat", type=int, default=3, help="runs per method (median shown)")
    args = parser.parse_args()
    host, _, port = args.registry.partition(":")
    cell = {c.key: c for c in load_matrix(ROOT / "matrix.yaml", ROOT / "templates").cells}["pytorch-cpu:2.13"]
    results = []
    with FaultProxy(upstream=(host, int(port or 80)), mode="tcp") as proxy:
        for size in (int(s) for s in args.sizes.split(",")):
            results += bench_size(args, proxy, size, cell)
    print(f"median of {args.repeat} runs each (each into a fresh repository); bytes counted by a TCP proxy that "
          "every client goes through. buildtool release also gates, locks, verifies and copies the verdict.")
    print(f"{'image MB':>9} {'method':<40} {'seconds':>8} {'MB moved':>9} {'digest kept':>11} {'x slower':>9}")
    for size in sorted({r["size_mb"] for r in results}):
        rows = [r for r in results if r["size_mb"] == size]
        ours = rows[0]["seconds"]
        for r in rows:
            print(f"{size:9.1f} {r['method']:<40} {r['seconds']:8.2f} {r['bytes'] / 1e6:9.2f} "
                  f"{'yes' if r['digest_kept'] else 'NO':>11} {r['seconds'] / ours:9.1f}")
    print("every run (seconds / MB moved):")
    for r in results:
        runs = ", ".join(f"{s:.2f}s/{b / 1e6:.1f}MB" for s, b in zip(r["runs"], r["moved"], strict=True))
        print(f"{r['size_mb']:9.1f} {r['method']:<40} {runs}")
    sizes = sorted({r["size_mb"] for r in results})
    if len(sizes) > 1:
        per = {m: [r["seconds"] for r in results if r["method"] == m] for m in dict.fromkeys(r["method"]
                                                                                             for r in results)}
        growth = ", ".join(f"{m.split(' (')[0]}: x{t[-1] / t[0]:.1f}" for m, t in per.items())
        print(f"time at {sizes[-1]:.0f} MB vs {sizes[0]:.0f} MB: {growth}")
    print(json.dumps(results), file=sys.stderr)


if __name__ == "__main__":
    main()
