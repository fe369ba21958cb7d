"""`make nightly` as a user runs it into a fresh NIGHTLY_OUT (issue 55): the first night reports without a trend and
says so, the next night's trend is against it, a failed night still leaves its report, and the history keeps the
busbw window. The steps run for real by make; the commands that need images are stand-ins (tests/nightly_fake.py);
tests/integration/test_user_runs.py runs the same nights with images."""

from __future__ import annotations

from pathlib import Path

import pytest

from buildtool.contracts import busbw
from buildtool.report.nightly import NO_TREND
from tests.nightly_fake import REPO, run_make
from tests.test_report import DDP, last_night, tonight, write


@pytest.fixture
def nights(tmp_path: Path) -> dict[str, Path]:
    """Two nights' verdicts as the registry gives them: pytorch-ngc's DDP test fails on the second."""
    return {"first": write(tmp_path / "first", last_night()), "second": write(tmp_path / "second", tonight())}


def nightly(tmp_path: Path, verdicts: Path, *settings: str, fail: str = "", env: dict[str, str] | None = None):
    return run_make("nightly", tmp_path, verdicts, "FRAMEWORK=pytorch-cpu", f"NIGHTLY_OUT={tmp_path / 'out'}",
                    *settings, fail=fail, env=env)


def test_the_first_night_into_a_fresh_folder_reports_and_says_it_has_no_trend(tmp_path, nights) -> None:
    out = tmp_path / "out"
    night = nightly(tmp_path, nights["first"])
    assert night.code == 0, night.stderr
    assert night.commands() == ["build", "validate", "scaling", "report"]
    assert night.call("build") == ["build", "--framework", "pytorch-cpu", "--push"]
    # No history yet: neither the baseline nor the previous night is passed (both refuse a folder that is not
    # there), and both say why.
    assert "--baseline" not in night.call("validate") and "--previous" not in night.call("report")
    assert f"no earlier night in {out}/history (the first night): the report shows no trend" in night.stderr
    assert "the bus bandwidth has no baseline" in night.stderr
    for page in ("report.md", "report.html"):
        text = (out / page).read_text()
        assert NO_TREND.replace("'", "&#39;" if page.endswith("html") else "'") in text, page
        assert "Newly failing" not in text and "Since the previous night" not in text
    # FRAMEWORK=pytorch-cpu does not build jax-cpu: its scaling is not run, and that is said.
    assert "the scaling in jax-cpu:0.10 is not run: FRAMEWORK=pytorch-cpu does not build it" in night.stderr
    assert night.call("scaling")[1:3] == ["--cell", "pytorch-cpu:2.13"]
    assert night.call("report")[night.call("report").index("--scaling") + 1] == f"{out}/scaling"
    [kept] = (out / "history").iterdir()
    assert sorted(p.name for p in kept.rglob("verdict.json")) == ["verdict.json"] * 3


def test_the_second_night_has_the_trend_against_the_first(tmp_path, nights) -> None:
    out = tmp_path / "out"
    assert nightly(tmp_path, nights["first"]).code == 0
    [first] = (out / "history").iterdir()
    night = nightly(tmp_path, nights["second"])
    assert night.code == 0, night.stderr
    report = night.call("report")
    assert report[report.index("--previous") + 1] == str(first)
    validate = night.call("validate")
    assert validate[validate.index("--baseline") + 1] == f"{out}/history"
    md = (out / "report.md").read_text()
    assert NO_TREND not in md and "### Newly failing" in md and f"`pytorch-ngc:25.10` `{DDP}` (was passed)" in md
    assert len(list((out / "history").iterdir())) == 2


def test_a_rerun_within_the_same_second_is_kept_beside_the_night_before_it(tmp_path, nights) -> None:
    """The night's folder is named by the second it ran; a rerun in that second gets a suffix, not a refusal."""
    import os

    clock = tmp_path / "bin" / "date"
    clock.parent.mkdir()
    clock.write_text('#!/bin/sh\necho 20261206T030000Z\n')
    clock.chmod(0o755)
    same_second = {"PATH": f"{clock.parent}:{os.environ['PATH']}"}
    out = tmp_path / "out"
    assert nightly(tmp_path, nights["first"], env=same_second).code == 0
    night = nightly(tmp_path, nights["second"], env=same_second)
    assert night.code == 0, night.stderr
    assert sorted(p.name for p in (out / "history").iterdir()) == ["20261206T030000Z", "20261206T030000Z-2"]
    report = night.call("report")
    assert report[report.index("--previous") + 1] == str(out / "history" / "20261206T030000Z")
    third = nightly(tmp_path, nights["second"], env=same_second)
    report = third.call("report")
    assert report[report.index("--previous") + 1] == str(out / "history" / "20261206T030000Z-2")


def test_a_failed_night_still_leaves_its_report_and_exits_1(tmp_path, nights) -> None:
    out = tmp_path / "out"
    assert nightly(tmp_path, nights["first"]).code == 0
    assert (out / "scaling").is_dir()
    night = nightly(tmp_path, nights["second"], fail="build validate scaling")
    # make's own status for a target whose recipe failed is 2; the nightly's message says it is a failure.
    assert night.code == 2 and "nightly: a step failed (above); exit 1" in night.stderr
    assert night.commands() == ["build", "validate", "scaling", "report"]
    # The failed scaling left nothing, and last night's results are not reported as tonight's.
    assert not (out / "scaling").exists() and "--scaling" not in night.call("report")
    assert f"no scaling results in {out}/scaling (that run failed or was not run)" in night.stderr
    assert "### Newly failing" in (out / "report.md").read_text()


def test_a_failed_report_is_the_nights_failure_and_keeps_no_night(tmp_path, nights) -> None:
    night = nightly(tmp_path, nights["first"], fail="report")
    assert night.code == 2 and "nightly: a step failed (above); exit 1" in night.stderr
    assert not (tmp_path / "out" / "history").exists()


def test_the_workflows_report_step_keeps_a_window_of_nights_and_reports_against_the_newest(tmp_path) -> None:
    """The nightly workflow's report step (`make nightly-report` with its settings, in the checkout), nine nights
    in a row: the history keeps the busbw window's 7 newest nights, one folder each (UTC time and run id), and
    each night's trend is the night before it; the first has none."""
    import shutil

    import yaml

    from buildtool.render.workflows import NIGHTLY_PATH

    doc = yaml.safe_load((REPO / NIGHTLY_PATH).read_text())
    script = next(s["run"] for s in doc["jobs"]["report"]["steps"] if s.get("name") == "Report")
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    clock = tmp_path / "bin" / "date"
    clock.parent.mkdir()
    clock.write_text('#!/bin/sh\necho "$FAKE_NIGHT"\n')   # the night's UTC time, as `date -u +%Y%m%dT%H%M%SZ`
    clock.chmod(0o755)
    seen = []
    for n in range(1, 10):
        tonight_dir = write(tmp_path / f"night{n}", last_night())
        run = script.replace("${{ github.run_id }}", f"run{n:02d}").replace(
            'cat reports/nightly/report.md >> "$GITHUB_STEP_SUMMARY"', "")
        night = run_make(run.split()[1], tmp_path, tonight_dir, *run.split()[2:], cwd=tmp_path,
                         env={"PATH": f"{clock.parent}:{__import__('os').environ['PATH']}",
                              "FAKE_NIGHT": f"202612{n:02d}T030000Z"})
        assert night.code == 0, night.stderr
        report = night.call("report")
        seen.append(report[report.index("--previous") + 1] if "--previous" in report else None)
        assert (tmp_path / "reports" / "nightly" / "report.md").is_file()
    history = sorted(p.name for p in (tmp_path / "reports" / "verdict-history").iterdir())
    assert len(history) == busbw.DEFAULT_WINDOW == 7
    assert history == [f"202612{n:02d}T030000Z-run{n:02d}" for n in range(3, 10)]
    assert seen[0] is None
    assert seen[1:] == [f"reports/verdict-history/202612{n:02d}T030000Z-run{n:02d}" for n in range(1, 9)]


def test_the_nightly_runs_the_slurm_scaling_and_reports_it_when_a_bundle_folder_is_set(tmp_path, nights) -> None:
    out = tmp_path / "out"
    plain = nightly(tmp_path, nights["first"], "FRAMEWORK=")
    assert plain.code == 0, plain.stderr
    # The strategies side by side (issue 42): PyTorch's in the PyTorch cell, JAX data parallelism in the JAX cell.
    assert [c for c in plain.calls if c[0] == "scaling"] == [
        ["scaling", "--cell", "pytorch-cpu:2.13", "--counts", "1,2", "--out", f"{out}/scaling", "--strategy",
         "ddp,fsdp,deepspeed"],
        ["scaling", "--cell", "jax-cpu:0.10", "--strategy", "jax-dp", "--counts", "1,2", "--out", f"{out}/scaling-jax"]]
    report = plain.call("report")
    assert [report[i + 1] for i, a in enumerate(report) if a == "--scaling"] == [f"{out}/scaling", f"{out}/scaling-jax"]
    assert "bundle" not in plain.commands()
    no_jax = nightly(tmp_path, nights["first"], "FRAMEWORK=", "NIGHTLY_JAX_SCALING_CELL=")
    assert [c[2] for c in no_jax.calls if c[0] == "scaling"] == ["pytorch-cpu:2.13"]
    slurm = nightly(tmp_path, nights["first"], "FRAMEWORK=", "NIGHTLY_SLURM_BUNDLE=/shared/bundles/nightly",
                    "NIGHTLY_SLURM_FLAGS=--partition gpu")
    assert slurm.code == 0, slurm.stderr
    bundle = slurm.call("bundle")
    assert bundle[0] == "bundle" and bundle[1].split("/")[-1].startswith("pytorch-cpu-dev:")
    assert bundle[2:] == ["/shared/bundles/nightly", "--force"]
    assert ["scaling", "--launcher", "slurm", "--runtime", "oci", "--image", "/shared/bundles/nightly", "--strategy",
            "ddp,fsdp,deepspeed", "--nodes", "1,2", "--partition", "gpu", "--metrics-dir",
            f"{out}/scaling-slurm"] in slurm.calls
    report = slurm.call("report")
    assert [report[i + 1] for i, a in enumerate(report) if a == "--scaling"] == [
        f"{out}/scaling", f"{out}/scaling-jax", f"{out}/scaling-slurm"]


def test_make_nightly_with_no_settings_in_a_fresh_checkout_runs_its_first_night(tmp_path) -> None:
    """`make nightly` as documented, no flag at all (FRAMEWORK all, NIGHTLY_OUT reports/nightly in the checkout), on
    an empty state: no earlier night, verdicts or baseline. Each step runs, says it is the first night, and the night
    leaves its report and its history (the task guide: "`make nightly` fails on its first night", once)."""
    import os
    import subprocess

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60).stdout
    tar = subprocess.run(["tar", "-c", "--null", "-T", "-", "-f", "-"], input=tracked, cwd=REPO, capture_output=True,
                         check=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-f", "-"], input=tar, cwd=checkout, check=True, timeout=120)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=checkout, check=True, capture_output=True, timeout=60)
    assert not (checkout / "reports").exists()
    night = run_make("nightly", tmp_path, write(tmp_path / "tonight", last_night()), cwd=checkout,
                     env={"PYTHONPATH": str(checkout), "PATH": os.environ["PATH"]})
    assert night.code == 0, night.stderr
    assert night.commands() == ["build", "validate", "scaling", "scaling", "report"]
    assert night.call("build") == ["build", "--framework", "all", "--push"]
    assert night.call("validate") == ["validate", "--framework", "all", "--reports", "reports/nightly/validate"]
    assert "--previous" not in night.call("report")
    assert "no earlier night in reports/nightly/history (the first night): the bus bandwidth has no baseline" \
        in night.stderr
    assert "no earlier night in reports/nightly/history (the first night): the report shows no trend" in night.stderr
    out = checkout / "reports" / "nightly"
    assert NO_TREND in (out / "report.md").read_text() and (out / "report.html").is_file()
    [kept] = (out / "history").iterdir()
    assert sorted(p.name for p in kept.rglob("verdict.json")) == ["verdict.json"] * 3


def test_pruning_the_history_under_a_folder_with_a_space_removes_old_nights_and_nothing_else(tmp_path) -> None:
    """xargs split the history's paths at the space: `my nights/history/...` removed the folder `my` beside it (and
    a relative `nights/history/...`), and no old night."""
    (tmp_path / "my").mkdir()
    (tmp_path / "my" / "keep.txt").write_text("not a night")
    out = tmp_path / "my nights"
    for day in (1, 2, 3):
        write(out / "history" / f"2026120{day}T030000Z", last_night())
    night = run_make("nightly-report", tmp_path, write(tmp_path / "tonight", last_night()), "FRAMEWORK=pytorch-cpu",
                     f"NIGHTLY_OUT={out}", "NIGHTLY_KEEP=2")
    assert night.code == 0, night.stderr
    assert (tmp_path / "my" / "keep.txt").read_text() == "not a night"
    kept = sorted(p.name for p in (out / "history").iterdir())
    assert len(kept) == 2 and kept[0] == "20261203T030000Z" and kept[1] > kept[0], kept


def test_a_runner_clock_behind_the_newest_night_keeps_nothing_and_says_so(tmp_path) -> None:
    """Nights are named by the runner's clock and ordered by name: a runner whose clock is behind the newest kept
    night wrote tonight's folder first in the order, so the next trend compared with the wrong night and pruning
    could drop the newest. The night is refused naming the clock; the history is left as it was."""
    out = tmp_path / "nights"
    write(out / "history" / "29991231T000000Z", last_night())
    night = run_make("nightly-report", tmp_path, write(tmp_path / "tonight", last_night()), "FRAMEWORK=pytorch-cpu",
                     f"NIGHTLY_OUT={out}", "NIGHTLY_KEEP=1")
    assert night.code == 2, night.stderr   # make's status for a recipe that failed (the recipe exits 1)
    assert "is behind the newest kept night 29991231T000000Z" in night.stderr and "fix the clock" in night.stderr
    assert sorted(p.name for p in (out / "history").iterdir()) == ["29991231T000000Z"]
