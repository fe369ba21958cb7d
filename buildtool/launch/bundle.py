"""An OCI bundle of an image for SLURM's own containers (`srun --container=BUNDLE`), fitted to its run profile.

skopeo copies the image into an OCI layout; umoci unpacks it (`rootfs/` and a runtime `config.json`); fit_config
fits umoci's generic config to the multi-node check and the image's run profile (its label_keys.RUN_PROFILE
label, else the matrix cell's), as docs/multinode.md ("on a SLURM cluster") lists. Why not umoci's defaults:
its 64 MB /dev/shm fails DataLoader workers and NCCL; its nofile 1024 is too few (without it the job's own
limits apply, as under apptainer and pyxis); the container must be the node (no private pid, network or uts
namespace: c10d agents on one host are told apart by hostname and pid); SLURM 22.05 has no per-job bind
mounts, so jobs write to `BUNDLE/jobs/<job>/`, bound read-only at JOBS_MOUNT.

Mount sources are absolute paths: a bundle is made for the place it lives in. The folder appears whole or
not at all (built beside DEST in a temporary folder, renamed into place).

A bundle is of one platform (os/arch): skopeo picks that platform's manifest of an image index, the copied
image's config must declare it, and the bundle's record names it (`platform`, and `machine` as `uname -m`
prints it), so the sbatch script can refuse nodes of another architecture (buildtool.launch.slurm).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from buildtool.common import argcheck, sizes
from buildtool.common.errors import FailedError, UserError
from buildtool.contracts import label_keys, platforms
from buildtool.contracts.image_labels import ImageLabels, LabelError
from buildtool.registry.tools import skopeo_access

JOBS_DIR = "jobs"
JOBS_MOUNT = "/opt/dl-images/jobs"
HOSTS_FILE = "hosts"
META_FILE = "dl-images-bundle.json"
# The image's ENTRYPOINT, one argument a line (empty: none). SLURM's containers run the step's command in place
# of the bundle's process, so the sbatch script puts these words first, as validate runs the image (issue 39).
ENTRYPOINT_FILE = "entrypoint.args"
COPY_TIMEOUT_S = 1800
UNPACK_TIMEOUT_S = 1800
UNLIMITED = 2**64 - 1
# docker --ulimit names -> OCI rlimit types
RLIMITS = {name: f"RLIMIT_{name.upper()}" for name in ("stack", "memlock", "nofile", "nproc", "core", "cpu", "fsize",
                                                     "as", "rss", "msgqueue", "sigpending", "nice", "rtprio", "locks",
                                                     "data")}
# A ulimit: one value for soft and hard (docker's NAME=VALUE, a run profile's), or (soft, hard); -1: unlimited.
Limit = int | tuple[int, int]
ULIMIT_VALUE = r"-1|unlimited|[0-9]{1,19}"   # contracts/arguments.py ULIMIT's grammar, the form --help advertises


@dataclass(frozen=True)
class Profile:
    """What the bundle takes from a run profile."""

    shm_size: str
    ulimits: tuple[tuple[str, Limit], ...] = ()
    gpus: bool = False
    ipc_host: bool = False
    source: str = ""          # where it came from, for the summary


@dataclass(frozen=True)
class Bundle:
    path: str
    image: str
    digest: str
    profile_source: str
    shm_size: str
    shm_bytes: int
    ulimits: dict[str, Limit]
    read_only: bool
    hosts: str
    jobs_dir: str
    seconds: float
    platform: str = ""        # os/arch of the image unpacked (the record of an older bundle lacks it)
    machine: str = ""         # what `uname -m` prints on nodes that run it natively
    entrypoint: tuple[str, ...] = ()   # the image's ENTRYPOINT (also in ENTRYPOINT_FILE, for the sbatch script)


def docker_transport(image: str) -> str:
    """`docker://IMAGE` as containers/image reads it (skopeo, Apptainer's docker:// pulls), which refuses a reference
    with a tag and a digest ("both a tag and digest are currently not supported"): the digest, which names the image,
    goes alone."""
    ref = argcheck.reference("IMAGE", image)
    return f"docker://{ref.registry}/{ref.repository}@{ref.digest}" if ref.tag and ref.digest else f"docker://{image}"


def shm_bytes(size: str, what: str = "--shm-size") -> int:
    """A /dev/shm size (8g, 512m, 1048576) in bytes, by the one rule (sizes.shm_bytes); UserError naming WHAT."""
    try:
        return sizes.shm_bytes(size)
    except sizes.SizeError as exc:
        raise UserError(f"{what}: {exc}") from None


def _profile_shm_bytes(profile: Profile) -> int:
    return shm_bytes(profile.shm_size, f"shm_size of {profile.source or 'the run profile'}")


def profile_from_labels(labels: dict[str, str]) -> Profile | None:
    """The run profile an image carries in its label (None when it carries none); a label that does not
    parse (contracts.image_labels) is a UserError naming it, never a fallback to the matrix cell's."""
    try:
        run = ImageLabels.parse(labels).run_profile
    except LabelError as exc:
        raise UserError(f"the image's {exc}; rebuild it with `buildtool build`") from None
    if run is None:
        return None
    return Profile(shm_size=run.shm_size, ulimits=run.ulimits or (), gpus=run.gpus not in (None, "none"),
                   ipc_host=run.ipc == "host", source=f"the image's {label_keys.RUN_PROFILE} label")


def fit_config(config: dict[str, Any], bundle: Path, profile: Profile, *, hosts: bool, jobs_dir: Path | None,
               read_only: bool = True) -> dict[str, Any]:
    """umoci's config.json -> one for `srun --container` with PROFILE (pure; BUNDLE is where it will live)."""
    cfg = json.loads(json.dumps(config))
    process = cfg.setdefault("process", {})
    process["terminal"] = False
    # umoci writes nofile 1024 (too few for DataLoader workers); without an entry the job's own limit applies,
    # as under apptainer and pyxis (SLURM propagates the submitter's limits). Only the profile's are set.
    limits = {r["type"]: r for r in process.get("rlimits", []) if r.get("type") != "RLIMIT_NOFILE"}
    for name, value in profile.ulimits:
        kind = RLIMITS.get(name)
        if kind is None:
            raise UserError(f"run profile ulimit {name!r} has no OCI rlimit; known: {', '.join(sorted(RLIMITS))}")
        soft, hard = ((UNLIMITED if v < 0 else v) for v in (value if isinstance(value, tuple) else (value, value)))
        limits[kind] = {"type": kind, "hard": hard, "soft": soft}
    process["rlimits"] = [limits[k] for k in sorted(limits)]
    if profile.gpus:
        env = [e for e in process.get("env", [])
               if not e.startswith(("NVIDIA_VISIBLE_DEVICES=", "NVIDIA_DRIVER_CAPABILITIES="))]
        process["env"] = [*env, "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
    cfg.pop("hostname", None)
    linux = cfg.setdefault("linux", {})
    keep = {"mount"} if profile.ipc_host else {"mount", "ipc"}
    linux["namespaces"] = [ns for ns in linux.get("namespaces", []) if ns.get("type") in keep]
    cfg.setdefault("root", {"path": "rootfs"})["readonly"] = read_only
    replaced = {"/dev/shm", "/etc/hosts", "/etc/resolv.conf", "/tmp", JOBS_MOUNT}
    mounts = [m for m in cfg.get("mounts", []) if m.get("destination") not in replaced]
    tmpfs, ro_bind = ["nosuid", "nodev", "mode=1777"], ["rbind", "ro"]
    added = [("/dev/shm", "tmpfs", "shm", [*tmpfs, f"size={_profile_shm_bytes(profile)}"]),
             ("/etc/hosts", "bind", str(bundle / HOSTS_FILE) if hosts else "/etc/hosts", ro_bind),
             *([] if hosts else [("/etc/resolv.conf", "bind", "/etc/resolv.conf", ro_bind)]),
             *([("/tmp", "tmpfs", "tmpfs", tmpfs)] if read_only else []),
             (JOBS_MOUNT, "bind", str(jobs_dir or bundle / JOBS_DIR), ro_bind)]
    cfg["mounts"] = mounts + [{"destination": destination, "type": kind, "source": source, "options": list(options)}
                              for destination, kind, source, options in added]
    return cfg


def _tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise UserError(f"`buildtool bundle` needs {name} on PATH; install it (Debian: apt-get install skopeo umoci)")
    return path


def _run(argv: list[str], timeout: float, what: str) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise FailedError(f"{what} took over {timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise FailedError(f"{what} failed (exit {proc.returncode}): {tail}")


def _blob(layout: Path, digest: str) -> dict[str, Any]:
    algorithm, _, hexdigest = digest.partition(":")
    return json.loads((layout / "blobs" / algorithm / hexdigest).read_text(encoding="utf-8"))


def _layout_config(layout: Path) -> tuple[str, dict[str, Any]]:
    """(manifest digest, config) of the one image in an OCI layout written by skopeo."""
    digest = json.loads((layout / "index.json").read_text(encoding="utf-8"))["manifests"][0]["digest"]
    return digest, _blob(layout, _blob(layout, digest)["config"]["digest"])


def layout_entrypoint(layout: Path) -> tuple[str, ...]:
    """The ENTRYPOINT of the one image in an OCI layout (() for none); UserError for a word the one-per-line
    record cannot hold."""
    config = _layout_config(layout)[1].get("config") or {}
    given = config.get("Entrypoint") or []
    # The image config's Entrypoint is a list of strings: a string would be recorded one character a line.
    if not isinstance(given, list) or not all(isinstance(w, str) for w in given):
        raise UserError(f"the image's ENTRYPOINT {json.dumps(given)[:120]} is not a list of strings (the image "
                        "config's Entrypoint); rebuild the image with an exec-form ENTRYPOINT")
    words = tuple(given)
    if any("\n" in w or not w for w in words):
        raise UserError(f"the image's ENTRYPOINT {list(words)!r} has an empty word or a newline: a bundle records "
                        "it one word a line")
    return words


def platform_problem(wanted: platforms.Platform, config: dict[str, Any]) -> str | None:
    """Why the copied image is not of the platform the bundle is made for (None: it is), from its config's own
    os, architecture and variant fields (not their "/"-joined string split again: `{"os": "linux/amd64"}` read so
    passed as linux/amd64)."""
    fields = {k: config[k] for k in ("os", "architecture", "variant") if config.get(k) is not None}
    missing = [k for k in ("os", "architecture") if not config.get(k)]
    if missing:
        return (f"the image's config declares no {' and no '.join(missing)} ({json.dumps(fields)[:120]}), so it is "
                f"of no known platform, not {wanted.name}; rebuild it (`buildtool build`), or bundle an image whose "
                "config declares its os and architecture")
    try:
        found = platforms.from_descriptor(fields)
    except platforms.UnknownPlatform:
        found = None
    if found is not None and found.name == wanted.name:
        return None
    declared = "/".join(str(v) for v in fields.values() if v)
    return (f"the image is {declared}, not {wanted.name}: it is no index with a "
            f"{wanted.name} manifest; bundle the platform it has (--platform), or an image of {wanted.name}")


def parse_ulimits(items: list[str]) -> tuple[tuple[str, Limit], ...]:
    """`NAME=SOFT[:HARD]` (docker's --ulimit form: one value for both, or the soft and the hard limit; -1 or
    unlimited: unlimited) -> pairs, the value (soft, hard) where two are given."""
    pairs: list[tuple[str, Limit]] = []
    for item in items:
        found = re.fullmatch(rf"([a-z]+)=({ULIMIT_VALUE})(?::({ULIMIT_VALUE}))?", item)
        if found is None or found.group(1) not in RLIMITS:
            raise UserError(f"--ulimit {item!r} must be NAME=SOFT[:HARD] with NAME one of {', '.join(sorted(RLIMITS))} "
                            "and SOFT, HARD whole numbers (-1 or unlimited: unlimited)")
        given = found.group(2), found.group(3) or found.group(2)
        soft, hard = (-1 if v == "unlimited" else int(v) for v in given)
        if hard != -1 and (soft == -1 or soft > hard):   # runc's setrlimit refuses it when the job starts
            raise UserError(f"--ulimit {item!r}: the soft limit is above the hard limit; give SOFT <= HARD")
        pairs.append((found.group(1), soft if found.group(3) is None else (soft, hard)))
    return tuple(pairs)


def limit_text(value: Limit) -> str:
    """A ulimit as --ulimit writes it: VALUE, or SOFT:HARD."""
    return ":".join(str(v) for v in value) if isinstance(value, tuple) else str(value)


@dataclass(frozen=True)
class BundleRequest:
    """What `buildtool bundle` asks for: IMAGE's `platform` image as a bundle at `dest`. The run profile is the
    image's label, else `fallback` (the matrix cell's); `shm_size` and `ulimits` override it (for nodes that cannot
    grant a limit, e.g. memlock without CAP_SYS_RESOURCE; the record says so)."""

    image: str
    dest: Path
    platform: platforms.Platform
    fallback: Profile | None = None
    shm_size: str | None = None
    ulimits: tuple[tuple[str, Limit], ...] = ()
    hosts: Path | None = None
    jobs_dir: Path | None = None
    read_only: bool = True
    force: bool = False


def make_bundle(request: BundleRequest, log: Callable[[str], None] = lambda _: None) -> Bundle:
    """Copy the image from its registry, unpack it, write the fitted config: the bundle appears whole or not at
    all."""
    started = time.monotonic()
    image, platform = request.image, request.platform
    ref = argcheck.reference("IMAGE", image)
    if request.shm_size is not None:
        shm_bytes(request.shm_size)
    if request.hosts is not None and not request.hosts.is_file():
        raise UserError(f"--hosts {request.hosts} is not a file")
    dest = Path(os.path.abspath(request.dest))
    if dest.exists() and not request.force:
        raise UserError(f"{dest} exists; remove it or pass --force to replace it")
    # --force replaces a bundle, never whatever else DEST is (a home folder, a checkout): the whole tree is deleted.
    if dest.exists() and not (dest.is_dir() and ((dest / META_FILE).is_file() or not any(dest.iterdir()))):
        raise UserError(f"{dest} is not a bundle made by `buildtool bundle` (no {META_FILE} in it): --force replaces "
                        "only a bundle or an empty folder; choose another DEST")
    skopeo, umoci = _tool("skopeo"), _tool("umoci")
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        layout = work / "layout"
        log(f"copying the {platform.name} image of {image} into an OCI layout (skopeo)")
        # Global options: which manifest of an index to copy (skopeo's default is this machine's platform).
        chosen = [f"--override-os={platform.os}", f"--override-arch={platform.architecture}"]
        # Plain HTTP, CA and credentials (a private --src-authfile) as the registry client has them.
        with skopeo_access(ref.registry, "src") as access:
            _run([skopeo, *chosen, "copy", "--quiet", *access, docker_transport(image), f"oci:{layout}:image"],
                 COPY_TIMEOUT_S, f"skopeo copy of {image}")
        digest, config = _layout_config(layout)
        entrypoint = layout_entrypoint(layout)
        problem = platform_problem(platform, config)
        if problem is not None:
            raise UserError(f"{image}: {problem}")
        profile = _profile(request, dict((config.get("config") or {}).get("Labels") or {}))
        staged = work / "bundle"
        log(f"unpacking {digest[:19]} (umoci)")
        _run([umoci, "unpack", "--image", f"{layout}:image", str(staged)], UNPACK_TIMEOUT_S, f"umoci unpack of {image}")
        shutil.rmtree(layout)  # the layers now live in rootfs/; the layout would double the disk used
        jobs = _fit(request, staged, dest, profile)
        bundle = Bundle(path=str(dest), image=image, digest=digest, profile_source=profile.source,
                        shm_size=profile.shm_size, shm_bytes=_profile_shm_bytes(profile),
                        ulimits=dict(profile.ulimits), read_only=request.read_only,
                        hosts=str(dest / HOSTS_FILE) if request.hosts is not None else "/etc/hosts (the node's)",
                        jobs_dir=str(jobs or dest / JOBS_DIR), seconds=round(time.monotonic() - started, 1),
                        platform=platform.name, machine=platform.machine, entrypoint=entrypoint)
        (staged / META_FILE).write_text(json.dumps(asdict(bundle), indent=1) + "\n", encoding="utf-8")
        (staged / ENTRYPOINT_FILE).write_text("".join(f"{word}\n" for word in entrypoint), encoding="utf-8")
        _move_into_place(staged, dest, work / "replaced")
        return bundle
    finally:
        if not (work / "replaced").exists():   # else an old bundle that could not be put back: the error names it
            shutil.rmtree(work, ignore_errors=True)


def _move_into_place(staged: Path, dest: Path, aside: Path) -> None:
    """STAGED renamed to DEST. An old DEST (--force) is moved ASIDE first, and back where the new one cannot take
    its place: a failed replace keeps the old bundle."""
    if dest.exists():
        os.rename(dest, aside)
    try:
        os.rename(staged, dest)
    except OSError as exc:
        if not aside.exists():
            raise FailedError(f"cannot move the new bundle into place at {dest}: {exc}") from None
        try:
            os.rename(aside, dest)
        except OSError as back:
            raise FailedError(f"cannot move the new bundle into place at {dest} ({exc}), nor the old one back "
                              f"({back}): the old bundle is at {aside}") from None
        raise FailedError(f"cannot move the new bundle into place at {dest} ({exc}); the old bundle is kept "
                          "there") from None
    shutil.rmtree(aside, ignore_errors=True)


def _profile(request: BundleRequest, labels: dict[str, str]) -> Profile:
    """The run profile the bundle is fitted to: the image's label, else the matrix cell's, with the overrides."""
    profile = profile_from_labels(labels) or request.fallback
    if profile is None and request.shm_size is None:
        raise UserError(f"{request.image} carries no {label_keys.RUN_PROFILE} label and matches no matrix cell; "
                        "pass --shm-size (and check its ulimits by hand)")
    if profile is None:
        profile = Profile(shm_size=str(request.shm_size), source="--shm-size")
    elif request.shm_size is not None:
        profile = replace(profile, shm_size=request.shm_size, source=f"{profile.source}, /dev/shm from --shm-size")
    if request.ulimits:
        merged = dict(profile.ulimits) | dict(request.ulimits)
        given = ", ".join(f"{k}={limit_text(v)}" for k, v in request.ulimits)
        profile = replace(profile, ulimits=tuple(sorted(merged.items())), source=f"{profile.source}, --ulimit {given}")
    return profile


def _fit(request: BundleRequest, staged: Path, dest: Path, profile: Profile) -> Path | None:
    """The unpacked bundle's config fitted to the profile, its hosts file and jobs folder; the jobs folder given
    (None: the bundle's own)."""
    config = json.loads((staged / "config.json").read_text(encoding="utf-8"))
    jobs = Path(os.path.abspath(request.jobs_dir)) if request.jobs_dir is not None else None
    fitted = fit_config(config, dest, profile, hosts=request.hosts is not None, jobs_dir=jobs,
                        read_only=request.read_only)
    (staged / "config.json").write_text(json.dumps(fitted, indent=1) + "\n", encoding="utf-8")
    if request.hosts is not None:
        shutil.copyfile(request.hosts, staged / HOSTS_FILE)
    if jobs is not None:
        jobs.mkdir(parents=True, exist_ok=True)
        (staged / JOBS_DIR).symlink_to(jobs)
    else:
        (staged / JOBS_DIR).mkdir()
        (staged / JOBS_DIR).chmod(0o1777)  # every user's jobs write here, as in /tmp
    return jobs


def read_meta(bundle: Path) -> dict[str, Any] | None:
    """What `make_bundle` recorded about a bundle (None when the folder holds no record)."""
    try:
        data = json.loads((bundle / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
