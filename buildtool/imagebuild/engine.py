"""Everything that talks to the Docker engine: BuildKit builds, inspect, tag, push, remove.

Builds go through a docker CLI because BuildKit (secrets, `RUN --mount`, host network) is
only reachable that way: `docker buildx build` where the plugin exists, otherwise a client
with built-in BuildKit (`DOCKER_BUILDKIT=1 /usr/bin/docker build`, Debian's 20.10 client).
The client is the one DOCKER_CLIENT chooses for every docker command (buildtool.common.docker_cli).
Everything else here uses the Docker SDK.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TextIO

import docker
import docker.errors
import requests

from buildtool.common import docker_cli
from buildtool.common.errors import UserError
from buildtool.common.refs import ReferenceError, parse_reference
from buildtool.contracts.apt_lock_format import build_error
from buildtool.imagebuild.cell_inputs import scrub

ENGINE_HINT = ("start one with `bash scripts/setup.sh` (or `sudo systemctl start docker`), "
               "or point DOCKER_HOST at a running engine")
SDK_TIMEOUT = 120
INLINE_CACHE_ARG = "BUILDKIT_INLINE_CACHE"
DRAIN_TIMEOUT = 10   # seconds the build's last output may take to reach its log once the client has exited


class BuildFailed(Exception):
    """`docker build` exited non-zero; the log file holds the details."""


@dataclass(frozen=True)
class BuildClient:
    """How to invoke a BuildKit build: argv prefix plus extra environment."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    kind: str  # "buildx" or "classic"

    def describe(self) -> str:
        prefix = " ".join(f"{k}={v}" for k, v in self.env)
        return f"{prefix} {' '.join(self.argv)}".strip()


def resolve_build_client(setting: str | None = None) -> BuildClient:
    """How to build with the docker client DOCKER_CLIENT chooses (buildtool.common.docker_cli, the
    same binary every other docker command uses): `buildx build --load` where the client has the
    plugin, else its own `build` with DOCKER_BUILDKIT=1 (`classic`, or a client before 23).
    `setting` stands in for DOCKER_CLIENT (tests).
    """
    value = docker_cli.setting() if setting is None else setting.strip()
    path = docker_cli.resolve(value)
    if docker_cli.has_buildx(path):
        return BuildClient((path, "buildx", "build", "--load"), (), "buildx")
    if value == "buildx":
        raise UserError(f"{docker_cli.SETTING}=buildx but `docker buildx` is not installed; install the buildx "
                        f"plugin or set {docker_cli.SETTING}=classic")
    if value == "classic" or docker_cli.builtin_buildkit(path):
        return BuildClient((path, "build"), (("DOCKER_BUILDKIT", "1"),), "classic")
    raise UserError(f"no docker client that can build with BuildKit ({path} has no buildx plugin and is 23 or "
                    f"newer): install the buildx plugin or Debian's docker.io client (bash scripts/setup.sh), or "
                    f"set {docker_cli.SETTING} to such a binary")


@lru_cache(maxsize=1)
def sdk() -> docker.DockerClient:
    """A Docker SDK client for a live engine, or a one-line UserError saying how to start one."""
    try:
        client = docker.from_env(timeout=SDK_TIMEOUT)
        client.ping()
    except (docker.errors.DockerException, requests.RequestException) as exc:
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise UserError(f"no Docker engine answers at {where} ({reason}); {ENGINE_HINT}") from None
    return client


@dataclass(frozen=True)
class BuildRequest:
    """One BuildKit build (secrets by file path). `platform`: os/arch (--platform, which sets TARGETARCH; None: the
    engine's own); `cache_from`: images to take layers from (cache_sources chooses them); `package_indexes`: the
    secrets' pip/uv locations without credentials (pipconfig.package_indexes), for the record; `log_secrets`:
    index credentials masked as `****` in each output line before it reaches the log, which never holds them."""

    context: Path
    dockerfile: Path
    build_args: Mapping[str, str]
    labels: Mapping[str, str]
    secrets: Mapping[str, Path]
    log_path: Path
    timeout: float = 3600
    tag: str | None = None
    network_host: bool = True
    no_cache: bool = False
    cache_from: Sequence[str] = ()
    platform: str | None = None
    package_indexes: Sequence[Mapping[str, str]] = ()
    log_secrets: Sequence[str] = ()


def build(client: BuildClient, request: BuildRequest) -> str:
    """Run one BuildKit build; the full log goes to `request.log_path`. Returns the image id.

    Secrets are passed by file path (`--secret id=..,src=..`), so their content never appears on a command line,
    in a build arg or in the log. Every image carries BuildKit's inline cache, so a later build on another machine
    can take its layers."""
    log_path = request.log_path
    log_path.parent.mkdir(parents=True, exist_ok=True)
    iidfile = log_path.with_suffix(".iid")
    iidfile.unlink(missing_ok=True)
    facts_path(log_path).unlink(missing_ok=True)
    argv = _argv(client, request, iidfile)
    wall_started = int(time.time())
    started = time.monotonic()
    with private_log(log_path) as log:
        log.write(f"$ {client.describe()} ... {request.context}\n")
        log.flush()
        try:
            returncode = run_masked(argv, {**os.environ, **dict(client.env)}, log, request.log_secrets,
                                    request.timeout)
        except subprocess.TimeoutExpired:
            log.write(f"\nbuild timed out after {request.timeout:.0f}s\n")
            raise BuildFailed(f"timed out after {request.timeout:.0f}s") from None
        log.write(f"\nexit {returncode} after {time.monotonic() - started:.1f}s\n")
    if returncode != 0:
        raise BuildFailed(f"{' '.join(client.argv)} exited {returncode}: {last_error_line(log_path)}")
    image_id = iidfile.read_text().strip()
    iidfile.unlink(missing_ok=True)
    # What the provenance states about this build (buildtool.imagebuild.provenance.BuildFacts): the arguments as
    # passed, secret ids (never their files' content), the network mode; beside the log it belongs to.
    facts_path(log_path).write_text(json.dumps({
        "image": image_id, "build_args": {**request.build_args, INLINE_CACHE_ARG: "1"},
        "secrets": sorted(request.secrets), "network": "host" if request.network_host else "default",
        "buildkit": client.kind, "cache_from": list(request.cache_from), "no_cache": request.no_cache,
        "platform": request.platform or "", "started": wall_started,
        "package_indexes": [dict(i) for i in request.package_indexes]}, sort_keys=True, indent=1))
    # The same record and log kept by image: the cell's files are the last build's, and another build of the
    # cell (another revision, a test beside it) replaces them while this image may still be pushed later.
    kept = image_record(log_path.parent, image_id)
    if kept is not None:
        kept[0].parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(log_path, kept[1])   # its mode too: private, as the log is
        shutil.copyfile(facts_path(log_path), kept[0])
    return image_id


def private_log(path: Path, append: bool = False) -> TextIO:
    """`path` emptied (or appended to) for writing and readable by this user only, an earlier build's log of another
    mode too: what pip or uv prints in a build (the index a package came from) is not every local user's to read.
    Every build log is opened here, the bases' too."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o600)
    os.fchmod(fd, 0o600)
    return open(fd, "a" if append else "w", errors="replace")


def run_masked(argv: list[str], env: dict[str, str], log: TextIO, secrets: Sequence[str], timeout: float) -> int:
    """Run a build (an image's, or mmdebstrap's for a base), its output copied into `log` a line at a time, each
    masked (`secrets`) before it is written: a build killed midway leaves no index token that pip or uv printed in
    the log. Its exit status; subprocess.TimeoutExpired past `timeout`, as subprocess.run raises it."""
    read_end, write_end = os.pipe()

    def copy() -> None:
        with open(read_end, "rb") as output:
            for line in output:
                # Read on whatever befalls the log (a full disk; closed, a killed client's child still printing):
                # the build must never block on its output.
                with suppress(ValueError, OSError):
                    log.write(scrub(line.decode(errors="replace"), secrets))
                    log.flush()

    copier = threading.Thread(target=copy, name="build-log", daemon=True)
    copier.start()
    try:
        with open(write_end, "w") as sink:
            return subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, timeout=timeout,
                                  stdin=subprocess.DEVNULL).returncode
    finally:   # the output's end (not waited for past DRAIN_TIMEOUT: a killed client's plugin may still hold it)
        copier.join(DRAIN_TIMEOUT)


def _argv(client: BuildClient, request: BuildRequest, iidfile: Path) -> list[str]:
    argv: list[str] = [*client.argv, "--progress=plain", "--iidfile", str(iidfile), "-f", str(request.dockerfile)]
    if request.network_host:
        # Containers on the default bridge cannot reach anything here (iptables off), and
        # the pip file server listens on loopback.
        argv += ["--network", "host"]
    if request.no_cache:
        argv.append("--no-cache")
    if request.platform:
        # BuildKit's TARGETPLATFORM/TARGETARCH; another architecture's RUN steps run under QEMU (binfmt_misc).
        argv += ["--platform", request.platform]
    if request.tag:
        argv += ["-t", request.tag]
    argv += [a for key, value in sorted(request.build_args.items()) for a in ("--build-arg", f"{key}={value}")]
    # BuildKit's own switch, not an ARG of the Dockerfile: it changes the image config (the cache
    # metadata), never a layer.
    argv += ["--build-arg", f"{INLINE_CACHE_ARG}=1"]
    argv += [a for ref in request.cache_from for a in ("--cache-from", ref)]
    argv += [a for key, value in sorted(request.labels.items()) for a in ("--label", f"{key}={value}")]
    argv += [a for sid, path in sorted(request.secrets.items()) for a in ("--secret", f"id={sid},src={path}")]
    return [*argv, str(request.context)]


def facts_path(log_path: Path) -> Path:
    """Where build() leaves the facts of the build logged at `log_path`."""
    return log_path.with_suffix(".facts.json")


def image_record(log_dir: Path, image_id: str) -> tuple[Path, Path] | None:
    """(facts, log) of the build of `image_id` as build() keeps them under `log_dir` (by-image/<id>); None for
    what is not an engine's image id (sha256:<64 hex>), which names no file."""
    name = image_id.removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-f]{64}", name):
        return None
    folder = log_dir / "by-image"
    return folder / f"{name}.facts.json", folder / f"{name}.log"


_STEP_HEADER = re.compile(r"^#\d+ \[[^\]]*\] ")


def last_error_line(log_path: Path) -> str:
    """The most telling line of a failed build log, for a one-line summary: the tool's own
    `ERROR:` (pip, apt) before BuildKit's generic `executor failed running`."""
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "see log"
    for line in lines:   # a locked Debian version the archive no longer serves: the fix is `make lock`
        explained = build_error(line)
        if explained:
            return explained
    # Not BuildKit's step headers (`#5 [2/2] RUN ...`): they echo the command, `echo "ERROR: ..."` in it too.
    tool = [ln for ln in lines if "ERROR:" in ln and "executor failed" not in ln and "ERROR: process" not in ln
            and not _STEP_HEADER.match(ln)]
    if tool:
        return tool[0][:240]
    generic = [ln for ln in lines if "executor failed" in ln or "ERROR" in ln or "error:" in ln.lower()]
    if generic:
        return generic[-1][:240]
    return lines[-2][:240] if len(lines) > 1 else "no output"


# -- image store --------------------------------------------------------------------------


def image_attrs(ref: str) -> dict[str, Any] | None:
    """`docker image inspect` as a dict, or None when the image is not in the local store (docker_cli.inspect_image,
    the one way an image is inspected, validate's and the probe's too)."""
    return docker_cli.inspect_image(ref)


def image_labels(ref: str) -> dict[str, str]:
    attrs = image_attrs(ref) or {}
    return dict((attrs.get("Config") or {}).get("Labels") or {})


def find_by_label(key: str, value: str) -> list[dict[str, Any]]:
    """Local images carrying label key=value (newest first)."""
    found = sdk().api.images(filters={"label": f"{key}={value}"})
    return sorted(found, key=lambda i: i.get("Created", 0), reverse=True)


def tag(image: str, ref: str) -> None:
    parsed = parse_reference(ref)
    if not sdk().api.tag(image, parsed.name, parsed.tag or "latest", force=True):
        raise RuntimeError(f"engine refused to tag {image} as {ref}")


def untag(ref: str) -> None:
    """Remove one tag (never the image under other tags); quiet when absent."""
    try:
        sdk().api.remove_image(ref, noprune=False)
    except docker.errors.APIError as exc:   # ImageNotFound included: the SDK raises it for a 404 only
        if exc.status_code != 404:
            raise


def _repo_and_tag(ref: str) -> tuple[str, str]:
    """(repository, tag or "") of `ref`, a registry's `:port` kept in the repository (`127.0.0.1:5000/x` has no
    tag); RuntimeError naming what is wrong where it is no image reference."""
    try:
        parsed = parse_reference(ref)
    except ReferenceError as exc:
        raise RuntimeError(str(exc)) from None
    return parsed.name, parsed.tag


def push(ref: str) -> str:
    """Push one tag (`latest` where `ref` names none); returns the manifest digest the engine reports. Raises
    RuntimeError on error."""
    repo, tagname = _repo_and_tag(ref)
    digest = ""
    for event in sdk().api.push(repo, tag=tagname or "latest", stream=True, decode=True):
        if "error" in event:
            raise RuntimeError(str(event.get("error"))[:300])
        aux = event.get("aux") or {}
        digest = aux.get("Digest", digest)
    if not digest:
        raise RuntimeError(f"push of {ref} reported no digest")
    return digest


def run_output(image: str, command: list[str], timeout: int = 120, platform: str | None = None) -> str:
    """stdout of a short command in a throw-away container (no network), always removed. `platform`
    (os/arch): the image is that platform's (run under QEMU where it is not this machine's). RuntimeError with
    one line on any failure: the engine's refusal, the command's exit status, or its running past `timeout`."""
    try:
        container = sdk().containers.create(image, command, network_disabled=True,
                                            **({"platform": platform} if platform else {}))
    except (docker.errors.DockerException, requests.RequestException) as exc:
        raise RuntimeError(f"the engine cannot create a container of {image}: {sdk_reason(exc)}") from None
    try:
        container.start()
        status = container.wait(timeout=timeout)
        output = container.logs(stdout=True, stderr=False).decode(errors="replace")
    except (docker.errors.DockerException, requests.RequestException) as exc:
        if sdk_timed_out(exc):    # container.wait(timeout=) running out
            raise RuntimeError(f"{command[0]} in {image} did not finish within {timeout}s") from None
        raise RuntimeError(f"{command[0]} in {image} failed in the engine: {sdk_reason(exc)}") from None
    finally:
        try:
            container.remove(force=True)
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise RuntimeError(f"cannot remove container {container.short_id} of {image} ({sdk_reason(exc)}): "
                               f"remove it with `docker rm -f {container.short_id}`") from None
    if status.get("StatusCode") != 0:
        raise RuntimeError(f"{' '.join(command)} in {image} exited {status.get('StatusCode')}")
    return output


def sdk_timed_out(exc: Exception) -> bool:
    """Whether the SDK's `exc` is a wait past its timeout: a ReadTimeout, or a ConnectionError saying so."""
    return isinstance(exc, requests.Timeout) or "timed out" in str(exc).lower()


def sdk_reason(exc: Exception) -> str:
    """An SDK or HTTP error as one short line: the engine's explanation where it gave one."""
    reason = str(getattr(exc, "explanation", None) or exc).strip()
    return (reason.splitlines() or [type(exc).__name__])[0][:200]


def pull(ref: str, platform: str | None = None) -> None:
    """Pull one image (of `platform`, os/arch, from an index) into the local store; RuntimeError with the
    engine's reason on failure."""
    # A digest reference goes whole (the SDK splits it at its '@').
    repo, tagname = _repo_and_tag(ref) if "@" not in ref else (ref, "")
    try:
        sdk().api.pull(repo, tag=tagname or None, **({"platform": platform} if platform else {}))
    except (docker.errors.DockerException, requests.RequestException) as exc:
        raise RuntimeError(f"pull of {ref} failed: {sdk_reason(exc)}") from None
