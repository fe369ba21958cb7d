"""The one way to run the docker client: which binary, how it is invoked, what its errors say.

One setting, DOCKER_CLIENT, chooses the client for everything that talks to the engine through a
CLI: builds (`buildtool.imagebuild.engine` adds `buildx build --load`, or DOCKER_BUILDKIT=1 for the
classic client), validation (inspect, pull, ps, rm, the run-profile probe), the image-tests harness
(run, exec, logs, rm), the scaling launcher, scripts/gpu_smoke.py and the benchmarks.

- `buildx`: the `docker` on PATH (it builds with its buildx plugin);
- `classic`: Debian's docker.io client, /usr/bin/docker (BuildKit built in; no buildx needed);
- anything else: a name on PATH or a path of a docker binary;
- unset: the first of the `docker` on PATH and /usr/bin/docker that has buildx, else the first
  that builds with its built-in BuildKit (a client before 23), else the `docker` on PATH.

IMAGETEST_DOCKER, the image tests' former setting, is refused wherever it is set: it names it
and says to set DOCKER_CLIENT, never silently ignored.

Every error is one line naming what to fix (a UserError: exit 2). Standard library only, and
Python 3.9 syntax: scripts/gpu_smoke.py imports it on GPU runners with whatever Python is there.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from buildtool.common.errors import UserError

SETTING = "DOCKER_CLIENT"
RETIRED = "IMAGETEST_DOCKER"
# Debian's docker.io client (20.10): BuildKit built in, so it builds without the buildx plugin.
CLASSIC = "/usr/bin/docker"
CHOICES = "buildx, classic or a path to a docker binary"
START_HINT = "start it (bash scripts/setup.sh) or point DOCKER_HOST at a running engine"
PROBE_TIMEOUT_S = 20
# How the client says that it reached no engine (the first line of its stderr).
_UNREACHABLE = ("cannot connect to the docker daemon", "error during connect",
                "permission denied while trying to connect to the docker daemon")
# Subcommands that take a second word (`docker image inspect`): the timeout message names both.
_GROUPS = frozenset({"buildx", "builder", "container", "image", "network", "system", "volume"})


class DockerError(UserError):
    """The docker client could not be chosen or run, or reached no engine. One line."""


class RetiredSetting(DockerError):
    """IMAGETEST_DOCKER is set: it is no longer read."""


class ClientNotFound(DockerError):
    """DOCKER_CLIENT (or the autodetection) names no runnable docker binary."""


class EngineUnreachable(DockerError):
    """The client ran but reached no engine."""


class LeftBehind(DockerError):
    """A clean-up could not list or remove the containers it should: they may be left behind."""


class DockerTimeout(DockerError, subprocess.TimeoutExpired):
    """A docker command ran past its timeout. Also a subprocess.TimeoutExpired, so a caller that
    handles a slow command (the harness kills a probe's supervisor) still catches it."""

    def __init__(self, args: Sequence[str], timeout: float, cmd: Sequence[str],
                 output: str | bytes | None = None, stderr: str | bytes | None = None) -> None:
        subprocess.TimeoutExpired.__init__(self, list(cmd), timeout, output, stderr)
        self.subcommand = subcommand(args)
        self.message = (f"`docker {self.subcommand}` did not finish within {timeout:g} s; is the engine "
                        f"answering? ({START_HINT})")
        self.args = (self.message,)

    def __str__(self) -> str:
        return self.message


def subcommand(args: Sequence[str]) -> str:
    """The words of `args` that name the command (`run`, `image inspect`)."""
    words = [a for a in args if not a.startswith("-")][:2]
    if not words:
        return " ".join(args[:1])
    return " ".join(words) if words[0] in _GROUPS and len(words) > 1 else words[0]


def check_retired(environ: Mapping[str, str] | None = None) -> None:
    """Refuse IMAGETEST_DOCKER: it chose the client of validation and the image tests before
    DOCKER_CLIENT chose it for everything."""
    env = os.environ if environ is None else environ
    if RETIRED in env:
        raise RetiredSetting(f"{RETIRED} is no longer read (it is set to {env[RETIRED]!r}): unset it and set "
                             f"{SETTING} instead ({CHOICES})")


def setting(environ: Mapping[str, str] | None = None) -> str:
    """DOCKER_CLIENT as set ('' when unset); refuses IMAGETEST_DOCKER."""
    env = os.environ if environ is None else environ
    check_retired(env)
    return env.get(SETTING, "").strip()


@functools.lru_cache(maxsize=16)
def has_buildx(path: str) -> bool:
    """`path buildx version` works: the client has the buildx plugin."""
    try:
        run = subprocess.run([path, "buildx", "version"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return run.returncode == 0


@functools.lru_cache(maxsize=16)
def builtin_buildkit(path: str) -> bool:
    """The client's own `build` speaks BuildKit with DOCKER_BUILDKIT=1: up to 22.x (Debian's 20.10
    does); from 23 on, `docker build` needs the buildx plugin."""
    try:
        run = subprocess.run([path, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True,
                             timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
        major = int(run.stdout.strip().split(".")[0])
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return False
    return major < 23


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def resolve(value: str) -> str:
    """The docker binary a DOCKER_CLIENT value names (see the module's docstring), as a path."""
    value = value.strip()
    if value == "classic":
        if not _executable(CLASSIC):
            raise ClientNotFound(f"{SETTING}=classic names {CLASSIC}, which is not installed: install Debian's "
                                 f"docker.io (bash scripts/setup.sh) or set {SETTING} to buildx or a path")
        return CLASSIC
    if value:
        found = shutil.which("docker" if value == "buildx" else value)
        if found:
            return os.path.abspath(found)
        if value == "buildx":
            raise ClientNotFound(f"{SETTING}=buildx but no `docker` is on PATH: install Docker with the buildx "
                                 f"plugin or set {SETTING} to classic or a path")
        raise ClientNotFound(f"{SETTING}={value!r} is not an executable: set it to {CHOICES}")
    on_path = shutil.which("docker")
    candidates = list(dict.fromkeys(os.path.abspath(p) for p in (on_path, CLASSIC) if p and _executable(p)))
    if not candidates:
        raise ClientNotFound(f"no docker client: none on PATH and no {CLASSIC}; install Docker (bash "
                             f"scripts/setup.sh) or set {SETTING} to {CHOICES}")
    found = next((path for path in candidates if has_buildx(path)), None)
    return found or next((path for path in candidates if builtin_buildkit(path)), candidates[0])


def client() -> str:
    """The docker binary DOCKER_CLIENT chooses, for every command (refuses IMAGETEST_DOCKER)."""
    return resolve(setting())


def argv(*args: str) -> list[str]:
    """[client, *args]: for the few callers that run the client themselves (a streamed or
    detached process, an environment of their own)."""
    return [client(), *args]


# Lines the client adds around the engine's answer that say nothing about the cause: the usage
# hint (20.10: "See 'docker run --help'.", 23 on: "Run 'docker run --help' for more information"),
# the attach loop's "ERRO[0000] error waiting for container: context canceled", and the NVIDIA
# runtime's "Auto-detected mode as 'legacy'" that a hook's stderr starts with.
_CLIENT_NOISE = re.compile(r"^(?:See '[^']*--help'\.?|Run '[^']*--help' for more information\.?"
                           r"|ERRO\[[0-9]+\] error waiting for container:(?: context canceled)?"
                           r"|Auto-detected mode as '[^']*')$")
# The NVIDIA tools that say what is wrong at the end of the engine's runtime/hook chain.
_HOOK_TOOL = re.compile(r"nvidia-container-(?:cli|runtime(?:-hook)?): ")
_DAEMON = "Error response from daemon:"


def engine_error(stderr: str, limit: int = 300) -> str:
    """The line of a failed `docker run`'s stderr that says why the engine refused it: an NVIDIA
    hook's own message (`nvidia-container-cli: requirement error: ...`) cut out of the OCI runtime
    chain, else the daemon's answer, else the last line; never the client's usage hint."""
    lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    useful = [line for line in lines if not _CLIENT_NOISE.match(line)]
    if not useful:
        return lines[-1][:limit] if lines else "no message"
    for line in useful:
        found = _HOOK_TOOL.search(line)
        if found:
            # runc's chain escapes the hook's stderr (\" and \\n, by nesting level) and ends ": unknown."
            cause = re.split(r'\\+n|\\+"|"', line[found.start():])[0].strip()
            return re.sub(r"(?::\s*unknown)?\.?$", "", cause)[:limit]
    daemon = [line for line in useful if _DAEMON in line]
    return (daemon[-1] if daemon else useful[-1])[:limit]


def check_reached(proc: subprocess.CompletedProcess[str]) -> None:
    """EngineUnreachable when a docker command failed because the client reached no engine (for
    callers that run the client themselves, as `argv` gives it): the first line of its stderr says so."""
    said = next((line.strip() for line in (proc.stderr or "").splitlines() if line.strip()), "")
    if proc.returncode != 0 and any(marker in said.lower()[:120] for marker in _UNREACHABLE):
        raise EngineUnreachable(f"the Docker engine is not reachable ({said[:200]}); {START_HINT}")


def docker(*args: str, timeout: float, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `docker ARGS...` with the chosen client; stdout and stderr captured as text.

    A non-zero exit is the caller's to read (`check`: subprocess.CalledProcessError), except that
    the client reached no engine (EngineUnreachable). A missing client is ClientNotFound (naming
    DOCKER_CLIENT), a command past its timeout DockerTimeout (naming the subcommand). Each is one line.
    """
    path = client()
    cmd = [path, *args]
    try:
        # Decoded as UTF-8 whatever the locale, a byte that is not UTF-8 replaced: what a container or an image's
        # files print is not ours to vouch for, and a strict decode ended the command in a UnicodeDecodeError.
        proc = subprocess.run(cmd, capture_output=True, encoding="utf-8", errors="replace", timeout=timeout)
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise ClientNotFound(f"cannot run the docker client {path} ({exc.strerror or exc}): set {SETTING} to "
                             f"{CHOICES}") from None
    except subprocess.TimeoutExpired as exc:
        raise DockerTimeout(args, timeout, cmd, exc.output, exc.stderr) from None
    check_reached(proc)
    if check:
        proc.check_returncode()
    return proc


# What the docker CLI (and podman's) say of an image the engine does not hold.
_NO_SUCH_IMAGE = ("no such image", "image not known")


def inspect_image(ref: str, timeout: float = 60) -> dict[str, Any] | None:
    """`docker image inspect REF`'s object (the engine API's ImageInspect), or None when the engine holds no such
    image: the one way buildtool inspects a local image. Any other failure is a DockerError naming the engine's
    words, never taken for a missing image."""
    proc = docker("image", "inspect", ref, timeout=timeout)
    if proc.returncode != 0:
        if any(words in proc.stderr.lower() for words in _NO_SUCH_IMAGE):
            return None
        raise DockerError(f"cannot inspect {ref}: {engine_error(proc.stderr)}")
    try:
        found = json.loads(proc.stdout)
    except json.JSONDecodeError:
        found = None      # a client that printed a warning and exited 0: no image to read either
    if not isinstance(found, list) or len(found) != 1 or not isinstance(found[0], dict):
        raise DockerError(f"cannot inspect {ref}: the docker client printed no single image")
    return found[0]


def remove(*names: str, timeout: float = 120) -> None:
    """`docker rm -f -v NAMES`: best effort, for clean-up paths (a container already gone, a slow
    or lost engine is no new error there)."""
    if not names:
        return
    with contextlib.suppress(DockerTimeout, EngineUnreachable):
        docker("rm", "-f", "-v", *names, timeout=timeout)


def remove_labelled(key: str, value: str, timeout: float = 120) -> list[str]:
    """Remove every container (running or not) labelled key=value; returns their ids. A `docker ps` that fails is
    LeftBehind naming the label, never taken for nothing to remove; so is a `docker rm` that fails for a container
    still there (one gone meanwhile is removed)."""
    label = f"{key}={value}"
    left = (f"containers labelled {label} may be left: remove them with "
            f"`docker rm -f -v $(docker ps -aq --filter label={label})`")
    listed = docker("ps", "-aq", "--filter", f"label={label}", timeout=60)
    if listed.returncode != 0:
        raise LeftBehind(f"cannot list the containers labelled {label} (`docker ps`: "
                         f"{engine_error(listed.stderr)}); {left}")
    ids = listed.stdout.split()
    if ids:
        removed = docker("rm", "-f", "-v", *ids, timeout=timeout)
        failed = [line for line in (removed.stderr or "").splitlines()
                  if line.strip() and "no such container" not in line.lower()]
        if removed.returncode != 0 and failed:
            said = engine_error("\n".join(failed))
            raise LeftBehind(f"cannot remove the containers labelled {label} (`docker rm`: {said}); {left}")
    return ids
