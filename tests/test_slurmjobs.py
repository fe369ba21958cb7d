"""Submitting and waiting for SLURM jobs is bounded: with stand-ins for sbatch, scontrol and scancel that keep the
job's state in a file, a job past the bound is cancelled and waited for, and a finished job's output is read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from buildtool.common.errors import FailedError, UserError
from buildtool.launch.slurmjobs import JobForgotten, run_job

SBATCH = '#!/bin/sh\necho "sbatch $*" >> "$STUB_DIR/log"\necho "123;cluster"\n'
SCONTROL = ('#!/bin/sh\n'
            'if [ -e "$STUB_DIR/purged" ]; then echo "slurm_load_jobs error: Invalid job id specified" >&2; '
            'exit 1; fi\n'
            'if [ -e "$STUB_DIR/down" ]; then echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; '
            'exit 1; fi\n'
            'echo "JobId=123 JobName=x JobState=$(cat "$STUB_DIR/state") Reason=$(cat "$STUB_DIR/reason") '
            'ExitCode=$(cat "$STUB_DIR/exit") StdOut=$STUB_DIR/job-123.out"\n')
SCANCEL = '#!/bin/sh\necho "scancel $*" >> "$STUB_DIR/log"\necho CANCELLED > "$STUB_DIR/state"\n'


@pytest.fixture
def stubs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "stubs"
    folder.mkdir()
    for name, body in (("sbatch", SBATCH), ("scontrol", SCONTROL), ("scancel", SCANCEL)):
        (folder / name).write_text(body)
        (folder / name).chmod(0o755)
    (folder / "exit").write_text("0:0\n")
    (folder / "reason").write_text("None\n")
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    monkeypatch.setenv("STUB_DIR", str(folder))
    return folder


def test_a_finished_job_is_read_back(stubs: Path, tmp_path: Path) -> None:
    (stubs / "state").write_text("COMPLETED\n")
    (stubs / "job-123.out").write_text("DDP check passed: world size 2\n")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n")
    end = run_job(script, cwd=tmp_path, timeout_s=30, args=("--partition=gpu",))
    assert (end.job_id, end.state, end.exit_code) == ("123", "COMPLETED", "0:0")
    assert end.output == "DDP check passed: world size 2\n" and end.output_path == stubs / "job-123.out"
    assert (stubs / "log").read_text() == f"sbatch --parsable --partition=gpu {script}\n"


def test_a_job_past_its_bound_is_cancelled(stubs: Path, tmp_path: Path) -> None:
    (stubs / "state").write_text("RUNNING\n")
    with pytest.raises(FailedError, match=r"job 123 \(job.sbatch\) still RUNNING after 1 s; cancelled"):
        run_job(tmp_path / "job.sbatch", cwd=tmp_path, timeout_s=1, poll_s=0.1)
    assert (stubs / "log").read_text().splitlines()[-1] == "scancel 123"
    assert (stubs / "state").read_text().strip() == "CANCELLED"


def test_a_pending_job_past_its_bound_is_named_with_slurms_reason(stubs: Path, tmp_path: Path) -> None:
    (stubs / "state").write_text("PENDING\n")
    (stubs / "reason").write_text("ReqNodeNotAvail\n")
    with pytest.raises(FailedError, match=r"job 123 \(job.sbatch\) still PENDING \(ReqNodeNotAvail\) after 1 s"):
        run_job(tmp_path / "job.sbatch", cwd=tmp_path, timeout_s=1, poll_s=0.1)


def test_a_job_slurm_has_purged_is_named_at_once_not_called_queued(stubs: Path, tmp_path: Path) -> None:
    """A job waited for after it ended and MinJobAge passed: slurmctld answers "Invalid job id". Before, that
    read as no fields, the wait ran out its whole bound and said "still queued" (CI, stop 33)."""
    (stubs / "purged").write_text("")
    with pytest.raises(JobForgotten, match=r"SLURM no longer knows job 123: it ended more than MinJobAge ago"):
        run_job(tmp_path / "job.sbatch", cwd=tmp_path, timeout_s=30, poll_s=0.1)
    assert "scancel" not in (stubs / "log").read_text(), "a job that has ended is not cancelled"


def test_a_controller_that_does_not_answer_is_asked_again_then_named(stubs: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from buildtool.launch import slurmjobs

    monkeypatch.setattr(slurmjobs, "CANCEL_WAIT_S", 1)   # scancel is sent; its end cannot be seen either
    (stubs / "down").write_text("")
    (stubs / "state").write_text("RUNNING\n")
    with pytest.raises(FailedError, match=r"job 123 \(job.sbatch\) still unanswered by scontrol after 1 s"):
        run_job(tmp_path / "job.sbatch", cwd=tmp_path, timeout_s=1, poll_s=0.1)


def test_an_interrupted_wait_cancels_the_job(stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from buildtool.launch import slurmjobs

    polls: list[str] = []
    real = slurmjobs.job_fields

    def ctrl_c_on_the_second_poll(job_id: str, env: dict[str, str] | None = None) -> dict[str, str]:
        polls.append(job_id)
        if len(polls) == 2:
            raise KeyboardInterrupt
        return real(job_id, env)

    (stubs / "state").write_text("PENDING\n")
    monkeypatch.setattr(slurmjobs, "job_fields", ctrl_c_on_the_second_poll)
    with pytest.raises(KeyboardInterrupt):
        run_job(tmp_path / "job.sbatch", cwd=tmp_path, timeout_s=60, poll_s=0.05)
    assert (stubs / "log").read_text().splitlines()[-1] == "scancel 123"
    assert (stubs / "state").read_text().strip() == "CANCELLED"


def test_no_slurm_here_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="sbatch not found"):
        run_job(tmp_path / "job.sbatch", cwd=tmp_path, timeout_s=5)



def test_an_sbatch_answer_with_no_job_id_is_one_line_never_another_jobs_state(stubs: Path, tmp_path: Path) -> None:
    """sbatch exited 0 without a job id on stdout: `scontrol show job ''` lists every job, and the wait read another
    job's state (COMPLETED here) and output as this one's. A line printed before the id is no id either."""
    (stubs / "state").write_text("COMPLETED\n")
    (stubs / "job-123.out").write_text("SCALING_RESULT {}\n")
    (stubs / "sbatch").write_text("#!/bin/sh\necho 'sbatch: warning: no GRES given'\n")
    with pytest.raises(FailedError, match=r"^sbatch --parsable answered no job id for job.sbatch \(stdout 'sbatch: "):
        run_job(tmp_path / "job.sbatch", cwd=tmp_path, timeout_s=5, poll_s=0.1)
    (stubs / "sbatch").write_text("#!/bin/sh\necho 'sbatch: warning: no GRES given'\necho '123;cluster'\n")
    assert run_job(tmp_path / "job.sbatch", cwd=tmp_path, timeout_s=5, poll_s=0.1).job_id == "123"


def test_an_output_path_with_spaces_is_read_whole(stubs: Path, tmp_path: Path) -> None:
    """job_fields split scontrol's line on every space: `StdOut=/shared/my runs/slurm-123.out` read as `/shared/my`,
    so a finished job's output was read from a file that is not there (an empty tail). Each value runs to the next
    `Key=` now, spaces and all, in a line as SLURM 22.05 writes it."""
    folder = stubs / "my runs"
    folder.mkdir()
    (folder / "slurm-123.out").write_text("DDP check passed: world size 2\n")
    line = ("JobId=123 JobName=ddp check UserId=ci(1000) MCS_label=N/A Account=(null) JobState=COMPLETED Reason=None "
            "Dependency=(null) ExitCode=0:0 RunTime=00:00:14 AllocNode:Sid=head:42 ReqB:S:C:T=0:0:*:* "
            "TRES=cpu=2,mem=1G,node=2 Socks/Node=* CPUs/Task=1 Comment= Command=$STUB_DIR/my runs/job.sbatch "
            "WorkDir=$STUB_DIR/my runs StdErr=$STUB_DIR/my runs/slurm-123.out StdIn=/dev/null "
            "StdOut=$STUB_DIR/my runs/slurm-123.out Power= ")
    (stubs / "scontrol").write_text(f'#!/bin/sh\necho "{line}"\n')
    end = run_job(tmp_path / "job.sbatch", cwd=tmp_path, timeout_s=30, poll_s=0.1)
    assert (end.state, end.exit_code, end.output_path) == ("COMPLETED", "0:0", folder / "slurm-123.out")
    assert end.output == "DDP check passed: world size 2\n"
