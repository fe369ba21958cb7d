"""`buildtool validate` whose reports cannot be written (--reports through a file, a full disk mid-run): one line
naming the folder and why (exit 2), never a traceback."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from buildtool.contracts import label_keys
from buildtool.validate import runner
from buildtool.validate.containers import Resolved
from buildtool.validate.probe import Inventory

REPO = Path(__file__).resolve().parent.parent
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


def test_a_verdict_write_that_fails_midway_leaves_the_older_verdict_whole(tmp_path: Path) -> None:
    """Before: verdict.json was written in place, so a disk that filled during the write (here RLIMIT_FSIZE: the write
    stops with EFBIG after its first 64 KiB) left a truncated verdict.json, which the report and the busbw baseline
    window then met; now it is written beside and renamed, so the older verdict stays as it was and nothing is left."""
    folder = tmp_path / "reports" / "pytorch-cpu" / ("a" * 12)
    folder.mkdir(parents=True)
    older = '{"schema": 6, "result": "passed"}\n'
    (folder / "verdict.json").write_text(older)
    code = textwrap.dedent(f"""
        import errno, resource, signal, types
        from pathlib import Path
        from buildtool.contracts import label_keys
        from buildtool.validate import runner, sbomref
        from buildtool.validate.containers import Resolved
        from buildtool.validate.options import Options
        from buildtool.validate.probe import Inventory
        from tests.conftest import fixture_matrix

        image = Resolved(ref="pytorch-cpu-dev:t", run_ref="pytorch-cpu-dev:t", digest="sha256:" + "a" * 64,
                         host=None, repo=None, labels={{label_keys.CELL: "pytorch-cpu:2.13"}})
        runner.gpu_inventory = lambda: Inventory([], problem="nvidia-smi not found")
        runner.resolve = lambda *_a, **_k: image
        runner.probe_flags = lambda _image, flags, *_a, **_k: (flags, [])
        sbomref.verdict_sbom = lambda *_a: ("", "no registry")
        runner.label_checks = lambda *_a: []
        runner._run = lambda *_a: None
        big = {{"schema": 6, "result": "passed", "padding": "x" * (1 << 20)}}   # past the limit below
        runner.make_verdict = lambda *_a: types.SimpleNamespace(to_json=lambda: big)
        matrix = fixture_matrix()
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
        try:
            runner.validate_image(image.ref, matrix, Path.cwd(), Options(store=False, reports=Path({str(tmp_path)!r})
                                  / "reports"), print)
        except OSError as exc:
            print("refused:", errno.errorcode[exc.errno])
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "refused: EFBIG" in proc.stdout, proc.stdout + proc.stderr
    left = (folder / "verdict.json").read_text()
    assert left == older, f"verdict.json is now {len(left)} bytes of {left[:40]!r}..."
    assert sorted(p.name for p in folder.iterdir() if "verdict" in p.name) == ["verdict.json"]   # no partial copy
