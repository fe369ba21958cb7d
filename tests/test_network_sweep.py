"""validate.network.sweep reads `docker network ls` lines written by whoever can label a network on this engine:
each line it cannot use is passed over, never a traceback that stops every later validation on the host."""

from __future__ import annotations

import socket
import subprocess

from buildtool.validate import network


def test_an_owner_pid_of_digits_that_are_not_ascii_is_passed_over(monkeypatch):
    """`str.isdigit` takes '²' and '٣', and int('²') raised ValueError out of sweep, which only suppresses the
    engine's errors: one network labelled so stopped every validation on the host with a traceback."""
    host = socket.gethostname()
    lines = [f"dl-run-a {host}:12² run-a", f"dl-run-b {host}:٣ run-b", f"dl-run-c {host}:999999999999 run-c"]
    calls = []

    def docker(*args, **_kwargs):
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, "\n".join(lines) + "\n" if args[1] == "ls" else "", "")

    monkeypatch.setattr(network.docker_cli, "docker", docker)
    removed = network.sweep(log=lambda _line: None)
    assert removed == ["dl-run-c"]          # no process can have that pid: its maker is gone
    assert [c[:3] for c in calls if c[1] == "rm"] == [("network", "rm", "dl-run-c")]
