"""Every argument is checked before anything outside the process is called (issue 37): hostile values exit 2
with one line, and no program is started, no socket opened, no registry or engine client made before that.
Messages cut long values, escape non-ASCII and never echo a password. The commands run in-process."""

from __future__ import annotations

import socket
import subprocess
from typing import Any

import pytest
import typer.main

from buildtool.cli import main
from buildtool.cli.app import app

LONG = "127.0.0.1:5000/x:" + "a" * 20_000
SECRET = "s3cr3t"
CREDENTIALS = f"admin:{SECRET}@127.0.0.1:5000/pytorch-cpu:2.13"
LOOKALIKE = "127.0.0.1:5000/j\u0430x:0.10"            # a Cyrillic а
INJECTED = "x:y;touch /tmp/p"
HOSTILE_REFERENCES = [LONG, CREDENTIALS, LOOKALIKE, INJECTED, "", "127.0.0.1:5000/x@sha256:zz"]
GOOD = "127.0.0.1:5000/pytorch-cpu:2.13"


class Called(AssertionError):
    pass


@pytest.fixture
def outside(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every way out of the process, each raising (and recorded) when called."""
    calls: list[str] = []

    def refuse(what: str) -> Any:
        def called(*args: Any, **kwargs: Any) -> Any:
            calls.append(f"{what} {args[:2]!r}"[:200])
            raise Called(f"{what} called before the arguments were checked")
        return called

    monkeypatch.setattr(subprocess, "run", refuse("subprocess.run"))
    monkeypatch.setattr(subprocess, "Popen", refuse("subprocess.Popen"))
    monkeypatch.setattr(socket, "create_connection", refuse("socket.create_connection"))
    monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
    monkeypatch.setattr("buildtool.registry.client.RegistryClient.__init__", refuse("RegistryClient"))
    try:
        import docker
    except ImportError:
        pass
    else:
        monkeypatch.setattr(docker, "from_env", refuse("docker.from_env"))
        monkeypatch.setattr(docker, "DockerClient", refuse("docker.DockerClient"))
    return calls


def run(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_refused(outside: list[str], capsys: pytest.CaptureFixture, *args: str) -> str:
    code, out, err = run(capsys, *args)
    assert outside == [], (args, outside)
    assert code == 2, (args[:3], code, err[-300:])
    assert SECRET not in err and SECRET not in out
    assert len(err) < 1_000, err[:300]
    assert "\u0430" not in err
    return err


def _commands_taking_an_image() -> list[tuple[str, list[str]]]:
    """(command, the arguments after the hostile IMAGE) of every command whose first argument is an image."""
    group = typer.main.get_group(app)
    found = []
    for name, command in sorted(group.commands.items()):
        arguments = [p for p in command.params if getattr(p, "param_type_name", "") == "argument"]
        if arguments and arguments[0].name in ("image", "images", "image_a"):
            rest = [GOOD] if len(arguments) > 1 and arguments[1].name == "image_b" else []
            found.append((name, rest))
    return found


def test_the_walk_finds_the_commands_that_take_an_image() -> None:
    names = {name for name, _ in _commands_taking_an_image()}
    assert {"validate", "sbom", "diff", "verify", "k8s"} <= names, names


@pytest.mark.parametrize("hostile", HOSTILE_REFERENCES, ids=["long", "credentials", "lookalike", "injected", "empty",
                                                            "bad-digest"])
def test_every_command_taking_an_image_refuses_a_hostile_reference_before_calling_out(
        outside: list[str], capsys: pytest.CaptureFixture, hostile: str) -> None:
    skipped = {"bundle", "slurm"}    # they take a local bundle folder too (not a reference): not walked here
    for name, rest in _commands_taking_an_image():
        if name in skipped:
            continue
        err = assert_refused(outside, capsys, name, hostile, *rest)
        if hostile is CREDENTIALS:
            assert "cannot carry credentials" in err and "admin" not in err, err
        if hostile is LONG:
            assert "(20017 characters)" in err, err
        if hostile is LOOKALIKE:
            assert "j\\u0430x" in err, err


def test_diff_checks_the_second_image_before_reading_the_first(outside: list[str],
                                                               capsys: pytest.CaptureFixture) -> None:
    err = assert_refused(outside, capsys, "diff", GOOD, LONG)
    assert "at most 512 characters" in err


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", "0"], "--nodes must be at least 1, not 0"),
    (["--nodes", "-1"], "--nodes must be at least 1, not -1"),
    (["--gpus-per-node", "-1"], "--gpus-per-node must be at least 0, not -1"),
    (["--node-selector", "gpu=a100\nhostNetwork: true"], "is not a Kubernetes label value"),
    (["--node-selector", "gpu=a100", "--node-selector", "gpu=h100"], "'gpu' is given twice"),
    (["--node-selector", "bad key=x"], "is not a Kubernetes label key"),
    (["--node-selector", "gpu=" + "x" * 5000], "(5000 characters)"),
])
def test_k8s_checks_counts_and_node_selectors_before_the_registry(outside: list[str], capsys: pytest.CaptureFixture,
                                                                  args: list[str], message: str) -> None:
    err = assert_refused(outside, capsys, "k8s", GOOD, *args)
    assert message in err, err
