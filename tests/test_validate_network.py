"""The bridge network of a validation (buildtool.validate.network): one per run, named by the run, removed
however the run ends (an error or Ctrl-C inside it, containers still attached), and a network whose maker
was killed is removed by the next validation, never one whose maker still runs."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from buildtool.common import docker_cli
from buildtool.contracts import label_keys
from buildtool.validate import network

pytestmark = pytest.mark.engine


def networks() -> set[str]:
    return set(docker_cli.docker("network", "ls", "--format", "{{.Name}}", timeout=60).stdout.split())


def test_each_run_has_its_own_name():
    assert network.name_for("abc") != network.name_for("abd")
    assert network.name_for("abc").startswith(network.PREFIX)


@pytest.mark.parametrize("interrupt", [RuntimeError, KeyboardInterrupt])
def test_the_network_is_removed_however_the_run_ends(interrupt):
    run_id = f"t{uuid.uuid4().hex[:10]}"
    name = network.name_for(run_id)
    with pytest.raises(interrupt), network.run_network(run_id) as made:
        assert made == name and name in networks()
        # A container of the run still attached: removed first, then the network.
        docker_cli.docker("run", "-d", "--name", f"{name}-c", "--network", name, "--label",
                          f"{label_keys.IMAGETEST_RUN}={run_id}", "--entrypoint", "sleep",
                          "127.0.0.1:5000/library/debian:bookworm-slim", "60", timeout=120, check=True)
        raise interrupt("stop")
    assert name not in networks()


def test_a_network_whose_maker_died_is_swept_and_a_living_ones_is_kept():
    dead_run, live_run = f"t{uuid.uuid4().hex[:10]}", f"t{uuid.uuid4().hex[:10]}"
    # Made by a process that has ended (as if killed before its `finally` ran).
    subprocess.run([sys.executable, "-c", f"from buildtool.validate import network; network.create({dead_run!r})"],
                   check=True, timeout=120)
    live = network.create(live_run)
    try:
        assert network.name_for(dead_run) in networks()
        swept = network.sweep()
        assert network.name_for(dead_run) in swept and live not in swept
        assert network.name_for(dead_run) not in networks() and live in networks()
    finally:
        network.remove(live, live_run)
        network.remove(network.name_for(dead_run), dead_run)
