"""What every command shares, declared once: the consoles, the common options and the project.

A leaf module: it imports nothing from the rest of the CLI, and nothing heavy (the command
modules import the pipeline stages they call inside the command functions, so that
`buildtool --help` stays fast). The consoles and the project live in buildtool.cli.console
(no typer), re-exported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from buildtool.cli.console import Project, emit_json, err, find_project, log, out, path_of, say

# Re-exported for the command modules, with the options declared here.
__all__ = ["FrameworkOption", "JsonOption", "MatrixOption", "Project", "RevisionOption", "TsaOption", "emit_json",
           "err", "find_project", "log", "out", "path_of", "say"]


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
    # No envvar: DL_IMAGES_TSA_URL has one reader, buildtool.common.tsa.configured_url (click took "  " as a value).
    typer.Option("--tsa", metavar="URL",
                 help="An RFC 3161 timestamp authority: each Sigstore bundle written carries its timestamp over the "
                      "signature (docs/release-trust.md). Default: DL_IMAGES_TSA_URL, else none."),
]
RevisionOption = Annotated[
    str | None,
    typer.Option("--revision", envvar="REVISION",
                 help="Revision whose dev images to use (default: git's short sha of HEAD, "
                      "-dirty.<hash> when the tree has changes)."),
]
