"""What the image tests are told (buildtool.validate.targets), built without an engine or a registry."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from buildtool.common.errors import UserError
from buildtool.contracts import label_keys
from buildtool.contracts.verdict import Gpu
from buildtool.validate.containers import Resolved
from buildtool.validate.options import Options
from buildtool.validate.probe import Inventory
from buildtool.validate.run_plan import RunPlan
from buildtool.validate.targets import build_target, expectations, find_cell, pytest_argv
from tests.conftest import fixture_matrix

MATRIX = fixture_matrix()
CPU = next(c for c in MATRIX.cells if c.key == "pytorch-cpu:2.13")
IMAGE = Resolved("reg/pytorch-cpu-dev:x", "reg/pytorch-cpu-dev@sha256:" + "1" * 64, "sha256:" + "1" * 64, "reg",
                 "pytorch-cpu-dev", {}, {"PATH": "/usr/bin"})


def test_pytest_argv_names_the_groups_the_target_and_the_outputs(tmp_path: Path) -> None:
    tests, out = tmp_path / "image-tests", tmp_path / "out"
    argv = pytest_argv(tests, ["common", "pytorch"], out, CPU.key, out / "probes" / "r1", "not slow")
    assert argv[:5] == [sys.executable, "-m", "pytest", str(tests / "common"), str(tests / "pytorch")]
    for flag, value in (("--target", out / "target.json"), ("--results", out / "results.json"),
                        ("--junitxml", out / "junit.xml"), ("--defined-tests", out / "defined.json"),
                        ("--basetemp", out / "probes" / "r1"), ("--rootdir", tests), ("-k", "not slow")):
        assert argv[argv.index(flag) + 1] == str(value)
    assert f"junit_suite_name={CPU.key}" in argv
    assert "-k" not in pytest_argv(tests, ["common"], out, CPU.key, out / "p", None)


def test_jobs_run_the_image_tests_on_xdist_workers_or_in_one_process(tmp_path: Path, monkeypatch) -> None:
    tests, out = tmp_path / "image-tests", tmp_path / "out"
    serial = pytest_argv(tests, ["common", "pytorch"], out, CPU.key, out / "p", None, jobs=1)
    assert serial[3:5] == [str(tests / "common"), str(tests / "pytorch")] and "-n" not in serial
    assert serial[serial.index("-p", serial.index("--basetemp")) + 1] == "no:xdist"
    assert Options().jobs == 2   # concurrent unless asked otherwise
    workers = pytest_argv(tests, ["common", "pytorch"], out, CPU.key, out / "p", None, jobs=3)
    # The framework's files (the long probes) are handed out first, in this order: no reordering by size.
    assert workers[3:5] == [str(tests / "pytorch"), str(tests / "common")]
    assert workers[-5:] == ["-n", "3", "--dist", "loadscope", "--no-loadscope-reorder"]
    import importlib.util

    from buildtool.common.errors import UserError

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"pytest-xdist workers, which is not installed: pip install -e '\.\[dev\]'.*or "
                                        r"pass --jobs 1"):
        pytest_argv(tests, ["common"], out, CPU.key, out / "p", None, jobs=2)


def test_a_selection_runs_on_one_worker(tmp_path: Path) -> None:
    """A -k run picks a few tests: a second worker would only start and warm a second container."""
    tests, out = tmp_path / "image-tests", tmp_path / "out"
    selected = pytest_argv(tests, ["common", "pytorch"], out, CPU.key, out / "p", "shm_size", jobs=2)
    assert "-n" not in selected and selected[selected.index("-p", selected.index("--basetemp")) + 1] == "no:xdist"
    assert selected[selected.index("-k") + 1] == "shm_size"


def test_build_target_is_what_it_was_given() -> None:
    options = Options(extra_run_flags=["--pids-limit=64"], deadline_s=90)
    plan = RunPlan("reg/pytorch-cpu-dev:x", IMAGE, CPU, MATRIX, options, Inventory([]), flags=["--shm-size=2g"],
                   not_granted=["memlock"], run_id="r1", deadline_s=90.0)
    target = build_target(plan, {}, 60.0, {**expectations(CPU, {}), "labels": []})
    assert (target.image, target.digest, target.cell) == (IMAGE.run_ref, IMAGE.digest, CPU.key)
    assert target.run_flags == ["--shm-size=2g"] and target.ulimits_not_granted == ["memlock"]
    assert target.extra_run_flags == ["--pids-limit=64"] and target.image_env == {"PATH": "/usr/bin"}
    assert (target.deadline_s, target.probe_budget_s, target.run_id) == (90.0, 60.0, "r1")
    assert target.busbw_floor_GBps is None and target.runner_gpus == []


def test_cell_is_refused_when_the_images_cell_label_names_another_cell() -> None:
    """Before: --cell ("Cell to test against when the image has no cell label") won over the image's label, so a
    pytorch-cpu:2.13 image was validated, and its verdict signed, as pytorch-cuda:2.13; now that is one line (exit 2)
    naming both cells. Without a label, or with the label's own cell, --cell is taken as before."""
    ref, labelled = "reg/pytorch-cpu-dev:x-2.13", {label_keys.CELL: CPU.key}
    with pytest.raises(UserError) as caught:
        find_cell(MATRIX, labelled, "pytorch-cuda:2.13", ref)
    assert str(caught.value) == (f"image {ref} is labelled cell 'pytorch-cpu:2.13' ({label_keys.CELL}), not "
                                 "'pytorch-cuda:2.13': --cell is for an image without a cell label; drop --cell, or "
                                 "pass the image built for that cell")
    assert find_cell(MATRIX, labelled, CPU.key, ref) is CPU and find_cell(MATRIX, labelled, None, ref) is CPU
    assert find_cell(MATRIX, {}, "pytorch-cuda:2.13", ref).key == "pytorch-cuda:2.13"
    assert find_cell(MATRIX, {label_keys.CELL: ""}, CPU.key, ref) is CPU   # an emptied label is no label


def test_build_target_gives_gpus_of_two_models_no_floor() -> None:
    """Before: the target's floor was the first usable GPU's model (H100 SXM over PCIe: a fault naming a broken
    NVLink) though the second GPU is an L40S; now GPUs of several models get no floor, saying why."""
    gpus = [Gpu(index="0", name="NVIDIA H100 80GB HBM3"), Gpu(index="1", name="NVIDIA L40S")]
    usable = [{"index": g.index, "name": g.name} for g in gpus]
    plan = RunPlan("reg/pytorch-cpu-dev:x", IMAGE, CPU, MATRIX, Options(), Inventory(gpus, interconnect="PCIe"),
                   flags=[], usable=usable, run_id="r1", deadline_s=90.0)
    target = build_target(plan, {}, 60.0, {**expectations(CPU, {}), "labels": []})
    assert (target.busbw_floor_fault, target.busbw_floor_GBps, target.busbw_floor_model) == ("", None, "")
    assert target.busbw_floor_note.startswith("no floor for these GPUs: they are of 2 models")
