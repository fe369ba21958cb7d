"""Every argument is checked before anything outside the process is called (issue 37): hostile values exit 2
with one line, and no program is started, no socket opened, no registry or engine client made before that.
Messages cut long values, escape non-ASCII and never echo a password. The commands run in-process."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
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
            second = arguments[1].name if len(arguments) > 1 else None
            rest = {"image_b": [GOOD], "dest": ["/nonexistent/bundle-folder"], None: []}[second]
            found.append((name, rest))
    return found


def test_the_walk_finds_the_commands_that_take_an_image() -> None:
    names = {name for name, _ in _commands_taking_an_image()}
    assert {"validate", "sbom", "diff", "verify", "k8s", "slurm", "bundle"} <= names, names


@pytest.mark.parametrize("hostile", HOSTILE_REFERENCES, ids=["long", "credentials", "lookalike", "injected", "empty",
                                                            "bad-digest"])
def test_every_command_taking_an_image_refuses_a_hostile_reference_before_calling_out(
        outside: list[str], capsys: pytest.CaptureFixture, hostile: str) -> None:
    for name, rest in _commands_taking_an_image():
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


@pytest.mark.parametrize("tag", ["garbage", "9.99", "0123456789ab-9.99"])
def test_validate_refuses_a_matrix_image_whose_tag_names_no_cell_before_the_registry(
        outside: list[str], capsys: pytest.CaptureFixture, tag: str) -> None:
    """The audit's `validate IMAGE:garbage` said "not found in registry": the tag is what is wrong, and it is
    known to be wrong before anything is asked."""
    matrix = str(Path(__file__).resolve().parent.parent / "matrix.yaml")
    err = assert_refused(outside, capsys, "validate", f"127.0.0.1:5000/pytorch-cpu:{tag}", "--matrix", matrix)
    assert f"tag {tag!r} names no cell of pytorch-cpu" in err, err


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


# --- The walk: every subcommand, every parameter, hostile values of its type (issue 37) ---------------------------
#
# The grammar of each parameter is buildtool.contracts.arguments.ARGUMENTS (command -> parameter -> (flag,
# grammar)). For each value below, the table says whether it is refused; a refused value must exit 2 with one
# short line naming the flag, before any way out of the process is taken; a value the grammar accepts may go on
# (the command then stops at the first way out, or at "no matrix.yaml": the walk runs in an empty folder), but a
# command that exits 2 after taking a way out checked too late.

NEWLINE = "gpu=a100\nhostNetwork: true"
RTL = "evil\u202eexe.yaml"
HOSTILE_TEXT = [LONG, NEWLINE, "$(touch /tmp/p)", INJECTED, CREDENTIALS, RTL, "j\u0430x", ""]
HOSTILE_INT = ["0", "-1", "99999999999"]
HOSTILE_FLOAT = ["0", "-1", "nan", "inf", "1e300"]


def _hostile_paths(tmp: Path) -> list[str]:
    (tmp / "a-file").write_text("x\n")
    (tmp / "a-folder").mkdir(exist_ok=True)
    return [str(tmp / "missing"), str(tmp / "a-folder"), str(tmp / "a-file"), str(tmp / "new\nline"),
            "/" + "p" * 20_000, str(tmp / "x\u202ey")]


def _walk(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    if hasattr(command, "commands"):
        return [found for name, sub in sorted(command.commands.items()) for found in _walk(sub, (*path, name))]
    return [(" ".join(path), command)]


COMMANDS = dict(_walk(typer.main.get_command(app)))


def _params(command: Any) -> list[Any]:
    return [p for p in command.params if p.name != "help"]


def _flag(param: Any) -> str:
    return param.opts[0] if param.param_type_name == "option" else param.name.upper()


def _is_flag(param: Any) -> bool:
    return bool(getattr(param, "is_flag", False)) or param.type_descriptor.annotation is bool


def _base(command_path: str, command: Any, tmp: Path) -> dict[str, list[str]]:
    """Valid values of the required parameters (by name): what the hostile one is put beside."""
    plan = tmp / "plan.json"
    plan.write_text("{}\n")
    good = {"image": GOOD, "images": GOOD, "image_a": GOOD, "image_b": GOOD, "dest": str(tmp / "bundle"),
            "version": "0.1.0", "plan": str(plan), "cells": "pytorch-cpu"}
    return {p.name: [good[p.name]] for p in _params(command) if p.required}


def _argv(command_path: str, command: Any, base: dict[str, list[str]], param: Any, value: str) -> list[str]:
    values = {**base, param.name: [value]}
    argv = command_path.split()
    for p in _params(command):
        if p.name not in values:
            continue
        if p.param_type_name == "argument":
            argv += values[p.name]
        else:
            argv += [p.opts[0], *values[p.name]]
    return argv


def _typed(param: Any, value: str) -> Any:
    annotation = str(param.type_descriptor.annotation)
    one: Any = value
    if "int" in annotation:
        one = int(value)
    elif "float" in annotation:
        one = float(value)
    elif "Path" in annotation:
        one = Path(value)
    return [one] if param.multiple or param.nargs != 1 else one


def _hostile(param: Any, tmp: Path) -> list[str]:
    annotation = str(param.type_descriptor.annotation)
    if "Path" in annotation:
        return _hostile_paths(tmp)
    if "int" in annotation:
        return HOSTILE_INT
    if "float" in annotation:
        return HOSTILE_FLOAT
    return HOSTILE_TEXT


def test_every_parameter_of_every_command_has_a_grammar() -> None:
    from buildtool.contracts.arguments import ARGUMENTS, FLAG

    assert set(ARGUMENTS) == set(COMMANDS), set(ARGUMENTS) ^ set(COMMANDS)
    for command_path, command in COMMANDS.items():
        table = ARGUMENTS[command_path]
        names = {p.name for p in _params(command)}
        assert set(table) == names, (command_path, set(table) ^ names)
        for p in _params(command):
            flag, grammar = table[p.name]
            assert flag == _flag(p), (command_path, p.name, flag, _flag(p))
            assert (grammar is FLAG) == _is_flag(p), (command_path, p.name)


def _refused(command_path: str, param: Any, value: str) -> bool:
    from buildtool.common.errors import UserError
    from buildtool.contracts.arguments import check_argument

    try:
        check_argument(command_path, param.name, _typed(param, value))
    except UserError:
        return True
    return False


def _problems(capsys: pytest.CaptureFixture, outside: list[str], argv: list[str], flag: str,
              refused: bool) -> list[str]:
    try:
        main(argv)
        code: int | str = 0
    except SystemExit as exc:
        code = int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except Called:
        code = "called"
    except Exception as exc:   # an accepted value that went on and failed otherwise: not this test's business
        code = f"raised {type(exc).__name__}"
    err = capsys.readouterr().err.strip()
    called, shown_argv = list(outside), [a[:40] for a in argv]
    outside.clear()
    if code == 2 and called:
        return [f"{shown_argv}: exit 2 after calling out ({called[0]}): checked too late"]
    if not refused:
        return []
    if code != 2:
        return [f"{shown_argv}: the grammar refuses it, the command gave {code} ({called[:1]})"]
    usage = "Usage:" in err    # click's own refusal (a min= range): its usage text, not ours
    wrong = []
    if not usage and (flag not in err or "\n" in err or len(err) > 330):
        wrong.append(f"{shown_argv}: not one short line naming {flag}: {err[:400]!r}")
    if any(s in err for s in (SECRET, "\u202e", "\u0430")):
        wrong.append(f"{shown_argv}: echoes a raw hostile value: {err[:300]!r}")
    return wrong


@pytest.mark.parametrize("command_path", sorted(COMMANDS))
def test_the_walk_every_option_hostile_values(outside: list[str], capsys: pytest.CaptureFixture, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch, command_path: str) -> None:
    """Every parameter of `command_path` gets each hostile value of its type beside valid required values."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("FRAMEWORK", "REVISION", "VERSION", "PUSH_WITH", "BASE_MIRROR", "DL_IMAGES_RDZV_JOIN_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    command = COMMANDS[command_path]
    base = _base(command_path, command, tmp_path)
    problems: list[str] = []
    walked = 0
    for param in _params(command):
        if _is_flag(param):
            continue
        for value in _hostile(param, tmp_path):
            argv = _argv(command_path, command, base, param, value)
            problems += _problems(capsys, outside, argv, _flag(param), _refused(command_path, param, value))
            walked += 1
    assert walked or all(_is_flag(p) for p in _params(command))
    assert not problems, "\n".join(problems[:25])
