"""TensorBoard started as a user starts it (`tensorboard --logdir DIR --port P`, no --host) listens on the
loopback address only, TensorBoard's own default: a training's data is served to the network only when the
user asks (--bind_all). TensorBoard is served by scripts/tb_query.py (a program, left running); its socket is
read through testinfra's `host` while it serves."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.shared(why="a TensorBoard of its own in the worker's container")

TB_START_S = 60
LOOPBACK = ("127.0.0.1", "::1")


def test_tensorboard_listens_on_loopback_only(main, host):
    logdir = f"/tmp/imgtest-serve-{uuid.uuid4().hex[:6]}"
    with main.serving("tb_query.py", "--logdir", logdir, "--mkdir", "--mode", "serve", "--timeout", str(TB_START_S),
                      step="TensorBoard serving as `tensorboard --logdir DIR` does", quiet=TB_START_S + 30) as served:
        port = served["port"]
        listening = [s for s in host.socket.get_listening_sockets() if s.startswith("tcp://")
                     and s.rsplit(":", 1)[1] == str(port)]
    addresses = sorted({s[len("tcp://"):].rsplit(":", 1)[0] for s in listening})
    assert addresses, f"TensorBoard answered on port {port} but no socket listens there (/proc/net/tcp, tcp6)"
    exposed = [a for a in addresses if a not in LOOPBACK]
    assert not exposed, (
        f"TensorBoard started without --host listens on {', '.join(exposed)}:{port}, not on loopback only: every "
        "network the container is on can read the training's logs and profiles; the image changed TensorBoard's "
        "default address (`localhost`); users who want it exposed pass --bind_all")
