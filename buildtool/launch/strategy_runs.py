"""Several strategies side by side (`buildtool scaling --strategy ddp,fsdp,...`, issue 42): each strategy's runs at
every count through scaling.run_scaling, with the same model, subset, batch and epochs, into its own folder
METRICS/<strategy>/ (scaling.json, scaling.csv, time_per_epoch.png, speedup.png), and the comparison beside them:
comparison.json, comparison.md (the table), and time_per_epoch.png / speedup.png with every strategy that ran on
one plot each (the ideal linear speed-up drawn). One strategy alone writes its folder's files straight into
METRICS, as the DDP benchmark always has.

A strategy whose speed-up at the largest count is below `min_efficiency` of ideal is flagged (in its scaling.json,
the table and the report); one that cannot run on this runner is "not run on this runner: <reason>", never a pass.
One that fails among several is "failed: <reason>" (its scaling.json, the table, the report): the others still run
and are compared, and the command fails once the comparison is written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from buildtool.common.errors import FailedError
from buildtool.common.files import write_atomic
from buildtool.contracts.strategies import Strategy
from buildtool.launch.scaling import (
    PLOTS,
    Launcher,
    RunSettings,
    ScalingResult,
    SlurmLauncher,
    launcher_info,
    plot_pair,
    run_scaling,
    write_metrics,
)

COMPARISON = "comparison.json"


def run_strategies(launcher_for: Callable[[Strategy], Launcher | SlurmLauncher], strategies: list[Strategy],
                   counts: list[int], root: Path, out: Path,
                   settings: RunSettings) -> tuple[list[ScalingResult], dict[str, Path]]:
    """Each strategy's runs, then (several) their comparison. One that fails among several is recorded as failed, in
    its folder and the comparison, and the others still run: the caller fails the command on its status."""
    results, paths = [], {}
    for strategy in strategies:
        folder = out if len(strategies) == 1 else out / strategy.name
        launcher = launcher_for(strategy)
        try:
            result, written = run_scaling(launcher, counts, root / strategy.worker, folder, settings,
                                          strategy=strategy.name, title=strategy.title)
        except FailedError as exc:
            if len(strategies) == 1:
                raise
            # Its scaling.json says so, over whatever an earlier run left in the folder (the report reads it).
            result = ScalingResult(unit=settings.unit, samples=settings.samples, epochs=settings.epochs,
                                   launcher=launcher_info(launcher), strategy=strategy.name, title=strategy.title,
                                   batch=settings.batch, status="failed", reason=f"failed: {exc}",
                                   min_efficiency=settings.min_efficiency)
            written = write_metrics(result, folder)
        results.append(result)
        paths.update({f"{strategy.name} {kind}": path for kind, path in written.items()})
    if len(strategies) > 1:
        paths.update(write_comparison(results, out))
    return results, paths


def summary_row(result: ScalingResult) -> dict[str, Any]:
    """One strategy in the comparison table: its figures at the largest count (or why it did not run)."""
    row: dict[str, Any] = {"strategy": result.strategy, "title": result.title, "status": result.status,
                           "reason": result.reason, "flagged": result.flagged, "min_efficiency": result.min_efficiency}
    if result.runs:
        top = result.runs[-1]
        row.update(count=top.count, time_per_epoch_s=top.time_per_epoch_s, speedup=top.speedup,
                   efficiency=top.efficiency, samples_per_s=top.samples_per_s,
                   peak_memory_mb=max(top.peak_memory_mb, default=0.0), backend=top.backend,
                   base_time_per_epoch_s=result.runs[0].time_per_epoch_s)
    return row


def write_comparison(results: list[ScalingResult], out: Path) -> dict[str, Path]:
    from buildtool.common.documents import render_document

    out.mkdir(parents=True, exist_ok=True)
    unit = results[0].unit
    rows = [summary_row(r) for r in results]
    paths = {"comparison json": out / COMPARISON, "comparison table": out / "comparison.md"}
    data = {"unit": unit, "samples": results[0].samples, "epochs": results[0].epochs, "batch": results[0].batch,
            "launcher": results[0].launcher, "strategies": [r.strategy for r in results], "rows": rows,
            "results": [asdict(r) for r in results]}
    # Atomically: the report reads comparison.json, and a file cut short would block it until someone deleted it.
    write_atomic(paths["comparison json"], json.dumps(data, indent=1) + "\n")
    write_atomic(paths["comparison table"], render_document("buildtool.launch", "comparison.md.j2", rows=rows,
                                                            unit=unit))
    ran = [r for r in results if r.runs]
    if ran:
        paths.update(plot_comparison(ran, out))
    else:   # none ran: an earlier comparison's plots would pass for this one's
        for name in PLOTS:
            (out / name).unlink(missing_ok=True)
    return paths


def plot_comparison(results: list[ScalingResult], out: Path) -> dict[str, Path]:
    paths = {"comparison time": out / PLOTS[0], "comparison speedup": out / PLOTS[1]}
    lines = [(r.title, r.title + (" (flagged)" if r.flagged else ""), r.runs) for r in results]
    plot_pair(lines, (paths["comparison time"], paths["comparison speedup"]), results[0].unit,
              (f"Time per epoch by strategy (absolute wall-clock), {results[0].samples} samples",
               "Speed-up by strategy (relative wall-clock)"), 6.5)
    return paths
