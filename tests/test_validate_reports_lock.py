"""Two validations of one digest and cell share their reports folder (reports/<cell>/<digest12>/): they removed and
overwrote each other's results, defined tests and JUnit XML, so a verdict could be made from the other run's. A second
run is now refused (exit 2) naming the folder and the run that holds it; the lock dies with its process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from buildtool.common.errors import UserError
from buildtool.contracts import label_keys
from buildtool.validate import runner
from buildtool.validate.containers import Resolved
from buildtool.validate.options import Options
from buildtool.validate.probe import Inventory
from tests.conftest import fixture_matrix

REPO = Path(__file__).resolve().parent.parent
MATRIX = fixture_matrix()
CPU = {c.key: c for c in MATRIX.cells}["pytorch-cpu:2.13"]
IMAGE = Resolved(ref="pytorch-cpu-dev:t", run_ref="pytorch-cpu-dev:t", digest="sha256:" + "a" * 64, host=None,
                 repo=None, labels={label_keys.CELL: CPU.key})


class Ran(Exception):
    """The run got as far as pytest."""


@pytest.fixture
def validate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """validate_image of IMAGE with its reports under tmp_path/reports; every step but the run itself as it is."""
    monkeypatch.setattr(runner, "gpu_inventory", lambda: Inventory([], problem="nvidia-smi not found"))
    monkeypatch.setattr(runner, "resolve", lambda *_a, **_k: IMAGE)
    monkeypatch.setattr(runner, "probe_flags", lambda _image, flags, *_a, **_k: (flags, []))
    monkeypatch.setattr("buildtool.validate.sbomref.verdict_sbom", lambda *_a: ("", "no registry"))
    monkeypatch.setattr(runner, "label_checks", lambda *_a: [])

    def run(plan, *_a: object) -> None:  # type: ignore[no-untyped-def]
        raise Ran(plan.out_dir)
    monkeypatch.setattr(runner, "_run", run)
    options = Options(store=False, reports=tmp_path / "reports")
    return lambda: runner.validate_image(IMAGE.ref, MATRIX, REPO, options, print)


def _other_run(folder: Path) -> subprocess.Popen[str]:
    """Another process that holds `folder`'s lock (as a validation does for its run) until it is killed."""
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from buildtool.validate.reports_lock import hold
        with hold(Path({str(folder)!r}), "buildtool validate of the other run"):
            print("held", flush=True)
            time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_a_second_validation_of_the_same_digest_is_refused_naming_the_folder_and_the_other_run(validate,
                                                                                            tmp_path: Path) -> None:
    folder = (tmp_path / "reports" / CPU.name / ("a" * 12)).resolve()
    other = _other_run(folder)
    try:
        with pytest.raises(UserError) as refused:
            validate()
        message = str(refused.value)
        assert message.startswith(f"{folder} is in use by another validation of this image and cell "
                                  f"(buildtool validate of the other run, pid {other.pid} on "), message
        assert message.endswith("; wait for it to end, or give this run another --reports folder")
        assert "\n" not in message
        assert not list(folder.glob("tests-*")) and not (folder / "target.json").exists()   # it wrote nothing there
    finally:
        os.kill(other.pid, signal.SIGKILL)
        other.wait()
    # The other run was killed: its lock went with it (no stale refusal), and this run's lock goes when it ends.
    with pytest.raises(Ran):
        validate()
    assert (folder / "target.json").is_file() and not (folder / ".validate.lock").exists()


def _try_hold(folder: Path) -> str:
    """What another process taking `folder`'s lock says: `ran`, or its refusal."""
    code = textwrap.dedent(f"""
        from pathlib import Path
        from buildtool.common.errors import UserError
        from buildtool.validate.reports_lock import hold
        try:
            with hold(Path({str(folder)!r}), "second"):
                print("ran")
        except UserError as exc:
            print(exc)
    """)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_validation_started_while_another_of_the_digest_runs_is_refused(validate, monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    """A second run of the digest and cell, started while the first is in pytest, is refused (it went on, removing the
    first run's results and writing its own into the same folder); once the first ended, another may run."""
    folder = (tmp_path / "reports" / CPU.name / ("a" * 12)).resolve()
    second: list[str] = []

    def run(plan, *_a: object) -> None:  # type: ignore[no-untyped-def]
        if not second:
            second.append("started")
            try:
                validate()
            except UserError as exc:
                second.append(str(exc))
            except Ran:
                second.append("ran in the first run's folder")
        raise Ran
    monkeypatch.setattr(runner, "_run", run)
    with pytest.raises(Ran):
        validate()
    assert second[1].startswith(f"{folder} is in use by another validation of this image and cell (buildtool "
                                f"validate of {IMAGE.ref}, pid {os.getpid()} on "), second
    assert _try_hold(folder) == "ran" and not (folder / ".validate.lock").exists()
