"""What any image contains, read inside it: for `buildtool diff` against an image without an SBOM
(a base, an upstream NGC image).

The listing is the SBOM's own (image-tests/scripts/packages.py, as buildtool.imagebuild.contents runs
it), run by every Python environment the image has, each folder once; Debian packages come from its
`dpkg-query` line run by the shell, so an image without Python gives them alone (docs/contents.md#buildtool-diff
says which environments, in what order).

One throw-away container per image, through the client DOCKER_CLIENT chooses: no network, no
implicit pull (the image is pulled first, when the engine does not have it), a name of its own
that is removed in `finally`, since a client killed at its timeout never runs its own `--rm`.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from buildtool.common import docker_cli
from buildtool.common.errors import FailedError
from buildtool.sbom.document import deb_keys

PROBE_TIMEOUT_S = 180
PULL_TIMEOUT_S = 900
# A listing's line is `status<TAB>package<TAB>version<TAB>arch`: never starts with this.
_MARK = "@@"
# $1 is the listing's source. Sections: apt (or no-dpkg), os, then one per Python environment.
_SCRIPT = r"""
src="$1"
echo "@@os $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | head -n 1)"
if command -v dpkg-query >/dev/null 2>&1; then
  echo "@@apt"
  dpkg-query -W -f '${db:Status-Abbrev}\t${Package}\t${Version}\t${Architecture}\n' \
    || echo "@@fail dpkg-query exited $?"
else
  echo "@@no-dpkg"
fi
seen=" "
for c in python ${VIRTUAL_ENV:+"$VIRTUAL_ENV/bin/python"} /opt/venv/bin/python python3 /usr/bin/python3 \
         /usr/local/bin/python3; do
  p=$(command -v "$c" 2>/dev/null) || continue
  case "$p" in /*) ;; *) continue ;; esac
  d=${p%/*}
  case "$seen" in *" $d "*) continue ;; esac
  seen="$seen$d "
  echo "@@python $p"
  "$p" -c "$src" || echo "@@fail $p exited $?"
done
echo "@@end"
"""


@dataclass(frozen=True)
class Environment:
    """One Python environment the probe listed."""

    python: str                  # the interpreter's path in the image
    version: str                 # its Python version
    packages: dict[str, str]     # PEP 503 name -> version

    def to_json(self) -> dict[str, Any]:
        return {"python": self.python, "version": self.version, "packages": len(self.packages)}


@dataclass(frozen=True)
class Probed:
    """What the probe found in one image."""

    image_id: str                            # the local image it ran (config digest)
    os: str
    apt: dict[str, str]                      # dpkg's Package -> version (installed ones), as deb purls name them
    environments: tuple[Environment, ...] = field(default_factory=tuple)
    cuda: str = ""

    def listing(self) -> dict[str, Any]:
        """As packages.py prints it: Python packages of every environment, the first one listed
        winning a name (as `python` on PATH would import it), Python version of the first."""
        python = {name: version for env in reversed(self.environments) for name, version in env.packages.items()}
        first = self.environments[0].version if self.environments else ""
        return {"python": first, "os": self.os, "cuda": self.cuda, "python_packages": dict(sorted(python.items())),
                "apt_packages": dict(sorted(self.apt.items()))}


def local_image(ref: str, pull_timeout: float = PULL_TIMEOUT_S) -> tuple[str, list[str]]:
    """(local image id, configured environment) of `ref`, pulled first when the engine does not have it."""
    found = _inspect(ref)
    if found is None:
        try:
            pulled = docker_cli.docker("pull", ref, timeout=pull_timeout)
        except docker_cli.DockerTimeout:
            raise FailedError(f"cannot pull {ref}: no answer within {pull_timeout:g} s") from None
        if pulled.returncode != 0:
            raise FailedError(f"cannot pull {ref}: {docker_cli.engine_error(pulled.stderr)}")
        found = _inspect(ref)
        if found is None:
            raise FailedError(f"cannot pull {ref}: the engine has no such image after the pull")
    return found


def _inspect(ref: str) -> tuple[str, list[str]] | None:
    """(image id, configured environment) of `ref`, None when the engine does not hold it."""
    found = docker_cli.inspect_image(ref)
    if found is None:
        return None
    return str(found["Id"]), [str(item) for item in (found.get("Config") or {}).get("Env") or []]


def probe_image(ref: str, source: str, *, timeout: float = PROBE_TIMEOUT_S,
                pull_timeout: float = PULL_TIMEOUT_S) -> Probed:
    """Pull `ref` when needed and list its packages in a throw-away container (see the module)."""
    image_id, env = local_image(ref, pull_timeout)
    name = f"dl-images-probe-{secrets.token_hex(6)}"
    try:
        run = docker_cli.docker("run", "--rm", "--name", name, "--network", "none",
                                "--pull", "never", "--entrypoint", "/bin/sh", image_id, "-c", _SCRIPT, "sh", source,
                                timeout=timeout)
    except docker_cli.DockerTimeout:
        raise FailedError(f"cannot probe {ref}: its package listing did not finish within {timeout:g} s") from None
    finally:
        docker_cli.remove(name)
    if run.returncode != 0:
        raise FailedError(f"cannot run {ref} to list its packages: {docker_cli.engine_error(run.stderr)}")
    # The listing reads CUDA_VERSION from its environment; a Python-less image has no listing to say it.
    cuda = next((item.partition("=")[2] for item in env if item.partition("=")[0] == "CUDA_VERSION"), "")
    return parse(ref, image_id, run.stdout, cuda)


def parse(ref: str, image_id: str, stdout: str, cuda: str = "") -> Probed:
    """The probe script's output; FailedError naming `ref` when a part failed or is missing."""
    sections: list[tuple[str, list[str]]] = []
    for line in stdout.splitlines():
        if line.startswith(_MARK):
            sections.append((line[len(_MARK):], []))
        elif sections:
            sections[-1][1].append(line)
    heads = [head for head, _ in sections]
    failed = [head for head in heads if head.startswith("fail ")]
    if failed:
        raise FailedError(f"cannot list the packages of {ref}: {failed[0][5:]}")
    if not heads or heads[-1] != "end" or not heads[0].startswith("os"):
        raise FailedError(f"cannot list the packages of {ref}: the probe's output is incomplete "
                          f"({stdout.strip()[-160:] or 'no output'})")
    os_name = heads[0][3:].strip().strip('"')
    debs: dict[tuple[str, str], str] = {}
    environments: list[Environment] = []
    for head, lines in sections[1:-1]:
        if head == "apt":
            for line in lines:
                status, *fields = line.split("\t")
                if status[1:2] == "i":    # installed, whatever is wanted of it (`hi`: on hold)
                    name, version, arch = _installed(ref, line, fields)
                    debs[(name, arch)] = version
        elif head.startswith("python "):
            environments.append(_environment(ref, head[7:], lines))
    return Probed(image_id=image_id, os=os_name, apt=deb_keys(debs), environments=tuple(environments), cuda=cuda)


def _installed(ref: str, line: str, fields: list[str]) -> tuple[str, str, str]:
    """An installed package's name, version and architecture (which older dpkg listings leave out); a line cut
    short or garbled is an error, never a package with an empty name or version."""
    if len(fields) not in (2, 3) or not all(fields[:2]):
        raise FailedError(f"cannot list the packages of {ref}: dpkg-query printed {line!r}, not its status, "
                          "package, version and architecture")
    return fields[0], fields[1], fields[2] if len(fields) == 3 else ""


def _environment(ref: str, python: str, lines: list[str]) -> Environment:
    # The listing prints one JSON line last; a sitecustomize may print before it.
    try:
        found = json.loads(next(line for line in reversed(lines) if line.strip()))
        return Environment(python=python, version=str(found["python"]),
                           packages={str(k): str(v) for k, v in dict(found["python_packages"]).items()})
    except (StopIteration, ValueError, KeyError, TypeError):
        raise FailedError(f"cannot list the packages of {ref}: {python} printed no package listing "
                          f"({' '.join(lines)[-160:] or 'no output'})") from None
