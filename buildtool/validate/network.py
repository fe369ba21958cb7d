"""The bridge network a validation's containers share: each container its own network namespace, as
separate nodes have, reaching the others by name (the engine's DNS on a user-defined network) or
address. Multi-process and multi-node checks run across it, so a setting that only works on one
host (a socket interface pinned to `lo`, a coordinator on 127.0.0.1) fails here as on a cluster.

One network per validation, named by its run id (two validations side by side never share one),
labelled with the run and with who made it (host and pid). It is removed when the validation ends,
on errors, Ctrl-C and SIGTERM too (the CLI turns SIGTERM into an exception), after the run's
containers; a network whose maker died without removing it (SIGKILL) is removed by the next
validation on this host (`sweep`), never one whose maker still runs.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Callable, Iterator

from buildtool.common import docker_cli
from buildtool.common.errors import UserError
from buildtool.common.processes import pid_alive
from buildtool.contracts import label_keys

PREFIX = "dl-imagetest"
OWNER_LABEL = label_keys.IMAGETEST_OWNER
TIMEOUT_S = 60


def name_for(run_id: str) -> str:
    return f"{PREFIX}-{run_id}"


def create(run_id: str) -> str:
    """A new bridge network for run `run_id`; its name. One line naming the engine's error otherwise."""
    name = name_for(run_id)
    proc = docker_cli.docker("network", "create", "--driver", "bridge", "--label",
                             f"{label_keys.IMAGETEST_RUN}={run_id}", "--label",
                             f"{OWNER_LABEL}={socket.gethostname()}:{os.getpid()}", name, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise UserError(f"cannot create the bridge network {name} the image tests' containers share: "
                        f"{docker_cli.engine_error(proc.stderr)}")
    return name


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")


def remove(name: str, run_id: str, log: Callable[[str], None] = _stderr) -> None:
    """Remove the network, first any container of the run still attached to it. Never raises: it
    runs in `finally` blocks; what could not be removed is left to `sweep`, and containers of the run that
    could not be listed or removed are a warning on `log`, naming the run's label."""
    try:
        docker_cli.remove_labelled(label_keys.IMAGETEST_RUN, run_id)
    except (OSError, docker_cli.DockerError) as exc:
        log(f"warning: {exc}")
    with contextlib.suppress(OSError, docker_cli.DockerError):
        docker_cli.docker("network", "rm", name, timeout=TIMEOUT_S)


def sweep(log: Callable[[str], None] = _stderr) -> list[str]:
    """Remove the networks that validations on this host made and left behind when killed (their
    maker's pid is gone); returns their names."""
    fields = f'{{{{.Name}}}} {{{{.Label "{OWNER_LABEL}"}}}} {{{{.Label "{label_keys.IMAGETEST_RUN}"}}}}'
    proc = docker_cli.docker("network", "ls", "--filter", f"label={OWNER_LABEL}", "--format", fields,
                             timeout=TIMEOUT_S)
    removed = []
    host = socket.gethostname()
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        parts = line.split()
        if len(parts) != 3:
            continue
        name, owner, run_id = parts
        who, _, pid = owner.rpartition(":")
        if who == host and pid.isascii() and pid.isdigit() and not pid_alive(int(pid)):
            remove(name, run_id, log)
            removed.append(name)
    return removed


@contextlib.contextmanager
def run_network(run_id: str, log: Callable[[str], None] = _stderr) -> Iterator[str]:
    """The run's network for the `with` block; removed when it ends, however it ends (warnings on `log`)."""
    with contextlib.suppress(docker_cli.DockerError):
        sweep(log)
    try:
        name = create(run_id)
    except (docker_cli.DockerTimeout, KeyboardInterrupt):   # cut short (Ctrl-C, CI's cancel too): the engine may
        remove(name_for(run_id), run_id, log)               # have made it all the same
        raise
    try:
        yield name
    finally:
        remove(name, run_id, log)
