"""The validation report: verdicts -> one static HTML page and Markdown for a CI summary.

Images are rows, checks are columns; every cell says pass/fail/skip with its reason and duration.
A row is one platform's image: a multi-platform cell (an image index) has one verdict per platform
manifest, so one row per platform, keyed by (cell, platform) everywhere (loading, the trend, bus
bandwidth), so that one platform's verdict never hides another's. When the previous night's verdicts
are given, checks that fail now but did not fail then (on the same cell and platform) are "newly
failing": they are listed first, and their rows and columns sort first. The page is a single
self-contained file (inline CSS, plots next to it), so it can be published anywhere as is.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from buildtool.common.documents import code_span, render_document
from buildtool.common.errors import UserError
from buildtool.common.files import write_atomic
from buildtool.common.units import human_size, short_digest
from buildtool.contracts import platforms
from buildtool.contracts.gpu import BUSBW_FIGURE, busbw_peak
from buildtool.contracts.verdict import Runner
from buildtool.report.rows import UNRECORDED, Busbw, Check, Report, Row, Trend

# What a report without a previous night's verdicts says in place of the trend (a first night: `make nightly`
# passes --previous only when its history holds a night).
NO_TREND = "No previous night's verdicts to compare against (a first night): this report shows no trend."
_MARK = {"passed": "pass", "failed": "FAIL", "skipped": "skip", "incomplete": "INCOMPLETE", None: "—"}
_MD_MARK = {"passed": "✅ pass", "failed": "❌ **FAIL**", "skipped": "⏭️ skip", "incomplete": "⚠️ **incomplete**",
            None: "—"}
SCALING_PLOTS = ("time_per_epoch.png", "speedup.png")


# -- the model ----------------------------------------------------------------------------------

def previous_of(current: list[Row], previous: list[Row]) -> dict[tuple[str, str], Row]:
    """Each current row's row of the previous night: the same cell and platform. A row that records no
    platform (a schema-4 verdict) is the image's only platform: it pairs with the other night's row of
    the cell when each night has exactly one row of it (the night verdicts began to record platforms)."""
    before = {row.key: row for row in previous}
    count_now, count_before = Counter(row.cell for row in current), Counter(row.cell for row in previous)
    only_before = {row.cell: row for row in previous if count_before[row.cell] == 1}
    found = {}
    for row in current:
        old = before.get(row.key)
        if old is None and count_now[row.cell] == 1 and row.cell in only_before:
            candidate = only_before[row.cell]
            if UNRECORDED in (row.platform, candidate.platform):
                old = candidate
        if old is not None:
            found[row.key] = old
    return found


def gone_rows(current: list[Row], previous: list[Row], before: dict[tuple[str, str], Row]) -> list[Row]:
    """The previous night's rows (images) that no row of tonight is paired with: a cell, or a platform of one, that
    has no verdict and no missing record tonight. A row that records no platform is about the cell's only image:
    accounted for by any row of its cell tonight (as tonight's unrecorded row accounts for each of the cell's)."""
    paired = {id(old) for old in before.values()}
    cells = {row.cell for row in current}
    unrecorded = {row.cell for row in current if row.platform == UNRECORDED}
    return [old for old in previous if id(old) not in paired
            and not (old.cell in cells and (old.platform == UNRECORDED or old.cell in unrecorded))]


def build_report(current: list[Row], previous: list[Row] | None = None) -> Report:
    before = previous_of(current, list(previous or []))
    newly: list[Trend] = []
    fixed: list[Trend] = []
    not_run: list[Trend] = []
    failed_not_run: list[Trend] = []
    for row in sorted(current, key=lambda r: r.key):
        old = before.get(row.key)
        if old is None:
            continue
        if row.runner is not None:    # a missing record's own failure says it: its checks are not listed one by one
            gone = [Trend(row.cell, cid, was.result, row.checks[cid].result if cid in row.checks else "absent",
                          row.platform, row.emulated)
                    for cid, was in old.checks.items() if cid not in row.checks or row.checks[cid].result == "skipped"]
            not_run += [t for t in gone if t.before == "passed"]
            # A failure not run again is not fixed: named, never "no change" (a missing record's failure is tonight's
            # verdict itself, not a check).
            failed_not_run += [t for t in gone if t.before == "failed" and old.runner is not None]
        for check in row.checks.values():
            was = old.checks[check.id].result if check.id in old.checks else None
            trend = Trend(row.cell, check.id, was, check.result, row.platform, row.emulated)
            if check.result == "failed" and was != "failed":
                newly.append(trend)
            elif check.result == "passed" and was == "failed":
                fixed.append(trend)
    new_rows = {(t.cell, t.platform) for t in newly}
    new_checks = {t.check for t in newly}

    def row_key(row: Row) -> tuple[int, int, str, int, str]:
        order = list(platforms.KNOWN)
        return (row.key not in new_rows, row.result == "passed", row.cell,
                order.index(row.platform) if row.platform in order else -1, row.platform)

    seen = dict.fromkeys(check_id for row in current for check_id in row.checks)   # first seen, first
    failing = {cid for row in current for cid, c in row.checks.items() if c.result == "failed"}
    columns = sorted(seen, key=lambda cid: (cid not in new_checks, cid not in failing, cid))
    return Report(rows=sorted(current, key=row_key), columns=columns, newly_failing=newly, fixed=fixed,
                  not_run=not_run, failed_not_run=failed_not_run,
                  gone=gone_rows(current, list(previous or []), before), has_previous=previous is not None,
                  unpaired=[row for row in sorted(current, key=lambda r: r.key)
                            if previous is not None and row.key not in before],
                  previous_rows=list(previous or []))


# -- formatting helpers -------------------------------------------------------------------------

def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def short_check(check_id: str) -> str:
    return check_id.rsplit("::", 1)[-1] if "::" in check_id else check_id.rsplit("/", 1)[-1]


def check_file(check_id: str) -> str:
    """`image-tests/common/test_shm.py::test_x` -> `common/test_shm.py` (the column's sub-heading)."""
    return check_id.split("::", 1)[0].removeprefix("image-tests/") if "::" in check_id else ""


def format_figure(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={format_figure(v)}" for k, v in value.items())
    return str(value)


def gpu_names(runner: Runner | None) -> list[str]:
    """GPU models of a verdict's runner (none for a missing verdict)."""
    return [g.name or "?" for g in runner.gpus] if runner is not None else []


def _runner(row: Row) -> str:
    runner = row.runner
    if runner is None:
        return "—"
    gpus = gpu_names(runner)
    gpu_text = f"{len(gpus)} GPU ({gpus[0]})" if gpus else "no GPU"
    driver = f", driver {runner.driver}" if runner.driver else ""
    cuda = f" (CUDA {runner.cuda_driver})" if runner.cuda_driver else ""
    usable = ", GPUs not usable" if runner.gpus_usable is False else ""
    problem = f": {runner.gpu_problem}" if runner.gpu_problem and not gpus else ""
    return f"{runner.hostname}: {gpu_text}{driver}{cuda}{usable}{problem}"


# -- bus bandwidth --------------------------------------------------------------------------------

def busbw_rows(report: Report) -> list[Busbw]:
    """Each image's busbw figure, compared with the median of earlier nights that validate recorded in it;
    a verdict without one (older verdicts) is compared with the previous night's figure of the same cell
    and platform on the same GPUs, and says it is one night."""
    before = previous_of(report.rows, report.previous_rows)
    found = []
    for row in report.rows:
        peak = busbw_peak(row.figures)
        if peak is None:
            continue
        figure = row.figures[BUSBW_FIGURE]
        base = _gbps(figure, "baseline_GBps" if "baseline_GBps" in figure else "previous_GBps", row)
        nights = figure.get("baseline_nights")
        if nights is not None and (type(nights) is not int or nights < 0):    # a bool is no count either
            raise UserError(f"verdict of {row.image}: its busbw figure's baseline_nights {nights!r} is not a count "
                            "of nights; validate it again (validate writes them)")
        nights = nights or (1 if base is not None else 0)
        old = before.get(row.key)
        if base is None and old is not None and gpu_names(old.runner) == gpu_names(row.runner):
            base = busbw_peak(old.figures)
            nights = 1 if base is not None else 0
        base = base or None
        gpus = gpu_names(row.runner)
        floor = _gbps(figure, "floor_GBps", row)
        found.append(Busbw(cell=row.cell, gpus=f"{figure.get('ranks', len(gpus))}x {figure.get('gpu_model') or '?'}",
                           peak_GBps=peak, floor_GBps=floor,
                           previous_GBps=base, change=(peak / base - 1) if base else None,
                           sizes=_sizes(figure, row), nights=nights,
                           floor_note=str(figure.get("floor_note") or ""), fault=str(figure.get("floor_fault") or ""),
                           interconnect=row.runner.interconnect if row.runner is not None else "",
                           platform=row.platform, emulated=row.emulated))
    return found


def _gbps(figure: dict[str, Any], key: str, row: Row) -> float | None:
    """A busbw figure's `key` (GB/s), None when absent; anything but a finite number (NaN compares false: a floor of
    NaN would read `ok`) is a UserError naming it."""
    value = figure.get(key)
    if value is not None and not _finite(value):
        raise UserError(f"verdict of {row.image}: its busbw figure's {key} {value!r} is not a finite number; "
                        "validate it again (validate writes them)")
    return None if value is None else float(value)


_SIZE_FIELDS = ("bytes", "time_us", "algbw_GBps", "busbw_GBps")


def _sizes(figure: dict[str, Any], row: Row) -> list[dict[str, Any]]:
    """A busbw figure's per-size table (the image's word): a list of objects whose fields the report shows are finite
    numbers where present; anything else is a UserError naming the verdict, never a traceback out of the template."""
    sizes = figure.get("sizes") or []
    if not isinstance(sizes, list) or not all(
            isinstance(r, dict) and all(f not in r or _finite(r[f]) for f in _SIZE_FIELDS) for r in sizes):
        raise UserError(f"verdict of {row.image}: its busbw figure's sizes are not a list of objects of numbers "
                        f"({', '.join(_SIZE_FIELDS)}); validate it again (validate writes them)")
    return sizes


def _finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _binary(size: Any) -> str:
    """Message sizes as nccl-tests' tables think of them: 8 MiB, 1 GiB."""
    if not isinstance(size, int):
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


# -- details shared by both formats ---------------------------------------------------------------

def failures(report: Report, new: set[tuple[str, str, str]]) -> list[tuple[Row, Check, bool]]:
    """Every failed check as (row, check, newly failing: its (cell, platform, check) in `new`), newly failing first,
    in row order."""
    found = [(row, check, (*row.key, cid) in new)
             for row in report.rows for cid in report.columns
             if (check := row.checks.get(cid)) is not None and check.result == "failed"]
    return sorted(found, key=lambda item: not item[2])


def skip_reasons(report: Report) -> list[tuple[str, list[str], list[str]]]:
    """Skips grouped by reason: (reason, checks, images); the same GPU skip is listed once."""
    groups: dict[str, tuple[dict[str, None], dict[str, None]]] = {}
    for row in report.rows:
        for cid in report.columns:
            check = row.checks.get(cid)
            if check is not None and check.result == "skipped":
                checks, cells = groups.setdefault(check.skip_reason or "no reason given", ({}, {}))
                checks[cid] = None
                # The platform named where the cell has more than one (or the run was emulated).
                note = report.platform_note(row)
                cells[f"{row.cell} on {note}" if note else row.cell] = None
    return [(reason, list(checks), list(cells)) for reason, (checks, cells) in groups.items()]


# -- rendering (templates/report.html.j2 and report.md.j2) ------------------------------------------

def _filters(report: Report) -> dict[str, Any]:
    """How the report formats numbers; the same helpers serve both templates. `on`: ' on linux/arm64' after
    a cell's name where the report must say which platform (Report.platform_note), else ''."""
    def on(item: Row | Trend | Busbw) -> str:
        note = report.platform_note(item)
        return f" on {note}" if note else ""

    return {"duration": human_duration, "size": lambda size: human_size(size, missing="—"),
            "short_digest": lambda digest: short_digest(digest, missing="—"), "short_check": short_check,
            "figure": format_figure, "gbps": lambda value: "—" if value is None else f"{value:.1f} GB/s",
            "change": lambda value: "—" if value is None else f"{value:+.0%}", "binary": _binary,
            "percent": lambda value: f"{value:.0%}", "runner": _runner, "scaling_title": scaling_title,
            "scaling_flag": scaling_flag, "on": on, "code_cell": code_cell,
            # The job summary's share of a reason (GitHub refuses a summary over 1024k whole): its first 300 characters.
            "brief": lambda text: (str(text).strip().splitlines() or [""])[0][:300]}


def code_cell(value: Any) -> str:
    """`code` inside a Markdown table cell: GitHub splits cells at every `|`, in a code span too, unless escaped
    (a cell or digest of a hand-made verdict file). Not for list lines, where the backslash would show."""
    return code_span(value).replace("|", "\\|")


def _view(report: Report, title: str) -> dict[str, Any]:
    """Everything both templates show, decided once: order, anchors, what is newly failing."""
    new = {(t.cell, t.platform, t.check) for t in report.newly_failing}
    new_rows = {(t.cell, t.platform) for t in report.newly_failing}
    new_checks = {t.check for t in report.newly_failing}
    failing_checks = {cid for row in report.rows for cid, c in row.checks.items() if c.result == "failed"}
    failed = failures(report, new)
    anchors = {(*row.key, check.id): f"f{i}" for i, (row, check, _) in enumerate(failed, 1)}
    columns = [{"id": cid,
                "classes": ["check"] + (["has-failed"] if cid in failing_checks else [])
                + (["newly-failing"] if cid in new_checks else []),
                "file": check_file(cid) or next((r.checks[cid].group for r in report.rows if cid in r.checks), "")}
               for cid in report.columns]
    rows: list[dict[str, Any]] = [{"row": row,
                                   "classes": f"image-{row.result}" + (" newly-failing" if row.key in new_rows else ""),
                                   "cells": [{"check": row.checks.get(cid), "newly": (*row.key, cid) in new,
                                              "anchor": anchors.get((*row.key, cid), "")} for cid in report.columns],
                                   "figures": [(k, v) for k, v in sorted(row.figures.items()) if k != BUSBW_FIGURE]
                                   + ([("cold start", row.cold_start)] if row.cold_start else [])}
                                  for row in report.rows]
    scaling = [{"title": scaling_title(found), "unit": str(found.get("unit", "workers")), "runs": found.get("runs", []),
                "plots": found.get("plots", []), "reason": found.get("reason", ""),
                "failed": found.get("status") == "failed", "flag": scaling_flag(found),
                "comparison": found.get("rows", [])} for found in report.scaling if found]
    return {"title": title, "report": report, "counts": report.counts, "marks": _MARK, "md_marks": _MD_MARK,
            "no_trend": NO_TREND,
            "shows_platform": report.shows_platform,
            "columns": columns, "rows": rows, "failures": failed, "anchors": anchors,
            "skips": skip_reasons(report), "incomplete": [row for row in report.rows if row.result == "incomplete"],
            "bandwidth": busbw_rows(report), "scaling": scaling,
            "figure_rows": [(row["row"], k, v) for row in rows for k, v in row["figures"]]}


def render_html(report: Report, title: str = "Image validation report") -> str:
    """One self-contained page; every value is autoescaped by the template."""
    return render_document("buildtool.report", "report.html.j2", filters=_filters(report),
                           **_view(report, title))


def render_markdown(report: Report, title: str = "Image validation report") -> str:
    """The same report for a CI job summary."""
    return render_document("buildtool.report", "report.md.j2", filters=_filters(report), **_view(report, title))


# -- writing ------------------------------------------------------------------------------------

def scaling_title(scaling: dict[str, Any]) -> str:
    launcher = scaling.get("launcher") or {}
    what = "Scaling: strategies side by side" if "rows" in scaling else f"{scaling.get('title') or 'DDP'} scaling"
    if launcher.get("kind") == "slurm":
        return f"{what} over SLURM nodes ({launcher.get('runtime', '?')} containers)"
    return what


def scaling_flag(scaling: dict[str, Any]) -> str:
    """The flag of a strategy whose speed-up at the largest count is below its declared fraction of ideal."""
    runs = scaling.get("runs") or []
    if not scaling.get("flagged") or not runs:
        return ""
    top = runs[-1]
    return (f"flagged: speed-up {top.get('speedup', 0):.2f}x at {top.get('count')} {scaling.get('unit', '')} is "
            f"{top.get('efficiency', 0):.0%} of ideal, below the declared {scaling.get('min_efficiency', 0):.0%}")


_RUN_NUMBERS = ("count", "time_per_epoch_s", "speedup", "efficiency")
_ROW_NUMBERS = (*_RUN_NUMBERS, "samples_per_s", "peak_memory_mb", "min_efficiency")


def scaling_problem(data: Any) -> str:
    """What the report cannot show of a scaling.json/comparison.json ('' when nothing): it is an object; each run,
    and each row that ran, needs its figures as numbers (the templates format them); each its other fields shown."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for key, numbers in (("runs", _RUN_NUMBERS), ("rows", _ROW_NUMBERS)):
        entries = data.get(key, [])
        if not isinstance(entries, list):
            return f"`{key}` is a JSON {type(entries).__name__}, not a list"
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict):
                return f"`{key}[{index}]` is a JSON {type(entry).__name__}, not an object"
            ran = key == "runs" or entry.get("status") == "ran"
            fields = ("backend",) if key == "runs" else ("title", "flagged") if ran else ("title", "reason")
            if absent := [f for f in fields if f not in entry]:
                return f"`{key}[{index}]` has no `{absent[0]}`"
            if bad := [f for f in numbers if ran and (not isinstance(entry.get(f), int | float)
                                                      or isinstance(entry[f], bool))]:
                return f"`{key}[{index}]`.{bad[0]} is {entry.get(bad[0])!r}, not a number"
    return ""


def scaling_folders(folders: Sequence[Path]) -> list[Path]:
    """A metrics folder of several strategies (comparison.json) stands for itself (the side-by-side plots and
    table) followed by each strategy's folder, in the order they ran."""
    expanded: list[Path] = []
    for folder in folders:
        expanded.append(folder)
        if (folder / "comparison.json").is_file():
            try:
                data = json.loads((folder / "comparison.json").read_text(encoding="utf-8"))
                expanded += [folder / str(name) for name in data["strategies"]]
            except (OSError, json.JSONDecodeError, KeyError, TypeError, RecursionError) as exc:
                raise UserError(f"{folder / 'comparison.json'}: cannot read the strategies ({exc})") from None
    return expanded


def write_report(report: Report, out_dir: Path, scaling_dirs: Path | Sequence[Path] | None = None
                 ) -> dict[str, Path]:
    """Write report.html and report.md into `out_dir` (plots copied beside them); returns the paths.

    Each scaling folder (a `buildtool scaling` metrics folder) becomes a section; the first one's plots go to
    `scaling/`, the next ones' to `scaling-2/`, ...
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    folders = scaling_folders([scaling_dirs] if isinstance(scaling_dirs, Path) else list(scaling_dirs or []))
    report.scaling = []
    for index, folder in enumerate(folders):
        data: dict[str, Any] = {}
        for name in ("scaling.json", "comparison.json"):
            if (folder / name).is_file():
                try:
                    data = json.loads((folder / name).read_text(encoding="utf-8"))
                except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:   # too deep
                    raise UserError(f"{folder / name}: cannot read the scaling results ({exc})") from None
                if problem := scaling_problem(data):
                    raise UserError(f"{folder / name}: cannot read the scaling results ({problem}); run "
                                    "`buildtool scaling` again")
                data.pop("results", None)   # comparison.json repeats every strategy's runs
        plots: list[str] = []
        if folder.is_dir():
            sub = "scaling" if index == 0 else f"scaling-{index + 1}"
            for name in SCALING_PLOTS:
                source = folder / name
                if source.is_file():
                    (out_dir / sub).mkdir(exist_ok=True)
                    if source.resolve() != (out_dir / sub / name).resolve():
                        shutil.copyfile(source, out_dir / sub / name)
                    plots.append(f"{sub}/{name}")
        if data or plots:
            report.scaling.append({**data, "plots": plots})
    paths = {"html": out_dir / "report.html", "markdown": out_dir / "report.md"}
    write_atomic(paths["html"], render_html(report))   # a report cut short leaves the last one whole
    write_atomic(paths["markdown"], render_markdown(report))
    return paths
