"""`buildtool release`: promote tested dev images of a commit to release tags (the typer command: help and usage;
the work is in buildtool.cli.release_run, which also parses the common case itself). Its options are declared once,
in buildtool.contracts.arguments.RELEASE_OPTIONS: this command's signature is made from that table, as the fast
parser is."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from buildtool.cli.console import path_of
from buildtool.contracts.arguments import RELEASE_OPTIONS, Option

_TYPES = {"value": str | None, "append": list[str] | None, "flag": bool}


def release(**options: Any) -> None:
    """Promote the dev images of a commit to release tags, digest for digest, inside the registry."""
    from buildtool.cli.release_run import run_release

    run_release(**options)


def _parameter(option: Option) -> inspect.Parameter:
    kind: Any = Path | None if option.dest == "matrix" else _TYPES[option.kind]
    declared = typer.Option(*option.flags, envvar=option.envvar, help=option.help,
                            parser=path_of("--matrix") if option.dest == "matrix" else None)
    default = inspect.Parameter.empty if option.required else (False if option.kind == "flag" else None)
    return inspect.Parameter(option.dest, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[kind, declared])


# typer reads a command's options from its signature: this one's is the table's.
release.__signature__ = inspect.Signature([_parameter(o) for o in RELEASE_OPTIONS])  # type: ignore[attr-defined]
