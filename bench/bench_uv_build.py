"""Benchmark: today's pip install path against the locked uv + cache-mount path, side by side.

For one pip-installed cell (default pytorch-cpu:2.13), several rounds, the two paths in turn:
- cold build of the pip path: the Dockerfile as `buildtool` rendered it before locks (apt,
  venv, `pip install --no-cache-dir` of the framework, then of the tools);
- cold build of the uv path: the cell's rendered Dockerfile and its committed locks;
- rebuild after bumping one tool package (tensorboard 2.21.0 -> 2.20.0; for uv the locks are
  re-resolved with `buildtool lock`'s code, keeping every other pin) on top of each cold build,
  and whether the framework layer was reused (BuildKit prints CACHED for it).

"Cold" means nothing of this Dockerfile is in the build cache: a unique CACHE_EPOCH build arg
after the first FROM changes every step's cache key, and the uv cache mount gets a unique id,
so neither layers nor uv's download cache help. The engine's cache is shared with others and
is never pruned wholesale: only the cache mounts this run created are removed at the end.
Both paths get the same pip settings, CA bundle and loopback file server (`pip_secrets`), the
same base and host networking, through the same docker client.

Prints each round, the medians, the ratios (pip / uv) and the image sizes; exits 1 when a
target is missed: cold >= 1.5x faster, rebuild after the bump < 20 s with the framework layer
reused, image not larger. Needs the engine and local registry (bash scripts/setup.sh).
    python bench/bench_uv_build.py [--cell pytorch-cpu:2.13] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from buildtool.common import docker_cli  # noqa: E402
from buildtool.contracts.locks import FRAMEWORK_LOCK, TOOLS_LOCK  # noqa: E402
from buildtool.imagebuild import engine  # noqa: E402
from buildtool.imagebuild.cell_inputs import secret_strings  # noqa: E402
from buildtool.imagebuild.lock import Pins, compile_cell, read_locks  # noqa: E402
from buildtool.imagebuild.pipconfig import HostPip, pip_secrets  # noqa: E402
from buildtool.matrix.loader import load_matrix  # noqa: E402
from buildtool.matrix.plan import mirror_base  # noqa: E402

LOCAL = "127.0.0.1:5000"
BUMP = ("tensorboard", "2.20.0")
TARGET_COLD_RATIO = 1.5
TARGET_REBUILD_S = 20.0


def legacy_dockerfile(cell, packages: dict[str, str]) -> str:
    """The pip path as `buildtool render` wrote it before locks (templates at commit c140198)."""
    extra = "".join(f"      --extra-index-url {u} \\\n" for u in cell.extra_index_urls)
    index = f"      --index-url {cell.index_url} \\\n" if cell.index_url else ""
    framework = " \\\n".join(f'      "{r}"' for r in cell.framework_requirements)
    tools = " \\\n".join(f'      "{n}=={v}"' for n, v in packages.items())
    apt = " ".join(["ca-certificates", "python3", "python3-venv", *cell.apt_packages])
    pip = ("RUN --mount=type=secret,id=pip.conf \\\n    --mount=type=secret,id=pip-ca \\\n"
           "    PIP_CONFIG_FILE=/run/secrets/pip.conf python -m pip install --no-cache-dir \\\n")
    return f"""\
ARG BASE_IMAGE={cell.base}
FROM ${{BASE_IMAGE}}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG CACHE_EPOCH=0
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \\
 && apt-get install -y --no-install-recommends {apt} \\
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
ENV VIRTUAL_ENV=/opt/venv \\
    PATH=/opt/venv/bin:$PATH \\
    PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv "$VIRTUAL_ENV"
{pip}{index}{extra}{framework}
{pip}{tools}
RUN mkdir -p /workspace && chmod 1777 /workspace
WORKDIR /workspace
"""


def cold_variant(dockerfile: str, cache_id: str) -> str:
    """Every step's cache key made unique (CACHE_EPOCH after the first FROM), the uv cache too."""
    first = re.search(r"^FROM .*$", dockerfile, re.M)
    assert first is not None
    text = dockerfile[:first.end()] + "\nARG CACHE_EPOCH=0" + dockerfile[first.end():]
    return text.replace("id=dl-images-uv,", f"id={cache_id},")


class Bench:
    def __init__(self, cell, client: engine.BuildClient, secret_files: dict[str, Path], tmp: Path, tag: str,
                 host: HostPip | None = None):
        self.cell, self.client, self.secrets, self.tmp, self.tag = cell, client, secret_files, tmp, tag
        # The index credentials (of `host`, default this machine's pip settings, as pip_secrets reads them): masked in
        # the build's log and errors, as the builder masks them.
        self.log_secrets = secret_strings(host if host is not None else HostPip.from_host())
        self.base = mirror_base(cell.base, LOCAL)
        self.images: list[str] = []

    def build(self, context: Path, name: str, epoch: str) -> tuple[float, int, str]:
        ref = f"{self.tag}/{name}:{epoch}"
        log = self.tmp / f"{name}-{epoch}.log"
        started = time.perf_counter()
        engine.build(self.client, engine.BuildRequest(
            context, context / "Dockerfile", build_args={"BASE_IMAGE": self.base, "CACHE_EPOCH": epoch}, labels={},
            secrets=self.secrets, log_path=log, tag=ref, log_secrets=self.log_secrets))
        elapsed = time.perf_counter() - started
        self.images.append(ref)
        size = int((engine.image_attrs(ref) or {}).get("Size", 0))
        return elapsed, size, log.read_text(errors="replace")


def framework_cached(log: str, marker: str) -> bool:
    """Did BuildKit reuse the step that installs the framework?"""
    steps: dict[str, str] = {}
    for line in log.splitlines():
        match = re.match(r"^#(\d+) (.*)$", line)
        if match:
            steps.setdefault(match[1], "")
            steps[match[1]] += match[2] + "\n"
    return any(marker in text.split("\n", 1)[0] and "CACHED" in text for text in steps.values())


_STEPS = (("apt-get", "apt"), ("venv", "venv"), ("/uv -r", "uv"), (FRAMEWORK_LOCK, "framework"),
          (TOOLS_LOCK, "tools"), ("exporting", "export"))


def step_times(log: str) -> list[tuple[str, float]]:
    """(step, seconds) of each BuildKit step that ran, from a --progress=plain log; pip-path steps
    are named by order (apt, venv, framework, tools)."""
    titles: dict[str, str] = {}
    done: list[tuple[str, float]] = []
    pip_steps = iter(("framework", "tools"))
    for line in log.splitlines():
        match = re.match(r"^#(\d+) (\[.*|exporting to image)$", line)
        if match and match[1] not in titles:
            text = match[2]
            name = next((n for key, n in _STEPS if key in text), "")
            if not name and "pip install" in text:
                name = next(pip_steps, "pip")
            titles[match[1]] = name or text[:20]
        match = re.match(r"^#(\d+) DONE ([0-9.]+)s", line)
        if match and float(match[2]) >= 0.3:
            done.append((titles.get(match[1], "?"), float(match[2])))
    return done


def cache_mounts() -> dict[str, str]:
    """The engine's cache mounts (id: description). An answer that cannot be read stops the bench: read as none,
    the mounts before the run were unknown and the clean-up at its end pruned every uv cache mount of the
    shared engine as if the run had made it."""
    run = docker_cli.docker("system", "df", "-v", "--format", "{{json .BuildCache}}", timeout=120)
    try:
        records = json.loads(run.stdout) if run.returncode == 0 else ()
    except ValueError:
        records = ()
    if records is None:    # `null`: an engine with no build cache at all
        records = []
    if not isinstance(records, list):
        said = (run.stderr or run.stdout).strip().splitlines()
        raise SystemExit(f"bench: `docker system df -v` gave no list of the build cache (exit {run.returncode}: "
                         f"{said[-1] if said else 'no output'}); no cache mount is pruned")
    return {r["ID"]: r.get("Description", "") for r in records if r.get("CacheType") == "exec.cachemount"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cell", default="pytorch-cpu:2.13")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.exit(2, f"--rounds {args.rounds}: give 1 or more rounds\n")
    matrix = load_matrix(ROOT / "matrix.yaml")
    cell = next((c for c in matrix.cells if c.key == args.cell), None)
    if cell is None or not cell.framework_requirements:
        print(f"--cell {args.cell}: name a pip-installed cell of matrix.yaml (e.g. pytorch-cpu:2.13)", file=sys.stderr)
        return 2
    folder = ROOT / cell.dockerfile
    host = HostPip.from_host()
    locks = read_locks(ROOT, cell)
    bumped_cell = replace(cell, packages=tuple((n, BUMP[1] if n == BUMP[0] else v) for n, v in cell.packages))
    print(f"re-locking {cell.key} with {BUMP[0]}=={BUMP[1]} (other pins kept)", file=sys.stderr)
    bumped = compile_cell(bumped_cell, host, Pins(locks, (BUMP[0],)), base=None,
                          log=lambda m: print(m, file=sys.stderr))
    framework_same = bumped[FRAMEWORK_LOCK] == (folder.parent / FRAMEWORK_LOCK).read_text()
    before = set(cache_mounts())
    client = engine.resolve_build_client()
    tag = f"bench-uv-{secrets.token_hex(3)}"
    rows: list[dict[str, float | int | bool]] = []
    with tempfile.TemporaryDirectory(prefix="bench-uv-") as tmpdir, pip_secrets(host) as pip:
        tmp = Path(tmpdir)
        bench = Bench(cell, client, pip.files, tmp, tag, host)
        try:
            for n in range(1, args.rounds + 1):
                row: dict[str, float | int | bool] = {}
                for path in ("pip", "uv") if n % 2 else ("uv", "pip"):
                    epoch = secrets.token_hex(6)
                    ctx = tmp / f"{path}-{epoch}"
                    ctx.mkdir()
                    if path == "pip":
                        text = legacy_dockerfile(cell, dict(cell.packages))
                        (ctx / "Dockerfile").write_text(cold_variant(text, ""))
                    else:
                        for item in folder.parent.iterdir():
                            if item.is_file():
                                shutil.copy(item, ctx / item.name)
                        (ctx / "Dockerfile").write_text(cold_variant(folder.read_text(), f"bench-uv-{epoch}"))
                    row[f"{path}_cold_s"], row[f"{path}_size"], log = bench.build(ctx, path, epoch)
                    steps = ", ".join(f"{t} {s:.1f}" for t, s in step_times(log))
                    print(f"  round {n} {path} cold steps: {steps}", file=sys.stderr)
                    # The same build after the bump, on top of the cold one.
                    if path == "pip":
                        bumped_text = legacy_dockerfile(cell, dict(bumped_cell.packages))
                        (ctx / "Dockerfile").write_text(cold_variant(bumped_text, ""))
                        marker = "pip install"
                    else:
                        for name, text in bumped.items():
                            (ctx / name).write_text(text)
                        marker = FRAMEWORK_LOCK
                    row[f"{path}_bump_s"], _, log = bench.build(ctx, f"{path}-bump", epoch)
                    row[f"{path}_framework_reused"] = framework_cached(log, marker)
                    steps = ", ".join(f"{t} {s:.1f}" for t, s in step_times(log))
                    print(f"  round {n} {path} rebuild steps: {steps}", file=sys.stderr)
                rows.append(row)
                print(json.dumps({"round": n, **{k: round(v, 1) if isinstance(v, float) else v
                                                  for k, v in row.items()}}), flush=True)
        finally:
            for ref in bench.images:
                docker_cli.docker("rmi", "-f", ref, timeout=120)
            for record, description in cache_mounts().items():
                if record not in before and "/run/uv/cache" in description:
                    docker_cli.docker("builder", "prune", "-f", "--filter", f"id={record}", timeout=300)

    def med(key: str) -> float:
        return statistics.median(float(r[key]) for r in rows)

    cold_ratio = med("pip_cold_s") / med("uv_cold_s")
    bump_ratio = med("pip_bump_s") / med("uv_bump_s")
    reused = all(bool(r["uv_framework_reused"]) for r in rows)
    size_ok = med("uv_size") <= med("pip_size")
    summary = {
        "cell": cell.key, "rounds": len(rows),
        "pip_cold_s": round(med("pip_cold_s"), 1), "uv_cold_s": round(med("uv_cold_s"), 1),
        "cold_ratio": round(cold_ratio, 2),
        "pip_bump_s": round(med("pip_bump_s"), 1), "uv_bump_s": round(med("uv_bump_s"), 1),
        "bump_ratio": round(bump_ratio, 2), "uv_framework_layer_reused": reused,
        "framework_lock_unchanged_by_bump": framework_same,
        "pip_size_mb": round(med("pip_size") / 1e6, 1), "uv_size_mb": round(med("uv_size") / 1e6, 1),
    }
    print(json.dumps(summary, indent=1))
    print(f"cold build: pip {summary['pip_cold_s']} s, uv {summary['uv_cold_s']} s -> {cold_ratio:.2f}x "
          f"(target >= {TARGET_COLD_RATIO}x)\n"
          f"rebuild after {BUMP[0]} -> {BUMP[1]}: pip {summary['pip_bump_s']} s, uv {summary['uv_bump_s']} s "
          f"(target < {TARGET_REBUILD_S:.0f} s, framework layer reused: {reused})\n"
          f"image size: pip {summary['pip_size_mb']} MB, uv {summary['uv_size_mb']} MB (target: not larger)")
    met = cold_ratio >= TARGET_COLD_RATIO and med("uv_bump_s") < TARGET_REBUILD_S and reused and size_ok
    print("targets met" if met else "TARGET MISSED")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
