"""The `buildtool` command line: parse, call, print. Logic lives in the pipeline's packages.

stdout carries results (`--json` for machines); stderr carries logs. Exit codes:
0 success, 1 a check, build or test failed, 2 bad input or usage.

Each command module registers its commands on the app here; they share options through the
leaf module `buildtool.cli.options` and import the stages they call inside each command, so
the CLI has no import cycle and `buildtool --help` imports no stage at all.
"""

from __future__ import annotations

import sys

import typer

from buildtool.cli import build, contents, generate, ops, release, validate
from buildtool.cli.options import err
from buildtool.common.errors import FailedError, UserError

app = typer.Typer(
    help="Build and verify deep-learning container images from one version matrix (matrix.yaml).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
for module in (generate, build, contents, validate, release, ops):
    module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point: turn our errors into one line and an exit code.

    Typer's standalone mode already answers usage errors (exit 2), --help and Ctrl-C.
    """
    try:
        app(args=argv)
    except UserError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        sys.exit(exc.exit_code)
    except FailedError as exc:
        err.print(f"failed: {exc}", markup=False, highlight=False)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
