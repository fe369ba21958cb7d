"""The typer application: every command module registers its commands here."""

from __future__ import annotations

import typer

from buildtool.cli import build, contents, generate, keys, ops, release, validate

app = typer.Typer(
    help="Build and verify deep-learning container images from one version matrix (matrix.yaml).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
for module in (generate, build, contents, validate, release, keys, ops):
    module.register(app)
