"""What every command shares, declared once: the consoles, the common options and the project.

A leaf module: it imports nothing from the rest of the CLI, and nothing heavy (the command
modules import the pipeline stages they call inside the command functions, so that
`buildtool --help` stays fast). The consoles and the project live in buildtool.cli.console
(no typer), re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from buildtool.cli.console import Project, emit_json, err, find_project, log, out, say

# Re-exported for the command modules, with the options declared here.
__all__ = ["FrameworkOption", "JsonOption", "MatrixOption", "Project", "RevisionOption", "TsaOption", "emit_json",
           "err", "find_project", "log", "out", "path_of", "say"]


def path_of(flag: str) -> Callable[[str | Path], Path]:
    """The `parser` of a path argument or option named FLAG: typer's own makes '' the current folder (Path('') is
    Path('.')), so `--out ""` (an unset variable) wrote keys into the checkout and `bundle IMAGE "" --force` would
    have replaced it; '' is refused in one line naming FLAG (exit 2)."""
    from buildtool.common.errors import UserError

    def parse(value: str | Path) -> Path:
        if isinstance(value, str) and value == "":
            raise UserError(f"{flag}: the path is empty; name a file or folder ('.' for this one)")
        return Path(value)

    return parse

FrameworkOption = Annotated[
    str | None,
    typer.Option("--framework", "-f", envvar="FRAMEWORK",
                 help="An image (pytorch-cpu), a cell (pytorch-cpu:2.13), a framework (pytorch) or all."),
]
MatrixOption = Annotated[
    Path | None, typer.Option("--matrix", parser=path_of("--matrix"),
                              help="The version matrix (default: matrix.yaml at the project root).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for machines instead of a table.")]
TsaOption = Annotated[
    str | None,
    typer.Option("--tsa", envvar="DL_IMAGES_TSA_URL", metavar="URL",
                 help="An RFC 3161 timestamp authority: each Sigstore bundle written carries its timestamp over the "
                      "signature (docs/release-trust.md). Default: none."),
]
RevisionOption = Annotated[
    str | None,
    typer.Option("--revision", envvar="REVISION",
                 help="Revision whose dev images to use (default: git's short sha of HEAD, "
                      "-dirty.<hash> when the tree has changes)."),
]
