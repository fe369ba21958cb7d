"""Release every validated cell of the matrix through a far registry, beside a skopeo loop making the same copies.

    python3 bench/bench_release.py [--runs 5] [--delay-ms 20] [--size-mb 4] [--registry 127.0.0.1:5000]

The cells are the matrix's CPU cells (the ones a runner here can validate). Each gets a releasable dev
image written straight into the registry under a throwaway `t-bench-<random>/` prefix: one random
layer, the labels a build sets, its SBOM (plain and signed, as push attaches them), signed provenance
from a builder key and a signed verdict (schema 4, the image-tests of the bench's own commit, every
test the cell's groups define) from a tester key; both keys are made for the run and trusted by a
throwaway copy of the project (config/trusted-keys.yaml). The registry is put 20 ms away (each way)
by bench/delayproxy.py; every command below talks to the proxy, never to the registry itself.

Figures, each the wall time of whole processes started from a shell, medians of `--runs` rounds
(every command once per round, each into a fresh release repository):

- `buildtool release -f <every CPU cell>`: the real command (gates, signed verdict and provenance and
  SBOM checked, lock, 3 tags per image, the 4 referrers and the referrers index copied, re-check,
  release notes and catalogue written);
- `buildtool release --dry-run`: the same reads and gates, nothing written;
- the skopeo loop: one `bash` running `skopeo copy --preserve-digests` per tag (3 per image) and per
  referrer (verdict, provenance, SBOM, SBOM attestation: each artifact manifest by digest) and the
  fallback referrers index tag `sha256-<hex>`; no gate, no lock, no notes.

Requests are counted in the proxy per run and printed per image, with the log of request kinds.
With `--variants N`, the argparse fast path and the matrix snapshot are measured on the loopback
registry directly (no proxy): each removed in turn by patching it out in the process (`python -c`),
the same command otherwise.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.delayproxy import DelayProxy  # noqa: E402
from buildtool.attest.dsse import PrivateKey, generate  # noqa: E402
from buildtool.attest.keys import BUILDER, TESTER, trusted_entry  # noqa: E402
from buildtool.attest.referrers import referrers  # noqa: E402
from buildtool.contracts import names  # noqa: E402
from buildtool.matrix.loader import load_matrix  # noqa: E402
from buildtool.matrix.plan import git_revision  # noqa: E402
from buildtool.matrix.schema import Cell  # noqa: E402
from buildtool.registry.client import RegistryClient, RegistryError  # noqa: E402
from buildtool.validate.collect import defined_tests, image_tests_hash  # noqa: E402
from tests import signing  # noqa: E402
from tests.integration.test_release import labels_for, push_single  # noqa: E402

TIMEOUT = 900
# The least any correct, gated release of one image of this bench needs (single-arch, one layer, 4
# referrers of one layer each sharing the empty config, a fresh release repository), request by request.
LEAST = (
    (1, "GET the dev manifest by its tag (digest and bytes)"),
    (1, "GET the image config blob (the labels gate: cell, base and its digest)"),
    (1, "GET the referrers (the fallback index tag on a registry without the referrers API)"),
    (6, "GET manifest + blob of the verdict, the provenance and the SBOM attestation (each signature checked)"),
    (1, "GET the plain SBOM's manifest (its bytes are copied; its blob is mounted, not read)"),
    (1, "GET the release repository's tags (version tags are never overwritten; fresh: none there)"),
    (7, "POST blob mounts: image config + layer, 4 referrer layers, the shared empty config"),
    (3, "PUT the image manifest under each of its 3 tags (no multi-tag PUT in the distribution API)"),
    (4, "PUT the 4 referrer manifests by digest"),
    (1, "PUT the referrers index under its fallback tag"),
)
# What this project's concurrency rules add per release repository (buildtool.release.repo_lock, the re-check).
LOCKED = (
    (4, "the release lock (its config is the empty blob mounted above): GET is it free, PUT it, GET it back "
        "after the settle wait, PUT it released"),
    (3, "the re-check of the 3 tags after the last write (a late write is caught and repaired)"),
)
TAGS_PER_IMAGE = 3
# The command as each variant runs it: `python -c CODE release ...`; the patches remove one shortcut.
RUN = "import sys\n{patch}\nfrom buildtool.cli import main\nmain(sys.argv[1:])"
VARIANTS = {
    "as is": "",
    "no argparse fast path (typer parses)": "import buildtool.cli as c\nc._fast_path = lambda args: False",
    "no matrix snapshot (matrix loaded)": ("from buildtool.cli.console import Project\n"
                                           "Project.load_fast = Project.load\n"
                                           "import buildtool.matrix.snapshot as s\ns.write = lambda *a: None"),
    "neither": ("import buildtool.cli as c\nc._fast_path = lambda args: False\n"
                "from buildtool.cli.console import Project\nProject.load_fast = Project.load\n"
                "import buildtool.matrix.snapshot as s\ns.write = lambda *a: None"),
}


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, **kw)  # type: ignore[call-overload]
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-1500:]
        raise SystemExit(f"{' '.join(argv[:6])} failed ({result.returncode}): {output}")
    return result


def make_project(work: Path, keys: str) -> Path:
    """A copy of the project's matrix, templates, image-tests and generated files, trusting `keys`, in git."""
    project = work / "project"
    project.mkdir()
    shutil.copy2(ROOT / "matrix.yaml", project / "matrix.yaml")
    for folder in ("templates", "dockerfiles", "docs", "image-tests"):
        shutil.copytree(ROOT / folder, project / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(project / "docs/releases", ignore_errors=True)
    (project / "config").mkdir()
    (project / "config/trusted-keys.yaml").write_text("keys:\n" + keys)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=b@e", "-c", "user.name=b", "commit", "-qm", "b"]):
        run(["git", "-C", str(project), *args])
    return project


def make_image(client: RegistryClient, cell: Cell, repo: str, tag: str, size: int, commit: str, code: str,
               tests_dir: Path, builder: PrivateKey, tester: PrivateKey) -> str:
    """A releasable dev image of `cell`: as push and validate leave it (see the module's docstring)."""
    digest, _ = push_single(client, repo, tag, labels_for(cell), size)
    signing.attest_sbom(client, repo, digest, key=builder)
    signing.attach_provenance(client, repo, digest, signing.provenance(cell, revision=commit), key=builder)
    defined = defined_tests(cell, tests_dir, code)
    tests = [signing.result(t, gpu=gpu) for t, gpu in defined.items()]
    signing.attest(client, repo, digest, signing.verdict(cell, digest, tests=tests, test_code=code), key=tester)
    return digest


def skopeo_script(skopeo: str, host: str, images: list[tuple[Cell, str, str, str, list[str]]], dest_prefix: str,
                  version: str) -> str:
    """The shell loop: every tag and every referrer a release makes, one `skopeo copy` each. skopeo 1.9
    refuses to keep the digest of the fallback referrers index ("Manifest list must be converted to type
    application/vnd.oci.image.index.v1+json ... Instructed to preserve digests"), so that one copy alone
    is made without --preserve-digests."""
    tls = "--src-tls-verify=false --dest-tls-verify=false"
    lines = ["set -eu"]
    for cell, repo, tag, digest, artifacts in images:
        src, dest = f"docker://{host}/{repo}", f"docker://{host}/{dest_prefix}/{cell.name}"
        tags = [f"{cell.version}-{version}", cell.version, "latest"]
        lines += [f"{skopeo} copy -q --preserve-digests {tls} {src}:{tag} {dest}:{t}" for t in tags]
        lines += [f"{skopeo} copy -q --preserve-digests {tls} {src}@{a} {dest}@{a}" for a in artifacts]
        index = digest.replace(":", "-")
        lines.append(f"{skopeo} copy -q --multi-arch index-only {tls} {src}:{index} {dest}:{index}")
    return "\n".join(lines) + "\n"


def refused(patch: str, frameworks: str, project: Path, env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-c", RUN.format(patch=patch), "release", "--version", "x.y", "-f",
                           frameworks], cwd=project, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode != 2 or "is not a version" not in done.stderr:
        raise SystemExit(f"release --version x.y: expected exit 2 naming the version, got {done.returncode}: "
                         f"{done.stderr[-800:]}")


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def cpu_timed(action: Callable[[], object]) -> tuple[float, float]:
    """(wall, CPU) seconds: the CPU time (user + system) of the processes `action` waited for. What a
    start-up shortcut saves is CPU work, and CPU time is not lengthened by other load on the machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = timed(action)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="rounds (median shown); 0: only --variants")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="added each way by the proxy")
    parser.add_argument("--size-mb", type=float, default=4.0, help="the random layer of each image")
    parser.add_argument("--registry", default=os.environ.get("REGISTRY_HOST", "127.0.0.1:5000"))
    parser.add_argument("--skopeo", default="skopeo")
    parser.add_argument("--variants", type=int, default=0, metavar="RUNS",
                        help="also measure the fast path and the snapshot, RUNS rounds (0: not)")
    args = parser.parse_args()
    for option, value in (("--runs", args.runs), ("--variants", args.variants)):
        if value < 0:
            parser.exit(2, f"{option} {value}: give 0 (none) or more rounds\n")
    if not args.runs and not args.variants:
        parser.exit(2, "--runs 0 measures only --variants: give --variants RUNS, or --runs 1 or more\n")
    cells = [c for c in load_matrix(ROOT / "matrix.yaml", ROOT / "templates").cells if not c.needs_gpu]
    prefix = f"t-bench-{uuid.uuid4().hex[:8]}"
    client = RegistryClient(args.registry)
    builder, tester = generate(), generate()
    keys = (trusted_entry("bench builder", builder.public(), (BUILDER,))
            + trusted_entry("bench tester", tester.public(), (TESTER,)))
    python = sys.executable
    upstream = args.registry.rsplit(":", 1)
    made: list[str] = []
    with cleaned_up(client, made), tempfile.TemporaryDirectory(prefix="bench-release-") as tmp, \
            DelayProxy((upstream[0], int(upstream[1])), args.delay_ms / 1000) as proxy:
        work = Path(tmp)
        project = make_project(work, keys)
        revision = git_revision(project)
        commit = run(["git", "-C", str(project), "rev-parse", "HEAD"]).stdout.strip()
        # As a user runs it: bytecode cached, caches (the defined tests, the snapshot) under the bench's folder.
        os.environ["XDG_CACHE_HOME"] = str(work / "cache")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(XDG_CONFIG_HOME=str(work / "config"))
        code = image_tests_hash(project / "image-tests")
        images = []
        for cell in cells:
            repo, tag = names.dev_repo(prefix, cell.name), names.dev_tag(revision, cell.version)
            made.append(repo)   # before its first write: an image that fails half-way is cleaned up too
            digest = make_image(client, cell, repo, tag, int(args.size_mb * (1 << 20)), commit, code,
                                project / "image-tests", builder, tester)
            images.append((cell, repo, tag, digest, [r.digest for r in referrers(client, repo, digest)]))
        frameworks = ",".join(c.key for c in cells)

        def release(host: str, dest: str, *extra: str, patch: str = "") -> str:
            made.extend(f"{prefix}/{dest}/{c.name}" for c in cells)
            version = f"0.1.{uuid.uuid4().int % 10**6}"
            done = run([python, "-c", RUN.format(patch=patch), "release", "--version", version, "-f", frameworks,
                        *extra], cwd=project,
                       env={**env, "REGISTRY": f"{host}/{prefix}", "RELEASE_REGISTRY": f"{host}/{prefix}/{dest}"})
            shutil.rmtree(project / "docs/releases", ignore_errors=True)
            return done.stderr

        def skopeo(dest: str) -> None:
            made.extend(f"{prefix}/{dest}/{c.name}" for c in cells)
            script = work / "skopeo.sh"
            script.write_text(skopeo_script(args.skopeo, proxy.address, images, f"{prefix}/{dest}", "0.1.0"))
            run(["bash", str(script)], env=env)

        # Warm (not timed): bytecode, the snapshot and the defined tests' cache, skopeo's blob-info cache.
        print(release(proxy.address, "warm-real"), file=sys.stderr)
        if args.runs:
            skopeo("warm-skopeo")
        proxy.take()
        commands: list[tuple[str, str, Callable[[int], object]]] = [
            ("buildtool release", f"whole process, {len(cells)} cells: gates, lock, {TAGS_PER_IMAGE} tags + 4 "
             "referrers + referrers index each, re-check, notes", lambda i: release(proxy.address, f"rel-{i}")),
            ("buildtool release --dry-run", "whole process: the same reads and gates, nothing written",
             lambda i: release(proxy.address, f"dry-{i}", "--dry-run")),
            ("skopeo loop", f"bash: {TAGS_PER_IMAGE + 5} skopeo copy per image ({TAGS_PER_IMAGE} tags, 4 referrers by "
             "digest, the referrers index tag); no gates", lambda i: skopeo(f"skopeo-{i}")),
        ]
        times: dict[str, list[float]] = collections.defaultdict(list)
        counts: dict[str, list[collections.Counter[str]]] = collections.defaultdict(list)
        for i in range(args.runs):   # round-robin: a burst of load hits every command alike
            for name, _, action in commands:
                times[name].append(timed(lambda a=action, n=i: a(n)))   # type: ignore[misc]
                counts[name].append(proxy.take())
        variant_times: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        if args.variants:
            for i in range(args.variants):
                for label, patch in VARIANTS.items():
                    for extra in ((), ("--dry-run",)):
                        key = f"{' '.join(('buildtool release', *extra))} [{label}]"
                        variant_times[key].append(cpu_timed(lambda p=patch, e=extra, n=i: release(  # type: ignore[misc]
                            args.registry, f"v{n}-{uuid.uuid4().hex[:6]}", *e, patch=p)))
                    # Start-up alone: a bad --version is refused after parsing and loading the matrix,
                    # before any registry request (exit 2), so no registry noise is in this row.
                    key = f"buildtool release --version x.y (bad input, exit 2) [{label}]"
                    variant_times[key].append(cpu_timed(lambda p=patch: refused(p, frameworks, project, env)))  # type: ignore[misc]
    report(args, cells, commands, times, counts, variant_times)


def report(args: argparse.Namespace, cells: list[Cell], commands: list, times: dict[str, list[float]],
           counts: dict[str, list[collections.Counter[str]]],
           variant_times: dict[str, list[tuple[float, float]]]) -> None:
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if variant_times:
        print(f"\nShortcuts, {len(cells)} cells, loopback registry (no proxy), {args.variants} rounds: wall median "
              "(min), CPU median (user + system of the process)")
        for key, values in variant_times.items():
            wall, cpu = [v[0] for v in values], [v[1] for v in values]
            print(f"  {key:<95} {statistics.median(wall):7.3f} ({min(wall):.3f}) {statistics.median(cpu):7.3f}")
    print(json.dumps({"times": times, "variants": variant_times}), file=sys.stderr)
    if not times:
        return
    base = statistics.median(times["skopeo loop"])
    print(f"\n{len(cells)} cells ({', '.join(c.key for c in cells)}), each image {args.size_mb} MB; registry "
          f"{args.delay_ms:g} ms away each way (bench/delayproxy.py); medians (min) of {args.runs} rounds of whole "
          f"processes")
    print(f"{'command':<30} {'median s':>9} {'min s':>7} {'x skopeo loop':>14} {'requests/image':>15}  measured")
    for name, what, _ in commands:
        per_image = statistics.median(sum(c.values()) - c["CONNECT (new TCP connections)"] for c in counts[name]) \
            / len(cells)
        median = statistics.median(times[name])
        print(f"{name:<30} {median:9.3f} {min(times[name]):7.3f} {median / base:14.2f} {per_image:15.1f}  {what}")
    least, locked = sum(n for n, _ in LEAST), sum(n for n, _ in LOCKED)
    print(f"\nLeast any correct release needs per image: {least} requests; {least + locked} with this project's "
          "lock and re-check (per release, add 1 GET /v2/ and 1 referrers API probe):")
    for n, what in (*LEAST, *LOCKED):
        print(f"  {n:3d}  {what}")
    for name, _, _ in commands:
        merged: collections.Counter[str] = collections.Counter()
        for counter in counts[name]:
            merged.update(counter)
        print(f"\nrequests of `{name}` per image (mean over {args.runs} runs):")
        for kind, n in merged.most_common():
            print(f"  {n / args.runs / len(cells):6.1f}  {kind}")


@contextlib.contextmanager
def cleaned_up(client: RegistryClient, repos: list[str]) -> Iterator[None]:
    """REPOS cleaned up however the block ends: a command that failed (SystemExit) or an interrupted round left
    the bench's t-bench-* repositories in the registry, which other work shares."""
    try:
        yield
    finally:
        cleanup(client, repos)


def cleanup(client: RegistryClient, repos: list[str]) -> None:
    """Untag what the bench made (its own t-bench prefix); the registry's GC reclaims the blobs."""
    for repo in dict.fromkeys(repos):
        try:
            digests = {client.manifest_digest(repo, tag) for tag in client.tags(repo)}
            for digest in filter(None, digests):
                client.request("DELETE", f"{repo}/manifests/{digest}", ok=(202, 404), repo=repo)
        except RegistryError as exc:
            print(f"cleanup of {repo}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    main()
