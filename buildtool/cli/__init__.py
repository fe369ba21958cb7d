"""The `buildtool` command line: parse, call, print. Logic lives in the pipeline's packages.

stdout carries results (`--json` for machines); stderr carries logs. Exit codes:
0 success, 1 a check, build or test failed, 2 bad input or usage.

Each command module (one per command or command group) holds its commands, which the app
(buildtool.cli.app) lists; they share options through the leaf module `buildtool.cli.options` (the
launch commands k8s, slurm, bundle and scaling also through `buildtool.cli.launch_options`) and
import the stages they call inside each command, so the CLI has no import cycle and `buildtool --help`
imports no stage's code (only buildtool.validate.options, the leaf module of validate's defaults).
No function here runs past 60 lines (tests/test_cli_shape.py).
`buildtool release ...` takes a fast path that does not import typer (buildtool.cli.release_run).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from buildtool.cli.console import emit_json, json_emitted, log, reset_json
from buildtool.common.errors import FailedError, UserError


def __getattr__(name: str) -> Any:
    if name == "app":   # `from buildtool.cli import app` still works, built on first use
        from buildtool.cli.app import app

        return app
    raise AttributeError(name)


def main(argv: list[str] | None = None) -> None:
    """Entry point: turn our errors into one line and an exit code.

    Typer's standalone mode already answers usage errors (exit 2), --help and Ctrl-C. With
    `release --json` and `verify --json`, stdout always carries one JSON document: a release that fails before it
    has a report (bad input, a registry that is down) prints `{"ok": false, "error": ...}`, a verify that fails
    before it has a verification `{"verified": false, "error": ...}` (_json_error).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    reset_json()
    try:
        if not _fast_path(args):
            _command()(args=args)
    except UserError as exc:
        _failed(args, f"error: {exc}", exc.exit_code)
    except FailedError as exc:
        _failed(args, f"failed: {exc}", exc.exit_code)
    except KeyboardInterrupt:   # typer answers Ctrl-C itself; this is for the fast path
        _failed(args, "Aborted!", 130)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code != 0 and _json_wanted(args):
            _json_error(args, f"exit {code}: see stderr (usage error or interrupted)", code)
        raise


@functools.cache
def _command() -> Callable[..., Any]:
    """The click command typer builds from the app, built once per process: building it reads every command's
    signature and type hints (about 0.25 s), which a process that runs several commands in turn (the toolkit's
    own tests do, in-process) would otherwise pay on each. The app's pretty exceptions are off, so calling the
    click command is what `app(args=...)` does."""
    import typer.main

    from buildtool.cli.app import app

    return typer.main.get_command(app)


def _fast_path(args: list[str]) -> bool:
    """`release` without typer (see buildtool.cli.release_run); True when it ran."""
    if args[:1] != ["release"]:
        return False
    from buildtool.cli.release_run import fast_release

    return fast_release(args[1:])


def _failed(args: list[str], message: str, code: int) -> None:
    log(message)
    if _json_wanted(args):
        _json_error(args, message, code)
    sys.exit(code)


def _json_wanted(args: list[str]) -> bool:
    return args[:1] in (["release"], ["verify"]) and "--json" in args and not json_emitted()


def _json_error(args: list[str], message: str, code: int) -> None:
    if args[:1] == ["verify"]:
        # The keys verify's document always has (release.chain.Verification.to_json), plus why there is none; no
        # image: the argument may be what is wrong, and may hold a password.
        emit_json({"image": None, "verified": False, "problem": message, "cell": "", "gated": False,
                   "problems": [message], "not_run": [], "manifests": [], "error": message, "exit_code": code})
        return
    # The keys a release's document always has, plus why there is no report.
    emit_json({"ok": False, "error": message, "exit_code": code, "release": None, "status": {}})
