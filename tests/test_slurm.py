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
# apptainer run|exec [--nv] --bind SRC:DST:ro IMAGE CMD...: record, then run CMD with DST mapped to SRC.
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
SCONTROL = ('#!/bin/sh\nif [ "$2" = node ]; then echo "NodeName=$3 NodeAddr=127.0.0.1"; '
            'else echo localhost; echo node2; fi\n')


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


def fake_bundle(tmp_path: Path, machine: str | None = None) -> Path:
    """A bundle folder whose record (as `buildtool bundle` writes it) names `machine` (default: this host's)."""
    import platform

    bundle = tmp_path / "bundle"
    (bundle / "jobs").mkdir(parents=True)
    (bundle / "config.json").write_text("{}")
    (bundle / "entrypoint.args").write_text("")    # an image without ENTRYPOINT (the project's pip images)
    record = {"path": str(bundle), "shm_size": "1m"}
    if machine != "":
        record["machine"] = machine or platform.machine()
    (bundle / "dl-images-bundle.json").write_text(json.dumps(record, indent=1) + "\n")
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
    if runtime == "oci":   # first every node's architecture, against the bundle's platform
        assert srun_calls.pop(0)[1:] == ["--ntasks-per-node=1", "uname", "-m"]
    assert len(srun_calls) == 2  # the /dev/shm check, then the check itself
    launch = srun_calls[1][1:]
    assert launch[:2] == ["--kill-on-bad-exit=1", "--cpus-per-task=1"]   # a CPU job: one CPU for its one rank
    if runtime == "apptainer":
        apptainer = next(c for c in calls if c[0] == "apptainer")[1:]
        assert apptainer[:2] == ["run", "--bind"] and "--nv" not in apptainer
        assert f"docker://{IMAGE}" in apptainer
        command = apptainer[apptainer.index(f"docker://{IMAGE}") + 1:]
    elif runtime == "pyxis":
        assert "--container-image=127.0.0.1:5000#pytorch-cpu-dev:0123456789ab-2.13" in launch
        command = launch[launch.index("python3"):]
    else:
        # SLURM's own containers: the bundle, only the check's variables exported (the image's PATH survives),
        # the /dev/shm check inside the container, scripts in the bundle's jobs/ folder, removed afterwards.
        # DDP_EXPECT_*: what the verifier checks the run against (world size, backend).
        # DDP_NODES: the verifier finds this node's place there (the first hosts the c10d store).
        # PYTHONUNBUFFERED: the check's own lines reach the job's log even when a process dies.
        assert launch[2:4] == ["--export=DDP_EXPECT_BACKEND,DDP_EXPECT_WORLD_SIZE,DDP_NODES,DDP_NODE_ADDRS,DDP_STEPS,"
                               "DDP_TIMEOUT_S,PYTHONUNBUFFERED",
                               f"--container={bundle}"]
        shm = srun_calls[0][1:]
        assert shm[:3] == ["--ntasks-per-node=1", "--export=NONE", f"--container={bundle}"] and shm[3] == "sh"
        command = launch[launch.index("python3"):]
        assert command[:3] == ["python3", "/opt/dl-images/jobs/ddp-check-4242/verify_ddp.py", "torchrun"]
        assert command[-1] == "/opt/dl-images/jobs/ddp-check-4242/ddp_train.py"
        assert list((bundle / "jobs").iterdir()) == []
        command[1] = "/opt/image-tests/scripts/verify_ddp.py"
    assert command[:3] == ["python3", "/opt/image-tests/scripts/verify_ddp.py", "torchrun"]
    # The first node's address (localhost's, resolved by the batch script), not its name.
    assert f"--rdzv-endpoint=127.0.0.1:{port}" in command and "--rdzv-id=4242" in command
    # read_timeout follows the join timeout: torch's default (60 s) fails a node waiting for a late store host.
    assert "--rdzv-conf=join_timeout=900,read_timeout=900,is_host={is_host}" in command
    assert "--rdzv-backend=c10d" in command


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


DIGEST = "sha256:" + "ab" * 32
# enroot's image URI, as its import documents it (docker://[USER@][REGISTRY#]IMAGE[:TAG]) and parses it: an image of
# lower-case letters, digits and /._-, a tag of letters, digits and ._:- (the manifest reference it fetches).
ENROOT_URI = r"(?:(?P<registry>[^#]+)#)?(?P<image>[a-z0-9/._-]+)(?::(?P<tag>[A-Za-z0-9._:-]+))?"


@pytest.mark.parametrize(("image", "registry", "path"), [
    (f"127.0.0.1:5000/pytorch-cpu-dev:0123456789ab-2.13@{DIGEST}", "127.0.0.1:5000", "pytorch-cpu-dev"),
    (f"127.0.0.1:5000/pytorch-cpu-dev@{DIGEST}", "127.0.0.1:5000", "pytorch-cpu-dev"),
    (f"docker.io/library/ubuntu@{DIGEST}", None, "ubuntu"),
])
def test_pyxis_runs_the_image_a_digest_names(run_cli, tmp_path: Path, image: str, registry: str | None,
                                             path: str) -> None:
    """enroot's image URI has no `@digest`: `NAME@sha256:...` went to --container-image as it was, which enroot
    refuses on every node (Invalid image reference), and `NAME:TAG@sha256:...` lost its digest, so whatever the
    tag named that day ran. The digest goes where enroot takes a manifest reference: `REGISTRY#PATH:sha256:HEX`."""
    import re

    from buildtool.launch.slurm import enroot_image

    found = re.fullmatch(ENROOT_URI, enroot_image(image))
    assert found is not None, enroot_image(image)
    assert (found["registry"], found["image"], found["tag"]) == (registry, path, DIGEST)
    if "-2.13@" in image:   # a matrix image by its tag and digest: the script carries the digest
        script = generate(run_cli, tmp_path, image, "--runtime", "pyxis", "--gpus-per-node", "0",
                          "--framework", "pytorch")
        assert f"--container-image=127.0.0.1:5000#pytorch-cpu-dev:{DIGEST}" in script.read_text()


def test_apptainer_pulls_an_image_by_its_digest_alone(run_cli, tmp_path: Path) -> None:
    """Apptainer's docker:// pulls go through containers/image, which refuses a reference with a tag and a digest
    ("Docker references with both a tag and digest are currently not supported"): NAME:TAG@sha256:... failed on
    every node. The digest, which names the image, goes alone."""
    image = f"127.0.0.1:5000/pytorch-cpu-dev:0123456789ab-2.13@{DIGEST}"
    text = generate(run_cli, tmp_path, image, "--runtime", "apptainer", "--gpus-per-node", "0").read_text()
    assert f" docker://127.0.0.1:5000/pytorch-cpu-dev@{DIGEST} " in text and "-2.13@" not in text


def test_pyxis_refuses_a_sif_file_in_one_line(run_cli) -> None:
    """A .sif is Apptainer's image file; pyxis takes a registry reference. It ended in a ReferenceError traceback."""
    code, out, err = run_cli("slurm", "/shared/pytorch.sif", "--runtime", "pyxis", "--shm-size", "8g", "--framework",
                             "pytorch", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["error: '/shared/pytorch.sif' is a path: --runtime pyxis takes an image "
                                        "reference; a bundle folder needs --runtime oci"]


def test_oci_without_a_bundle_record_needs_shm_size(run_cli, tmp_path: Path) -> None:
    """Issue 21: no record to read the bundle's /dev/shm from is an error, not 8g."""
    bundle = fake_bundle(tmp_path)
    (bundle / "dl-images-bundle.json").unlink()
    code, out, err = run_cli("slurm", str(bundle), "--runtime", "oci", "--out", str(tmp_path / "s.sbatch"),
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "", err
    assert err.strip() == (f"error: no bundle record (dl-images-bundle.json) in {bundle} on this machine, so the "
                           "bundle's /dev/shm size is unknown; pass --shm-size (the size it was made with)"), err
    assert not (tmp_path / "s.sbatch").exists()


def test_a_bundle_record_with_no_size_is_named_not_shm_size_option(run_cli, tmp_path: Path) -> None:
    """A record whose shm_size is no size was reported as `--shm-size '8 GB' must be ...`: an option not given."""
    bundle = fake_bundle(tmp_path)
    (bundle / "dl-images-bundle.json").write_text(json.dumps({"shm_size": "8 GB"}))
    code, out, err = run_cli("slurm", str(bundle), "--runtime", "oci", "--framework", "pytorch", "--out",
                             str(tmp_path / "s.sbatch"), "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "", err
    assert err.strip() == (f"error: the bundle record (dl-images-bundle.json) in {bundle} gives shm_size '8 GB', "
                           "not a size like 8g or 512m; pass --shm-size (the size it was made with)"), err
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


def test_parse_output_skips_a_result_that_is_not_an_object() -> None:
    """`DDP_RESULT 5` (valid JSON, no object) was kept as the result and world_size raised AttributeError; it is
    skipped as broken JSON is, and an earlier object line stays the result."""
    odd = parse_output("DDP_RESULT 5\nDDP check passed: x")
    assert odd.passed and odd.result is None and odd.world_size == 0
    kept = parse_output('DDP_RESULT {"world_size": 2}\nDDP_RESULT [1]\nDDP check passed: x')
    assert kept.result == {"world_size": 2} and kept.world_size == 2
    assert parse_output('DDP_RESULT {"world_size": [2]}\nDDP check passed: x').world_size == 0


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
        (stubs / "scontrol").write_text('#!/bin/sh\n[ "$2" = node ] && echo "NodeName=n1 NodeAddr=127.0.0.1" '
                                        '|| echo n1\n')
        for stub in stubs.iterdir():
            stub.chmod(0o755)
        env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
               "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_SUBMIT_DIR": str(tmp_path)}
        proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env=env,
                              cwd=tmp_path)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == expected, proc.stderr


# -- issue 23 (5, 6): the rendezvous at an address, CPUs per task, NCCL settings ----------------------------

def _resolve_run(tmp_path: Path, script: Path, node_line: str,
                 env_extra: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], Calls]:
    """The script with stubs: scontrol knows nodes ghost1 and ghost2 (names that resolve nowhere) and prints
    NODE_LINE for `show node ghost1` (ghost2's NodeAddr is 127.0.0.2); srun records its arguments, runs nothing."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    (stubs / "scontrol").write_text(f'#!/bin/sh\nif [ "$3" = ghost1 ]; then echo {shlex.quote(node_line)}; '
                                    'elif [ "$2" = node ]; then echo "NodeName=$3 NodeAddr=127.0.0.2"; '
                                    'else printf "ghost1\\nghost2\\n"; fi\n')
    (stubs / "srun").write_text('#!/usr/bin/env python3\nimport os, sys\nwith open(os.environ["STUB_LOG"], "a") as log:'
                                '\n    log.write("srun " + "\\0".join(sys.argv[1:]) + "\\n")\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    log = tmp_path / "stub.log"
    log.write_text("")
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log), "SLURM_JOB_ID": "9",
           "SLURM_JOB_NODELIST": "ghost[1-2]", "SLURM_SUBMIT_DIR": str(tmp_path),
           "SCRIPTS_DIR": str(REPO / "image-tests/pytorch/scripts"), **(env_extra or {})}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    return proc, [line.rstrip("\n").split("\0") for line in log.read_text().splitlines()]


def test_the_rendezvous_is_at_the_first_nodes_address_not_its_name(run_cli, tmp_path: Path) -> None:
    """Containers may not resolve SLURM's node names (c10d then retried until the time limit): the batch script
    resolves the first node's NodeAddr and gives torchrun the address."""
    script = generate(run_cli, tmp_path, IMAGE, "--runtime", "pyxis", "--gpus-per-node", "0", "--rdzv-port", "29555")
    for node_line, env, endpoint in (
            ("NodeName=ghost1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.1.2.3 NodeHostName=ghost1", {}, "10.1.2.3"),
            ("NodeName=ghost1 NodeAddr=localhost NodeHostName=ghost1", {}, "127.0.0.1"),   # a name: resolved here
            ("NodeName=ghost1 NodeAddr=ghost1.invalid", {"RDZV_ADDR": "10.9.9.9"}, "10.9.9.9")):  # the override
        proc, calls = _resolve_run(tmp_path, script, node_line, env)
        assert proc.returncode == 0, proc.stderr
        launch = calls[-1]
        assert f"--rdzv-endpoint={endpoint}:29555" in launch, launch
        assert f"rendezvous at {endpoint}:29555 (node ghost1)" in proc.stdout
        assert "--local-addr={local_addr}" in launch   # each node's own, from DDP_NODE_ADDRS, by the verifier


def test_an_unresolvable_first_node_fails_fast_naming_it(run_cli, tmp_path: Path) -> None:
    script = generate(run_cli, tmp_path, IMAGE, "--runtime", "pyxis", "--gpus-per-node", "0")
    proc, calls = _resolve_run(tmp_path, script, "NodeName=ghost1 NodeAddr=ghost1.invalid NodeHostName=ghost1")
    message = ("DDP check failed: cannot resolve the address of node ghost1 (NodeAddr ghost1.invalid), which hosts "
               "the rendezvous; set RDZV_ADDR to its IP address")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == message, proc.stderr
    assert calls == []   # nothing started
    assert parse_output(proc.stdout + proc.stderr).reason == message


def test_a_node_scontrol_cannot_show_is_named_not_a_silent_exit(run_cli, tmp_path: Path) -> None:
    """`scontrol show node` failing (the controller busy or restarting) ended the script under `set -e` with exit 1
    and no line of its own, so the job read "ended without a result"; now the node is named as unresolvable."""
    script = generate(run_cli, tmp_path, IMAGE, "--runtime", "pyxis", "--gpus-per-node", "0")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "scontrol").write_text(
        '#!/bin/sh\nif [ "$2" = node ]; then echo "slurm_load_node error: Unable to contact slurm controller" >&2; '
        'exit 1; else printf "ghost1\\nghost2\\n"; fi\n')
    (stubs / "srun").write_text('#!/bin/sh\necho "srun $*" >> "$STUB_LOG"\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    log = tmp_path / "stub.log"
    log.write_text("")
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path, env={
        **os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log), "SLURM_JOB_ID": "9",
        "SLURM_JOB_NODELIST": "ghost[1-2]", "SLURM_SUBMIT_DIR": str(tmp_path),
        "SCRIPTS_DIR": str(REPO / "image-tests/pytorch/scripts")})
    calls = log.read_text().splitlines()
    message = ("DDP check failed: cannot resolve the address of node ghost1 (NodeAddr unknown), which hosts "
               "the rendezvous; set RDZV_ADDR to its IP address")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == message, proc.stderr
    assert calls == []   # nothing started
    assert parse_output(proc.stdout + proc.stderr).reason == message


@pytest.mark.parametrize(("runtime", "reader"), [("apptainer", "apptainer's --bind"),
                                               ("pyxis", "pyxis' --container-mounts")])
def test_a_submit_folder_with_a_bind_separator_stops_the_job_naming_it(run_cli, tmp_path: Path, runtime: str,
                                                                       reader: str) -> None:
    """The job folder (in the submit folder) goes into the runtime's bind list, SRC:DST:ro, comma-separated: a
    submit folder with ':' or ',' bound another path, or none, and the container failed with the runtime's own
    error. The job stops before anything starts, naming the folder."""
    script = generate(run_cli, tmp_path, IMAGE, "--runtime", runtime, "--gpus-per-node", "0")
    submit = tmp_path / "runs:2026,a"
    submit.mkdir()
    proc, calls = _resolve_run(tmp_path, script, "NodeName=ghost1 NodeAddr=127.0.0.1",
                               {"SLURM_SUBMIT_DIR": str(submit)})
    message = (f"DDP check failed: the job folder {submit}/.ddp-check-9 holds a ',' or ':', which {reader} reads "
               "as separators; submit from a folder without them")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == message, proc.stderr
    assert calls == [] and not list(submit.iterdir())   # nothing started, no job folder left
    assert parse_output(proc.stdout + proc.stderr).reason == message


def test_every_nodes_address_goes_to_torchrun_or_the_job_stops_naming_the_node(run_cli, tmp_path: Path) -> None:
    """torchrun's agent of group rank 0 gives the workers its own address (MASTER_ADDR), by default its node's
    name: each node's address goes to the verifier, which passes it as --local-addr."""
    script = generate(run_cli, tmp_path, IMAGE, "--runtime", "pyxis", "--gpus-per-node", "0")
    text = script.read_text()
    assert "export DDP_NODE_ADDRS" in text
    dump = tmp_path / "dump.sh"
    # Stop right after the addresses are known: print them.
    dump.write_text(text.replace("export DDP_NODE_ADDRS\n",
                                 'export DDP_NODE_ADDRS\necho "ADDRS $DDP_NODE_ADDRS"; exit 0\n'))
    proc, _ = _resolve_run(tmp_path, dump, "NodeName=ghost1 NodeAddr=10.1.2.3")
    assert proc.returncode == 0 and "ADDRS 10.1.2.3 127.0.0.2 " in proc.stdout, proc.stderr
    # A second node whose NodeAddr resolves nowhere: the job stops before anything starts, naming it.
    (tmp_path / "stubs" / "scontrol").write_text('#!/bin/sh\nif [ "$3" = ghost1 ]; then echo NodeAddr=10.1.2.3; '
                                                 'elif [ "$2" = node ]; then echo "NodeName=$3 NodeAddr=$3.invalid"; '
                                                 'else printf "ghost1\\nghost2\\n"; fi\n')
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path, env={
        **os.environ, "PATH": f"{tmp_path / 'stubs'}:{os.environ['PATH']}", "STUB_LOG": str(tmp_path / "stub.log"),
        "SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "ghost[1-2]", "SLURM_SUBMIT_DIR": str(tmp_path),
        "SCRIPTS_DIR": str(REPO / "image-tests/pytorch/scripts")})
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        "DDP check failed: cannot resolve the address of node ghost2 (NodeAddr ghost2.invalid), which torchrun's "
        "workers may need to reach"), proc.stderr


@pytest.mark.parametrize(("gpus", "args", "cpus"), [
    ("8", [], "32"),                         # 4 CPUs per GPU: the node's eight ranks do not share one CPU
    ("2", [], "8"),
    ("0", [], "1"),                          # a CPU check: one process
    ("8", ["--cpus-per-task", "12"], "12"),  # the site's figure
    ("8", ["--cpus-per-task", "0"], None),   # the partition's default: no directive
])
def test_the_one_task_per_node_gets_cpus_for_all_its_ranks(run_cli, tmp_path: Path, gpus: str, args: list[str],
                                                          cpus: str | None) -> None:
    text = generate(run_cli, tmp_path, IMAGE, "--gpus-per-node", gpus, *args).read_text()
    if cpus is None:
        assert "--cpus-per-task" not in text
        return
    assert f"#SBATCH --cpus-per-task={cpus}\n" in text
    # srun does not pass sbatch's --cpus-per-task to the step in SLURM 22.05 to 23.02: the step names it.
    assert f"\nsrun --kill-on-bad-exit=1 --cpus-per-task={cpus} apptainer run" in text


def test_a_negative_cpus_per_task_is_refused(run_cli) -> None:
    code, out, err = run_cli("slurm", IMAGE, "--cpus-per-task", "-1", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and "--cpus-per-task must be 0 (the partition's default) or more, not -1" in err


@pytest.mark.parametrize("runtime", ["apptainer", "oci"])
def test_nccl_settings_are_exported_only_when_set(run_cli, tmp_path: Path, runtime: str) -> None:
    image = str(fake_bundle(tmp_path)) if runtime == "oci" else IMAGE
    extra = ["--runtime", runtime, *(["--shm-size", "1g", "--framework", "pytorch"] if runtime == "oci" else [])]
    text = generate(run_cli, tmp_path, image, "--gpus-per-node", "8", *extra).read_text()
    assert "export NCCL_DEBUG=INFO\nexport NCCL_DEBUG_SUBSYS=INIT,NET\n" in text
    # (the embedded verifier and nccl_log.py name NCCL_IB_HCA, which they read: no such variable is set or exported)
    assert "export NCCL_SOCKET_IFNAME" not in text and "export NCCL_IB_HCA" not in text
    assert not [line for line in text.splitlines() if "srun" in line and ("NCCL_IB_HCA" in line or "IFNAME" in line)]
    text = generate(run_cli, tmp_path, image, "--gpus-per-node", "8", "--nccl-debug", "INFO", "--nccl-socket-ifname",
                    "ib0", "--nccl-ib-hca", "^mlx5_2", "--nccl-env", "NCCL_IB_GID_INDEX=3", *extra).read_text()
    for line in ("export NCCL_DEBUG=INFO", "export NCCL_SOCKET_IFNAME=ib0", "export NCCL_IB_HCA='^mlx5_2'",
                 "export NCCL_IB_GID_INDEX=3"):
        assert f"\n{line}\n" in text
    if runtime == "oci":   # SLURM's containers get only what --export names
        assert ("--export=DDP_EXPECT_BACKEND,DDP_EXPECT_TRANSPORT,DDP_EXPECT_WORLD_SIZE,DDP_GPUS_PER_NODE,DDP_NODES,"
                "DDP_NODE_ADDRS,DDP_STEPS,DDP_TIMEOUT_S,NCCL_DEBUG,NCCL_IB_GID_INDEX,NCCL_IB_HCA,"
                "NCCL_SOCKET_IFNAME,PYTHONUNBUFFERED") in text
    cpu = generate(run_cli, tmp_path, image, "--gpus-per-node", "0", *extra).read_text()
    # (the embedded verifier's text names NCCL_DEBUG in its transport message: no variable is set or exported)
    assert "export NCCL_" not in cpu and not [line for line in cpu.splitlines() if "srun" in line and "NCCL_" in line]


@pytest.mark.parametrize(("machine", "cause"), [
    ("riscv64", "DDP check failed: the bundle is for riscv64, but the nodes are {host} (uname -m); make a bundle of "
                "their platform (buildtool bundle --platform) or submit to nodes of its own"),
    ("", "dl-images-bundle.json records no platform (a bundle made before bundles recorded one): make it again "
         "with `buildtool bundle --platform`"),
])
def test_a_bundle_of_another_platform_than_the_nodes_is_refused_before_the_check(run_cli, tmp_path: Path,
                                                                               machine: str, cause: str) -> None:
    import platform

    bundle = fake_bundle(tmp_path, machine)
    script = generate(run_cli, tmp_path, str(bundle), "--runtime", "oci", "--nodes", "1", "--gpus-per-node", "0",
                      "--shm-size", "1m", "--framework", "pytorch")
    proc, calls = dry_run(tmp_path, script, REPO / "image-tests/pytorch/scripts")
    assert proc.returncode == 2, proc.stderr
    assert cause.format(host=platform.machine()) in proc.stderr, proc.stderr
    assert all("--kill-on-bad-exit=1" not in c for c in calls), "the check itself never started"


def _run_with_failing_srun(tmp_path: Path, script: Path, node: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The script run with an srun that fails as SLURM's does when a node never starts the step (each call logged)."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "srun").write_text('#!/bin/sh\necho "srun $*" >> "$STUB_LOG"\n'
                                f'echo "srun: error: Nodes {node} are still not ready" >&2; exit 1\n')
    (stubs / "scontrol").write_text(SCONTROL)
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    log = tmp_path / "stub.log"
    log.write_text("")
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log), "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "localhost,node2", "SLURM_SUBMIT_DIR": str(tmp_path),
           "SCRIPTS_DIR": str(REPO / "image-tests/pytorch/scripts")}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    return proc, log


def test_a_node_that_does_not_run_the_architecture_step_stops_the_job_naming_the_step(run_cli,
                                                                                    tmp_path: Path) -> None:
    """The oci script's `srun uname -m` step ran inside "$(...)" under set -e and pipefail: a node that never started
    it ended the script with srun's exit and no line of its own (the job read "ended without a result"). It is named
    as the /dev/shm step's failure is."""
    bundle = fake_bundle(tmp_path)
    script = generate(run_cli, tmp_path, str(bundle), "--runtime", "oci", "--nodes", "2", "--gpus-per-node", "0",
                      "--shm-size", "1m", "--framework", "pytorch")
    proc, log = _run_with_failing_srun(tmp_path, script, "n2")
    message = ("DDP check failed: the architecture check step (srun uname -m) failed (exit 1): a node did not run "
               "it (srun's error above)")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == message, proc.stderr
    assert len(log.read_text().splitlines()) == 1   # nothing ran after it
    assert parse_output(proc.stdout + proc.stderr).reason == message


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis"])
def test_a_node_that_does_not_run_the_dev_shm_step_stops_the_job_naming_the_step(run_cli, tmp_path: Path,
                                                                                runtime: str) -> None:
    """The /dev/shm step (srun bash -c ...) ran as a plain line under set -e: a node that never started it ended the
    script with srun's exit and no line of its own (the job read "ended without a result"). It is named."""
    script = generate(run_cli, tmp_path, IMAGE, "--runtime", runtime, "--nodes", "2", "--gpus-per-node", "0")
    proc, log = _run_with_failing_srun(tmp_path, script, "node2")
    message = ("DDP check failed: the /dev/shm check step failed (exit 1): a node's /dev/shm is too small (above), "
               "or the step did not start there (srun's error above)")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == message, proc.stderr
    assert len(log.read_text().splitlines()) == 1   # the check itself never started
    assert parse_output(proc.stdout + proc.stderr).reason == message
    assert not list(tmp_path.glob(".ddp-check-*")), "the job folder is removed"


# A folder name that ended "${VAR:-...}" early (`}`) or ran on the batch host ($(...), a backtick, `"`).
ODD_FOLDER = 'a}b $(touch PWNED) "q" `touch PWNED2` \'s\''
ODD_BUNDLE = 'a}b$(id>PWNED)"q"`id>PWNED2`\'s\''   # an image has no whitespace


def _odd_paths_script(tmp_path: Path, runtime: str) -> tuple[Path, Path, Path | None]:
    """A script whose --scripts-dir (and, for oci, bundle) is ODD_FOLDER; its command prints the copied file."""
    from buildtool.launch.multinode import MultiNodeJob
    from buildtool.launch.slurm import SlurmOptions, Workload, render

    scripts = tmp_path / "scripts" / ODD_FOLDER
    scripts.mkdir(parents=True)
    (scripts / "w.txt").write_text("from the folder given\n")
    bundle = fake_bundle(tmp_path / "bundles" / ODD_BUNDLE) if runtime == "oci" else None
    job = MultiNodeJob(image=str(bundle) if bundle else IMAGE, nodes=1, gpus_per_node=0, shm_size="1m")
    work = Workload(label="W", command=["env", "JOBDIR=$jobdir", "cat", "$workdir/w.txt"], copied=("w.txt",),
                    scripts_dir="x")
    script = tmp_path / "w.sbatch"
    script.write_text(render(job, SlurmOptions(runtime=runtime, scripts_dir=str(scripts)), work))
    return script, scripts, bundle


def _run_with_stubs(tmp_path: Path, script: Path) -> subprocess.CompletedProcess[str]:
    """SCRIPT under bash on one node n1: srun runs its command here, without the container."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "srun").write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n')
    (stubs / "scontrol").write_text('#!/bin/sh\n[ "$2" = node ] && echo "NodeName=n1 NodeAddr=127.0.0.1" || echo n1\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("SCRIPTS_DIR", "OCI_BUNDLE")}
    env |= {"PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1",
            "SLURM_SUBMIT_DIR": str(tmp_path)}
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)


@pytest.mark.parametrize("runtime", ["pyxis", "oci"])
def test_a_scripts_dir_or_bundle_with_shell_characters_is_taken_literally(tmp_path: Path, runtime: str) -> None:
    """--scripts-dir and the bundle path were written unquoted in "${VAR:-...}": a `}` cut the folder short and
    $(...) or a backtick ran on the batch host. They are quoted: the job reads the folder given, nothing else runs."""
    script, _, bundle = _odd_paths_script(tmp_path, runtime)
    proc = _run_with_stubs(tmp_path, script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "from the folder given" in proc.stdout
    assert not list(tmp_path.rglob("PWNED*")), "a command in the path ran"
    if bundle:
        assert (bundle / "jobs").is_dir() and not list((bundle / "jobs").iterdir()), "the job folder is in the bundle"


@pytest.mark.tools("shellcheck")
def test_a_script_with_quoted_paths_is_shellcheck_clean(tmp_path: Path) -> None:
    script, _, _ = _odd_paths_script(tmp_path, "oci")
    proc = subprocess.run(["shellcheck", "--severity=style", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout


def test_an_embedded_file_with_a_line_equal_to_its_marker_is_written_whole(tmp_path: Path) -> None:
    """A line `W_PY` in w.py ended its here-document early and bash ran the rest; the marker is one no line equals."""
    from buildtool.launch.multinode import MultiNodeJob
    from buildtool.launch.slurm import SlurmOptions, Workload, render

    text = "print(1)\nW_PY\nW_PY_END\ntouch PWNED\n"
    work = Workload(label="W", command=["cat", "$workdir/w.py"], embedded={"w.py": text})
    script = tmp_path / "w.sbatch"
    script.write_text(render(MultiNodeJob(image=IMAGE, nodes=1, gpus_per_node=0, shm_size="1m"),
                             SlurmOptions(runtime="pyxis"), work))
    proc = _run_with_stubs(tmp_path, script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.endswith(text), proc.stdout
    assert not list(tmp_path.rglob("PWNED*"))


@pytest.mark.parametrize("path", ["/shared/$(touch PWNED).sif", "/shared/`id`.sif", '/shared/a".sif',
                                  "/shared/a\\\\.sif"])
def test_a_sif_path_that_the_shell_would_expand_is_refused(run_cli, tmp_path: Path, path: str) -> None:
    """The .sif goes on the srun line double-quoted (so $jobdir expands there): `$(...)`, a backtick, a quote or a
    backslash in its name would run or break on the batch host. Refused in one line; nothing is written."""
    out_file = tmp_path / "s.sbatch"
    code, out, err = run_cli("slurm", path, "--runtime", "apptainer", "--shm-size", "8g", "--framework", "pytorch",
                             "--out", str(out_file), "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and not out_file.exists()
    assert err.strip().splitlines() == [f"error: {path!r}: a .sif path with '$`\"\\\\' in it would run as shell on "
                                        "the batch host; rename the file"]


def test_an_empty_job_name_is_refused(run_cli, tmp_path: Path) -> None:
    """--name '' wrote `#SBATCH --job-name=` and the log `--output=-%j.out`; it is refused in one line. An empty
    --partition or --account still means the site's default."""
    code, out, err = run_cli("slurm", IMAGE, "--name", "", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and err.strip() == ("error: --name '' is not a SLURM job name (letters, digits, "
                                                       "'_', '.', '-')"), err
    script = generate(run_cli, tmp_path, IMAGE, "--partition", "", "--account", "")
    assert "--partition" not in script.read_text() and "--account" not in script.read_text()


# srun that runs `uname -m`, passes the /dev/shm check and, for the step that runs the check (--kill-on-bad-exit),
# writes the environment the step would get as JSON: SLURM's --export=NAMES gives it those variables only.
SRUN_ENV = r'''#!/usr/bin/env python3
import json, os, platform, sys
args = sys.argv[1:]
if args[-2:] == ["uname", "-m"]:
    print(platform.machine())
elif "--kill-on-bad-exit=1" in args:
    export = next((a.split("=", 1)[1] for a in args if a.startswith("--export=")), "ALL")
    names = None if export == "ALL" else set(export.split(","))
    with open(os.environ["STEP_ENV"], "w") as out:
        json.dump({k: v for k, v in os.environ.items() if names is None or k in names}, out)
'''
# NCCL values that are free text, as NCCL takes them: aws-ofi-nccl's plugin name (a space), NCCL 2.24's per-function
# algorithms (`;`, `,`: SLURM's --export splits on commas), a topology file whose path has a space and quotes.
NCCL_TEXT = {"NCCL_NET": "AWS Libfabric", "NCCL_ALGO": "allreduce:tree,ring;broadcast:ring",
             "NCCL_TOPO_FILE": "/shared/topo files/it's \"p5\".xml"}


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis", "oci"])
def test_nccl_env_values_with_spaces_reach_the_step_as_given(run_cli, tmp_path: Path, runtime: str) -> None:
    """--nccl-env took a value only if it was one word: NCCL_NET="AWS Libfabric" (aws-ofi-nccl's name, the one way
    to pin EFA) exited 2. The sbatch script run by bash hands srun the value byte for byte, under every runtime (oci:
    a bundle made by `buildtool bundle`, whose step gets only what --export names)."""
    image = str(fake_bundle(tmp_path)) if runtime == "oci" else IMAGE
    extra = ["--shm-size", "1m", "--framework", "pytorch"] if runtime == "oci" else []
    given = [a for name, value in NCCL_TEXT.items() for a in ("--nccl-env", f"{name}={value}")]
    script = generate(run_cli, tmp_path, image, "--runtime", runtime, "--nodes", "2", "--gpus-per-node", "8",
                      "--fabric-rate", "p5.48xlarge", *extra, *given)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "srun").write_text(SRUN_ENV)
    (stubs / "scontrol").write_text(SCONTROL)
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    step = tmp_path / "step-env.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env |= {"PATH": f"{stubs}:{os.environ['PATH']}", "STEP_ENV": str(step), "SLURM_JOB_ID": "7",
            "SLURM_JOB_NODELIST": "localhost,node2", "SLURM_SUBMIT_DIR": str(tmp_path),
            "SCRIPTS_DIR": str(REPO / "image-tests/pytorch/scripts")}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(step.read_text())
    assert {name: got.get(name) for name in NCCL_TEXT} == NCCL_TEXT
    assert got["DDP_EXPECT_TRANSPORT"] == "EFA" and got["NCCL_DEBUG"] == "INFO"


@pytest.mark.parametrize("command", ["slurm", "k8s"])
def test_an_nccl_variable_given_twice_is_exit_2_never_one_value_dropped(run_cli, command: str) -> None:
    """Two --nccl-env values of one variable: the job got the last and the first was dropped without a word."""
    code, out, err = run_cli(command, "127.0.0.1:5000/pytorch-ngc-dev:0123456789ab-25.01", "--gpus-per-node", "8",
                             "--nccl-env", "NCCL_NET_GDR_LEVEL=PHB", "--nccl-env", "NCCL_NET_GDR_LEVEL=SYS",
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "--nccl-env NCCL_NET_GDR_LEVEL is given twice (PHB and SYS); give it once" in err, err


@pytest.mark.parametrize("limit", ["0", "00:00:00", "0-00:00"])
def test_a_time_limit_of_zero_is_exit_2_as_sbatch_reads_it_no_limit(run_cli, tmp_path: Path, limit: str) -> None:
    """sbatch: "A time limit of zero requests that no time limit be imposed". `--time 0` made a job with no bound,
    whose hung node held the allocation forever; the scaling benchmark's jobs too."""
    code, out, err = run_cli("slurm", IMAGE, "--time", limit, "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"--time {limit} is no time limit to SLURM (zero imposes none)" in err, err
    code, out, err = run_cli("scaling", "--launcher", "slurm", "--runtime", "oci", "--image", "/b", "--shm-size", "8g",
                             "--time", limit, "--out", str(tmp_path / "m"), "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and f"--time {limit} is no time limit to SLURM" in err and not (tmp_path / "m").exists(), err
    assert "--time=00:01:00" in generate(run_cli, tmp_path, IMAGE, "--time", "00:01:00").read_text()
