"""Release one image as a whole process, beside what a user would otherwise run, each as a whole process.

    python3 bench/bench_release.py [--runs 7] [--size-mb 16] [--registry 127.0.0.1:5000]

Every figure is the wall time of a complete command started from a shell (`subprocess.run`), so
interpreter start-up, imports, configuration and every registry round trip are in it; medians of
`--runs` runs, each into a fresh repository, printed side by side with the ratio to skopeo:

- `buildtool release` (the real command: matrix, git revision, gates, signed verdict verified,
  lock, 3 tags, attestation copied, re-check, release notes and catalogue written);
- `buildtool release --dry-run` (the same reads and gates, nothing written);
- `skopeo copy --preserve-digests` of the same image, blobs warm (already in the registry, skopeo's
  blob-info cache primed by one copy before the timed runs): one tag, no gates;
- `docker pull` + `tag` + `push` with the layers already in the engine: one tag, no gates (the docker
  client DOCKER_CLIENT chooses);
- start-up alone: `buildtool --help` and `python -c pass`;
- the imports of a release alone: the interpreter importing every module one release imports
  (the list read from `-X importtime` of an untimed release), doing nothing else. The release
  cannot be faster than this row: it is the floor set by Python and the libraries it uses;
- the least any Python release with signed verdicts imports: the standard library's HTTP client
  and JSON, and cryptography's Ed25519 (no YAML, no templates, none of buildtool).

The image is a `docker import` of random bytes labelled as cell pytorch-cpu:2.13, pushed under a
throwaway `t-bench-<random>/` prefix; its verdict is a schema-2 verdict signed with a key made for
the run and trusted by a throwaway copy of the project (it measures promotion, not validation).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from buildtool.common import docker_cli  # noqa: E402
from buildtool.common.dsse import generate  # noqa: E402
from buildtool.contracts import label_keys, names  # noqa: E402
from buildtool.matrix.schema import load_matrix  # noqa: E402
from buildtool.registry.client import RegistryClient, RegistryError  # noqa: E402
from buildtool.validate.keys import SigningKey, trusted_entry  # noqa: E402
from buildtool.validate.verdicts import attest  # noqa: E402

TIMEOUT = 900
MINIMAL_IMPORTS = "import http.client, json, cryptography.hazmat.primitives.asymmetric.ed25519"
CELL = "pytorch-cpu:2.13"


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, **kw)  # type: ignore[call-overload]
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed ({result.returncode}): {(result.stdout + result.stderr)[-600:]}")
    return result


def timed(action: Callable[[int], None], runs: int) -> list[float]:
    times = []
    for i in range(runs):
        start = time.perf_counter()
        action(i)
        times.append(time.perf_counter() - start)
    return times


def make_project(work: Path, key_pub: str) -> Path:
    """A copy of the project's matrix, templates and generated files, trusting the bench key, in git."""
    project = work / "project"
    project.mkdir()
    for name in ("matrix.yaml",):
        shutil.copy2(ROOT / name, project / name)
    for folder in ("templates", "dockerfiles", "docs", "image-tests"):
        shutil.copytree(ROOT / folder, project / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(project / "docs/releases", ignore_errors=True)
    (project / "config").mkdir()
    (project / "config/trusted-keys.yaml").write_text("keys:\n" + key_pub)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=b@e", "-c", "user.name=b", "commit", "-qm", "b"]):
        run(["git", "-C", str(project), *args])
    return project


def make_image(docker: str, ref: str, size_mb: int, labels: dict[str, str], work: Path) -> None:
    payload = work / "payload.bin"
    payload.write_bytes(os.urandom(size_mb << 20))
    with tarfile.open(work / "rootfs.tar", "w") as tar:
        tar.add(payload, arcname="opt/payload.bin")
    argv = [docker, "import"]
    for key, value in labels.items():
        argv += ["--change", f"LABEL {key}={value}"]
    run([*argv, str(work / "rootfs.tar"), ref])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per command (median shown)")
    parser.add_argument("--size-mb", type=int, default=16)
    parser.add_argument("--registry", default=os.environ.get("REGISTRY_HOST", "127.0.0.1:5000"))
    parser.add_argument("--skopeo", default="skopeo")
    args = parser.parse_args()
    docker = docker_cli.client()
    cell = {c.key: c for c in load_matrix(ROOT / "matrix.yaml", ROOT / "templates").cells}[CELL]
    prefix = f"t-bench-{uuid.uuid4().hex[:8]}"
    client = RegistryClient(args.registry)
    key = generate()
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-release-") as tmp:
        work = Path(tmp)
        project = make_project(work, trusted_entry("bench", key.public()))
        revision = run(["git", "-C", str(project), "rev-parse", "--short=12", "HEAD"]).stdout.strip()
        dev_repo, dev_tag = names.dev_repo(prefix, cell.name), names.dev_tag(revision, cell.version)
        dev_ref = f"{args.registry}/{dev_repo}:{dev_tag}"
        make_image(docker, dev_ref, args.size_mb, {label_keys.CELL: cell.key,
                                                   label_keys.OCI_BASE_NAME: cell.base}, work)
        run([docker, "push", dev_ref])
        digest = client.manifest_digest(dev_repo, dev_tag)
        assert digest
        tests = [{"id": f"{g}/test_bench.py::test_fixture", "group": g, "result": "passed", "duration_s": 0.0,
                  "message": "bench fixture: promotion only", "skip_code": "", "skip_subject": "", "skip_reason": "",
                  "gpu": False} for g in cell.tests]
        verdict = {"schema": 2, "digest": digest, "image": dev_ref, "cell": cell.key, "result": "passed",
                   "started": "2026-01-01T00:00:00+00:00", "duration_s": 0.0, "test_code": "bench",
                   "runner": {"hostname": "bench fixture"}, "groups": list(cell.tests),
                   "defined_tests": [t["id"] for t in tests], "selection": {"expression": None, "deselected": []},
                   "run_flags": [], "pytest_exit": 0, "tests": tests, "figures": {}}
        attest(client, dev_repo, digest, verdict, SigningKey(key, "bench", dev=False))
        # As a user runs it: bytecode cached (a shell that sets PYTHONDONTWRITEBYTECODE would recompile
        # every module on every run), caches under the bench's own folder.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(REGISTRY=f"{args.registry}/{prefix}", XDG_CACHE_HOME=str(work / "cache"),
                   XDG_CONFIG_HOME=str(work / "config"))
        made = [dev_repo]

        def release(i: int, *extra: str, python_flags: tuple[str, ...] = ()) -> str:
            dest = f"{prefix}/rel-{'dry' if extra else 'real'}-{i}"
            made.append(f"{dest}/{cell.name}")
            done = run([python, *python_flags, "-m", "buildtool", "release", "--version", f"0.1.{i}", "-f",
                        cell.name, *extra], cwd=project, env={**env, "RELEASE_REGISTRY": f"{args.registry}/{dest}"})
            shutil.rmtree(project / "docs/releases", ignore_errors=True)
            return done.stderr

        src = f"docker://{args.registry}/{dev_repo}:{dev_tag}"

        def skopeo(i: int) -> None:
            dest = f"{prefix}/rel-skopeo-{i}/{cell.name}"
            made.append(dest)
            run(["timeout", str(TIMEOUT), args.skopeo, "copy", "-q", "--preserve-digests", "--src-tls-verify=false",
                 "--dest-tls-verify=false", src, f"docker://{args.registry}/{dest}:{cell.version}-0.1.{i}"])

        def docker_way(i: int) -> None:
            dest = f"{args.registry}/{prefix}/rel-docker-{i}/{cell.name}:{cell.version}-0.1.{i}"
            made.append(dest.split("/", 1)[1].rsplit(":", 1)[0])
            run([docker, "pull", "-q", dev_ref])
            run([docker, "tag", dev_ref, dest])
            run([docker, "push", "-q", dest])
            subprocess.run([docker, "rmi", dest], capture_output=True, timeout=120)

        skopeo(99)          # warm skopeo's blob-info cache (not timed)
        release(99)         # warm: bytecode, the matrix snapshot, the OS file cache (not timed)
        modules = imported_modules(release(98, python_flags=("-X", "importtime")))
        # A name the release tried and failed to import (an optional module of another platform) is
        # tried here too, and fails the same way.
        import_all = ("import importlib, sys\nfor name in sys.argv[1:]:\n    try:\n"
                      "        importlib.import_module(name)\n    except ImportError:\n        pass")
        methods = [
            ("buildtool release", "whole process: gates, signed verdict, lock, 3 tags, attestation copy, "
             "re-check, notes + catalogue", release),
            ("buildtool release --dry-run", "whole process: the same reads and gates, nothing written",
             lambda i: release(i, "--dry-run")),
            ("skopeo copy --preserve-digests", "whole process: one tag, blobs warm, no gates", skopeo),
            ("docker pull + tag + push", "three whole processes: one tag, layers already in the engine",
             docker_way),
            ("buildtool --help", "whole process: start-up and imports only",
             lambda i: run([python, "-m", "buildtool", "--help"], cwd=project, env=env)),
            ("python -c pass", "whole process: the interpreter alone", lambda i: run([python, "-c", "pass"])),
            ("imports of a release alone", f"whole process: the interpreter importing the {len(modules)} modules a "
             "release imports, nothing else (the floor)",
             lambda i: run([python, "-c", import_all, *modules], cwd=project, env=env)),
            ("HTTP + JSON + Ed25519 imports", "whole process: the interpreter importing http.client, json and "
             "cryptography's Ed25519, nothing else", lambda i: run([python, "-c", MINIMAL_IMPORTS])),
        ]
        # Round-robin: every method once per round, so a burst of load on a shared machine hits all alike.
        times: dict[str, list[float]] = {name: [] for name, _, _ in methods}
        for i in range(args.runs):
            for name, _, action in methods:
                times[name] += timed(lambda _i, a=action, n=i: a(n), 1)
        rows = [(name, what, times[name]) for name, what, _ in methods]
        run([docker, "rmi", dev_ref])
        cleanup(client, made)
    base = statistics.median(next(t for name, _, t in rows if name.startswith("skopeo")))
    print(f"Whole processes against whole processes: median (min) of {args.runs} rounds (each round runs every "
          f"command once), each release or copy into a fresh repository; image {args.size_mb} MB; "
          "ratio = median / skopeo's median.")
    print(f"{'command':<32} {'median s':>9} {'min s':>7} {'x skopeo':>9}  measured")
    for name, what, times in rows:
        print(f"{name:<32} {statistics.median(times):9.3f} {min(times):7.3f} {statistics.median(times) / base:9.2f}  "
              f"{what}")
    print(json.dumps({name: times for name, _, times in rows}), file=sys.stderr)


def imported_modules(importtime: str) -> list[str]:
    """Every module `-X importtime` reported, in order (nesting is not used: imports done in a
    thread are printed nested under whatever another thread was importing at the time)."""
    names = [line.rsplit("|", 1)[1].strip() for line in importtime.splitlines()
             if line.startswith("import time:") and "|" in line]
    names = [n for n in names if n and n != "imported package"]
    if not names:
        raise SystemExit("the release printed no -X importtime lines: cannot measure the import floor")
    return names


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
