"""free_port: a rendezvous port bound minutes after it is chosen is not one the kernel hands out
meanwhile to other sockets, and never a port in use."""

from __future__ import annotations

import socket

from buildtool.common import net


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    low, _ = net._ephemeral_range()
    ports = {net.free_port() for _ in range(50)}
    assert all(net._LOW <= p < low for p in ports)
    assert not ports & net._TORCH_DEFAULTS
    assert len(ports) > 1                                 # random, not one fixed port per host
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.pop()))


class _Picks:
    """Stands in for SystemRandom: hands out the given ports in order."""

    def __init__(self, *ports: int) -> None:
        self.ports = iter(ports)

    def randrange(self, _low: int, _high: int) -> int:
        return next(self.ports)


def test_a_port_in_use_is_never_returned(monkeypatch) -> None:  # noqa: ANN001
    with socket.socket() as taken, socket.socket() as other:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        other.bind(("127.0.0.1", 0))
        busy, free = taken.getsockname()[1], other.getsockname()[1]
        other.close()
        monkeypatch.setattr(net, "_ephemeral_range", lambda: (65535, 65535))
        monkeypatch.setattr(net, "_LOW", 1024)
        monkeypatch.setattr(net.random, "SystemRandom", lambda: _Picks(29400, busy, free))
        assert net.free_port() == free
