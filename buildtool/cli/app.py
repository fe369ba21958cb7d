"""The typer application: every command module registers its commands here."""

from __future__ import annotations

import typer

from buildtool.cli.build import register as register_build
from buildtool.cli.contents import register as register_contents
from buildtool.cli.generate import register as register_generate
from buildtool.cli.keys import register as register_keys
from buildtool.cli.ops import register as register_ops
from buildtool.cli.release import register as register_release
from buildtool.cli.validate import register as register_validate
from buildtool.cli.verify import register as register_verify

app = typer.Typer(
    help="Build and verify deep-learning container images from one version matrix (matrix.yaml).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
for register in (register_generate, register_build, register_contents, register_validate, register_release,
                 register_keys, register_ops, register_verify):
    register(app)
