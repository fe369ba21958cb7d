"""`buildtool validate` whose reports cannot be written (--reports through a file, a full disk mid-run): one line
naming the folder and why (exit 2), never a traceback."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from buildtool.contracts import label_keys
from buildtool.validate import runner
from buildtool.validate.containers import Resolved
from buildtool.validate.probe import Inventory

REF = "pytorch-cpu-dev@sha256:" + "a" * 64
IMAGE = Resolved(ref=REF, run_ref=REF, digest="sha256:" + "a" * 64, host=None, repo=None,
                 labels={label_keys.CELL: "pytorch-cpu:2.13"})


@pytest.fixture
def validate(run_cli, fixture_project: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """`buildtool validate IMAGE --no-store` of a local image: every step up to pytest as it is."""
    monkeypatch.setattr(runner, "gpu_inventory", lambda: Inventory([], problem="nvidia-smi not found"))
    monkeypatch.setattr(runner, "resolve", lambda *_a, **_k: IMAGE)
    monkeypatch.setattr(runner, "probe_flags", lambda _image, flags, *_a, **_k: (flags, []))
    monkeypatch.setattr("buildtool.validate.sbomref.verdict_sbom", lambda *_a: ("", "no registry"))
    monkeypatch.setattr(runner, "label_checks", lambda *_a: [])
    return lambda *args: run_cli("validate", REF, "--no-store", "--matrix", str(fixture_project / "matrix.yaml"), *args)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_reports_through_a_file_are_one_line_naming_the_folder(validate, tmp_path: Path) -> None:
    """Before: NotADirectoryError's traceback, after the image was pulled and its cell found."""
    (tmp_path / "file").write_text("x")
    folder = tmp_path / "file" / "reports"
    code, out, err = validate("--reports", str(folder))
    line = _one_line(err)
    said = f"error: --reports {folder.resolve()}: cannot write the run's reports there ("
    assert code == 2 and line.startswith(said), line
    assert "Not a directory" in line and line.endswith("give a --reports folder this user can write"), line


def test_a_disk_that_fills_during_the_run_is_one_line_naming_the_folder(validate, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the ENOSPC of writing the target file was a traceback (and no verdict)."""
    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(runner, "write_target", full)
    folder = tmp_path / "reports"
    code, out, err = validate("--reports", str(folder))
    line = _one_line(err)
    assert code == 2 and line == (f"error: --reports {folder.resolve()}: cannot write the run's reports there: "
                                  f"{os.strerror(errno.ENOSPC)}; free space there or give a --reports folder this "
                                  "user can write"), line
    assert not list(folder.rglob("tests-*")) and not list(folder.rglob(".validate.lock"))   # nothing left behind
