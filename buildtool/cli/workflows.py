"""`buildtool workflows write | ci-matrix`: the GitHub Actions workflows generated from the matrix."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from buildtool.cli.console import writing
from buildtool.cli.options import MatrixOption, find_project, out, path_of
from buildtool.common.errors import UserError
from buildtool.contracts.arguments import check_arguments

GpuLabelsOption = Annotated[str, typer.Option(help="Comma list of the GPU runners' labels.")]
CronOption = Annotated[str, typer.Option(help="When the nightly runs (cron, UTC).")]
OutDirOption = Annotated[Path | None, typer.Option("--out", parser=path_of("--out"),
    help="Folder to write into (default: the project).")]
PlanOption = Annotated[Path, typer.Option(parser=path_of("--plan"), help="Output of `buildtool plan --json`.")]
CellsOption = Annotated[str, typer.Option(help="Comma list of cells to keep.")]

app = typer.Typer(help="GitHub Actions workflows generated from the matrix.", no_args_is_help=True)


@app.command("write")
def workflows_write(
    gpu_labels: GpuLabelsOption = "self-hosted,linux,x64,gpu",
    cron: CronOption = "17 2 * * *",
    out_dir: OutDirOption = None,
    matrix: MatrixOption = None,
) -> None:
    """Write .github/workflows/*.yml (`make render` writes them with the defaults)."""
    check_arguments("workflows write", locals())   # every argument first (issue 37)
    from buildtool.render.dockerfiles import Outputs, write_outputs
    from buildtool.render.workflows import WorkflowOptions, render_workflows

    project = find_project(matrix)
    labels = tuple(gpu_labels.split(","))   # one label or more, no spaces (check_arguments)
    files = render_workflows(project.load(), WorkflowOptions(gpu_labels=labels, nightly_cron=cron))
    target = out_dir or project.root
    with writing("--out", target):   # a folder that cannot be made or written: one line, not a traceback
        written = write_outputs(target, Outputs(files=files))
    for rel in written:
        out.print(f"wrote {rel}")


@app.command("ci-matrix")
def workflows_ci_matrix(plan: PlanOption, cells: CellsOption) -> None:
    """Print `matrix=<one-line JSON>` for $GITHUB_OUTPUT: the plan narrowed to CELLS."""
    check_arguments("workflows ci-matrix", locals())   # every argument first (issue 37)
    from buildtool.common.refs import shown
    from buildtool.render.workflows import ci_matrix

    wanted = [c for c in cells.split(",") if c]
    if not wanted:   # an empty CI matrix: GitHub fails the job later, or it runs nothing and passes
        raise UserError(f"--cells {shown(cells)} names no cell; give a comma list of cells (image:version)")
    try:
        data = json.loads(plan.read_text(encoding="utf-8"))
        narrowed = ci_matrix(data, wanted)
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        raise UserError(f"{plan}: {exc}") from None
    sys.stdout.write("matrix=" + json.dumps(narrowed, separators=(",", ":"), sort_keys=True) + "\n")
