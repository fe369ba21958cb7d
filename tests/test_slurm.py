"""`buildtool slurm`: shellcheck-clean, and a dry run with stub srun/scontrol/apptainer on PATH that
record their arguments and then run the real check on this machine (torch on the host, CPU, gloo)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.common.net import free_port
from buildtool.launch.slurm import parse_output

REPO = Path(__file__).resolve().parent.parent
IMAGE = "127.0.0.1:5000/pytorch-cpu-dev:0123456789ab-2.13"

# srun: record, drop srun options (pyxis' --container-* and SLURM's --container=BUNDLE included, remapping
# their mounts: the bundle's jobs/ folder is seen at /opt/dl-images/jobs), run the rest.
SRUN_ARGS = r'''import os, sys
with open(os.environ["STUB_LOG"], "a") as log:
    log.write("srun " + "\0".join(sys.argv[1:]) + "\n")
args, mounts = sys.argv[1:], []
while args and args[0].startswith("-"):
    if args[0].startswith("--container-mounts="):
        src, dst = args[0].split("=", 1)[1].split(":")[:2]
        mounts.append((dst, src))
    if args[0].startswith("--container="):
        mounts.append(("/opt/dl-images/jobs", args[0].split("=", 1)[1] + "/jobs"))
    args = args[1:]
args = [a.replace(dst, src) if a.startswith(dst) else a for a in args for dst, src in (mounts or [("\0", "")])]
'''
SRUN = "#!/usr/bin/env python3\n" + SRUN_ARGS + "os.execvp(args[0], args)\n"
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


def generate(run_cli, tmp_path: Path, *args: str) -> Path:
    script = tmp_path / "ddp.sbatch"
    code, _, err = run_cli("slurm", *args, "--out", str(script), "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    return script


@pytest.mark.tools("shellcheck")
@pytest.mark.parametrize("runtime", ["apptainer", "pyxis", "oci"])
@pytest.mark.parametrize("gpus", ["8", "0"])
def test_script_is_shellcheck_clean(run_cli, tmp_path: Path, runtime: str, gpus: str) -> None:
    image = "/shared/bundles/pytorch-cpu" if runtime == "oci" else IMAGE
    # A bundle on the cluster, not here: no record to read its /dev/shm from, and no matrix cell to say its framework.
    shm = ["--shm-size", "8g", "--framework", "pytorch"] if runtime == "oci" else []
    script = generate(run_cli, tmp_path, image, "--runtime", runtime, "--nodes", "4", "--gpus-per-node", gpus,
                      "--partition", "gpu", "--account", "ml", "--cpus-per-task", "16", *shm)
    proc = subprocess.run(["shellcheck", "--severity=style", str(script)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout
    text = script.read_text()
    assert "#SBATCH --nodes=4" in text and "#SBATCH --ntasks-per-node=1" in text
    assert ("#SBATCH --gpus-per-node=8" in text) == (gpus == "8")
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --account=ml" in text


@pytest.mark.tools("shellcheck")
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


def fake_bundle(tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle"
    (bundle / "jobs").mkdir(parents=True)
    (bundle / "config.json").write_text("{}")
    return bundle


@pytest.mark.host_torch
@pytest.mark.parametrize("runtime", ["apptainer", "pyxis", "oci"])
def test_dry_run_runs_the_real_ddp_check(run_cli, tmp_path: Path, runtime: str) -> None:
    port = free_port()
    bundle = fake_bundle(tmp_path)
    script = generate(run_cli, tmp_path, str(bundle) if runtime == "oci" else IMAGE, "--runtime", runtime,
                      "--nodes", "1", "--gpus-per-node", "0", "--shm-size", "1m", "--rdzv-port", str(port),
                      *(["--framework", "pytorch"] if runtime == "oci" else []))   # a bundle: no matrix cell
    proc, calls = dry_run(tmp_path, script, REPO / "image-tests/pytorch/scripts")
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
    elif runtime == "pyxis":
        assert "--container-image=127.0.0.1:5000#pytorch-cpu-dev:0123456789ab-2.13" in launch
        command = launch[launch.index("python3"):]
    else:
        # SLURM's own containers: the bundle, only the check's variables exported (the image's PATH survives),
        # the /dev/shm check inside the container, scripts in the bundle's jobs/ folder, removed afterwards.
        # DDP_EXPECT_*: what the verifier checks the run against (world size, backend).
        assert launch[1:3] == ["--export=DDP_EXPECT_BACKEND,DDP_EXPECT_WORLD_SIZE,DDP_STEPS,DDP_TIMEOUT_S",
                               f"--container={bundle}"]
        shm = srun_calls[0][1:]
        assert shm[:3] == ["--ntasks-per-node=1", "--export=NONE", f"--container={bundle}"] and shm[3] == "sh"
        command = launch[launch.index("python3"):]
        assert command[:3] == ["python3", "/opt/dl-images/jobs/ddp-check-4242/verify_ddp.py", "torchrun"]
        assert command[-1] == "/opt/dl-images/jobs/ddp-check-4242/ddp_train.py"
        assert list((bundle / "jobs").iterdir()) == []
        command[1] = "/opt/image-tests/scripts/verify_ddp.py"
    assert command[:3] == ["python3", "/opt/image-tests/scripts/verify_ddp.py", "torchrun"]
    assert f"--rdzv-endpoint=localhost:{port}" in command and "--rdzv-id=4242" in command
    # read_timeout follows the join timeout: torch's default (60 s) fails a node waiting for a late store host.
    assert "--rdzv-conf=join_timeout=900,read_timeout=900" in command and "--rdzv-backend=c10d" in command


@pytest.mark.host_torch
def test_dry_run_fails_when_ranks_disagree(run_cli, tmp_path: Path) -> None:
    broken = tmp_path / "broken-scripts"
    broken.mkdir()
    (broken / "ddp_train.py").write_text(
        'print(\'DDP_RESULT {"backend": "gloo", "world_size": 1, "first_loss": 1.0, "last_loss": 0.1, '
        '"identical": false}\')\n')
    script = generate(run_cli, tmp_path, IMAGE, "--nodes", "1", "--gpus-per-node", "0", "--shm-size", "1m",
                      "--rdzv-port", str(free_port()))
    # torchrun is stubbed by a plain python here: the fault is in what the script reports.
    proc, _ = dry_run(tmp_path, script, broken)
    # The job's output (stdout and stderr together, as SLURM writes it) says why.
    assert proc.returncode != 0 and "ranks ended with different parameters" in proc.stdout
    assert parse_output(proc.stdout + proc.stderr).reason == "DDP check failed: ranks ended with different parameters"


def test_dry_run_refuses_a_small_dev_shm(run_cli, tmp_path: Path) -> None:
    script = generate(run_cli, tmp_path, IMAGE, "--nodes", "2", "--gpus-per-node", "0", "--shm-size", "100000g")
    proc, calls = dry_run(tmp_path, script, REPO / "image-tests/pytorch/scripts")
    assert proc.returncode == 1 and "/dev/shm on" in proc.stderr and "need 107374182400000" in proc.stderr
    assert not [c for c in calls if c[0] == "apptainer"], "the check must not start"


def test_default_shm_comes_from_the_cell(run_cli, tmp_path: Path) -> None:
    script = generate(run_cli, tmp_path, "127.0.0.1:5000/pytorch-ngc-dev:abc-25.10")
    assert f"SHM_BYTES={8 << 30}" in script.read_text()


def test_bad_runtime_is_exit_2(run_cli) -> None:
    code, out, err = run_cli("slurm", IMAGE, "--runtime", "docker", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and "--runtime" in err


def test_oci_takes_a_bundle_folder_and_the_others_an_image(run_cli) -> None:
    matrix = ["--matrix", str(REPO / "matrix.yaml")]
    code, out, err = run_cli("slurm", IMAGE, "--runtime", "oci", *matrix)
    assert code == 2 and out == "" and "--runtime oci takes the bundle folder" in err
    code, out, err = run_cli("slurm", "/shared/bundles/pytorch-cpu", "--runtime", "pyxis", *matrix)
    assert code == 2 and out == "" and "a bundle folder needs --runtime oci" in err
    code, out, err = run_cli("slurm", IMAGE, "--time", "soon", *matrix)
    assert code == 2 and out == "" and "--time 'soon'" in err


def test_oci_without_a_bundle_record_needs_shm_size(run_cli, tmp_path: Path) -> None:
    """Issue 21: no record to read the bundle's /dev/shm from is an error, not 8g."""
    bundle = fake_bundle(tmp_path)
    code, out, err = run_cli("slurm", str(bundle), "--runtime", "oci", "--out", str(tmp_path / "s.sbatch"),
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "", err
    assert err.strip() == (f"error: no bundle record (dl-images-bundle.json) in {bundle} on this machine, so the "
                           "bundle's /dev/shm size is unknown; pass --shm-size (the size it was made with)"), err
    assert not (tmp_path / "s.sbatch").exists()


def test_oci_shm_comes_from_the_bundle_record(run_cli, tmp_path: Path) -> None:
    bundle = fake_bundle(tmp_path)
    (bundle / "dl-images-bundle.json").write_text(json.dumps({"shm_size": "2g"}))
    script = generate(run_cli, tmp_path, str(bundle), "--runtime", "oci", "--framework", "pytorch")
    text = script.read_text()
    assert f"SHM_BYTES={2 << 30}" in text and f'OCI_BUNDLE="${{OCI_BUNDLE:-{bundle}}}"' in text


# What the jobs printed on the real cluster (tests/integration/test_slurm_cluster.py), shortened.
RENDEZVOUS_TIMEOUT = """\
torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed.
srun: error: n2: task 1: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=4.1
srun: error: n1: task 0: Terminated
DDP check failed: the c10d rendezvous timed out: not every node joined within the join timeout of 8 s (n2 gave up \
first: task 1: Exited with exit code 1)
"""
KILLED = """\
[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:21207: Connection reset by peer.
srun: error: n2: task 1: Exited with exit code 137
srun: launch/slurm: _step_signal: Terminating StepId=19.1
srun: error: n1: task 0: Terminated
DDP check failed on node n2: task 1: Exited with exit code 137; --kill-on-bad-exit stopped the other nodes
"""
SHM = """\
error: /dev/shm on n3 is 67108864 bytes, need 8589934592 as the run profile says
srun: error: n3: task 1: Exited with exit code 1
"""
PASSED = """\
DDP_RESULT {"backend": "gloo", "world_size": 2, "nnodes": 2, "first_loss": 4.49, "last_loss": 0.05, "identical": true}
DDP check passed: world size 2, loss 4.4937 -> 0.0577
"""
TIME_LIMIT = "slurmstepd-n1: error: *** JOB 18 ON n1 CANCELLED AT 2026-11-30T07:14:13 DUE TO TIME LIMIT ***\n"


def test_parse_output() -> None:
    passed = parse_output(PASSED)
    assert passed.passed and passed.world_size == 2 and passed.result and passed.result["identical"]
    rdzv = parse_output(RENDEZVOUS_TIMEOUT)
    assert not rdzv.passed and rdzv.rendezvous_timeout and rdzv.failed_node == "n2"
    assert "join timeout of 8 s" in rdzv.reason
    killed = parse_output(KILLED)
    assert not killed.passed and not killed.rendezvous_timeout and killed.failed_node == "n2"
    assert killed.reason.startswith("DDP check failed on node n2: task 1: Exited with exit code 137")
    shm = parse_output(SHM)
    assert not shm.passed and shm.failed_node == "n3" and shm.reason.startswith("error: /dev/shm on n3 is 67108864")
    limit = parse_output(PASSED.splitlines()[0] + "\n" + TIME_LIMIT)
    assert not limit.passed and limit.reason == "DDP check failed: the job reached its time limit"
    assert not parse_output("").passed and parse_output("").reason == "DDP check failed: the job ended without a result"
    norun = parse_output('runc run failed: unable to start container process: error setting rlimits for ready '
                         'process: error setting rlimit type 8: operation not permitted\n'
                         'srun: error: n1: task 0: Exited with exit code 1\n'
                         'DDP check failed: the /dev/shm check step failed (exit 1): a node\'s /dev/shm is too small '
                         '(above), or the container did not start there (runc\'s error above)\n')
    assert not norun.passed and norun.failed_node == "n1" and "the /dev/shm check step failed" in norun.reason
    # A pass line followed by a failure (the verifier passed on one node, another failed) is a failure.
    assert not parse_output(PASSED + KILLED).passed


def test_the_failure_summary_names_what_srun_reported(tmp_path: Path) -> None:
    """The script's epilogue, run against srun outputs as the real cluster printed them."""
    from buildtool.launch.multinode import MultiNodeJob
    from buildtool.launch.slurm import SlurmOptions, Workload, render

    cases = {"rdzv": (RENDEZVOUS_TIMEOUT.split("DDP check failed")[0],
                      "DDP check failed: the c10d rendezvous timed out: not every node joined within the join timeout "
                      "of 8 s (n2 gave up first: task 1: Exited with exit code 1)"),
             "killed": (KILLED.split("DDP check failed")[0], "DDP check failed on node n2: task 1: Exited with exit "
                        "code 137; --kill-on-bad-exit stopped the other nodes"),
             "silent": ("", "DDP check failed: the step exited 3 (see the output above)")}
    for name, (printed, expected) in cases.items():
        (tmp_path / f"{name}.txt").write_text(printed)
        job = MultiNodeJob(image=IMAGE, nodes=2, gpus_per_node=0, join_timeout_s=8, shm_size="1m")
        work = Workload(label="DDP check", command=["sh", "-c", f"cat {tmp_path / name}.txt; exit 3"])
        script = tmp_path / f"{name}.sbatch"
        script.write_text(render(job, SlurmOptions(runtime="pyxis"), work))
        stubs = tmp_path / "stubs"
        stubs.mkdir(exist_ok=True)
        (stubs / "srun").write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n')
        (stubs / "scontrol").write_text("#!/bin/sh\necho n1\n")
        for stub in stubs.iterdir():
            stub.chmod(0o755)
        env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
               "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_SUBMIT_DIR": str(tmp_path)}
        proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env=env,
                              cwd=tmp_path)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == expected, proc.stderr
