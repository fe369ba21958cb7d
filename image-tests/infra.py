"""A pytest-testinfra `host` for each container the harness starts: checks that inspect an image are written
as its users write them (`host.file`, `host.pip`, `host.user`, `host.environment`, `host.mount_point`,
`host.socket`, `host.run`), on a backend of ours that keeps the harness's rules.

testinfra's own docker backend runs `docker exec NAME /bin/sh -c CMD` with whatever `docker` is first on
PATH and no bound on time. This one runs the same shell command through the harness (`Container.run`): with
the docker client DOCKER_CLIENT names, as the image's default user in its working directory (docker exec's
defaults, what `docker run IMAGE` gives a user), under scripts/supervise.py with what is left of the image's
deadline and the quiet window. `/bin/sh -c` is neither a login nor an interactive shell, so no profile,
bashrc, ENV or BASH_ENV is read. A command that hangs, runs out of the deadline or cannot be started fails
the test right there with the cause as its first line; otherwise its exit status and output are testinfra's.
"""

from __future__ import annotations

import functools
import json
import re
import socket
from typing import Any

import pytest
import testinfra.host
from testinfra.backend.base import BaseBackend, CommandResult
from testinfra.modules.socket import Socket


class ContainerBackend(BaseBackend):
    """testinfra's backend over a harness container (anything with the harness's `run(argv, step=...)`)."""

    NAME = "imagetest"

    def __init__(self, container: Any) -> None:
        self.container = container
        super().__init__(getattr(container, "name", "container"))

    def run(self, command: str, *args: str, **kwargs: Any) -> CommandResult:
        cmd = self.get_command(command, *args)
        probe = self.container.run(["/bin/sh", "-c", cmd], step=f"`{cmd[:80]}`")
        if probe.cut or probe.error:          # a non-zero exit is the command's own answer, not a failure here
            pytest.fail(probe.cause(), pytrace=False)
        out, err = (_bytes(probe.dir / name) for name in ("stdout", "stderr"))
        return self.result(probe.rc, self.encode(cmd), out, err)

    def get_encoding(self) -> str:
        return "utf-8"    # testinfra would start python3 to ask; only non-ASCII output needs it


def _bytes(path: Any) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


class ProcNetSocket(Socket):
    """`host.socket` where the image has neither `ss` nor `netstat` (Debian's minbase has neither): the
    kernel's own tables, /proc/net/{tcp,tcp6,udp,udp6}, as those tools read them."""

    LISTEN = {"tcp": "0A", "udp": "07"}      # TCP_LISTEN; an unconnected UDP socket (TCP_CLOSE)

    @classmethod
    def get_module_class(cls, host: Any) -> type[ProcNetSocket]:
        return cls

    def _iter_sockets(self, listening: bool) -> Any:
        for protocol in ("tcp", "udp"):
            if self.protocol not in (None, protocol):
                continue
            for table in (protocol, protocol + "6"):
                lines = self.run_test("cat /proc/net/%s", table).stdout.splitlines()[1:]
                for fields in (line.split() for line in lines):
                    (host, port), (peer, peer_port), state = _address(fields[1]), _address(fields[2]), fields[3]
                    if listening and state == self.LISTEN[protocol]:
                        yield protocol, host, port
                    elif not listening and state == "01":
                        yield protocol, host, port, peer, peer_port


def _address(field: str) -> tuple[str, int]:
    """`0100007F:1F90` -> ('127.0.0.1', 8080): the kernel writes each 32-bit word in host (little-endian) order."""
    hexaddr, hexport = field.split(":")
    raw = b"".join(bytes.fromhex(hexaddr[i:i + 8])[::-1] for i in range(0, len(hexaddr), 8))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw), int(hexport, 16)


class ImageHost(testinfra.host.Host):
    """testinfra's Host; `socket` falls back to /proc/net where the image has no ss or netstat."""

    @functools.cached_property
    def socket(self) -> Any:   # type: ignore[override]
        try:
            return super().__getattr__("socket")
        except RuntimeError:   # testinfra: 'either "ss" or "netstat" utility is required in $PATH'
            return ProcNetSocket.get_module(self)


def normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_list(host: Any) -> dict[str, str]:
    """Every Python distribution the `pip` on the image's PATH lists (normalised name -> version): testinfra's
    `host.pip.get_packages`, but reading pip's JSON from its last line, since an image's start-up hook (a .pth,
    sitecustomize) may print before it at every Python start."""
    listing = host.run("%s list --no-index --format=json", host.find_command("pip"))
    assert listing.rc == 0, f"`pip list` in the image exited {listing.rc}: {listing.stderr.strip()[-300:]}"
    last = (listing.stdout.strip().splitlines() or [""])[-1]
    try:
        listed = json.loads(last)
    except ValueError:
        listed = None
    assert isinstance(listed, list) and all(isinstance(d, dict) and isinstance(d.get("name"), str)
                                            and isinstance(d.get("version"), str) for d in listed), (
        f"`pip list --format=json` in the image printed no list of packages (name, version) as its last line: "
        f"{last[:200] or '(nothing)'}")
    return {normalized(d["name"]): d["version"] for d in listed}


def host_of(container: Any) -> ImageHost:
    """The testinfra host of a harness container (one per container: testinfra caches what it learns)."""
    found = getattr(container, "_testinfra_host", None)
    if found is None:
        backend = ContainerBackend(container)
        found = ImageHost(backend)
        backend.set_host(found)
        container._testinfra_host = found
    return found
