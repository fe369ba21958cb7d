"""Submit an sbatch script and wait for it, bounded: what `buildtool scaling --launcher slurm` and the tests use.

`sbatch --wait` polls with a growing interval (a 14 s job returned after 42 s here), so this polls
`scontrol show job` itself. A job still running at the bound, or when the caller is interrupted, is
cancelled and waited for: nothing is left in the queue.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from buildtool.common.errors import FailedError, UserError

FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                          "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT"})
CALL_TIMEOUT_S = 60
CANCEL_WAIT_S = 60


@dataclass(frozen=True)
class JobEnd:
    job_id: str
    state: str
    exit_code: str          # "status:signal", as SLURM writes it
    output_path: Path
    output: str
    seconds: float


def _call(argv: list[str], env: dict[str, str] | None, cwd: Path | None = None,
          what: str = "") -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=CALL_TIMEOUT_S, env=env, cwd=cwd,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise UserError(f"{argv[0]} not found: run this on a SLURM submit host") from None
    except subprocess.TimeoutExpired:
        raise FailedError(f"{what or ' '.join(argv[:3])} did not answer within {CALL_TIMEOUT_S} s") from None


def submit(script: Path, *, cwd: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> str:
    """sbatch SCRIPT from CWD; the job id."""
    proc = _call(["sbatch", "--parsable", *args, str(script)], env, cwd=cwd, what="sbatch")
    if proc.returncode != 0:
        raise FailedError(f"sbatch refused {script.name}: {proc.stderr.strip()}")
    lines = proc.stdout.strip().splitlines()   # `ID[;CLUSTER]`, last (a site's wrapper may print before it)
    job_id = lines[-1].split(";")[0].strip() if lines else ""
    # `scontrol show job ''` lists every job: waiting on no id read another job's state and output as this one's.
    if not re.fullmatch(r"[0-9]+", job_id):
        raise FailedError(f"sbatch --parsable answered no job id for {script.name} (stdout "
                          f"{proc.stdout.strip()[:120]!r}, stderr {proc.stderr.strip()[:120]!r}); nothing was "
                          "waited for")
    return job_id


class JobForgotten(FailedError):
    """slurmctld no longer knows the job: it ended more than MinJobAge ago (300 s by default) and was purged."""


def job_fields(job_id: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """`scontrol show job -o ID` as a dict; {} when scontrol failed for another reason (the controller busy or
    restarting), to be asked again. A job the controller has purged raises JobForgotten: its end state is gone,
    and polling on would wait out the whole bound and call it queued."""
    proc = _call(["scontrol", "show", "job", "-o", job_id], env)
    if proc.returncode != 0:
        if "invalid job id" in proc.stderr.lower():
            raise JobForgotten(f"SLURM no longer knows job {job_id}: it ended more than MinJobAge ago and its "
                               f"state was purged; wait for it sooner, or raise MinJobAge in slurm.conf")
        return {}
    return {m.group(1): m.group(2) for m in _PAIR.finditer(proc.stdout)}


# scontrol's one line is `Key=Value` pairs joined by spaces, and a value may hold spaces (a job name, an output path:
# `StdOut=/shared/my runs/slurm-1.out`): a pair ends only where a space is followed by a key and `=`. Keys as scontrol
# writes them: a capital, then letters, digits, `_`, `:` and `/` (`AllocNode:Sid`, `CPUs/Task`, `MCS_label`).
_PAIR = re.compile(r"(?:^| )([A-Z][\w:/]*)=(.*?)(?= +[A-Z][\w:/]*=| *$)", re.MULTILINE)


def cancel(job_id: str, env: dict[str, str] | None = None) -> None:
    """scancel, then wait (bounded) until the job has ended."""
    _call(["scancel", job_id], env)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while time.monotonic() < deadline:
        try:
            if job_fields(job_id, env).get("JobState") in FINAL_STATES:
                return
        except JobForgotten:
            return
        time.sleep(0.5)


def wait(job_id: str, *, timeout_s: float, env: dict[str, str] | None = None, poll_s: float = 0.5,
         started: float | None = None, what: str = "") -> JobEnd:
    """Wait for a submitted job to end; past TIMEOUT_S (counted from STARTED) or interrupted, it is cancelled."""
    started = time.monotonic() if started is None else started
    fields: dict[str, str] = {}
    try:
        while True:
            fields = job_fields(job_id, env) or fields
            if fields.get("JobState") in FINAL_STATES or time.monotonic() - started > timeout_s:
                break
            time.sleep(poll_s)
    except JobForgotten:
        raise
    except BaseException:
        if fields.get("JobState") not in FINAL_STATES:
            cancel(job_id, env)
        raise
    if fields.get("JobState") not in FINAL_STATES:
        cancel(job_id, env)
        state = fields.get("JobState") or "unanswered by scontrol"
        reason = fields.get("Reason", "None")
        raise FailedError(f"job {job_id}{f' ({what})' if what else ''} still {state}"
                          f"{'' if reason == 'None' else f' ({reason})'} after {timeout_s:.0f} s; cancelled")
    output_path = Path(fields.get("StdOut") or f"slurm-{job_id}.out")
    try:
        output = output_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        output = ""
    return JobEnd(job_id=job_id, state=fields.get("JobState", "UNKNOWN"), exit_code=fields.get("ExitCode", ""),
                  output_path=output_path, output=output, seconds=round(time.monotonic() - started, 1))


def run_job(script: Path, *, cwd: Path, timeout_s: float, env: dict[str, str] | None = None,
            args: tuple[str, ...] = (), poll_s: float = 0.5) -> JobEnd:
    """sbatch SCRIPT from CWD and wait for it to end; past TIMEOUT_S (or interrupted) it is cancelled."""
    started = time.monotonic()
    job_id = submit(script, cwd=cwd, env=env, args=args)
    return wait(job_id, timeout_s=timeout_s, env=env, poll_s=poll_s, started=started, what=script.name)
