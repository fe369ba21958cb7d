"""The typer application: every command module registers its commands here, in the order `--help` lists them."""

from __future__ import annotations

import typer

from buildtool.cli.build import register as register_build
from buildtool.cli.bundle import register as register_bundle
from buildtool.cli.contents import register as register_contents
from buildtool.cli.generate import register as register_generate
from buildtool.cli.k8s import register as register_k8s
from buildtool.cli.keys import register as register_keys
from buildtool.cli.release import register as register_release
from buildtool.cli.report import register as register_report
from buildtool.cli.scaling import register as register_scaling
from buildtool.cli.slurm import register as register_slurm
from buildtool.cli.validate import register as register_validate
from buildtool.cli.verify import register as register_verify
from buildtool.cli.workflows import register as register_workflows

app = typer.Typer(
    help="Build and verify deep-learning container images from one version matrix (matrix.yaml).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
# A command group (workflows) is listed after the commands, wherever it is registered.
for register in (register_generate, register_build, register_contents, register_validate, register_release,
                 register_keys, register_workflows, register_report, register_k8s, register_slurm, register_bundle,
                 register_scaling, register_verify):
    register(app)
