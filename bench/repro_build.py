"""Reproducibility report: two cold builds of the same commit of one cell, compared.

Builds the cell's rendered Dockerfile (and locks) twice with nothing of it in the build cache
(`--no-cache` and a unique uv cache mount: the shared engine's cache is never pruned wholesale;
no cache-busting build argument, which the config's history would record), then reports:
- package sets, by the SBOM probe (image-tests/scripts/packages.py): Python and Debian packages;
- layer digests (diff IDs) one by one;
- for every layer that differs, which files differ and how (content, mtime only, mode/owner,
  present in one build only), from `docker save` of both images.
- the image configs as built (their digests are the local image ids): which fields differ, with the
  reason when it is the engine's;
- the pushed image digests: each build pushed to the local registry the way `buildtool build --push`
  pushes (push_path's choice, then buildtool.imagebuild.repro_config: config times from SOURCE_DATE_EPOCH,
  the commit's time, and the inline cache kept apart under the cache tag), compared digest to digest.
Prints per layer `identical`/`DIFFERENT`, `layers identical: N/N` and `pushed image digests: equal` on
stderr, the JSON report on stdout. Makes the cell's base first when the registry lacks it or holds one of
an older recipe (`buildtool bases`). Exits 1 when a layer, the package sets or the pushed digests differ.
The local images, this run's cache mounts and the tags of its throw-away repository `repro-<hex>/<image>` in
the local registry (both pushes and their cache tags) are removed however the bench ends; --keep keeps that
repository to inspect the pushed images (the report names their digests).
    python bench/repro_build.py [--cell pytorch-cpu:2.13] [--keep]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import secrets
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_uv_build import LOCAL, cache_mounts  # noqa: E402

from buildtool.common import docker_cli  # noqa: E402
from buildtool.common.refs import split_repo  # noqa: E402
from buildtool.imagebuild import engine, push_path, repro_config  # noqa: E402
from buildtool.imagebuild.bases import fill_bases, push_verified  # noqa: E402
from buildtool.imagebuild.cell_inputs import secret_strings  # noqa: E402
from buildtool.imagebuild.contents import probe  # noqa: E402
from buildtool.imagebuild.pipconfig import HostPip, pip_secrets  # noqa: E402
from buildtool.matrix.loader import load_matrix  # noqa: E402
from buildtool.matrix.plan import git_full_revision, mirror_base  # noqa: E402
from buildtool.registry.client import RegistryClient, RegistryError  # noqa: E402


def layer_members(saved: tarfile.TarFile, name: str) -> dict[str, tuple[int, str, int, int]]:
    found = {}
    with tarfile.open(fileobj=saved.extractfile(name)) as inner:
        for member in inner:
            data = inner.extractfile(member) if member.isfile() else None
            content = hashlib.sha256(data.read()).hexdigest() if data else member.linkname
            found[member.name] = (int(member.mtime), content, member.mode, member.uid)
    return found


def compare_layers(first: Path, second: Path) -> list[dict[str, object]]:
    report = []
    with tarfile.open(first) as a, tarfile.open(second) as b:
        layers_a = json.load(a.extractfile("manifest.json"))[0]["Layers"]  # type: ignore[arg-type]
        layers_b = json.load(b.extractfile("manifest.json"))[0]["Layers"]  # type: ignore[arg-type]
        for n, (la, lb) in enumerate(zip(layers_a, layers_b, strict=True)):
            ma, mb = layer_members(a, la), layer_members(b, lb)
            kinds: collections.Counter[str] = collections.Counter()
            examples: dict[str, list[str]] = collections.defaultdict(list)
            for path in sorted(set(ma) | set(mb)):
                if path not in ma or path not in mb:
                    kind = "in one build only"
                elif ma[path] == mb[path]:
                    continue
                elif ma[path][1] != mb[path][1]:
                    kind = "content"
                elif ma[path][0] != mb[path][0]:
                    kind = "mtime only"
                else:
                    kind = "mode/owner"
                kinds[kind] += 1
                if len(examples[kind]) < 5:
                    examples[kind].append(path)
            report.append({"layer": n, "entries": len(ma), "differences": dict(kinds), "examples": dict(examples)})
    return report


# Config fields that differ between two builds of the same inputs with Docker 20.10's BuildKit (v0.8): the
# wall-clock time in `created` and every history entry (no SOURCE_DATE_EPOCH before BuildKit 0.11, no
# rewrite-timestamp before 0.13), and the inline cache's metadata (engine.INLINE_CACHE_ARG). The push path
# rewrites exactly these (buildtool.imagebuild.repro_config), so the pushed digests are compared too.
ENGINE_TIMES = "created", "history[].created", "moby.buildkit.cache.v0"
ENGINE_REASON = ("the engine stamps config `created` and every history entry's `created` with the build's "
                 "wall-clock time (Docker 20.10 / BuildKit v0.8: no SOURCE_DATE_EPOCH, which BuildKit >= 0.11 "
                 "honours) and the inline cache writes its metadata; the push path normalises both "
                 "(repro_config: see `pushed`)")


def config_differences(a: object, b: object, path: str = "") -> list[str]:
    """JSON paths where two image configs differ (list items as `[]`, so history entries group)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return sorted({d for key in set(a) | set(b)
                       for d in config_differences(a.get(key), b.get(key), f"{path}.{key}" if path else key)})
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return sorted({d for x, y in zip(a, b, strict=True) for d in config_differences(x, y, f"{path}[]")})
    return [] if a == b else [path]


def image_verdict(differences: list[str]) -> dict[str, object]:
    if not differences:
        return {"identical": True, "reason": "configs equal"}
    if set(differences) <= set(ENGINE_TIMES):
        return {"identical": False, "differing_fields": differences, "reason": ENGINE_REASON}
    return {"identical": False, "differing_fields": differences,
            "reason": "fields besides the engine's build times differ: a cause in this project to fix"}


def saved_config(saved: Path) -> dict[str, object]:
    with tarfile.open(saved) as tar:
        name = json.load(tar.extractfile("manifest.json"))[0]["Config"]  # type: ignore[arg-type]
        return json.load(tar.extractfile(name))  # type: ignore[arg-type]


def push_both(refs: list[str], logs: list[Path]) -> dict[str, object]:
    """Push each build as `buildtool build --push` does (push_path's choice for a fresh build, then the
    config normalised in the registry, repro_config) under LOCAL/<ref>; the digests before and after."""
    epoch = repro_config.commit_time(ROOT, git_full_revision(ROOT))
    client = RegistryClient(LOCAL)
    found: dict[str, object] = {"source_date_epoch": epoch}
    for n, (ref, log) in enumerate(zip(refs, logs, strict=True), 1):
        pushed_ref = f"{LOCAL}/{ref}"
        engine.tag(ref, pushed_ref)
        try:    # the tag goes however the push ends: `rmi -f REF` at the end removes REF, not this tag of the image
            via = push_path.choose(push_path.AUTO, log.read_text(errors="replace"))
            built = push_verified(pushed_ref, lambda line: print(line, file=sys.stderr), via=via)
            _, repo, tag = split_repo(pushed_ref)
            published = repro_config.publish_normalised(client, repo, tag, epoch)
        finally:
            engine.untag(pushed_ref)
        found.update({f"built_{n}": built, f"digest_{n}": published.digest, f"cache_{n}": published.cache,
                      f"pushed_with_{n}": via})
        found["normalised"] = list(published.changed)
    found["identical"] = found["digest_1"] == found["digest_2"]
    return found


def clean_up(refs: list[str], before: set[str], repo: str, keep: bool) -> None:
    """The run's local images and uv cache mounts; its registry REPO's tags (the registry's GC reclaims the blobs)
    unless KEEP. A registry failure is said, not raised: the bench's own outcome stands."""
    for ref in refs:
        docker_cli.docker("rmi", "-f", ref, timeout=120)
    for record, description in cache_mounts().items():
        if record not in before and "uv/cache" in description:
            docker_cli.docker("builder", "prune", "-f", "--filter", f"id={record}", timeout=300)
    if keep:
        print(f"kept {LOCAL}/{repo} (--keep): delete its tags when done", file=sys.stderr)
        return
    client = RegistryClient(LOCAL)
    try:
        for digest in filter(None, {client.manifest_digest(repo, tag) for tag in client.tags(repo)}):
            client.request("DELETE", f"{repo}/manifests/{digest}", ok=(202, 404), repo=repo)
    except RegistryError as exc:
        print(f"clean-up of {LOCAL}/{repo}: {exc}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cell", default="pytorch-cpu:2.13")
    parser.add_argument("--keep", action="store_true",
                        help="keep the pushed images in the local registry (repro-<hex>/<image>) to inspect")
    args = parser.parse_args()
    cell = next((c for c in load_matrix(ROOT / "matrix.yaml").cells if c.key == args.cell), None)
    if cell is None:
        print(f"--cell {args.cell}: not a cell of matrix.yaml", file=sys.stderr)
        return 2
    folder = (ROOT / cell.dockerfile).parent
    with tempfile.TemporaryDirectory(prefix="repro-bases-") as logs:
        fill_bases([cell], LOCAL, force=False, log=lambda line: print(line, file=sys.stderr), log_dir=Path(logs),
                   templates=ROOT / "templates")
    client = engine.resolve_build_client()
    log_secrets = secret_strings(HostPip.from_host())   # the index credentials: masked in the builds' logs and errors
    before = set(cache_mounts())
    tag = f"repro-{secrets.token_hex(3)}"
    refs: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="repro-") as tmpdir, pip_secrets() as pip:
            tmp = Path(tmpdir)
            for n in (1, 2):
                ctx = tmp / f"ctx{n}"
                shutil.copytree(folder, ctx)
                # A cache mount's id is not in the config (its history records RUN lines and build args).
                text = (folder / "Dockerfile").read_text()
                if "id=dl-images-uv," not in text:
                    raise SystemExit(f"{cell.dockerfile} has no uv cache mount (id=dl-images-uv): cannot make it cold")
                text = text.replace("id=dl-images-uv,", f"id=repro-{secrets.token_hex(6)},")
                (ctx / "Dockerfile").write_text(text)
                ref = f"{tag}/{cell.name}:{n}"
                engine.build(client, engine.BuildRequest(
                    ctx, ctx / "Dockerfile", build_args={"BASE_IMAGE": mirror_base(cell.base, LOCAL)}, labels={},
                    secrets=pip.files, log_path=tmp / f"{n}.log", tag=ref, no_cache=True, log_secrets=log_secrets))
                refs.append(ref)
                print(f"built {ref}", file=sys.stderr)
            probes = [probe(ROOT, ref) for ref in refs]
            layers = [(engine.image_attrs(ref) or {})["RootFS"]["Layers"] for ref in refs]
            for n, ref in enumerate(refs, 1):
                docker_cli.docker("save", ref, "-o", str(tmp / f"{n}.tar"), check=True, timeout=900)
            files = compare_layers(tmp / "1.tar", tmp / "2.tar")
            ids = [str((engine.image_attrs(ref) or {})["Id"]) for ref in refs]
            image = {"id_1": ids[0], "id_2": ids[1],
                     **image_verdict(config_differences(saved_config(tmp / "1.tar"), saved_config(tmp / "2.tar")))}
            pushed = push_both(refs, [tmp / f"{n}.log" for n in (1, 2)])
    finally:
        clean_up(refs, before, f"{tag}/{cell.name}", args.keep)
    same_python = probes[0]["python_packages"] == probes[1]["python_packages"]
    same_apt = probes[0]["apt_packages"] == probes[1]["apt_packages"]
    same = [a == b for a, b in zip(layers[0], layers[1], strict=True)]
    for n, (equal, found) in enumerate(zip(same, files, strict=True)):
        print(f"layer {n}: {'identical' if equal else 'DIFFERENT'} ({found['entries']} entries"
              f"{'' if equal else ', ' + json.dumps(found['differences'])})", file=sys.stderr)
    print(f"layers identical: {sum(same)}/{len(same)}", file=sys.stderr)
    print(f"image configs as built: {'equal' if image['identical'] else 'different'}: {image['reason']}",
          file=sys.stderr)
    print(f"pushed image digests: {'equal' if pushed['identical'] else 'DIFFERENT'} ({pushed['digest_1']} "
          f"{pushed['digest_2']}; as built {pushed['built_1']} {pushed['built_2']}; normalised: "
          f"{', '.join(pushed['normalised'])})", file=sys.stderr)
    verdict = {True: "equal", False: "DIFFERENT"}
    print(f"package sets: python {verdict[same_python]}, debian {verdict[same_apt]}", file=sys.stderr)
    print(json.dumps({
        "cell": cell.key,
        "python_packages_identical": same_python, "python_packages": len(probes[0]["python_packages"]),
        "apt_packages_identical": same_apt, "apt_packages": len(probes[0]["apt_packages"]),
        "layers_identical": f"{sum(same)}/{len(same)}",
        "layers": [{"layer": n, "identical": a == b, "diff_id_1": a, "diff_id_2": b}
                   for n, (a, b) in enumerate(zip(layers[0], layers[1], strict=True))],
        "files": files,
        "image": image,
        "pushed": pushed,
    }, indent=1))
    return 0 if same_python and same_apt and all(same) and pushed["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
