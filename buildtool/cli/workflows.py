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
    _check_cron(cron)
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


# The fields of a schedule and their values (POSIX cron, as GitHub Actions reads `on.schedule[].cron`).
_CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of the month", 1, 31), ("month", 1, 12),
                ("day of the week", 0, 6))


def _check_cron(cron: str) -> None:
    """Each field of --cron within its range: `*`, N or N-M (N <= M), each with an optional /STEP (1 or more), comma
    separated. The option's grammar only knew the characters, so `99 99 99 99 99` was written into nightly.yml,
    which GitHub refuses as a workflow: the nightly never ran."""
    import re

    from buildtool.common.refs import shown

    for text, (field, low, high) in zip(cron.split(" "), _CRON_FIELDS, strict=True):
        for item in text.split(","):
            found = re.fullmatch(r"(\*|([0-9]+)(?:-([0-9]+))?)(?:/([0-9]+))?", item)
            first, last = (int(found[2]), int(found[3] or found[2])) if found and found[2] else (low, high)
            if found is None or not low <= first <= last <= high or (found[4] is not None and int(found[4]) < 1):
                raise UserError(f"--cron {shown(cron)}: the {field} {shown(item)} is not *, N or N-M from {low} to "
                                f"{high} (with an optional /STEP of 1 or more)")


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
