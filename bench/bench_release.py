"""Promote one CPU image three ways, side by side: `buildtool release`, `skopeo copy`, and
`docker pull` + `tag` + `push`; time and bytes moved each, at two image sizes.

    python3 bench/bench_release.py [--sizes 16,200] [--registry 127.0.0.1:5000] [--docker /usr/bin/docker]

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
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from buildtool.matrix import load_matrix  # noqa: E402
from buildtool.plan import Settings  # noqa: E402
from buildtool.registry import RegistryClient  # noqa: E402
from buildtool.release import ReleaseOptions, release  # noqa: E402
from buildtool.verdicts import store_verdict  # noqa: E402
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
    changes = [f"LABEL {k}={v}" for k, v in {**labels, "io.dl-images.cell": cell_key}.items()]
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
                   {"io.dl-images.framework-version": cell.framework_version}, Path(tmp))
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
    rows = []

    def ours() -> None:
        settings = Settings(registry=f"{via}/{prefix}", release_registry=f"{via}/{prefix}/rel-buildtool")
        report = release([cell], settings, ReleaseOptions("0.1.0", revision))
        if not report.ok:
            raise SystemExit(f"release failed: {report.images[0].problems}")

    seconds, moved = measure(proxy, ours)
    rows.append(("buildtool release (3 tags + verdict)", seconds, moved,
                 client.manifest_digest(f"{prefix}/rel-buildtool/{cell.name}", f"{cell.version}-0.1.0")))

    skopeo_dst = f"{prefix}/rel-skopeo/{cell.name}"
    seconds, moved = measure(proxy, lambda: run(
        ["timeout", str(TIMEOUT), args.skopeo, "copy", "--preserve-digests", "--src-tls-verify=false",
         "--dest-tls-verify=false", f"docker://{via}/{dev_repo}:{dev_tag}",
         f"docker://{via}/{skopeo_dst}:{cell.version}-0.1.0"]))
    rows.append(("skopeo copy --preserve-digests (1 tag)", seconds, moved,
                 client.manifest_digest(skopeo_dst, f"{cell.version}-0.1.0")))

    docker_dst = f"{prefix}/rel-docker/{cell.name}"
    src, dst = f"{via}/{dev_repo}:{dev_tag}", f"{via}/{docker_dst}:{cell.version}-0.1.0"

    def docker_way() -> None:
        run([args.docker, "pull", "-q", src])
        run([args.docker, "tag", src, dst])
        run([args.docker, "push", dst])

    try:
        seconds, moved = measure(proxy, docker_way)
    finally:
        subprocess.run([args.docker, "rmi", src, dst], capture_output=True, timeout=120)
    rows.append(("docker pull + tag + push (1 tag)", seconds, moved,
                 client.manifest_digest(docker_dst, f"{cell.version}-0.1.0")))
    return [{"size_mb": image_bytes / 1e6, "method": m, "seconds": s, "bytes": b, "digest_kept": d == digest}
            for m, s, b, d in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,200", help="image sizes in MB, comma separated")
    parser.add_argument("--registry", default=os.environ.get("REGISTRY", "127.0.0.1:5000"))
    parser.add_argument("--docker", default="/usr/bin/docker")
    parser.add_argument("--skopeo", default="skopeo")
    args = parser.parse_args()
    host, _, port = args.registry.partition(":")
    cell = {c.key: c for c in load_matrix(ROOT / "matrix.yaml", ROOT / "templates").cells}["pytorch-cpu:2.13"]
    results = []
    with FaultProxy(upstream=(host, int(port or 80)), mode="tcp") as proxy:
        for size in (int(s) for s in args.sizes.split(",")):
            results += bench_size(args, proxy, size, cell)
    print(f"{'image MB':>9} {'method':<40} {'seconds':>8} {'MB moved':>9} {'digest kept':>11} {'x slower':>9}")
    for size in sorted({r["size_mb"] for r in results}):
        rows = [r for r in results if r["size_mb"] == size]
        ours = rows[0]["seconds"]
        for r in rows:
            print(f"{size:9.1f} {r['method']:<40} {r['seconds']:8.2f} {r['bytes'] / 1e6:9.2f} "
                  f"{'yes' if r['digest_kept'] else 'NO':>11} {r['seconds'] / ours:9.1f}")
    sizes = sorted({r["size_mb"] for r in results})
    if len(sizes) > 1:
        per = {m: [r["seconds"] for r in results if r["method"] == m] for m in dict.fromkeys(r["method"]
                                                                                             for r in results)}
        growth = ", ".join(f"{m.split(' (')[0]}: x{t[-1] / t[0]:.1f}" for m, t in per.items())
        print(f"time at {sizes[-1]:.0f} MB vs {sizes[0]:.0f} MB: {growth}")
    print(json.dumps(results), file=sys.stderr)


if __name__ == "__main__":
    main()
