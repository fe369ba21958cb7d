"""A command whose output folder or file cannot be written (a path through a file, no permission, a full disk)
says so in one line naming the option (exit 2), never a traceback; nothing half-written is left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_keys_into_a_folder_that_cannot_be_made_is_one_line(run_cli, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    code, out, err = run_cli("keys", "--name", "k", "--out", str(tmp_path / "file" / "keys"))
    line = _one_line(err)
    assert code == 2 and line.startswith("error: --out ") and "cannot write there" in line, err


def test_keys_whose_public_half_cannot_be_written_leave_no_private_key(run_cli, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def full(self: Path, *args: object, **kwargs: object) -> int:
        raise OSError(28, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", full)
    code, out, err = run_cli("keys", "--name", "k", "--out", str(tmp_path))
    assert code == 2 and "No space left on device" in _one_line(err), err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["k8s", "slurm"])
def test_a_job_written_where_no_file_can_be_is_one_line(run_cli, tmp_path: Path, command: str) -> None:
    (tmp_path / "file").write_text("x")
    target = tmp_path / "file" / "jobs" / "job.out"
    code, out, err = run_cli(command, "127.0.0.1:5000/pytorch-cpu-dev:0123456789ab-2.13", "--out", str(target))
    line = _one_line(err)
    assert code == 2 and line.startswith("error: --out ") and "cannot write there" in line, err


def test_a_report_written_where_no_folder_can_be_is_one_line(run_cli, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "verdicts").mkdir()
    # A folder with a verdict: one with none is refused before anything is written (test_report).
    missing = {"missing": True, "cell": "pytorch-cpu:2.13", "image": "r/pytorch-cpu-dev:x", "reason": "no image"}
    (tmp_path / "verdicts" / "pytorch-cpu_2.13.verdict.json").write_text(json.dumps(missing))
    code, out, err = run_cli("report", "--verdicts", str(tmp_path / "verdicts"), "--out",
                             str(tmp_path / "file" / "report"))
    line = _one_line(err)
    assert code == 2 and line.startswith("error: --out ") and "cannot write there" in line, err


def test_workflows_written_where_no_folder_can_be_is_one_line(run_cli, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    code, out, err = run_cli("workflows", "write", "--out", str(tmp_path / "file" / "wf"))
    line = _one_line(err)
    assert code == 2 and line.startswith("error: --out ") and "cannot write there" in line, err


@pytest.mark.parametrize("name", ["x[/]y", "[red]z", "q:ok:q"])
def test_a_written_path_is_said_as_it_is_not_read_as_markup(run_cli, tmp_path: Path, name: str) -> None:
    """The line naming what was written went through rich: a `[/]` in --out was markup that closed nothing (a
    traceback and exit 1 after the files were written), `[red]` was dropped and `:ok:` became an emoji, so the
    line named a path that does not exist. It is the path as written now."""
    (tmp_path / "verdicts").mkdir()
    missing = {"missing": True, "cell": "pytorch-cpu:2.13", "image": "r/pytorch-cpu-dev:x", "reason": "no image"}
    (tmp_path / "verdicts" / "pytorch-cpu_2.13.verdict.json").write_text(json.dumps(missing))   # none: refused
    report = tmp_path / name
    code, out, err = run_cli("report", "--verdicts", str(tmp_path / "verdicts"), "--out", str(report))
    assert code == 0 and "Traceback" not in err, err
    assert out.startswith(f"{report / 'report.html'}: 1 image"), out
    job = tmp_path / f"{name}.sbatch"
    code, out, err = run_cli("slurm", "127.0.0.1:5000/pytorch-cpu-dev:0123456789ab-2.13", "--out", str(job))
    assert code == 0 and "Traceback" not in err, err
    assert out == f"wrote {job}\n" and job.is_file(), out


@pytest.mark.parametrize("command", ["k8s", "slurm"])
def test_a_job_cut_short_by_a_full_disk_leaves_no_half_file(tmp_path: Path, command: str) -> None:
    """k8s and slurm wrote --out in place: a disk that filled half-way (here a file size limit) said so in one line,
    but left the first part of the job where --out names it, an sbatch script or manifest cut mid-line that a later
    `sbatch`/`kubectl apply` would take. Nothing is left now."""
    import os
    import resource
    import signal
    import subprocess
    import sys

    from tests.conftest import REPO

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))

    target = tmp_path / "jobs" / "job.out"
    image = "127.0.0.1:5000/pytorch-cpu-dev:0123456789ab-2.13"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "buildtool", command, image, "--out", str(target)], cwd=REPO,
                          capture_output=True, text=True, timeout=60, preexec_fn=small_files, env=env)
    assert proc.returncode == 2 and _one_line(proc.stderr).startswith("error: --out "), proc.stderr
    assert not target.exists() and list(target.parent.iterdir()) == []


def test_keys_interrupted_before_the_public_half_leave_neither_half(run_cli, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Only an OSError removed the private key: Ctrl-C between NAME.key and NAME.pub left the private key alone,
    and the rerun was refused ("exists"). Any exception removes what was written now, and the rerun makes the pair."""
    def interrupted(self: Path, *args: object, **kwargs: object) -> int:
        self.write_bytes(b"-----BEGIN")   # part of the public half written, then Ctrl-C
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(Path, "write_text", interrupted)
        code, out, err = run_cli("keys", "--name", "k", "--out", str(tmp_path))   # typer answers Ctrl-C itself
    assert code == 130, err
    assert list(tmp_path.iterdir()) == []
    code, out, err = run_cli("keys", "--name", "k", "--out", str(tmp_path))
    assert code == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["k.key", "k.pub"], err
