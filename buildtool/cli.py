"""The `buildtool` command line: parse, call, print. Logic lives in the other modules.

stdout carries results (`--json` for machines); stderr carries logs. Exit codes:
0 success, 1 a check, build or test failed, 2 bad input or usage.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from buildtool.catalogue import CATALOGUE_PATH, catalogue_outputs
from buildtool.errors import FailedError, UserError
from buildtool.matrix import Matrix, load_matrix
from buildtool.plan import Settings, git_revision, plan_matrix
from buildtool.render import Outputs, drift, prune, render_outputs, write_outputs
from buildtool.workflows import workflow_outputs

app = typer.Typer(
    help="Build and verify deep-learning container images from one version matrix (matrix.yaml).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
# Wide output when piped (CI logs), the terminal's width otherwise.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, soft_wrap=True)

FrameworkOption = Annotated[
    str | None,
    typer.Option("--framework", "-f", envvar="FRAMEWORK",
                 help="An image (pytorch-cpu), a cell (pytorch-cpu:2.13), a framework (pytorch) or all."),
]
MatrixOption = Annotated[
    Path | None, typer.Option("--matrix", help="The version matrix (default: matrix.yaml at the project root).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for machines instead of a table.")]


@dataclass(frozen=True)
class Project:
    """Where the matrix, templates and generated files are."""

    root: Path
    matrix_path: Path

    @property
    def templates(self) -> Path:
        return self.root / "templates"

    def load(self) -> Matrix:
        display = (str(self.matrix_path.relative_to(self.root))
                   if self.matrix_path.is_relative_to(self.root) else str(self.matrix_path))
        return load_matrix(self.matrix_path, self.templates, display=display)


def find_project(matrix: Path | None) -> Project:
    if matrix is not None:
        matrix = matrix.resolve()
        return Project(root=matrix.parent, matrix_path=matrix)
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "matrix.yaml").is_file():
            return Project(root=folder, matrix_path=folder / "matrix.yaml")
    raise UserError("no matrix.yaml in this folder or above; run from the project or pass --matrix")


def all_outputs(project: Project, matrix: Matrix) -> Outputs:
    def catalogue(m: Matrix) -> dict[str, bytes]:
        return catalogue_outputs(m, project.root)

    return render_outputs(matrix, project.templates, extras=(catalogue, workflow_outputs))


@app.command()
def render(
    matrix: MatrixOption = None,
    prune_stale: Annotated[bool, typer.Option("--prune", help="Delete Dockerfiles of cells no longer in the matrix.")]
    = False,
) -> None:
    """Render every cell's Dockerfile under dockerfiles/ and the catalogue, atomically."""
    project = find_project(matrix)
    outputs = all_outputs(project, project.load())
    changed = write_outputs(project.root, outputs)
    for rel in changed:
        out.print(f"wrote {rel}")
    stale = outputs.stale(project.root)
    if stale and prune_stale:
        prune(project.root, stale)
        for rel in stale:
            out.print(f"deleted {rel} (its cell is gone from the matrix)")
    elif stale:
        for rel in stale:
            err.print(f"stale: {rel} belongs to no cell; delete it or run `buildtool render --prune`")
    if not changed:
        err.print(f"{len(outputs.files)} generated files already up to date")


@app.command()
def check(matrix: MatrixOption = None) -> None:
    """Fail (exit 1, printing a unified diff) when committed generated files differ from the matrix."""
    project = find_project(matrix)
    outputs = all_outputs(project, project.load())
    diff, stale = drift(project.root, outputs)
    if diff:
        out.print(diff, end="", markup=False, highlight=False)
    for rel in stale:
        err.print(f"stale: {rel} belongs to no cell in the matrix; delete it or run `buildtool render --prune`")
    if diff or stale:
        raise FailedError("generated files drifted from matrix.yaml; run `make render` and commit the result")
    err.print(f"{len(outputs.files)} generated files match matrix.yaml")


@app.command()
def plan(
    framework: FrameworkOption = None,
    as_json: JsonOption = False,
    release: Annotated[str, typer.Option(help="Release version to fill into release tags.")] = "{release}",
    matrix: MatrixOption = None,
) -> None:
    """Show, per cell, the dev and release images, base, build args, tests and run profile."""
    project = find_project(matrix)
    loaded = project.load()
    cells = loaded.select(framework)
    plans = plan_matrix(loaded, cells, Settings.from_env(), git_revision(project.root), release)
    if as_json:
        out.print(json.dumps({"include": [p.to_json() for p in plans]}, indent=2), markup=False, highlight=False)
        return
    table = Table(title="Build plan", show_lines=True)
    for column in ("cell", "dev image", "release tags", "base", "tests", "run flags"):
        table.add_column(column, overflow="fold")
    for p in plans:
        tags = "\n".join(f"{p.release_repo}:{t}" for t in (*p.release_tags, *p.moving_tags))
        table.add_row(p.cell.key, p.dev_ref, tags, p.base, ",".join(p.cell.tests), " ".join(p.cell.run.docker_flags()))
    out.print(table)


@app.command()
def catalogue(matrix: MatrixOption = None) -> None:
    """Write docs/images.md, the catalogue of every image (also done by `render`)."""
    project = find_project(matrix)
    outputs = Outputs(files=catalogue_outputs(project.load(), project.root))
    changed = write_outputs(project.root, outputs)
    out.print(f"wrote {CATALOGUE_PATH}" if changed else f"{CATALOGUE_PATH} already up to date")


# Commands that live in their own modules register here (one line each).
# -- command registrations --
__import__("buildtool.cli_build").cli_build.register(app)
__import__("buildtool.cli_release").cli_release.register(app)
__import__("buildtool.cli_validate").cli_validate.register(app)
__import__("buildtool.cli_ops").cli_ops.register(app)


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
