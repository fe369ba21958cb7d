"""The files a later run reads (the saved verdicts the next night compares against, the report, a scaling run's
scaling.json/.csv and the comparison of strategies) are written atomically: a write cut short midway (a full disk,
a kill) leaves the previous file whole, never a truncated one that blocks the next report until someone deletes it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from buildtool.launch.scaling import RunResult, ScalingResult, write_metrics
from buildtool.launch.strategy_runs import write_comparison
from buildtool.report.nightly import build_report, write_report
from buildtool.report.rows import Report
from buildtool.report.verdict_files import parse_verdict, save_verdicts
from tests.test_report import SHM, test, verdict
from tests.torn_writes import torn_writes


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _cut_short(monkeypatch: pytest.MonkeyPatch, after: int, write: Callable[..., object], *args: object) -> None:
    with torn_writes(monkeypatch, after=after), pytest.raises(OSError):
        write(*args)


def test_saved_verdicts_cut_short_are_the_previous_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_verdicts([verdict("pytorch-cpu:2.13", [test(SHM, "passed")], schema=5)], tmp_path)
    before = _files(tmp_path)
    _cut_short(monkeypatch, 0, save_verdicts, [verdict("pytorch-cpu:2.13", [test(SHM, "failed")], schema=5)], tmp_path)
    assert _files(tmp_path) == before


@pytest.mark.parametrize("after", [0, 1])   # report.html cut short; report.md cut short
def test_a_report_cut_short_leaves_each_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   after: int) -> None:
    def report(result: str) -> Report:
        return build_report([parse_verdict(verdict("pytorch-cpu:2.13", [test(SHM, result)], schema=5), "x")])

    write_report(report("passed"), tmp_path)
    before = _files(tmp_path)
    _cut_short(monkeypatch, after, write_report, report("failed"), tmp_path)
    now = _files(tmp_path)
    assert sorted(now) == ["report.html", "report.md"]
    torn = sorted(now)[after]
    assert now[torn] == before[torn]
    if after:   # the one written before the cut is the new report, whole
        assert b"failed" in now["report.html"] and now["report.html"] != before["report.html"]


def _scaling(epoch: float, strategy: str = "ddp") -> ScalingResult:
    runs = [RunResult(count=n, backend="gloo", epoch_times_s=[epoch / n] * 3, losses=[1.0] * 3, identical=True,
                      time_per_epoch_s=epoch / n, speedup=float(n), efficiency=1.0, peak_memory_mb=[300.0] * n)
            for n in (1, 2)]
    return ScalingResult(unit="processes", samples=512, epochs=3, launcher={"kind": "host"}, runs=runs,
                         strategy=strategy)


@pytest.mark.parametrize("after", [0, 1])   # scaling.json cut short; scaling.csv cut short
def test_scaling_metrics_cut_short_leave_each_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         after: int) -> None:
    write_metrics(_scaling(8.0), tmp_path)
    before = _files(tmp_path)
    _cut_short(monkeypatch, after, write_metrics, _scaling(6.0), tmp_path)
    now = _files(tmp_path)
    torn = sorted(now)[1 - after]   # scaling.json is written first
    assert sorted(now) == ["scaling.csv", "scaling.json"] and now[torn] == before[torn]
    json.loads(now["scaling.json"])


@pytest.mark.parametrize("after", [0, 1])   # comparison.json cut short; comparison.md cut short
def test_a_comparison_cut_short_leaves_each_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       after: int) -> None:
    def results(epoch: float) -> list[ScalingResult]:
        return [ScalingResult(unit="processes", samples=512, epochs=3, launcher={}, strategy=name, status="not run",
                              reason=f"not run on this runner: {epoch}") for name in ("ddp", "fsdp")]

    write_comparison(results(8.0), tmp_path)
    before = _files(tmp_path)
    _cut_short(monkeypatch, after, write_comparison, results(6.0), tmp_path)
    now = _files(tmp_path)
    torn = ["comparison.json", "comparison.md"][after]
    assert sorted(now) == ["comparison.json", "comparison.md"] and now[torn] == before[torn]
    json.loads(now["comparison.json"])


def test_a_scaling_jobs_sbatch_script_cut_short_is_never_left_half_written(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The scaling benchmark wrote each node count's sbatch script in place in its output folder: a write cut short
    (a full disk) left half a script there, a job anyone could submit. It is written atomically: none is left."""
    from buildtool.launch.scaling import SlurmLauncher

    worker = tmp_path / "worker.py"
    worker.write_text("print('SCALING_RESULT {}')\n")
    jobs = tmp_path / "jobs"
    launcher = SlurmLauncher(runtime="pyxis", image="127.0.0.1:5000/pytorch-cpu-dev:0123456789ab-2.13", workdir=jobs)
    _cut_short(monkeypatch, 0, launcher.run, 2, worker, {}, 60.0)
    assert [p.name for p in jobs.iterdir()] == []
