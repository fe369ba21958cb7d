"""A free TCP port for a rendezvous on this host's network."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# torch's own defaults (c10d rendezvous, MASTER_PORT): someone else's job may be using them.
_TORCH_DEFAULTS = frozenset({29400, 29500})
_LOW = 20000


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, chosen below the kernel's ephemeral range.

    The port is often bound long after it is chosen (a rendezvous host that joins minutes late):
    a port from the ephemeral range can meanwhile be handed to any outgoing connection or any
    `bind(0)` (gloo opens many), and the early node then talks to a stranger and hangs. Ports
    below the range are only taken by a program that asks for them by number.
    """
    low, _ = _ephemeral_range()
    rng = random.SystemRandom()
    if low - _LOW > 1000:
        for _ in range(100):
            port = rng.randrange(_LOW, low)
            if port in _TORCH_DEFAULTS:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:        # a machine with an unusual range: any free port
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
