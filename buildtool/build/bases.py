"""`buildtool bases`: fill a (local) mirror registry with the bases a build needs.

When the upstream registries cannot be reached (air-gapped sites, this project's CI):
- Debian bases (`docker.io/library/debian:<suite>[-slim]`) come from debootstrap of the same
  suite, imported and pushed to the mirror path of the upstream;
- NGC bases (`nvcr.io/nvidia/...`) get a stand-in built FROM that Debian base with python and
  pip on PATH, the framework from the cell's `standin.requirements` and NGC's working
  directory. A stand-in is a test fixture: it is labelled so, and images built on it carry
  that label, which the catalogue and the release command refuse.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from buildtool.build import engine, push_path, rootfs_seal
from buildtool.build.pipconfig import pip_secrets
from buildtool.common.errors import FailedError, UserError
from buildtool.common.refs import is_loopback_host, split_repo
from buildtool.contracts import frameworks, label_keys
from buildtool.contracts.names import DEFAULT_REGISTRY
from buildtool.matrix.plan import mirror_base
from buildtool.matrix.schema import Cell
from buildtool.registry.client import RegistryClient
from buildtool.render.dockerfiles import label_value

DEBIAN_REPO = "library/debian"
DEBOOTSTRAP_TIMEOUT = 1200
# What Debian's -slim images leave out (their dpkg excludes), so a debootstrapped -slim base
# is about the same size and a later apt-get install adds no docs either.
SLIM_EXCLUDES = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
"""

Log = Callable[[str], None]


@dataclass(frozen=True)
class BaseResult:
    ref: str
    action: str  # "present", "debootstrap", "stand-in"
    digest: str
    seconds: float


def local_mirror(base_mirror: str) -> str:
    """The single registry `bases` writes to: BASE_MIRROR when it is one registry, else the local one."""
    if not base_mirror:
        return DEFAULT_REGISTRY
    if "=" in base_mirror:
        raise UserError("`buildtool bases` needs BASE_MIRROR to be one registry (e.g. 127.0.0.1:5000), "
                        "not upstream=mirror pairs")
    return base_mirror.rstrip("/")


def is_loopback_registry(ref_or_host: str) -> bool:
    return is_loopback_host(ref_or_host.split("/", 1)[0])


def debian_suite(upstream: str) -> tuple[str, bool]:
    """`docker.io/library/debian:bookworm-slim` -> ("bookworm", slim=True)."""
    tag = upstream.rsplit(":", 1)[-1]
    suite, _, variant = tag.partition("-")
    return suite, variant == "slim"


def registry_digest(ref: str, attempts: int = 3) -> str | None:
    from buildtool.registry.client import RetryPolicy

    host, repo, tag = split_repo(ref)
    return RegistryClient(host, retry=RetryPolicy(attempts=attempts, timeout=20)).manifest_digest(repo, tag)


def push_verified(ref: str, log: Log, attempts: int = 4, via: str = push_path.ENGINE) -> str:
    """Push with retries and backoff, by the engine or by skopeo (buildtool.build.push_path); verify the
    registry serves the digest the push reported."""
    delay = 2.0
    for attempt in range(1, attempts + 1):
        try:
            digest = (push_path.skopeo_push(ref, insecure=is_loopback_registry(ref)) if via == push_path.SKOPEO
                      else engine.push(ref))
            stored = registry_digest(ref)
            if stored != digest:
                raise RuntimeError(f"registry holds {stored} for {ref}, {via} pushed {digest}")
            return digest
        except (RuntimeError, OSError) as exc:
            if attempt == attempts:
                raise FailedError(f"push of {ref} failed after {attempts} attempts: {exc}") from None
            log(f"push of {ref} failed ({exc}); retry {attempt}/{attempts - 1} in {delay:.0f}s")
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def base_source(suite: str) -> str:
    """The BASE_SOURCE label of a Debian base made here; it names the recipe, so an older base is made again."""
    return f"debootstrap --variant=minbase {suite}, recipe {rootfs_seal.RECIPE}"


def registry_base_source(ref: str) -> str | None:
    """The BASE_SOURCE label of a single-platform image in a registry (None: no such label or no config)."""
    host, repo, tag = split_repo(ref)
    client = RegistryClient(host)
    manifest = json.loads(client.get_manifest(repo, tag)[0])
    if "config" not in manifest:
        return None
    labels = (json.loads(client.get_blob(repo, manifest["config"]["digest"])).get("config") or {}).get("Labels")
    return (labels or {}).get(label_keys.BASE_SOURCE)


def _debootstrap(suite: str, slim: bool, ref: str, log: Log, log_file: Path) -> None:
    if not shutil.which("debootstrap"):
        raise UserError("debootstrap is not installed; run `bash scripts/setup.sh` (installs it as root)")
    with tempfile.TemporaryDirectory(prefix="buildtool-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"debootstrap --variant=minbase {suite} (about a minute) -> {ref}")
        with log_file.open("a") as out:
            try:
                run = subprocess.run(["debootstrap", "--variant=minbase", suite, str(rootfs)], stdout=out,
                                     stderr=subprocess.STDOUT, timeout=DEBOOTSTRAP_TIMEOUT, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                raise FailedError(f"debootstrap {suite} timed out after {DEBOOTSTRAP_TIMEOUT}s; see {log_file}") \
                    from None
        if run.returncode != 0:
            raise FailedError(f"debootstrap {suite} exited {run.returncode}; see {log_file}")
        epoch = rootfs_seal.release_epoch(rootfs, suite)  # read before the apt lists go
        if slim:
            (rootfs / "etc/dpkg/dpkg.cfg.d").mkdir(parents=True, exist_ok=True)
            (rootfs / "etc/dpkg/dpkg.cfg.d/docker-slim").write_text(SLIM_EXCLUDES)
            for folder in ("usr/share/man", "usr/share/info", "usr/share/locale"):
                target = rootfs / folder
                if target.is_dir():
                    shutil.rmtree(target)
                    target.mkdir()
            doc = rootfs / "usr/share/doc"
            for item in doc.iterdir() if doc.is_dir() else ():
                if item.is_dir() and not item.is_symlink():
                    for child in item.iterdir():
                        if child.name != "copyright":
                            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        # Package lists and downloaded .debs are not part of an image (as in Docker's Debian).
        for folder in ("var/lib/apt/lists", "var/cache/apt/archives"):
            for item in (rootfs / folder).glob("*"):
                if item.is_file():
                    item.unlink()
        rootfs_seal.seal(rootfs, epoch)  # last: every change above moved an mtime
        engine.import_rootfs(rootfs, ref, ['CMD ["bash"]', f'LABEL {label_keys.BASE_SOURCE}="{base_source(suite)}"'])


def _standin_dockerfile(cell: Cell, debian_ref: str) -> str:
    assert cell.standin is not None
    # Matrix values on the RUN line are single inert shell words; LABEL values are escaped.
    reqs = " ".join(shlex.quote(r) for r in cell.standin.requirements)
    return f"""\
# Stand-in for {cell.base}: a test fixture, never released.
ARG BASE_IMAGE={debian_ref}
FROM ${{BASE_IMAGE}}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \\
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \\
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
# NGC has `python` and `pip` on PATH; a venv first on PATH gives both.
ENV VIRTUAL_ENV=/usr/local/standin \\
    PATH=/usr/local/standin/bin:$PATH
RUN python3 -m venv "$VIRTUAL_ENV"
RUN --mount=type=secret,id=pip.conf \\
    --mount=type=secret,id=pip-ca \\
    PIP_CONFIG_FILE=/run/secrets/pip.conf python -m pip install --no-cache-dir {reqs}
WORKDIR {cell.standin.workdir}
LABEL {label_keys.STANDIN}="true" \\
      {label_keys.STANDIN_FRAMEWORK}={label_value(standin_framework_version(cell))} \\
      {label_keys.STANDIN_FOR}={label_value(cell.base)}
"""


def standin_framework_version(cell: Cell) -> str:
    """What the stand-in really carries: the pinned version of its framework requirement."""
    assert cell.standin is not None
    wanted = frameworks.get(cell.framework).distributions
    for req in cell.standin.requirements:
        name, sep, version = req.partition("==")
        if sep and name.strip().lower() in wanted:
            return version.strip()
    return "unknown"


def debian_upstream_for(cell: Cell) -> str:
    """The Debian upstream a cell needs: its own base, or its stand-in's base."""
    if cell.standin is not None and not cell.base.startswith("docker.io/library/debian:"):
        return cell.standin.base
    return cell.base


def outdated_recipe(found: str | None, suite: str) -> bool:
    """A base this tool made (its BASE_SOURCE says debootstrap) by another recipe than today's. A base
    without that label came from elsewhere (a mirror of the upstream) and is never replaced."""
    return found is not None and found.startswith("debootstrap ") and found != base_source(suite)


def _made_by_recipe(ref: str, suite: str, log: Log) -> bool:
    found = registry_base_source(ref)
    if not outdated_recipe(found, suite):
        return True
    log(f"{ref} was made by {found!r}, not {base_source(suite)!r}: making it again")
    return False


def recipe_suite(cell: Cell) -> str:
    """The Debian suite the cell's base is (or its stand-in is built on)."""
    return debian_suite(debian_upstream_for(cell))[0]


def fill_bases(cells: list[Cell], base_mirror: str, *, force: bool, log: Log, log_dir: Path) -> list[BaseResult]:
    """Make every base the cells need present in the mirror registry (idempotent)."""
    mirror = local_mirror(base_mirror)
    RegistryClient(mirror).ping()
    engine.sdk()
    log_dir.mkdir(parents=True, exist_ok=True)
    results: list[BaseResult] = []
    done: set[str] = set()
    # Debian first: stand-ins are built FROM it.
    for cell in cells:
        upstream = debian_upstream_for(cell)
        if not upstream.startswith("docker.io/library/debian:"):
            raise UserError(f"{cell.key}: no recipe for base {upstream}; only Debian bases and NGC stand-ins "
                            "can be made locally")
        ref = mirror_base(upstream, mirror)
        if ref in done:
            continue
        done.add(ref)
        started = time.monotonic()
        # Kept even with force: a new Debian base changes every image's content key.
        digest = registry_digest(ref)
        suite, slim = debian_suite(upstream)
        if digest and _made_by_recipe(ref, suite, log):
            results.append(BaseResult(ref, "present", digest, time.monotonic() - started))
            continue
        _debootstrap(suite, slim, ref, log, log_dir / f"base-debian-{suite}.log")
        digest = push_verified(ref, log)
        results.append(BaseResult(ref, "debootstrap", digest, time.monotonic() - started))
    for cell in cells:
        if cell.standin is None or cell.base.startswith("docker.io/library/debian:"):
            continue
        ref = mirror_base(cell.base, mirror)
        if ref in done:
            continue
        done.add(ref)
        started = time.monotonic()
        digest = None if force else registry_digest(ref)
        # A stand-in inherits its Debian base's labels: one on an older recipe's base is made again.
        if digest and _made_by_recipe(ref, debian_suite(cell.standin.base)[0], log):
            results.append(BaseResult(ref, "present", digest, time.monotonic() - started))
            continue
        debian_ref = mirror_base(cell.standin.base, mirror)
        log(f"building stand-in {ref} (FROM {debian_ref}, {' '.join(cell.standin.requirements)})")
        log_file = log_dir / f"base-standin-{cell.name}-{cell.version}.log"
        with tempfile.TemporaryDirectory(prefix="buildtool-standin-") as tmp, pip_secrets() as secrets:
            dockerfile = Path(tmp) / "Dockerfile"
            dockerfile.write_text(_standin_dockerfile(cell, debian_ref))
            client = engine.resolve_build_client()
            try:
                image = engine.build(client, Path(tmp), dockerfile, build_args={"BASE_IMAGE": debian_ref},
                                     labels={}, secrets=secrets.files, log_path=log_file)
                python = engine.run_output(image, ["python", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
                # Same steps again, all cached, now with the probed label.
                engine.build(client, Path(tmp), dockerfile, build_args={"BASE_IMAGE": debian_ref},
                             labels={label_keys.STANDIN_PYTHON: python.strip()}, secrets=secrets.files,
                             log_path=log_file.with_suffix(".label.log"), tag=ref)
            except (engine.BuildFailed, RuntimeError) as exc:
                raise FailedError(f"stand-in {ref}: {exc}; full log {log_file}") from None
        digest = push_verified(ref, log)
        results.append(BaseResult(ref, "stand-in", digest, time.monotonic() - started))
    return results
