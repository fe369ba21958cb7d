"""What every command shares, declared once: the consoles, the common options and the project.

A leaf module: it imports nothing from the rest of the CLI, and nothing heavy (the command
modules import the pipeline stages they call inside the command functions, so that
`buildtool --help` stays fast).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from buildtool.common.errors import UserError

if TYPE_CHECKING:
    from rich.console import Console

    from buildtool.matrix.schema import Matrix


class _LazyConsole:
    """A rich Console made on first use: importing rich costs more than `buildtool --help` may take."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            if self._stderr:
                self._console = Console(stderr=True, soft_wrap=True)
            else:   # wide output when piped (CI logs), the terminal's width otherwise
                self._console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
        return getattr(self._console, name)


out: Console = _LazyConsole(stderr=False)  # type: ignore[assignment]
err: Console = _LazyConsole(stderr=True)  # type: ignore[assignment]

FrameworkOption = Annotated[
    str | None,
    typer.Option("--framework", "-f", envvar="FRAMEWORK",
                 help="An image (pytorch-cpu), a cell (pytorch-cpu:2.13), a framework (pytorch) or all."),
]
MatrixOption = Annotated[
    Path | None, typer.Option("--matrix", help="The version matrix (default: matrix.yaml at the project root).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for machines instead of a table.")]
RevisionOption = Annotated[
    str | None,
    typer.Option("--revision", envvar="REVISION",
                 help="Revision whose dev images to use (default: git's short sha of HEAD, "
                      "-dirty.<hash> when the tree has changes)."),
]


_JSON_EMITTED: list[bool] = []


def emit_json(document: object) -> None:
    """Print the command's one JSON document on stdout (and remember that it was printed)."""
    import json

    out.print(json.dumps(document, indent=2), markup=False, highlight=False)
    _JSON_EMITTED.append(True)


def json_emitted() -> bool:
    return bool(_JSON_EMITTED)


def reset_json() -> None:
    _JSON_EMITTED.clear()


def log(message: str) -> None:
    """Progress and notes: stderr, verbatim."""
    err.print(message, markup=False, highlight=False)


def say(message: str) -> None:
    """A result line: stdout, verbatim."""
    out.print(message, markup=False, highlight=False)


@dataclass(frozen=True)
class Project:
    """Where the matrix, templates and generated files are."""

    root: Path
    matrix_path: Path

    @property
    def templates(self) -> Path:
        return self.root / "templates"

    def load(self) -> Matrix:
        from buildtool.matrix.schema import load_matrix

        display = (str(self.matrix_path.relative_to(self.root))
                   if self.matrix_path.is_relative_to(self.root) else str(self.matrix_path))
        return load_matrix(self.matrix_path, self.templates, display=display)

    def revision(self, override: str | None = None) -> str:
        """The revision dev images are tagged with: `override` (checked) or the work tree's."""
        from buildtool.matrix.plan import git_revision, resolve_revision

        return resolve_revision(self.root, override, git_revision)


def find_project(matrix: Path | None) -> Project:
    if matrix is not None:
        matrix = matrix.resolve()
        return Project(root=matrix.parent, matrix_path=matrix)
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "matrix.yaml").is_file():
            return Project(root=folder, matrix_path=folder / "matrix.yaml")
    raise UserError("no matrix.yaml in this folder or above; run from the project or pass --matrix")
