"""The typer application: every command, in the order `--help` lists them."""

from __future__ import annotations

import typer

from buildtool.cli.build import bases, build
from buildtool.cli.bundle import bundle
from buildtool.cli.contents import diff, lock, sbom
from buildtool.cli.generate import catalogue, check, plan, render
from buildtool.cli.k8s import k8s
from buildtool.cli.keys import keys
from buildtool.cli.release import release
from buildtool.cli.report import report
from buildtool.cli.scaling import scaling
from buildtool.cli.slurm import slurm
from buildtool.cli.validate import validate
from buildtool.cli.verify import verify
from buildtool.cli.workflows import app as workflows

app = typer.Typer(
    help="Build and verify deep-learning container images from one version matrix (matrix.yaml).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
for command in (render, check, plan, catalogue, build, bases, lock, sbom, diff, validate, release, keys, report, k8s,
                slurm, bundle, scaling, verify):
    app.command()(command)
# A command group is listed after the commands, wherever it is added.
app.add_typer(workflows, name="workflows")
