"""`buildtool bases`: fill a (local) mirror registry with the bases a build needs.

When the upstream registries cannot be reached (air-gapped sites, this project's CI):
- Debian bases (`docker.io/library/debian:<suite>[-slim]`) are made by mmdebstrap at one archive state (the
  suite's InRelease, DEBIAN_ARCHIVE's, dated by its `Date:`) and written to the registry by base_index, so two
  machines given the same InRelease make the same base digest (issue 52; docs/contents.md#reproducibility says
  how). Each platform is an image by digest; one platform is tagged as it is, more become an OCI index;
- NGC bases (`nvcr.io/nvidia/...`) get a stand-in built FROM that Debian base with python and
  pip on PATH, the framework from the cell's `standin.requirements` and NGC's working
  directory. A stand-in is a test fixture: it is labelled so, and images built on it carry
  that label, which the catalogue and the release command refuse.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from buildtool.common import docker_cli
from buildtool.common.errors import FailedError, UserError
from buildtool.common.refs import is_loopback_host, split_repo
from buildtool.common.urls import public_url
from buildtool.contracts import emulation, frameworks, label_keys, platforms, versions
from buildtool.contracts.image_labels import archive_label
from buildtool.contracts.locks import uv_requirement
from buildtool.contracts.names import DEFAULT_REGISTRY
from buildtool.imagebuild import aptlock, archive_state, base_index, engine, multiplatform, push_path, rootfs_seal
from buildtool.imagebuild.cell_inputs import scrub_log, secret_strings
from buildtool.imagebuild.pipconfig import HostPip, pip_secrets
from buildtool.matrix.plan import mirror_base
from buildtool.matrix.schema import Cell
from buildtool.registry.client import NotFound, RegistryClient, RetryPolicy
from buildtool.registry.image_index import MAX_CONFIG_BYTES
from buildtool.render.dockerfiles import label_value

MMDEBSTRAP_TIMEOUT = 1200
MEASURE_TIMEOUT = 900   # importing the framework in a stand-in, under QEMU where emulated
ARCHIVE_ENV = "DEBIAN_ARCHIVE"
DEFAULT_ARCHIVE = "http://deb.debian.org/debian"
# mmdebstrap's own hook for merged /usr as debootstrap sets it up (symlinks and usr-is-merged): without it
# mmdebstrap installs the usrmerge package and perl with it (96 packages instead of debootstrap's 88).
MERGED_USR_HOOKS = "/usr/share/mmdebstrap/hooks/merged-usr"
# The image's command, as `docker run debian` has it.
BASE_CMD = ["bash"]
# What Debian's -slim images leave out (their dpkg excludes), so a -slim base made here
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
# Its path-includes (relative to the root): kept in the tree as dpkg keeps them in later installs.
SLIM_KEPT = tuple(line.split(" ", 1)[1].lstrip("/") for line in SLIM_EXCLUDES.splitlines()
                  if line.startswith("path-include "))

Log = Callable[[str], None]


@dataclass(frozen=True)
class BaseResult:
    ref: str
    action: str  # "present", "mmdebstrap", "stand-in"
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
    host, repo, tag = split_repo(ref)
    return RegistryClient(host, retry=RetryPolicy(attempts=attempts, timeout=20)).manifest_digest(repo, tag)


def push_verified(ref: str, log: Log, attempts: int = 4, via: str = push_path.ENGINE) -> str:
    """Push with retries and backoff, by the engine or by skopeo (buildtool.imagebuild.push_path); verify the
    registry serves the digest the push reported."""
    delay = 2.0
    for attempt in range(1, attempts + 1):
        try:
            digest = push_path.skopeo_push(ref) if via == push_path.SKOPEO else engine.push(ref)
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
    `platform`: the base's (None: the default platform); the label names its architecture unless it is the default
    one, whichever machine makes it (natively or under QEMU): the label is in the image's config, so its digest."""
    chosen = platforms.get(platform or platforms.DEFAULT[0])
    arch = f"--architectures={chosen.architecture} " if chosen.name != platforms.DEFAULT[0] else ""
    return f"mmdebstrap {arch}--variant=minbase {suite}, recipe {rootfs_seal.RECIPE}"


MADE_HERE = ("debootstrap ", "mmdebstrap ")   # BASE_SOURCE of a base this tool made, by any recipe


def debian_archive() -> str:
    """DEBIAN_ARCHIVE (the Debian archive the bases are made from), else deb.debian.org's; UserError when it is
    no http(s) URL without credentials."""
    archive = os.environ.get(ARCHIVE_ENV, "").strip().rstrip("/") or DEFAULT_ARCHIVE
    if not archive.startswith(("http://", "https://")) or public_url(archive) != archive:
        raise UserError(f"{ARCHIVE_ENV}: {public_url(archive) or 'the value'} is not an http(s) URL of a Debian "
                        "archive without credentials, query or fragment (e.g. http://deb.debian.org/debian)")
    return archive


def registry_base_source(ref: str) -> str | None:
    """The BASE_SOURCE label of a single-platform image in a registry (None: no such label or no config)."""
    host, repo, tag = split_repo(ref)
    client = RegistryClient(host)
    manifest = json.loads(client.get_manifest(repo, tag)[0])
    if "config" not in manifest:
        return None
    config = json.loads(client.get_blob(repo, manifest["config"]["digest"], limit=MAX_CONFIG_BYTES))
    labels = (config.get("config") or {}).get("Labels")
    return (labels or {}).get(label_keys.BASE_SOURCE)


@dataclass(frozen=True)
class ArchiveState:
    """The Debian archive a base is made from, as it was: its suite's InRelease (URL, sha256, Date)."""

    release: archive_state.ReleaseFile
    epoch: int        # its Date as Unix time: the base's SOURCE_DATE_EPOCH

    @property
    def label(self) -> str:
        return archive_label(self.release.uri, self.release.sha256, self.release.date)


def read_archive_state(archive: str, suite: str, fetch: archive_state.Fetch | None = None) -> ArchiveState:
    """The suite's InRelease as the archive serves it now (FailedError naming it when it cannot be read)."""
    release, date = archive_state.read_release(f"{archive}/dists/{suite}/InRelease", fetch)
    return ArchiveState(release, int(date.timestamp()))


@dataclass(frozen=True)
class LogFile:
    """Where a base's mmdebstrap writes its output, and the strings masked in each line (as in every build log)."""

    path: Path
    secrets: Sequence[str] = ()


def _make_platform(client: RegistryClient, repo: str, suite: str, slim: bool, platform: str, state: ArchiveState,
                   log: Log, log_file: LogFile) -> base_index.Child:
    """One platform's base: a sealed mmdebstrap tree (QEMU runs the second stage of another machine's), written
    to the registry as an image of `platform` by digest; no tag moves."""
    native = platform == platforms.host().name
    with tempfile.TemporaryDirectory(prefix="buildtool-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        started = time.monotonic()
        _make_rootfs(suite, slim, rootfs, None if native else platform, state, log, log_file)
        log(f"{platform} tree made in {time.monotonic() - started:.0f}s; writing its image to {client.host}/{repo}")
        started = time.monotonic()
        source = base_source(suite, platform)
        child = base_index.rootfs_image(client, repo, rootfs, platform, epoch=state.epoch, cmd=BASE_CMD,
                                        labels={label_keys.BASE_SOURCE: source, label_keys.BASE_ARCHIVE: state.label},
                                        created_by=f"{source} (buildtool bases)")
        log(f"{platform} image {child.digest} written in {time.monotonic() - started:.0f}s")
        return child


def _make_rootfs(suite: str, slim: bool, rootfs: Path, platform: str | None, state: ArchiveState, log: Log,
                 log_file: LogFile) -> None:
    """mmdebstrap (for `platform`, None: this machine's) at the archive state `state`, slimmed and sealed."""
    if not shutil.which("mmdebstrap"):
        raise UserError("mmdebstrap is not installed; run `bash scripts/setup.sh` (installs it as root)")
    # The lists are kept, to check which InRelease it read (they are removed after).
    argv = ["mmdebstrap", "--mode=root", "--variant=minbase", "--format=directory",
            *([f"--architectures={platforms.get(platform).architecture}"] if platform else []),
            f"--hook-dir={MERGED_USR_HOOKS}", "--skip=cleanup/apt/lists", suite, str(rootfs),
            state.release.uri.rsplit("/dists/", 1)[0]]
    what = " ".join(argv[:-2])
    log(f"SOURCE_DATE_EPOCH={state.epoch} {what} ({'a few minutes under QEMU' if platform else 'about a minute'})"
        f" -> {rootfs}")
    # Appended to: a suite's base and its -slim sibling share the log. Private and masked as an image's build log.
    with engine.private_log(log_file.path, append=True) as out:
        try:
            returncode = engine.run_masked(argv, {**os.environ, "SOURCE_DATE_EPOCH": str(state.epoch)}, out,
                                           log_file.secrets, MMDEBSTRAP_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise FailedError(f"{what} timed out after {MMDEBSTRAP_TIMEOUT}s; see {log_file.path}") from None
    if returncode != 0:
        raise FailedError(f"{what} exited {returncode}; see {log_file.path}")
    read = sorted((rootfs / "var/lib/apt/lists").glob(f"*_dists_{suite}_InRelease"))
    found = [hashlib.sha256(p.read_bytes()).hexdigest() for p in read]
    if found != [state.release.sha256]:
        raise FailedError(f"mmdebstrap read {', '.join(found) or 'no'} InRelease of {suite}, not the "
                          f"{state.release.uri} of sha256 {state.release.sha256} the base is dated by: the archive "
                          "moved while the base was made; run it again")
    if slim:
        _slim(rootfs)
    # Package lists and downloaded .debs are not part of an image (as in Docker's Debian).
    for folder in ("var/lib/apt/lists", "var/cache/apt/archives"):
        for item in (rootfs / folder).glob("*"):
            if item.is_file():
                item.unlink()
    rootfs_seal.seal(rootfs, state.epoch)  # last: every change above moved an mtime


def _slim(rootfs: Path) -> None:
    """What SLIM_EXCLUDES leaves out of later installs, taken out of the tree too (its path-includes kept), and
    the filter written for dpkg."""
    (rootfs / "etc/dpkg/dpkg.cfg.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/dpkg/dpkg.cfg.d/docker-slim").write_text(SLIM_EXCLUDES)
    # Its mode in the layer is Debian's (0644), not what the umask of the machine making the base leaves.
    (rootfs / "etc/dpkg/dpkg.cfg.d/docker-slim").chmod(0o644)
    for folder in ("usr/share/man", "usr/share/info", "usr/share/locale"):
        target = rootfs / folder
        for item in target.iterdir() if target.is_dir() else ():
            if not any(fnmatch.fnmatchcase(f"{folder}/{item.name}", kept) for kept in SLIM_KEPT):
                _remove(item)
    doc = rootfs / "usr/share/doc"
    for item in doc.iterdir() if doc.is_dir() else ():
        if item.is_dir() and not item.is_symlink():
            for child in item.iterdir():
                if child.name != "copyright":
                    _remove(child)


def _remove(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def _standin_dockerfile(cell: Cell, debian_ref: str) -> str:
    return _render_standin("standin.Dockerfile.j2", cell, debian_ref,
                           framework_version=standin_framework_version(cell))


def _standin_index_dockerfile(cell: Cell, debian_ref: str, uv_requirement: str) -> str:
    """A stand-in of a multi-platform cell, one Dockerfile for every platform: its requirements are resolved and
    installed by uv on the build machine (BuildKit's BUILDPLATFORM, the same Debian base and Python) for the
    target's wheel platform, in a venv at the stand-in's path, then copied in; on the target (under QEMU where it
    is another machine's) only apt runs. uv is the one templates/uv.lock pins, by hash."""
    return _render_standin("standin-index.Dockerfile.j2", cell, debian_ref, uv_requirement=uv_requirement,
                           targets=[platforms.get(p) for p in cell.platforms])


def _render_standin(template: str, cell: Cell, debian_ref: str, **context: object) -> str:
    """buildtool/imagebuild/templates/`template`. Matrix values on a RUN line are single inert shell words
    (`sh`, `quote`); LABEL values are escaped (`label`)."""
    from buildtool.common.documents import render_document

    filters = {"sh": shlex.join, "quote": shlex.quote, "label": label_value}
    return render_document("buildtool.imagebuild", template, filters, cell=cell, debian_ref=debian_ref,
                           label_keys=label_keys, **context)


def standin_framework_version(cell: Cell, platform: str | None = None) -> str:
    """What the stand-in (of `platform`; None: its only one) really carries: the pinned version of its
    framework requirement."""
    assert cell.standin is not None
    wanted = frameworks.get(cell.framework).distributions
    for text in cell.standin.requirements_for(platform or cell.platforms[0]):
        try:
            req = Requirement(text)    # `torch[opt]==2.13.0` pins torch, as pip reads it
        except InvalidRequirement:     # the matrix refuses it; the stand-in's own install names it
            continue
        pinned = [s.version for s in req.specifier if s.operator in ("==", "===")]
        if pinned and req.name.lower() in wanted:
            return pinned[0]
    return "unknown"


def debian_upstream_for(cell: Cell) -> str:
    """The Debian upstream a cell needs: its own base, or its stand-in's base."""
    if cell.standin is not None and not cell.base.startswith("docker.io/library/debian:"):
        return cell.standin.base
    return cell.base


def _current(found: str | None, what: str, wanted: str, log: Log) -> bool:
    """False (said in the log: `what` is made again) for a base this tool made (its BASE_SOURCE `found` says
    mmdebstrap, or debootstrap before issue 52) by another recipe than `wanted`, today's. A base without that
    label came from elsewhere (a mirror of the upstream): never replaced."""
    if found is None or not found.startswith(MADE_HERE) or found == wanted:
        return True
    log(f"{what} was made by {found!r}, not {wanted!r}: making it again")
    return False


def _made_by_recipe(ref: str, suite: str, log: Log, platform: str | None = None) -> bool:
    return _current(registry_base_source(ref), ref, base_source(suite, platform), log)


def recipe_suite(cell: Cell) -> str:
    """The Debian suite the cell's base is (or its stand-in is built on)."""
    return debian_suite(debian_upstream_for(cell))[0]


def debian_platforms(cell: Cell) -> tuple[str, ...]:
    """The platforms the cell needs of its Debian base: its own, or its stand-in's (one stand-in image per
    platform of the cell, each built FROM that platform's Debian image)."""
    return cell.platforms


def _stale(children: dict[str, base_index.Child], wanted: Iterable[str], ref: str, suite: str, log: Log) -> list[str]:
    return [p for p in wanted if p not in children or not _current(
        children[p].labels.get(label_keys.BASE_SOURCE), f"{ref} {p}",
        base_source(suite, p), log)]


def _children(client: RegistryClient, repo: str, tag: str) -> dict[str, base_index.Child]:
    """The platform images at repo:tag ({}: no such tag)."""
    try:
        return base_index.read_children(client, repo, tag)
    except NotFound:
        return {}


def stale_platforms(ref: str, wanted: tuple[str, ...], suite: str, log: Log = lambda line: None) -> list[str]:
    """Which of `wanted` the base tag lacks or holds by an older recipe (all of them: no such tag)."""
    host, repo, tag = split_repo(ref)
    return _stale(_children(RegistryClient(host), repo, tag), wanted, ref, suite, log)


def _check_runnable(names: Iterable[str], what: str) -> None:
    """Refused before anything is made: an emulated platform this machine cannot run."""
    for name in names:
        problem = platforms.binfmt_problem(name)
        if problem:
            raise UserError(f"cannot make the {name} {what}: {problem}")


def _ordered(names: set[str]) -> list[str]:
    return [p for p in platforms.KNOWN if p in names]


def _debian_base(ref: str, upstream: str, wanted: list[str], log: Log, log_dir: Path,
                 fetch: archive_state.Fetch | None = None) -> list[BaseResult]:
    """Make `ref` hold a current image of every wanted platform: one platform that image, more an OCI index over
    them. Images already current are kept by digest; the others are made by digest from one archive state (the
    suite's InRelease, read once) before the tag moves, so one that fails leaves the tag as it was."""
    started = time.monotonic()
    host, repo, tag = split_repo(ref)
    client = RegistryClient(host)
    suite, slim = debian_suite(upstream)
    children = _children(client, repo, tag)
    todo = _stale(children, wanted, ref, suite, log)
    if not todo:
        return [BaseResult(ref, "present", children[p].digest, time.monotonic() - started, p) for p in wanted]
    _check_runnable(todo, f"base {ref}")
    state = read_archive_state(debian_archive(), suite, fetch)
    log(f"{ref}: the archive state is {state.release.uri} sha256:{state.release.sha256} ({state.release.date})")
    results: dict[str, BaseResult] = {}
    made = dict(children)
    secrets = secret_strings(HostPip.from_host())   # as every build log is masked
    for name in todo:
        begun = time.monotonic()
        log_file = LogFile(log_dir / f"base-debian-{suite}-{platforms.get(name).architecture}.log", secrets)
        made[name] = _make_platform(client, repo, suite, slim, name, state, log, log_file)
        results[name] = BaseResult(ref, "mmdebstrap", made[name].digest, time.monotonic() - begun, name)
        log(f"{ref} {name}: mmdebstrap and write took {time.monotonic() - begun:.0f}s ({made[name].digest})")
    if len(made) == 1:
        base_index.tag_child(client, repo, tag, next(iter(made.values())))
    else:
        # Entries of platforms outside the table (an upstream index's) are not carried over.
        index = base_index.put_index(client, repo, tag, [made[p] for p in _ordered(set(made))])
        log(f"{ref}: index {index} over {', '.join(_ordered(set(made)))}")
    return [results.get(p) or BaseResult(ref, "present", made[p].digest, 0.0, p) for p in wanted]


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
        if digest and _made_by_recipe(ref, debian_suite(cell.standin.base)[0], log, cell.platforms[0]):
            results.append(BaseResult(ref, "present", digest, time.monotonic() - started))
            continue
        debian_ref = mirror_base(cell.standin.base, mirror)
        pinned = _pinned(debian_ref)
        log(f"building stand-in {ref} (FROM {pinned}, {' '.join(cell.standin.requirements)})")
        log_file = log_dir / f"base-standin-{cell.name}-{cell.version}.log"
        _build_standin(cell, _standin_dockerfile(cell, debian_ref), {"BASE_IMAGE": pinned}, ref, log_file)
        digest = push_verified(ref, log)
        results.append(BaseResult(ref, "stand-in", digest, time.monotonic() - started))
    return results


def _pinned(ref: str) -> str:
    """`ref` by the digest its registry holds now: a FROM by tag is resolved by the engine, which takes an image of
    that tag in its own store (an older base pulled or built here before) over the registry's."""
    digest = registry_digest(ref)
    if not digest:
        raise FailedError(f"the base {ref} is not in its registry after it was made; run `make bases` again")
    host, repo, _ = split_repo(ref)
    return f"{host}/{repo}@{digest}"


def _build_standin(cell: Cell, dockerfile_text: str, build_args: dict[str, str], tag: str, log_file: Path,
                   platform: str | None = None, measure_framework: bool = False) -> None:
    """Build a stand-in (of `platform`; None: the engine's own) and tag it, labelled with the Python it has.
    `measure_framework`: its framework version label is what the framework reports in it (imported there),
    which must be the version its requirement pins; otherwise the label is the pin."""
    labels: dict[str, str] = {}
    host = HostPip.from_host()
    with tempfile.TemporaryDirectory(prefix="buildtool-standin-") as tmp, pip_secrets(host) as secrets:
        dockerfile = Path(tmp) / "Dockerfile"
        dockerfile.write_text(dockerfile_text)
        client = engine.resolve_build_client()
        try:
            image = engine.build(client, engine.BuildRequest(Path(tmp), dockerfile, build_args=build_args, labels={},
                                 secrets=secrets.files, log_path=log_file, platform=platform,
                                 log_secrets=secret_strings(host)))
            if measure_framework:
                labels[label_keys.STANDIN_FRAMEWORK] = _measured_framework(cell, image, platform or
                                                                           platforms.host().name, Path(tmp))
            python = engine.run_output(image, ["python", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                       timeout=300, platform=platform)
            # Same steps again, all cached, now with the probed label.
            engine.build(client, engine.BuildRequest(Path(tmp), dockerfile, build_args=build_args,
                         labels={**labels, label_keys.STANDIN_PYTHON: python.strip()}, secrets=secrets.files,
                         log_path=log_file.with_suffix(".label.log"), tag=tag, platform=platform,
                         log_secrets=secret_strings(host)))
        except (engine.BuildFailed, RuntimeError) as exc:
            raise FailedError(f"stand-in {tag}: {exc}; full log {log_file}") from None
        finally:   # as the builder scrubs its logs: the index tokens pip or uv may have printed
            for log in (log_file, log_file.with_suffix(".label.log")):
                scrub_log(log, secret_strings(host))


def _measured_framework(cell: Cell, image: str, platform: str, folder: Path) -> str:
    """The framework's own `__version__` in a stand-in image of `platform` (under QEMU with the emulated CPU
    sysfs where it is another machine's), checked against the public version the stand-in's requirement
    pins: PyPI's CUDA torch 2.13.0 reports 2.13.0+cu130, and the image tests compare the image with this."""
    module = frameworks.get(cell.framework).module
    flags = emulation.run_flags(platform, folder / "cpu-sysfs")
    # A name of its own, removed in `finally`: a client killed at its timeout never runs its own `--rm`.
    name = f"dl-images-standin-{os.urandom(6).hex()}"
    try:
        run = docker_cli.docker("run", "--rm", "--name", name, "--network=none", "--platform", platform, *flags,
                                image, "python", "-c", f"import {module}; print({module}.__version__)",
                                timeout=MEASURE_TIMEOUT)
    except docker_cli.DockerTimeout:
        raise FailedError(f"stand-in of {cell.base} ({platform}): `import {module}` did not finish within "
                          f"{MEASURE_TIMEOUT}s") from None
    finally:
        docker_cli.remove(name)
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
    from buildtool.registry.image_index import put_index

    assert cell.standin is not None
    started = time.monotonic()
    host, repo, tag = split_repo(ref)
    client = RegistryClient(host)
    children = {} if force else _children(client, repo, tag)
    wanted = [p for p in cell.platforms if not only or p in only]
    if all(p in children for p in wanted):
        return [BaseResult(ref, "present", children[p].digest, time.monotonic() - started, p) for p in wanted]
    _check_runnable(wanted, f"stand-in {ref}")
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
