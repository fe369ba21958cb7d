"""`buildtool slurm`: shellcheck-clean, and a dry run with stub srun/scontrol/apptainer on PATH that
record their arguments and then run the real check on this machine (torch on the host, CPU, gloo)."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
IMAGE = "127.0.0.1:5000/pytorch-cpu-dev:0123456789ab-2.13"

# srun: record, drop srun options (pyxis' --container-* included, remapping the mounts), run the rest.
SRUN = r'''#!/usr/bin/env python3
import os, sys
with open(os.environ["STUB_LOG"], "a") as log:
    log.write("srun " + "\0".join(sys.argv[1:]) + "\n")
args, mounts = sys.argv[1:], []
while args and args[0].startswith("-"):
    if args[0].startswith("--container-mounts="):
        src, dst = args[0].split("=", 1)[1].split(":")[:2]
        mounts.append((dst, src))
    args = args[1:]
args = [a.replace(dst, src) if a.startswith(dst) else a for a in args for dst, src in (mounts or [("\0", "")])]
os.execvp(args[0], args)
'''
# apptainer exec [--nv] --bind SRC:DST:ro IMAGE CMD...: record, then run CMD with DST mapped to SRC.
APPTAINER = r'''#!/usr/bin/env python3
import os, sys
with open(os.environ["STUB_LOG"], "a") as log:
    log.write("apptainer " + "\0".join(sys.argv[1:]) + "\n")
args = sys.argv[2:]
src = dst = None
while args[0].startswith("-"):
    if args[0] == "--bind":
        src, dst = args[1].split(":")[:2]
        args = args[2:]
    else:
        args = args[1:]
cmd = [a.replace(dst, src) if dst and a.startswith(dst) else a for a in args[1:]]
os.execvp(cmd[0], cmd)
'''
SCONTROL = '#!/bin/sh\necho localhost\necho node2\n'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def generate(run_cli, tmp_path: Path, *args: str) -> Path:
    script = tmp_path / "ddp.sbatch"
    code, _, err = run_cli("slurm", *args, "--out", str(script), "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    return script


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis"])
@pytest.mark.parametrize("gpus", ["8", "0"])
def test_script_is_shellcheck_clean(run_cli, tmp_path: Path, runtime: str, gpus: str) -> None:
    script = generate(run_cli, tmp_path, IMAGE, "--runtime", runtime, "--nodes", "4", "--gpus-per-node", gpus,
                      "--partition", "gpu", "--account", "ml", "--cpus-per-task", "16")
    proc = subprocess.run(["shellcheck", "--severity=style", str(script)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout
    text = script.read_text()
    assert "#SBATCH --nodes=4" in text and "#SBATCH --ntasks-per-node=1" in text
    assert ("#SBATCH --gpus-per-node=8" in text) == (gpus == "8")
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --account=ml" in text


def test_shellcheck_is_not_blind(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/bash\nrm -rf $DIR/*\n")
    assert subprocess.run(["shellcheck", str(bad)], capture_output=True, timeout=60).returncode != 0


Calls = list[list[str]]


def dry_run(tmp_path: Path, script: Path, scripts_dir: Path) -> tuple[subprocess.CompletedProcess[str], Calls]:
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name, body in (("srun", SRUN), ("apptainer", APPTAINER), ("scontrol", SCONTROL)):
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    # torchrun of the host Python that has torch, first on PATH after the stubs.
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "torchrun").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m torch.distributed.run \"$@\"\n")
    (bindir / "torchrun").chmod(0o755)
    (bindir / "python3").symlink_to(sys.executable)
    log = tmp_path / "stub.log"
    log.write_text("")
    submit = tmp_path / "submit"
    submit.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": f"{stubs}:{bindir}:{os.environ['PATH']}", "STUB_LOG": str(log),
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "localhost,node2", "SLURM_SUBMIT_DIR": str(submit),
           "SCRIPTS_DIR": str(scripts_dir)}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=240, env=env, cwd=submit)
    calls = [line.split(" ", 1)[0:1] + line.rstrip("\n").split(" ", 1)[1].split("\0")
             for line in log.read_text().splitlines()]
    assert not list(submit.glob(".ddp-check-*")), "the job folder must be removed"
    return proc, calls


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis"])
def test_dry_run_runs_the_real_ddp_check(run_cli, tmp_path: Path, runtime: str) -> None:
    pytest.importorskip("torch", reason="the dry run trains on the host: pip install '.[scaling]'")
    port = free_port()
    script = generate(run_cli, tmp_path, IMAGE, "--runtime", runtime, "--nodes", "1", "--gpus-per-node", "0",
                      "--shm-size", "1m", "--rdzv-port", str(port))
    proc, calls = dry_run(tmp_path, script, REPO / "image-tests/scripts")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "DDP check passed: world size 1" in proc.stdout
    srun_calls = [c for c in calls if c[0] == "srun"]
    assert len(srun_calls) == 2  # the /dev/shm check, then the check itself
    launch = srun_calls[1][1:]
    assert launch[0] == "--kill-on-bad-exit=1"
    if runtime == "apptainer":
        apptainer = next(c for c in calls if c[0] == "apptainer")[1:]
        assert apptainer[:2] == ["exec", "--bind"] and "--nv" not in apptainer
        assert f"docker://{IMAGE}" in apptainer
        command = apptainer[apptainer.index(f"docker://{IMAGE}") + 1:]
    else:
        assert "--container-image=127.0.0.1:5000#pytorch-cpu-dev:0123456789ab-2.13" in launch
        command = launch[launch.index("python3"):]
    assert command[:3] == ["python3", "/opt/image-tests/scripts/verify_ddp.py", "torchrun"]
    assert f"--rdzv-endpoint=localhost:{port}" in command and "--rdzv-id=4242" in command
    assert "--rdzv-conf=join_timeout=900" in command and "--rdzv-backend=c10d" in command


def test_dry_run_fails_when_ranks_disagree(run_cli, tmp_path: Path) -> None:
    broken = tmp_path / "broken-scripts"
    broken.mkdir()
    (broken / "ddp_train.py").write_text(
        'print(\'DDP_RESULT {"world_size": 1, "first_loss": 1.0, "last_loss": 0.1, "identical": false}\')\n')
    script = generate(run_cli, tmp_path, IMAGE, "--nodes", "1", "--gpus-per-node", "0", "--shm-size", "1m",
                      "--rdzv-port", str(free_port()))
    # torchrun is stubbed by a plain python here: the fault is in what the script reports.
    proc, _ = dry_run(tmp_path, script, broken)
    assert proc.returncode != 0 and "ranks ended with different parameters" in proc.stderr


def test_dry_run_refuses_a_small_dev_shm(run_cli, tmp_path: Path) -> None:
    script = generate(run_cli, tmp_path, IMAGE, "--nodes", "2", "--gpus-per-node", "0", "--shm-size", "100000g")
    proc, calls = dry_run(tmp_path, script, REPO / "image-tests/scripts")
    assert proc.returncode == 1 and "/dev/shm on" in proc.stderr and "need 107374182400000" in proc.stderr
    assert not [c for c in calls if c[0] == "apptainer"], "the check must not start"


def test_default_shm_comes_from_the_cell(run_cli, tmp_path: Path) -> None:
    script = generate(run_cli, tmp_path, "127.0.0.1:5000/pytorch-ngc-dev:abc-25.10")
    assert f"SHM_BYTES={8 << 30}" in script.read_text()


def test_bad_runtime_is_exit_2(run_cli) -> None:
    code, out, err = run_cli("slurm", IMAGE, "--runtime", "docker", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and "--runtime" in err
