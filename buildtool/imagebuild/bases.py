"""`buildtool bases`: fill a (local) mirror registry with the bases a build needs.

When the upstream registries cannot be reached (air-gapped sites, this project's CI):
- Debian bases (`docker.io/library/debian:<suite>[-slim]`) come from debootstrap of the same
  suite, imported and pushed to the mirror path of the upstream. When a cell is built for another
  platform as well (linux/arm64 under QEMU here), that platform is debootstrapped too, sealed the
  same way, written to the registry as an image of that platform (buildtool.imagebuild.base_index), and
  the tag becomes an OCI index over both; the engine's own (host) image stays what it was, byte for
  byte, so single-platform cells keep pinning the same digest;
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

from buildtool.common.errors import FailedError, UserError
from buildtool.common.refs import is_loopback_host, split_repo
from buildtool.contracts import frameworks, label_keys, platforms
from buildtool.contracts.names import DEFAULT_REGISTRY
from buildtool.imagebuild import base_index, engine, push_path, rootfs_seal
from buildtool.imagebuild.pipconfig import pip_secrets
from buildtool.matrix.plan import mirror_base
from buildtool.matrix.schema import Cell
from buildtool.registry.client import NotFound, RegistryClient
from buildtool.render.dockerfiles import label_value

DEBIAN_REPO = "library/debian"
DEBOOTSTRAP_TIMEOUT = 1200
# What `docker import` is told for the engine's image; the written images of other platforms say the same.
BASE_CMD = ["bash"]
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
    digest: str  # the platform's own manifest (a child of the tag's index when it is one)
    seconds: float
    platform: str = platforms.DEFAULT[0]


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
    """Push with retries and backoff, by the engine or by skopeo (buildtool.imagebuild.push_path); verify the
    registry serves the digest the push reported."""
    delay = 2.0
    for attempt in range(1, attempts + 1):
        try:
            digest = (push_path.skopeo_push(ref) if via == push_path.SKOPEO
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


def base_source(suite: str, platform: str | None = None) -> str:
    """The BASE_SOURCE label of a Debian base made here; it names the recipe, so an older base is made again.
    `platform`: one the engine does not import natively (written by base_index); None: the engine's own."""
    arch = f"--arch={platforms.get(platform).architecture} " if platform else ""
    return f"debootstrap {arch}--variant=minbase {suite}, recipe {rootfs_seal.RECIPE}"


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
    """The engine's own platform: a sealed tree imported by the engine (tagged `ref`, not pushed)."""
    with tempfile.TemporaryDirectory(prefix="buildtool-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _make_rootfs(suite, slim, rootfs, None, log, log_file)
        engine.import_rootfs(rootfs, ref, [f"CMD {json.dumps(BASE_CMD)}",
                                           f'LABEL {label_keys.BASE_SOURCE}="{base_source(suite)}"'])


def _debootstrap_foreign(client: RegistryClient, repo: str, suite: str, slim: bool, platform: str, log: Log,
                         log_file: Path) -> base_index.Child:
    """Another platform: a sealed tree (debootstrap runs its second stage under QEMU), written to the
    registry as an image of `platform` by digest; no tag moves."""
    with tempfile.TemporaryDirectory(prefix="buildtool-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        started = time.monotonic()
        epoch = _make_rootfs(suite, slim, rootfs, platform, log, log_file)
        log(f"{platform} tree made in {time.monotonic() - started:.0f}s; writing its image to {client.host}/{repo}")
        started = time.monotonic()
        child = base_index.rootfs_image(client, repo, rootfs, platform, epoch=epoch, cmd=BASE_CMD,
                                        labels={label_keys.BASE_SOURCE: base_source(suite, platform)},
                                        created_by=f"{base_source(suite, platform)} (buildtool bases)")
        log(f"{platform} image {child.digest} written in {time.monotonic() - started:.0f}s")
        return child


def _make_rootfs(suite: str, slim: bool, rootfs: Path, platform: str | None, log: Log, log_file: Path) -> int:
    """debootstrap (for `platform`, None: this machine's), slimmed and sealed; returns the seal's epoch."""
    if not shutil.which("debootstrap"):
        raise UserError("debootstrap is not installed; run `bash scripts/setup.sh` (installs it as root)")
    arch = [f"--arch={platforms.get(platform).architecture}"] if platform else []
    what = f"debootstrap {' '.join([*arch, '--variant=minbase'])} {suite}"
    log(f"{what} ({'a few minutes under QEMU' if platform else 'about a minute'}) -> {rootfs}")
    with log_file.open("a") as out:
        try:
            run = subprocess.run(["debootstrap", *arch, "--variant=minbase", suite, str(rootfs)], stdout=out,
                                 stderr=subprocess.STDOUT, timeout=DEBOOTSTRAP_TIMEOUT, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise FailedError(f"{what} timed out after {DEBOOTSTRAP_TIMEOUT}s; see {log_file}") from None
    if run.returncode != 0:
        raise FailedError(f"{what} exited {run.returncode}; see {log_file}")
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
    return epoch


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


def _standin_index_dockerfile(cell: Cell, debian_ref: str, uv_requirement: str) -> str:
    """A stand-in of a multi-platform cell, one Dockerfile for every platform: its requirements are resolved and
    installed by uv on the build machine (BuildKit's BUILDPLATFORM, the same Debian base and Python) for the
    target's wheel platform, in a venv at the stand-in's path, then copied in; on the target (under QEMU where it
    is another machine's) only apt runs. uv is the one templates/uv.lock pins, by hash."""
    assert cell.standin is not None
    standin = cell.standin

    def words(platform: str) -> str:
        return " ".join(shlex.quote(r) for r in standin.requirements_for(platform))
    arches = " ".join(f"{p.architecture}) machine={p.machine}; reqs=({words(p.name)}) ;;"
                      for p in map(platforms.get, cell.platforms))
    apt = """RUN apt-get update \\
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \\
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb"""
    return f"""\
# Stand-in for {cell.base} ({', '.join(cell.platforms)}): a test fixture, never released.
ARG BASE_IMAGE={debian_ref}
ARG BUILD_BASE_IMAGE={debian_ref}
FROM --platform=$BUILDPLATFORM ${{BUILD_BASE_IMAGE}} AS build-python
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG DEBIAN_FRONTEND=noninteractive
{apt}
RUN python3 -m venv /usr/local/standin
RUN --mount=type=secret,id=pip.conf \\
    --mount=type=secret,id=pip-ca \\
    printf '%s\\n' {shlex.quote(uv_requirement)} > /tmp/uv.txt \\
 && PIP_CONFIG_FILE=/run/secrets/pip.conf /usr/local/standin/bin/python -m pip install --no-cache-dir --no-deps \\
      --require-hashes --target /uv -r /tmp/uv.txt && rm /tmp/uv.txt
ARG TARGETARCH
# TARGETARCH's machine and this Debian's glibc: the wheel tags pip would accept on the target.
RUN --mount=type=secret,id=uv.toml \\
    --mount=type=secret,id=pip-ca \\
    case "${{TARGETARCH}}" in {arches} *) echo "ERROR: no stand-in for ${{TARGETARCH}}" >&2; exit 1 ;; esac \\
 && glibc="$(getconf GNU_LIBC_VERSION | cut -d' ' -f2 | tr . _)" \\
 && if [ -f /run/secrets/pip-ca ]; then export SSL_CERT_FILE=/run/secrets/pip-ca; fi \\
 && UV_CONFIG_FILE=/run/secrets/uv.toml UV_NO_CACHE=1 UV_PYTHON_DOWNLOADS=never /uv/bin/uv pip install --no-progress \\
      --python /usr/local/standin/bin/python --python-platform "${{machine}}-manylinux_${{glibc}}" "${{reqs[@]}}"

FROM ${{BASE_IMAGE}}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG DEBIAN_FRONTEND=noninteractive
{apt}
COPY --from=build-python /usr/local/standin /usr/local/standin
# NGC has `python` and `pip` on PATH; a venv first on PATH gives both.
ENV VIRTUAL_ENV=/usr/local/standin \\
    PATH=/usr/local/standin/bin:$PATH
WORKDIR {cell.standin.workdir}
# Each platform's framework version ({label_keys.STANDIN_FRAMEWORK}, as the framework reports it there) is a
# label of its own build.
LABEL {label_keys.STANDIN}="true" \\
      {label_keys.STANDIN_FOR}={label_value(cell.base)}
"""


def standin_framework_version(cell: Cell, platform: str | None = None) -> str:
    """What the stand-in (of `platform`; None: its only one) really carries: the pinned version of its
    framework requirement."""
    assert cell.standin is not None
    wanted = frameworks.get(cell.framework).distributions
    for req in cell.standin.requirements_for(platform or cell.platforms[0]):
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


def debian_platforms(cell: Cell) -> tuple[str, ...]:
    """The platforms the cell needs of its Debian base: its own, or its stand-in's (one stand-in image per
    platform of the cell, each built FROM that platform's Debian image)."""
    return cell.platforms


def _child_current(child: base_index.Child, ref: str, suite: str, log: Log) -> bool:
    """A child this tool made (BASE_SOURCE says debootstrap) by another recipe is made again; one made
    elsewhere (a mirror of the upstream) is kept."""
    found = child.labels.get(label_keys.BASE_SOURCE)
    native = child.platform == platforms.host().name
    wanted = base_source(suite, None if native else child.platform)
    if found is None or not found.startswith("debootstrap ") or found == wanted:
        return True
    log(f"{ref} {child.platform} was made by {found!r}, not {wanted!r}: making it again")
    return False


def stale_platforms(ref: str, wanted: tuple[str, ...], suite: str, log: Log = lambda line: None) -> list[str]:
    """Which of `wanted` the base tag lacks or holds by an older recipe (all of them: no such tag)."""
    host, repo, tag = split_repo(ref)
    try:
        children = base_index.read_children(RegistryClient(host), repo, tag)
    except NotFound:
        return list(wanted)
    return [p for p in wanted if p not in children or not _child_current(children[p], ref, suite, log)]


def _ordered(names: set[str]) -> list[str]:
    return [p for p in platforms.KNOWN if p in names]


def _debian_base(ref: str, upstream: str, wanted: list[str], log: Log, log_dir: Path) -> list[BaseResult]:
    """Make `ref` hold a current image of every wanted platform: one platform the engine's single image,
    more an OCI index whose host child is that same image. Images already current are kept by digest;
    other platforms are made first, by digest, so one that fails leaves the tag as it was."""
    started = time.monotonic()
    host, repo, tag = split_repo(ref)
    client = RegistryClient(host)
    suite, slim = debian_suite(upstream)
    native = platforms.host().name
    try:
        children = base_index.read_children(client, repo, tag)
    except NotFound:
        children = {}
    todo = [p for p in wanted if p not in children or not _child_current(children[p], ref, suite, log)]
    if not todo:
        return [BaseResult(ref, "present", children[p].digest, time.monotonic() - started, p) for p in wanted]
    # Refused before any debootstrap: an emulated platform this machine cannot run.
    for name in todo:
        problem = platforms.binfmt_problem(name)
        if problem:
            raise UserError(f"cannot make the {name} base {ref}: {problem}")
    results: list[BaseResult] = []
    made = dict(children)
    # Other platforms first, by digest: a failure there leaves the tag as it was.
    for name in (p for p in todo if p != native):
        begun = time.monotonic()
        log_file = log_dir / f"base-debian-{suite}-{platforms.get(name).architecture}.log"
        made[name] = _debootstrap_foreign(client, repo, suite, slim, name, log, log_file)
        results.append(BaseResult(ref, "debootstrap", made[name].digest, time.monotonic() - begun, name))
        log(f"{ref} {name}: debootstrap and push took {time.monotonic() - begun:.0f}s ({made[name].digest})")
    if native in todo:
        begun = time.monotonic()
        _debootstrap(suite, slim, ref, log, log_dir / f"base-debian-{suite}.log")
        digest = push_verified(ref, log)   # the tag: the engine's single image, as a one-platform base is
        pushed = base_index.read_children(client, repo, digest)
        if native not in pushed:
            raise FailedError(f"{ref}: the engine imported a {', '.join(pushed)} image, not {native}")
        made[native] = pushed[native]
        results.append(BaseResult(ref, "debootstrap", digest, time.monotonic() - begun, native))
    if set(made) != {native}:
        # Entries of platforms outside the table (an upstream index's) are not carried over.
        index = base_index.put_index(client, repo, tag, [made[p] for p in _ordered(set(made))])
        log(f"{ref}: index {index} over {', '.join(_ordered(set(made)))}")
    done = {r.platform for r in results}
    results += [BaseResult(ref, "present", made[p].digest, 0.0, p) for p in wanted if p not in done]
    return sorted(results, key=lambda r: list(platforms.KNOWN).index(r.platform))


def fill_bases(cells: list[Cell], base_mirror: str, *, force: bool, log: Log, log_dir: Path,
               templates: Path, only: tuple[str, ...] = ()) -> list[BaseResult]:
    """Make every base the cells need present in the mirror registry (idempotent). `templates` is the
    project's folder: a multi-platform stand-in installs with the uv its uv.lock pins. `only`: just these
    platforms of each cell (a build without push of some of them; empty: every platform)."""
    mirror = local_mirror(base_mirror)
    RegistryClient(mirror.split("/", 1)[0]).ping()
    engine.sdk()
    log_dir.mkdir(parents=True, exist_ok=True)
    results: list[BaseResult] = []
    # Debian first: stand-ins are built FROM it. Every cell is checked before anything is made.
    wanted: dict[str, tuple[str, set[str]]] = {}
    for cell in cells:
        upstream = debian_upstream_for(cell)
        if not upstream.startswith("docker.io/library/debian:"):
            raise UserError(f"{cell.key}: no recipe for base {upstream}; only Debian bases and NGC stand-ins "
                            "can be made locally")
        names = [p for p in debian_platforms(cell) if not only or p in only]
        wanted.setdefault(mirror_base(upstream, mirror), (upstream, set()))[1].update(names)
    # Kept even with force: a new Debian base changes every image's content key.
    for ref, (upstream, needed) in wanted.items():
        results += _debian_base(ref, upstream, _ordered(needed), log, log_dir)
    done: set[str] = set(wanted)
    for cell in cells:
        if cell.standin is None or cell.base.startswith("docker.io/library/debian:"):
            continue
        ref = mirror_base(cell.base, mirror)
        if ref in done:
            continue
        done.add(ref)
        if cell.multi_platform:
            results += _standin_index(cell, ref, mirror, force=force, log=log, log_dir=log_dir, templates=templates,
                                      only=only)
            continue
        started = time.monotonic()
        digest = None if force else registry_digest(ref)
        # A stand-in inherits its Debian base's labels: one on an older recipe's base is made again.
        if digest and _made_by_recipe(ref, debian_suite(cell.standin.base)[0], log):
            results.append(BaseResult(ref, "present", digest, time.monotonic() - started))
            continue
        debian_ref = mirror_base(cell.standin.base, mirror)
        log(f"building stand-in {ref} (FROM {debian_ref}, {' '.join(cell.standin.requirements)})")
        log_file = log_dir / f"base-standin-{cell.name}-{cell.version}.log"
        _build_standin(cell, _standin_dockerfile(cell, debian_ref), {"BASE_IMAGE": debian_ref}, ref, log_file)
        digest = push_verified(ref, log)
        results.append(BaseResult(ref, "stand-in", digest, time.monotonic() - started))
    return results


def _build_standin(cell: Cell, dockerfile_text: str, build_args: dict[str, str], tag: str, log_file: Path,
                   platform: str | None = None, measure_framework: bool = False) -> None:
    """Build a stand-in (of `platform`; None: the engine's own) and tag it, labelled with the Python it has.
    `measure_framework`: its framework version label is what the framework reports in it (imported there),
    which must be the version its requirement pins; otherwise the label is the pin."""
    labels: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="buildtool-standin-") as tmp, pip_secrets() as secrets:
        dockerfile = Path(tmp) / "Dockerfile"
        dockerfile.write_text(dockerfile_text)
        client = engine.resolve_build_client()
        try:
            image = engine.build(client, Path(tmp), dockerfile, build_args=build_args, labels={},
                                 secrets=secrets.files, log_path=log_file, platform=platform)
            if measure_framework:
                labels[label_keys.STANDIN_FRAMEWORK] = _measured_framework(cell, image, platform or
                                                                           platforms.host().name, Path(tmp))
            python = engine.run_output(image, ["python", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                       timeout=300, platform=platform)
            # Same steps again, all cached, now with the probed label.
            engine.build(client, Path(tmp), dockerfile, build_args=build_args,
                         labels={**labels, label_keys.STANDIN_PYTHON: python.strip()}, secrets=secrets.files,
                         log_path=log_file.with_suffix(".label.log"), tag=tag, platform=platform)
        except (engine.BuildFailed, RuntimeError) as exc:
            raise FailedError(f"stand-in {tag}: {exc}; full log {log_file}") from None


def _measured_framework(cell: Cell, image: str, platform: str, folder: Path) -> str:
    """The framework's own `__version__` in a stand-in image of `platform` (under QEMU with the emulated CPU
    sysfs where it is another machine's), checked against the public version the stand-in's requirement
    pins: PyPI's CUDA torch 2.13.0 reports 2.13.0+cu130, and the image tests compare the image with this."""
    from buildtool.common import docker_cli
    from buildtool.contracts import emulation, versions

    module = frameworks.get(cell.framework).module
    flags = emulation.run_flags(platform, folder / "cpu-sysfs")
    run = docker_cli.docker("run", "--rm", "--network=none", "--platform", platform, *flags, image, "python", "-c",
                            f"import {module}; print({module}.__version__)", timeout=900)
    found = run.stdout.strip().splitlines()[-1:] if run.returncode == 0 else []
    if not found:
        raise FailedError(f"stand-in of {cell.base} ({platform}): `import {module}` failed in it: "
                          f"{run.stderr.strip().splitlines()[-1:] or run.returncode}")
    pinned = standin_framework_version(cell, platform)
    if versions.split(found[0])[0] != versions.split(pinned)[0]:
        raise FailedError(f"stand-in of {cell.base} ({platform}) has {module} {found[0]}, not the {pinned} its "
                          "requirement pins")
    return found[0]


def _standin_index(cell: Cell, ref: str, mirror: str, *, force: bool, log: Log, log_dir: Path,
                   templates: Path, only: tuple[str, ...] = ()) -> list[BaseResult]:
    """The stand-in of a multi-platform cell: one image per platform (_standin_index_dockerfile), each pushed
    under `<tag>__<arch>`, then an OCI index over them at the tag (the platforms' images first: one that fails
    leaves the tag as it was). A tag that already holds every platform is kept (a real mirror of the upstream
    too); one that lacks some is made again whole. `only`: just these of the cell's platforms are wanted (a build
    without push): they are made again when the tag lacks one of them, and the tag's other platforms are kept."""
    from buildtool.contracts.locks import uv_requirement
    from buildtool.imagebuild import aptlock, multiplatform
    from buildtool.registry.image_index import put_index

    assert cell.standin is not None
    started = time.monotonic()
    host, repo, tag = split_repo(ref)
    client = RegistryClient(host)
    try:
        children = {} if force else base_index.read_children(client, repo, tag)
    except NotFound:
        children = {}
    wanted = [p for p in cell.platforms if not only or p in only]
    if all(p in children for p in wanted):
        return [BaseResult(ref, "present", children[p].digest, time.monotonic() - started, p) for p in wanted]
    for name in wanted:
        problem = platforms.binfmt_problem(name)
        if problem:
            raise UserError(f"cannot make the {name} stand-in {ref}: {problem}")
    debian_ref = mirror_base(cell.standin.base, mirror)
    requirement = uv_requirement((templates / "uv.lock").read_text())[1]
    text = _standin_index_dockerfile(cell, debian_ref, requirement)
    build_base = aptlock.platform_base(debian_ref, platforms.host().name)
    made, results = [], []
    for name in wanted:
        begun = time.monotonic()
        arch = platforms.get(name).architecture
        log(f"building the {name} stand-in of {ref} (FROM {debian_ref}, "
            f"{' '.join(cell.standin.requirements_for(name))}; installed natively)")
        platform_ref = f"{host}/{repo}:{multiplatform.platform_tag(tag, name)}"
        _build_standin(cell, text, {"BASE_IMAGE": aptlock.platform_base(debian_ref, name),
                                    "BUILD_BASE_IMAGE": build_base}, platform_ref,
                       log_dir / f"base-standin-{cell.name}-{cell.version}-{arch}.log", platform=name,
                       measure_framework=True)
        digest = push_verified(platform_ref, log)
        made.append(multiplatform.child_of(client, repo, multiplatform.platform_tag(tag, name), name))
        results.append(BaseResult(ref, "stand-in", digest, time.monotonic() - begun, name))
    kept = [children[p] for p in cell.platforms if p not in wanted and p in children]
    index = put_index(client, repo, tag, sorted([*made, *kept], key=lambda c: cell.platforms.index(c.platform)))
    log(f"{ref}: index {index} over {', '.join(p for p in cell.platforms if p in wanted or p in children)}")
    return results
