"""Tracked containers for image tests: started detached from a run profile, every exec wrapped
in a timeout (inside the container with coreutils `timeout`, and around the `docker exec`),
and always removed, on errors, Ctrl-C and SIGTERM included.

Nothing is installed into the image under test: the scripts under image-tests/scripts are
bind-mounted read-only at /imagetests.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from buildtool.contracts import label_keys, skips

DOCKER = os.environ.get("IMAGETEST_DOCKER", "docker")
SCRIPTS = Path(__file__).resolve().parent / "scripts"
SCRIPTS_IN = "/imagetests"
SHARED_IN = "/shared"
RUN_LABEL = label_keys.IMAGETEST_RUN
_LIVE: set[str] = set()


@dataclass
class Result:
    rc: int
    out: str
    err: str
    seconds: float

    @property
    def text(self) -> str:
        return self.out + self.err

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.text.strip().splitlines()[-lines:])

    def payload(self, marker: str) -> Any:
        """The JSON after the last `MARKER ` line, or None."""
        found = None
        for line in self.out.splitlines():
            if line.startswith(marker + " "):
                found = line[len(marker) + 1:]
        return json.loads(found) if found is not None else None


def _docker(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)


class Container:
    """One running container of the image under test."""

    def __init__(self, image: str, run_flags: list[str], *, run_id: str, shared: Path | None = None,
                 network: str = "host", name_hint: str = "main") -> None:
        self.image = image
        self.name = f"t-imagetest-{name_hint}-{uuid.uuid4().hex[:8]}"
        if any(flag.startswith("--network") for flag in run_flags):
            network = ""  # a fault test's own network setting replaces the default
        args = ["run", "-d", "--init", "--name", self.name, "--label", f"{RUN_LABEL}={run_id}",
                *(["--network", network] if network else []), "-v", f"{SCRIPTS}:{SCRIPTS_IN}:ro",
                "-e", "PYTHONUNBUFFERED=1"]
        if shared is not None:
            args += ["-v", f"{shared}:{SHARED_IN}"]
        # The run profile's flags come last so a fault test's override (e.g. --shm-size=64m) wins.
        args += [*run_flags, image, "sleep", "infinity"]
        _LIVE.add(self.name)
        proc = _docker(*args, timeout=300)
        if proc.returncode != 0:
            self.remove()
            raise RuntimeError(f"cannot start {image} with {' '.join(run_flags)}: {proc.stderr.strip()}")

    def exec(self, cmd: list[str] | str, *, timeout: float = 120, env: dict[str, str] | None = None) -> Result:
        """Run `cmd` in the container, killed after `timeout` seconds (rc 124 then)."""
        argv = ["bash", "-lc", cmd] if isinstance(cmd, str) else list(cmd)
        envs = [x for k, v in (env or {}).items() for x in ("-e", f"{k}={v}")]
        full = ["exec", *envs, self.name, "timeout", "-k", "5", str(int(timeout)), *argv]
        started = time.monotonic()
        try:
            proc = _docker(*full, timeout=timeout + 30)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return Result(124, out, f"docker exec did not return within {timeout + 30:.0f}s",
                          time.monotonic() - started)
        return Result(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)

    def python(self, script: str, *args: str, timeout: float = 120, env: dict[str, str] | None = None) -> Result:
        return self.exec(["python3", f"{SCRIPTS_IN}/{script}", *args], timeout=timeout, env=env)

    def testinfra(self) -> Any:
        import testinfra

        return testinfra.get_host(f"docker://{self.name}")

    def remove(self) -> None:
        _docker("rm", "-f", "-v", self.name, timeout=120)
        _LIVE.discard(self.name)

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def remove_all() -> None:
    for name in list(_LIVE):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            _docker("rm", "-f", "-v", name, timeout=120)
        _LIVE.discard(name)


def install_signal_cleanup() -> None:
    """SIGTERM behaves like Ctrl-C (pytest tears fixtures down); atexit catches the rest."""

    def _term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _term)
    atexit.register(remove_all)


def free_port() -> int:
    """A free TCP port on this host (the containers share its network)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def size_bytes(text: str) -> int:
    """`65536k`, `8g`, `1073741824` -> bytes."""
    match = re.fullmatch(r"(\d+)([kmgt]?)b?", text.strip().lower())
    if not match:
        raise ValueError(f"not a size: {text!r}")
    return int(match.group(1)) * 1024 ** " kmgt".index(match.group(2) or " ")


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def quote(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def skip(code: skips.SkipCode, text: str, subject: str = "") -> None:
    """Skip with a code the release gate can judge (buildtool.contracts.skips), never with bare prose."""
    pytest.skip(skips.skip_text(code, text, subject))
