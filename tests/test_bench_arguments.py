"""The benches' bad arguments: one line naming what to fix and exit 2, before any work (no engine, registry or
process here: a bench that went on would start one, which the stand-in refuses)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from typing import Any

import pytest


def run_bench(name: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int | str | None:
    """The exit status of bench/NAME.py run with ARGV, as root; no process may start."""
    monkeypatch.setattr(sys, "path", list(sys.path))   # the bench puts the repository on sys.path
    module = importlib.import_module(f"bench.{name}")

    def no_process(*args: Any, **_: Any) -> None:
        raise AssertionError(f"the bench went on to run {args[0]!r}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    try:
        return module.main(argv) if name == "bench_validate" else module.main()
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize(("name", "argv", "said"), [
    ("bench_cold_import", ["--runs", "0", "img=torch"], "--runs 0: give 1 or more runs"),
    ("bench_first_hour", ["--private", "--runs", "-1"], "--runs -1: give 1 or more runs"),
    ("bench_fresh_runner", ["--runs", "0"], "--runs 0: give 1 or more runs"),
    ("bench_matrix", ["--runs", "0"], "--runs 0: give 1 or more runs"),
    ("bench_platforms", ["--runs", "0"], "--runs 0: give 1 or more runs"),
    ("bench_platforms", ["--validate-runs", "0"], "--validate-runs 0: give 1 or more runs"),
    ("bench_push", ["img:1", "--runs", "0"], "--runs 0: give 1 or more runs"),
    ("bench_render", ["--runs", "0"], "--runs 0: give 1 or more runs"),
    ("bench_uv_build", ["--rounds", "0"], "--rounds 0: give 1 or more rounds"),
    ("bench_release", ["--runs", "-1", "--registry", "127.0.0.1:9"], "--runs -1: give 0 (none) or more rounds"),
    ("bench_release", ["--runs", "0", "--registry", "127.0.0.1:9"], "--runs 0 measures only --variants: give "),
    ("bench_validate", ["--jobs", "img:1", "0"], "--jobs img:1 0: give --jobs IMAGE [RUNS], RUNS 1 or more"),
    ("bench_validate", ["--images", "a:1", "b:1", "x"], "--images a:1 b:1 x: give --images BEFORE AFTER [RUNS]"),
    ("bench_validate", ["--images", "a:1"], "--images a:1: give --images BEFORE AFTER [RUNS], RUNS 1 or more"),
])
def test_a_run_count_below_one_is_refused_in_one_line(name: str, argv: list[str], said: str,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`--runs 0` (or below) ran no round and then took the median of nothing (StatisticsError, IndexError), some
    benches only after building and pushing their images; bench_validate's RUNS (and a missing image) ended the
    same way or in int()'s ValueError, and bench_release's --runs -1 measured nothing and said nothing."""
    assert run_bench(name, argv, monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1, err


@pytest.mark.parametrize(("name", "argv", "said"), [
    ("bench_platforms", ["--cell", "nope:1"], "--cell nope:1: not a cell of matrix.yaml; name one built for two "),
    ("bench_platforms", ["--cell", "pytorch-cpu:2.13"], "pytorch-cpu:2.13 is built for linux/amd64 only"),
    ("bench_build", ["--cell", "nope:1"], "--cell nope:1: not a cell of matrix.yaml (cells: "),
    ("bench_cold_import", ["img:1"], "img:1: give IMAGE=MODULE (the image, and the module to import in it)"),
    ("bench_cold_import", ["img:1=torch", "img:2="], "img:2=: give IMAGE=MODULE"),
    ("bench_cold_import", ["=torch"], "=torch: give IMAGE=MODULE"),
])
def test_an_unknown_cell_or_an_image_with_no_module_is_refused_in_one_line(name: str, argv: list[str], said: str,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """bench_platforms' `[cell] = [...]` ended an unknown --cell in ValueError (and a one-platform cell in exit 1);
    bench_cold_import unpacked IMAGE without =MODULE as a pair (ValueError), after its first images had run;
    bench_build's unknown --cell exited 1 as if a build had failed."""
    assert run_bench(name, argv, monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1, err
