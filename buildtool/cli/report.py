"""`buildtool report`: verdicts as one static HTML page and Markdown (images by rows, checks by columns)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from buildtool.cli.console import writing
from buildtool.cli.options import FrameworkOption, MatrixOption, RevisionOption, err, find_project, path_of, say
from buildtool.contracts.arguments import check_arguments

VerdictsOption = Annotated[Path, typer.Option(parser=path_of("--verdicts"),
    help="Folder searched for verdict.json / *.verdict.json files (as "
         "`buildtool validate` writes them); --fetch writes here.")]
PreviousOption = Annotated[Path | None, typer.Option(parser=path_of("--previous"),
    help="The previous night's verdict folder, for the trend.")]
FetchOption = Annotated[bool, typer.Option(help="First fetch each planned cell's verdict from the registry.")]
ScalingOption = Annotated[list[Path] | None, typer.Option(parser=path_of("--scaling"),
    help="Folder with a scaling run's results and plots to "
         "include (repeat: processes, SLURM nodes).")]
OutDirOption = Annotated[Path, typer.Option("--out", parser=path_of("--out"),
    help="Where report.html and report.md go.")]


def report(
    verdicts: VerdictsOption = Path("reports"),
    previous: PreviousOption = None,
    fetch: FetchOption = False,
    framework: FrameworkOption = "all",
    revision: RevisionOption = None,
    scaling: ScalingOption = None,
    out_dir: OutDirOption = Path("reports/nightly"),
    matrix: MatrixOption = None,
) -> None:
    """Turn verdicts into one static HTML page and Markdown (images by rows, checks by columns)."""
    check_arguments("report", locals())   # every argument first (issue 37)
    from buildtool.common.documents import plural
    from buildtool.report import nightly as rep
    from buildtool.report.verdict_files import load_verdict_files, load_verdicts

    # Fetched: only what was fetched counts (a missing record is never outranked by an older verdict in the folder).
    rows = load_verdict_files(_fetch(verdicts, framework, revision, matrix)) if fetch else None
    prev_rows = load_verdicts(previous) if previous is not None and previous.is_dir() else None
    if previous is not None and prev_rows is None:
        err.print(f"no previous verdicts in {previous}; the report shows no trend")
    model = rep.build_report(load_verdicts(verdicts) if rows is None else rows, prev_rows)
    with writing("--out", out_dir):   # a folder that cannot be made or written: one line, not a traceback
        paths = rep.write_report(model, out_dir, scaling)
    counts = model.counts
    # Verbatim: rich read a `[/]` in --out as markup (a traceback after the report was written), `:ok:` as an emoji.
    say(f"{paths['html']}: {plural(len(model.rows), 'image')}, {counts['failed']} failed / {counts['passed']} passed"
        f" / {counts['skipped']} skipped checks, {len(model.newly_failing)} newly failing")


def _fetch(verdicts: Path, framework: str | None, revision: str | None, matrix: Path | None) -> list[Path]:
    """Save each planned cell's verdict from the registry into VERDICTS (one per platform of a cell); the files."""
    from buildtool.attest.keys import dev_public_key, load_trusted
    from buildtool.common.refs import is_loopback_host, split_repo
    from buildtool.matrix.plan import Settings, plan_matrix
    from buildtool.report.fetch import fetch_verdicts
    from buildtool.report.verdict_files import save_verdicts

    project = find_project(matrix)
    plans = plan_matrix(project.load().select(framework), Settings.from_env(), project.revision(revision))
    # The verdicts release would count: signed by a trusted key, or by this machine's dev key where every image is in
    # a loopback registry (a report is a view, not a gate: a local run shows its own verdicts). As validate, verify
    # and release: on a shared registry a dev key is anyone's, and what it signed is no runner's verdict.
    trusted = load_trusted(project.root)
    local = dev_public_key()
    if local is not None and all(is_loopback_host(split_repo(p.dev_ref)[0]) for p in plans):
        trusted.add_dev(local)
    # One record per platform of a multi-platform cell: each platform's verdict, or why it has none.
    fetched = fetch_verdicts({p.cell.key: p.dev_ref for p in plans}, trusted,
                             platforms={p.cell.key: p.cell.platforms for p in plans})
    with writing("--verdicts", verdicts):   # a full disk or a folder that cannot be made: one line, not a traceback
        return save_verdicts(fetched, verdicts)
