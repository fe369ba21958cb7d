"""The multi-node check is the image's framework's, declared in its folder (framework.yaml `multinode`).

Shown with the fixture framework (tests/fixtures/frameworks/fixturefw: `multinode: {script:
fixture_train.py, launcher: coordinator}`, a plain-socket stand-in for a coordinator framework such as
JAX) added to a copy of the fixture project: the sbatch script and the manifests run its script with
one process per node, the coordinator on the first node, and each node's process id resolved on the
node by the verifier. The SLURM dry run starts one task per node, each seeing its own hostname, and
runs the real script (standard library only: no torch needed here). Refusals are asserted by their
one-line messages. The PyTorch (torchrun) side is tests/test_slurm.py and tests/test_k8s.py.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from buildtool.common.net import free_port
from buildtool.contracts import frameworks
from buildtool.launch.multinode import VERIFY_FILES, MultiNodeJob, write_verifier
from buildtool.launch.slurm import parse_output
from tests.test_framework_folder import FIXTURE_FW, add_fixture_framework
from tests.test_k8s import validate
from tests.test_slurm import APPTAINER, SRUN_ARGS

REPO = Path(__file__).resolve().parent.parent
IMAGE = "127.0.0.1:5000/fixturefw-img-dev:0123456789ab-1.0"     # the fixture framework's matrix cell
FOREIGN = "ghcr.io/someone/other:1"
NODES = ("localhost", "node2", "node3")    # the stub scontrol's allocation: the first must resolve here

# srun for several nodes on one machine: one task per name in STUB_HOSTNAMES (default: the node list), each
# seeing that name as its hostname (sitecustomize.py in STUB_SITE patches socket.gethostname). Options are
# dropped as in test_slurm.py (pyxis' mounts and the OCI bundle's jobs/ folder mapped to this machine). Like
# --kill-on-bad-exit, the first task to fail ends the others (each task's process group), named as srun names it.
SRUN_TASKS = "#!/usr/bin/env python3\nimport signal, subprocess, time\n" + SRUN_ARGS + r'''
hosts = os.environ.get("STUB_HOSTNAMES", "").split() or os.environ["STUB_NODES"].split()
env = {**os.environ, "PYTHONPATH": os.environ["STUB_SITE"]}
tasks = [subprocess.Popen(args, env={**env, "STUB_HOSTNAME": host}, start_new_session=True) for host in hosts]
failed = None
while any(t.poll() is None for t in tasks):
    if failed is None:
        failed = next((i for i, t in enumerate(tasks) if t.poll() not in (None, 0)), None)
        if failed is not None:
            print(f"srun: error: {hosts[failed]}: task {failed}: Exited with exit code {tasks[failed].returncode}",
                  file=sys.stderr, flush=True)
            for t in tasks:
                if t.poll() is None:
                    os.killpg(t.pid, signal.SIGTERM)   # the task and what it started, as slurmstepd does
    time.sleep(0.05)
failed = next((i for i, t in enumerate(tasks) if t.returncode != 0), None) if failed is None else failed
sys.exit(0 if failed is None else tasks[failed].returncode)
'''
SITE = '''import os, socket
if os.environ.get("STUB_HOSTNAME"):
    socket.gethostname = lambda: os.environ["STUB_HOSTNAME"]
'''


@pytest.fixture(scope="module")
def fw_project(tmp_path_factory: pytest.TempPathFactory, fixture_project: Path) -> Path:
    """The fixture project with the fixture framework and its image (fixturefw-img:1.0) added."""
    root = tmp_path_factory.mktemp("multinode") / "project"
    shutil.copytree(fixture_project, root, ignore=shutil.ignore_patterns(".git"))
    add_fixture_framework(root)
    return root


def _matrix(project: Path) -> list[str]:
    return ["--matrix", str(project / "matrix.yaml")]


def slurm_script(run_cli, project: Path, tmp_path: Path, image: str, *args: str) -> Path:
    script = tmp_path / "check.sbatch"
    code, _, err = run_cli("slurm", image, *args, "--out", str(script), *_matrix(project))
    assert code == 0, err
    return script


def slurm_dry_run(tmp_path: Path, script: Path, *, nodes: tuple[str, ...] = NODES[:2],
                  hostnames: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    """Run the sbatch script with stub srun/scontrol/apptainer: every node a task on this machine."""
    stubs, site = tmp_path / "stubs", tmp_path / "site"
    for folder in (stubs, site):
        folder.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE)
    for name, body in (("srun", SRUN_TASKS), ("apptainer", APPTAINER),
                       ("scontrol", "#!/bin/sh\nfor n in $STUB_NODES; do echo \"$n\"; done\n")):
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    if not (bindir / "python3").exists():
        (bindir / "python3").symlink_to(sys.executable)
    log = tmp_path / "stub.log"
    log.write_text("")
    submit = tmp_path / "submit"
    submit.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": f"{stubs}:{bindir}:{os.environ['PATH']}", "STUB_LOG": str(log),
           "STUB_SITE": str(site), "STUB_NODES": " ".join(nodes), "STUB_HOSTNAMES": " ".join(hostnames),
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": ",".join(nodes), "SLURM_SUBMIT_DIR": str(submit),
           "SCRIPTS_DIR": str(FIXTURE_FW / "scripts")}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120, env=env, cwd=submit)
    calls = [line.split(" ", 1)[0:1] + line.rstrip("\n").split(" ", 1)[1].split("\0")
             for line in log.read_text().splitlines()]
    assert not list(submit.glob(".ddp-check-*")), "the job folder must be removed"
    return proc, calls


def fake_bundle(tmp_path: Path) -> Path:
    """A bundle folder with the record `buildtool bundle` writes (its platform: this host's, as the nodes')."""
    from tests.test_slurm import fake_bundle as recorded

    return recorded(tmp_path)


def _result(output: str) -> dict:
    [line] = [line for line in output.splitlines() if line.startswith("DDP_RESULT ")]
    return json.loads(line[len("DDP_RESULT "):])


# -- the row ------------------------------------------------------------------------------------------

def test_the_frameworks_declare_their_multinode_check() -> None:
    pytorch = frameworks.get("pytorch").multinode
    assert pytorch is not None and (pytorch.script, pytorch.launcher) == ("ddp_train.py", "torchrun")
    assert frameworks.get("tensorflow").multinode is None
    fixture = frameworks.load_row(FIXTURE_FW).multinode
    assert fixture is not None and (fixture.framework, fixture.script, fixture.launcher) == (
        "fixturefw", "fixture_train.py", "coordinator")


def test_a_coordinator_job_has_one_process_per_node() -> None:
    check = frameworks.load_row(FIXTURE_FW).multinode
    job = MultiNodeJob(image="x:1", nodes=3, gpus_per_node=8, check=check, steps=7, join_timeout_s=30)
    assert (job.world_size, job.backend, job.procs_per_node) == (3, "nccl", 1)
    assert job.env == {"DDP_EXPECT_WORLD_SIZE": "3", "DDP_EXPECT_BACKEND": "nccl", "PYTHONUNBUFFERED": "1",
                       "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "DDP_GPUS_PER_NODE": "8"}
    assert job.command("h1:29400", "r", "/s") == [
        "python3", "/s/verify_ddp.py", "python3", "/s/fixture_train.py", "--coordinator", "h1:29400",
        "--num-processes", "3", "--process-id", "{process_id}", "--steps", "7", "--init-timeout", "30"]


# -- SLURM ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("runtime", ["apptainer", "pyxis", "oci"])
def test_sbatch_runs_the_frameworks_script_with_the_coordinator_on_the_first_node(
        run_cli, fw_project: Path, tmp_path: Path, runtime: str) -> None:
    image = str(fake_bundle(tmp_path)) if runtime == "oci" else IMAGE
    extra = ["--shm-size", "1m", "--framework", "fixturefw"] if runtime == "oci" else []
    text = slurm_script(run_cli, fw_project, tmp_path, image, "--runtime", runtime, "--nodes", "3",
                        "--gpus-per-node", "8", "--steps", "5", "--join-timeout", "30", *extra).read_text()
    assert "torchrun --" not in text and "rdzv" not in text
    assert 'SCRIPTS_DIR="${SCRIPTS_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/image-tests/fixturefw/scripts}"' in text
    assert 'cp "$SCRIPTS_DIR/fixture_train.py" "$workdir/fixture_train.py"' in text
    assert "# The first node of the allocation hosts the coordinator (process 0)." in text
    assert 'DDP_NODES="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tr \'\\n\' \' \')"\nexport DDP_NODES' in text
    # one process per node: the world is the nodes, whatever the GPUs
    assert "export DDP_EXPECT_WORLD_SIZE=3\n" in text and "export DDP_EXPECT_BACKEND=nccl\n" in text
    assert "DDP_STEPS" not in text
    assert ('"$jobdir/verify_ddp.py" python3 "$jobdir/fixture_train.py" --coordinator "$endpoint" --num-processes 3 '
            "--process-id '{process_id}' --steps 5 --init-timeout 30") in text
    if runtime == "oci":
        assert "--export=DDP_EXPECT_BACKEND,DDP_EXPECT_WORLD_SIZE,DDP_GPUS_PER_NODE,DDP_NODES" in text


@pytest.mark.tools("shellcheck")
@pytest.mark.parametrize("runtime", ["apptainer", "pyxis", "oci"])
def test_coordinator_sbatch_is_shellcheck_clean(run_cli, fw_project: Path, tmp_path: Path, runtime: str) -> None:
    image = "/shared/bundles/fixturefw" if runtime == "oci" else IMAGE
    extra = ["--shm-size", "1g", "--framework", "fixturefw"] if runtime == "oci" else []
    script = slurm_script(run_cli, fw_project, tmp_path, image, "--runtime", runtime, *extra)
    proc = subprocess.run(["shellcheck", "--severity=style", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis", "oci"])
def test_dry_run_gives_each_node_its_process_id(run_cli, fw_project: Path, tmp_path: Path, runtime: str) -> None:
    """Three nodes, three tasks on this machine, each with its node's hostname: ids 0, 1, 2 follow the
    allocation's order, and process 0 (the first node) hosts the coordinator the others reach."""
    bundle = fake_bundle(tmp_path)
    port = free_port()
    extra = ["--framework", "fixturefw"] if runtime == "oci" else []
    script = slurm_script(run_cli, fw_project, tmp_path, str(bundle) if runtime == "oci" else IMAGE,
                          "--runtime", runtime, "--nodes", "3", "--gpus-per-node", "0", "--shm-size", "1m",
                          "--rdzv-port", str(port), "--join-timeout", "20", *extra)
    proc, calls = slurm_dry_run(tmp_path, script, nodes=NODES)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = _result(proc.stdout)
    assert result["hosts"] == list(NODES)         # process i ran on the allocation's node i
    assert result["world_size"] == 3 and result["identical"] and result["backend"] == "gloo"
    assert "DDP check passed: world size 3, gloo" in proc.stdout
    launch = [c for c in calls if c[0] == "srun"][-1]
    # The first node's address (the batch script resolved localhost), not its name.
    assert f"127.0.0.1:{port}" in launch and launch[launch.index("--process-id") + 1] == "{process_id}"
    if runtime == "oci":
        assert list((bundle / "jobs").iterdir()) == []


def test_dry_run_fails_on_a_node_whose_hostname_is_not_in_the_allocation(run_cli, fw_project: Path,
                                                                         tmp_path: Path) -> None:
    """Never process id 0 by default: a container whose hostname is not its node's name stops, naming both."""
    script = slurm_script(run_cli, fw_project, tmp_path, IMAGE, "--runtime", "pyxis", "--nodes", "2",
                          "--gpus-per-node", "0", "--shm-size", "1m", "--rdzv-port", str(free_port()),
                          "--join-timeout", "20")
    proc, _ = slurm_dry_run(tmp_path, script, hostnames=("localhost", "stranger"))
    assert proc.returncode != 0
    message = ("DDP check failed: this container's hostname 'stranger' is none of the job's nodes (localhost, node2), "
               "so it has no process id; the container must have its node's hostname (SLURM's NodeName)")
    assert message in proc.stdout.splitlines(), proc.stdout[-3000:]   # the step's output, as SLURM writes it
    assert parse_output(proc.stdout + proc.stderr).reason == message


# -- Kubernetes ---------------------------------------------------------------------------------------

def _k8s(run_cli, project: Path, *args: str) -> list[dict]:
    code, out, err = run_cli("k8s", *args, *_matrix(project))
    assert code == 0, err
    return list(yaml.safe_load_all(out))


def test_k8s_coordinator_check_is_an_indexed_job(run_cli, fw_project: Path) -> None:
    docs = _k8s(run_cli, fw_project, IMAGE, "--nodes", "3", "--gpus-per-node", "8", "--steps", "6")
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Job"]   # the default for a coordinator check
    for doc in docs:
        validate(doc)
    assert docs[0]["data"] == {"fixture_train.py": (fw_project / "image-tests/fixturefw/scripts/fixture_train.py")
                               .read_text(), **VERIFY_FILES}
    container = docs[2]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == [
        "python3", "/opt/image-tests/scripts/verify_ddp.py", "python3", "/opt/image-tests/scripts/fixture_train.py",
        "--coordinator", "ddp-check-0.ddp-check:29400", "--num-processes", "3", "--process-id", "{process_id}",
        "--steps", "6", "--init-timeout", "900"]
    assert {e["name"]: e["value"] for e in container["env"]} == {
        "DDP_EXPECT_BACKEND": "nccl", "DDP_EXPECT_WORLD_SIZE": "3", "NCCL_DEBUG": "INFO", "PYTHONUNBUFFERED": "1",
        "NCCL_DEBUG_SUBSYS": "INIT,NET", "DDP_GPUS_PER_NODE": "8",
        "DDP_RDZV_HOST": "ddp-check-0.ddp-check", "DDP_RESOLVE_TIMEOUT_S": "900",
        "DDP_APPEND_LIBRARY_PATH": "/usr/local/nvidia/lib64"}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_k8s_pods_take_their_process_id_from_the_completion_index(run_cli, fw_project: Path, tmp_path: Path) -> None:
    """The indexed Job's command, run as two pods would run it (JOB_COMPLETION_INDEX 0 and 1) on this machine."""
    port = free_port()
    docs = _k8s(run_cli, fw_project, IMAGE, "--nodes", "2", "--gpus-per-node", "0", "--rdzv-port", str(port),
                "--join-timeout", "20")
    for name, text in docs[0]["data"].items():
        (tmp_path / name).write_text(text)
    container = docs[2]["spec"]["template"]["spec"]["containers"][0]
    command = [a.replace("/opt/image-tests/scripts", str(tmp_path)).replace(f"ddp-check-0.ddp-check:{port}",
                                                                              f"127.0.0.1:{port}")
               for a in container["args"]]
    command[0] = command[2] = sys.executable
    env = {**os.environ, **{e["name"]: e["value"] for e in container["env"]}}
    assert env["DDP_RDZV_HOST"] == "ddp-check-0.ddp-check"
    env["DDP_RDZV_HOST"] = "localhost"    # the Service's name for pod 0, here
    pods = [subprocess.Popen(command, env={**env, "JOB_COMPLETION_INDEX": str(i)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for i in (1, 0)]
    outs = [p.communicate(timeout=60) for p in pods]
    assert [p.returncode for p in pods] == [0, 0], outs
    assert "DDP check passed: world size 2, gloo" in outs[1][0] and _result(outs[1][0])["world_size"] == 2


# -- refusals, each by its message ------------------------------------------------------------------------

def test_pytorchjob_is_refused_for_a_coordinator_check(run_cli, fw_project: Path) -> None:
    code, out, err = run_cli("k8s", IMAGE, "--variant", "pytorchjob", *_matrix(fw_project))
    assert code == 2 and out == ""
    assert err.strip() == ("error: --variant pytorchjob runs torchrun under Kubeflow's training operator, and "
                           "fixturefw's multi-node check is a coordinator check (fixture_train.py, one process per "
                           "node): use --variant job"), err


@pytest.mark.parametrize("command", ["k8s", "slurm"])
def test_a_framework_without_a_multinode_check_is_refused(run_cli, fw_project: Path, command: str) -> None:
    code, out, err = run_cli(command, "127.0.0.1:5000/tensorflow-cpu-dev:0123456789ab-2.21", *_matrix(fw_project))
    assert code == 2 and out == "", err
    assert err.strip() == ("error: framework tensorflow declares no multi-node check: add `multinode: {script: ..., "
                           "launcher: torchrun|coordinator}` to image-tests/tensorflow/framework.yaml"), err


@pytest.mark.parametrize("script", ["verify_ddp.py", "nccl_log.py", "busbw.py"])
def test_a_check_script_named_as_a_file_the_verifier_ships_is_refused(script: str) -> None:
    """The check's script and the verifier's files share one folder (the ConfigMap's data, the sbatch job folder):
    a framework whose multinode.script was named verify_ddp.py, nccl_log.py or busbw.py had it replaced by the
    shipped file without a word, and the job ran that as its check. Refused, naming the framework.yaml key."""
    import dataclasses

    from buildtool.common.errors import UserError
    from buildtool.contracts import frameworks
    from buildtool.launch.multinode import check_of

    row = frameworks.get("pytorch")
    assert row.multinode is not None
    named = dataclasses.replace(row, multinode=dataclasses.replace(row.multinode, script=script))
    with pytest.raises(UserError) as caught:
        check_of(named)
    assert str(caught.value) == (f"image-tests/pytorch/framework.yaml: multinode.script {script!r} is the name of a "
                                 "file shipped beside the check (verify_ddp.py, nccl_log.py, busbw.py), which would "
                                 "replace it in the job; rename the script")


@pytest.mark.parametrize(("command", "image", "args", "what"), [
    ("k8s", FOREIGN, ["--shm-size", "2g"], "no image of the matrix"),
    ("slurm", FOREIGN, ["--shm-size", "2g"], "no image of the matrix"),
    ("slurm", "/shared/images/other.sif", ["--shm-size", "2g"], "a file, not a registry image"),
    ("slurm", "/shared/bundles/other", ["--runtime", "oci", "--shm-size", "2g"], "a file, not a registry image"),
])
def test_an_image_the_matrix_does_not_know_needs_framework(run_cli, fw_project: Path, tmp_path: Path, command: str,
                                                           image: str, args: list[str], what: str) -> None:
    """Fail closed: never PyTorch's check by default."""
    target = tmp_path / "out"
    code, out, err = run_cli(command, image, *args, "--out", str(target), *_matrix(fw_project))
    assert code == 2 and out == "" and not target.exists()
    assert err.strip() == (f"error: {image} is {what}, so its framework is unknown; pass --framework NAME "
                           "(fixturefw, pytorch, tensorflow) to say whose multi-node check runs in it"), err
    platform = ["--platform", "linux/amd64"] if command == "k8s" else []   # nor its platform
    code, out, err = run_cli(command, image, *args, "--framework", "fixturefw", *platform, "--out", str(target),
                             *_matrix(fw_project))
    assert code == 0, err
    assert "fixture_train.py" in target.read_text()


def test_framework_must_agree_with_the_images_cell_and_exist(run_cli, fw_project: Path) -> None:
    code, out, err = run_cli("slurm", IMAGE, "--framework", "pytorch", *_matrix(fw_project))
    assert code == 2 and out == ""
    assert err.strip() == (f"error: --framework pytorch, but {IMAGE} is an image of fixturefw (the matrix cell "
                           "fixturefw-img:1.0); leave --framework out"), err
    code, out, err = run_cli("k8s", FOREIGN, "--shm-size", "2g", "--framework", "jax", *_matrix(fw_project))
    assert code == 2 and out == ""
    assert err.strip() == ("error: --framework 'jax' is no framework; one of fixturefw, pytorch, tensorflow (a "
                           "framework is a folder image-tests/<name>/ with its framework.yaml)"), err


def test_the_verifier_fails_a_process_0_that_reports_nothing(tmp_path: Path) -> None:
    """With torchrun any node may host rank 0; a coordinator check's process 0 must print the result line."""
    verify = write_verifier(tmp_path)
    env = {**os.environ, "DDP_EXPECT_WORLD_SIZE": "2", "DDP_EXPECT_BACKEND": "gloo"}
    silent = [sys.executable, str(verify), sys.executable, "-c", "pass", "{process_id}"]
    proc = subprocess.run(silent, capture_output=True, text=True, timeout=60, env={**env, "JOB_COMPLETION_INDEX": "0"})
    assert proc.returncode == 1
    assert proc.stderr.strip() == "DDP check failed: process 0 ended without its DDP_RESULT line"
    proc = subprocess.run(silent, capture_output=True, text=True, timeout=60, env={**env, "JOB_COMPLETION_INDEX": "1"})
    assert proc.returncode == 0, proc.stderr


def test_the_verifier_fails_a_malformed_result_in_one_line_after_the_check_ends(tmp_path: Path) -> None:
    """A DDP_RESULT line that is not JSON, not an object, or lacks what the checks read failed the verifier with a
    traceback (JSONDecodeError, KeyError) while the check still ran; now one line, once the check has ended."""
    verify = write_verifier(tmp_path)
    env = {**os.environ, "DDP_EXPECT_WORLD_SIZE": "1", "DDP_EXPECT_BACKEND": "gloo", "JOB_COMPLETION_INDEX": "0"}
    done = tmp_path / "done"
    for line, why in (("{bad", "a DDP_RESULT line that is not JSON (Expecting property name"),
                      ("5", "a DDP_RESULT line that is not a JSON object: 5"),
                      ('{"backend": "gloo", "world_size": true, "identical": true, "first_loss": 1}',
                       "DDP_RESULT line has no valid world_size (a whole number), last_loss (a number)")):
        done.unlink(missing_ok=True)
        check = (f"import time; print('DDP_RESULT ' + {line!r}, flush=True); time.sleep(0.5); print('after'); "
                 f"open({str(done)!r}, 'w').close()")
        proc = subprocess.run([sys.executable, str(verify), sys.executable, "-c", check, "{process_id}"],
                              capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("DDP check failed: "), proc.stderr
        assert why in proc.stderr, proc.stderr
        assert done.exists() and proc.stdout.endswith("after\n")   # the check ran to its end, waited for
    proc = subprocess.run([sys.executable, str(verify), "true"], capture_output=True, text=True, timeout=60,
                          env={**env, "DDP_RDZV_HOST": "localhost", "DDP_RESOLVE_TIMEOUT_S": "abc"})
    assert proc.returncode == 1
    assert proc.stderr == ("DDP check failed: DDP_RESOLVE_TIMEOUT_S='abc' is not a whole number of seconds (how long "
                           "to wait for the rendezvous host's name to resolve)\n"), proc.stderr


def test_the_verifier_needs_somewhere_to_read_the_process_id_from(tmp_path: Path) -> None:
    verify = write_verifier(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("JOB_COMPLETION_INDEX", "DDP_NODES")}
    env.update(DDP_EXPECT_WORLD_SIZE="2", DDP_EXPECT_BACKEND="gloo")
    proc = subprocess.run([sys.executable, str(verify), "echo", "{process_id}"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == ("DDP check failed: no process id for this node: neither JOB_COMPLETION_INDEX (a "
                                   "Kubernetes indexed Job) nor DDP_NODES (the SLURM job's node names) is set")
    # A node name with its domain matches the short hostname, and the other way round.
    for nodes, host, want in (("a.example b.example", "b", "1"), ("a b", "b.example", "1"), ("a b", "a", "0")):
        site = tmp_path / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(SITE)
        proc = subprocess.run([sys.executable, str(verify), "echo", "{process_id}"], capture_output=True, text=True,
                              timeout=60, env={**env, "DDP_NODES": nodes, "STUB_HOSTNAME": host,
                                               "PYTHONPATH": str(site)})
        assert proc.stdout == f"{want}\n", proc.stderr
        assert proc.returncode == (1 if want == "0" else 0), proc.stderr   # a process 0 must report a result


def test_the_verifier_says_which_slurm_node_hosts_the_store(tmp_path: Path) -> None:
    """torchrun under SLURM: the first node of DDP_NODES hosts the c10d store (is_host), found by this container's
    hostname, and the node's address from DDP_NODE_ADDRS is its agent's --local-addr; where the hostname is none
    of the nodes, torch decides both as it did before (and the log says so)."""
    verify, site = write_verifier(tmp_path), tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    conf = "--rdzv-conf=join_timeout=9,read_timeout=9,is_host={is_host}"
    for hostname, flag, local in (("n1", ",is_host=true", ["--local-addr=10.0.0.1"]),
                                  ("n2.cluster.example", ",is_host=false", ["--local-addr=10.0.0.2"]),
                                  ("stranger", "", [])):
        env = {**os.environ, "PYTHONPATH": str(site), "STUB_HOSTNAME": hostname, "DDP_NODES": "n1 n2 ",
               "DDP_NODE_ADDRS": "10.0.0.1 10.0.0.2 ", "DDP_EXPECT_WORLD_SIZE": "2", "DDP_EXPECT_BACKEND": "gloo"}
        env.pop("JOB_COMPLETION_INDEX", None)
        run = subprocess.run([sys.executable, str(verify), sys.executable, "-c", "import sys; print(sys.argv[1:])",
                              conf, "--local-addr={local_addr}"], capture_output=True, text=True, timeout=60, env=env)
        assert run.stdout.strip() == str([f"--rdzv-conf=join_timeout=9,read_timeout=9{flag}", *local]), run.stderr
        assert ("is none of the job's nodes" in run.stderr) == (hostname == "stranger")


def test_a_process_id_outside_the_node_addresses_is_refused_naming_it(tmp_path: Path) -> None:
    """JOB_COMPLETION_INDEX=-1 took the last node's address (Python's negative index), and an index past the list
    dropped --local-addr silently; now either stops the node in one line, the second naming the node count."""
    verify = write_verifier(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "DDP_NODES"}
    env.update(DDP_NODE_ADDRS="1.2.3.4 5.6.7.8", DDP_OWN_WORKLOAD="1", DDP_EXPECT_WORLD_SIZE="1",
               DDP_EXPECT_BACKEND="gloo")
    for index, why in (("-1", "JOB_COMPLETION_INDEX='-1' is not a whole number (this pod's index in its Kubernetes "
                              "indexed Job: the node's process id)"),
                       ("2", "this node's process id 2 (JOB_COMPLETION_INDEX) is outside DDP_NODE_ADDRS, which names "
                             "2 node(s) (process ids 0 to 1)")):
        proc = subprocess.run([sys.executable, str(verify), "echo", RDZV_CONF, "--local-addr={local_addr}"],
                              capture_output=True, text=True, timeout=60, env={**env, "JOB_COMPLETION_INDEX": index})
        assert (proc.returncode, proc.stdout) == (1, ""), proc.stdout
        assert proc.stderr == f"DDP check failed: {why}\n", proc.stderr
    proc = subprocess.run([sys.executable, str(verify), "echo", RDZV_CONF, "--local-addr={local_addr}"],
                          capture_output=True, text=True, timeout=60, env={**env, "JOB_COMPLETION_INDEX": "1"})
    assert proc.stdout == "--rdzv-conf=join_timeout=9,read_timeout=9,is_host=false --local-addr=5.6.7.8\n"


@pytest.mark.parametrize("index", ["a", "-1", " 1", "1_0"])
def test_a_completion_index_that_is_no_whole_number_is_refused_in_one_line(tmp_path: Path, index: str) -> None:
    """JOB_COMPLETION_INDEX=a ended in a traceback (int()) for a command with {is_host} or {local_addr}, and went
    into a {process_id} as it was; now every use stops the node in one line naming the variable and its value."""
    verify = write_verifier(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("DDP_NODES", "DDP_NODE_ADDRS")}
    env.update(JOB_COMPLETION_INDEX=index, DDP_EXPECT_WORLD_SIZE="1", DDP_EXPECT_BACKEND="gloo")
    for command, addrs in ((["echo", "--rdzv-conf=x,is_host={is_host}"], ""),
                           (["echo", "--rdzv-conf=x,is_host={is_host}", "--local-addr={local_addr}"], "1.2.3.4"),
                           (["echo", "{process_id}"], "")):
        proc = subprocess.run([sys.executable, str(verify), *command], capture_output=True, text=True, timeout=60,
                              env={**env, "DDP_NODE_ADDRS": addrs})
        assert (proc.returncode, proc.stdout) == (1, ""), proc.stdout
        assert proc.stderr == (f"DDP check failed: JOB_COMPLETION_INDEX={index!r} is not a whole number (this pod's "
                               "index in its Kubernetes indexed Job: the node's process id)\n"), proc.stderr


@pytest.mark.parametrize(("first", "last", "field"), [("Infinity", "1.0", "first_loss"),
                                                      ("1.0", "-Infinity", "last_loss")])
def test_the_verifier_fails_a_loss_that_is_no_finite_number(tmp_path: Path, first: str, last: str, field: str) -> None:
    """json reads Infinity and -Infinity, and `last < first` holds for 1.0 after Infinity and -Infinity after 1.0:
    such a result passed (`loss inf -> 1.0000`). Now it is a malformed result, named in one line."""
    verify = write_verifier(tmp_path)
    env = {**os.environ, "DDP_EXPECT_WORLD_SIZE": "1", "DDP_EXPECT_BACKEND": "gloo", "JOB_COMPLETION_INDEX": "0"}
    line = f'{{"backend": "gloo", "world_size": 1, "identical": true, "first_loss": {first}, "last_loss": {last}}}'
    proc = subprocess.run([sys.executable, str(verify), sys.executable, "-c", f"print('DDP_RESULT ' + {line!r})",
                           "{process_id}"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 1 and "DDP check passed" not in proc.stdout, proc.stdout
    assert proc.stderr == f"DDP check failed: the check's DDP_RESULT line has no valid {field} (a number): {line}\n"


# -- torchrun: which node holds rank 0 is torch's choice; the check's DDP_RANK lines say ----------------------

# A stand-in for torchrun on one node: prints a DDP_RANK line for each global rank in argv[1] (local world size: how
# many), then argv[2] as rank 0's result when given, and exits 0. The rendezvous configuration follows, as torchrun's.
TORCHRUN_NODE = """\
import json, sys
ranks = [int(r) for r in sys.argv[1].split(",") if r]
for local, rank in enumerate(ranks):
    print("DDP_RANK " + json.dumps({"rank": rank, "local_rank": local, "local_world_size": int(sys.argv[3])}))
if sys.argv[2]:
    print("DDP_RESULT " + sys.argv[2])
"""
GOOD = json.dumps({"backend": "gloo", "world_size": 4, "identical": True, "first_loss": 2.0, "last_loss": 0.5})
RDZV_CONF = "--rdzv-conf=join_timeout=9,read_timeout=9,is_host={is_host}"


def torchrun_node(tmp_path: Path, index: str, ranks: str, result: str = "", local_world: int = 2,
                  **env: str) -> subprocess.CompletedProcess[str]:
    """The verifier around TORCHRUN_NODE on pod INDEX of an indexed Job of 2 nodes x 2 processes (gloo)."""
    verify = write_verifier(tmp_path)
    stand_in = tmp_path / "torchrun_node.py"
    stand_in.write_text(TORCHRUN_NODE)
    full = {k: v for k, v in os.environ.items() if k not in ("DDP_NODES", "DDP_OWN_WORKLOAD")}
    full |= {"DDP_EXPECT_WORLD_SIZE": "4", "DDP_EXPECT_BACKEND": "gloo", "JOB_COMPLETION_INDEX": index, **env}
    return subprocess.run([sys.executable, str(verify), sys.executable, str(stand_in), ranks, result,
                           str(local_world), RDZV_CONF], capture_output=True, text=True, timeout=60, env=full)


def test_under_torchrun_a_node_that_ran_rank_0_without_its_result_fails(tmp_path: Path) -> None:
    """The verifier required rank 0's DDP_RESULT only of a process id 0 (a coordinator check): under torchrun a rank 0
    that printed nothing and exited 0 passed on every node, and the Job succeeded. Now the node whose DDP_RANK lines
    include global rank 0 fails, naming it, whichever pod it is."""
    host = socket.gethostname()
    for index in ("0", "1"):
        proc = torchrun_node(tmp_path, index, "0,1")
        assert proc.returncode == 1, proc.stdout
        assert proc.stderr == f"DDP check failed: global rank 0 ran on this node ({host}) and ended without its " \
                              "DDP_RESULT line\n", proc.stderr
        assert "DDP check passed" not in proc.stdout


def test_rank_0_on_a_node_other_than_the_rendezvous_host_is_verified_there(tmp_path: Path) -> None:
    """torch may give rank 0 to a node that does not host the store (pod 1 here): that node verifies the result and
    passes; pod 0, whose ranks are 2 and 3, passes saying where rank 0 ran; a bad result fails on pod 1."""
    host = socket.gethostname()
    store = torchrun_node(tmp_path, "0", "2,3")
    assert store.returncode == 0, store.stderr
    assert "DDP check passed" not in store.stdout
    assert store.stdout.endswith(f"verify_ddp.py: global rank(s) 2, 3 ran on this node ({host}); rank 0 ran on "
                                 "another node, whose verifier checks its DDP_RESULT\n"), store.stdout
    rank0 = torchrun_node(tmp_path, "1", "0,1", GOOD)
    assert rank0.returncode == 0, rank0.stderr
    assert "DDP check passed: world size 4, gloo, transport Socket, loss 2.0000 -> 0.5000" in rank0.stdout
    bad = torchrun_node(tmp_path, "1", "0,1", GOOD.replace('"identical": true', '"identical": false'))
    assert bad.returncode == 1 and bad.stderr == "DDP check failed: ranks ended with different parameters\n"


def test_a_torchrun_node_that_cannot_tell_where_rank_0_ran_fails(tmp_path: Path) -> None:
    """No DDP_RANK line (the reader's reproducer: a check that prints nothing), a local rank without one, or a
    malformed one: nothing says rank 0 ran elsewhere, so the node fails in one line rather than pass by default."""
    host = socket.gethostname()
    verify = write_verifier(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("JOB_COMPLETION_INDEX", "DDP_NODES", "DDP_OWN_WORKLOAD")}
    env |= {"DDP_EXPECT_WORLD_SIZE": "2", "DDP_EXPECT_BACKEND": "gloo"}
    silent = subprocess.run([sys.executable, str(verify), sys.executable, "-c", "pass"], capture_output=True,
                            text=True, timeout=60, env=env)
    assert silent.returncode == 1 and silent.stdout == ""
    assert silent.stderr.startswith(f"DDP check failed: the check printed no DDP_RANK line on this node ({host}), so "
                                    "nothing says whether global rank 0 ran here and owed its DDP_RESULT line"), \
        silent.stderr
    assert len(silent.stderr.splitlines()) == 1
    partial = torchrun_node(tmp_path, "0", "3")   # local rank 1 of 2 never said
    assert partial.returncode == 1
    assert partial.stderr == ("DDP check failed: this node's DDP_RANK lines do not cover its local ranks (local world "
                              f"size 2; no line from local rank(s) 1), so nothing says whether global rank 0 ran here "
                              f"({host}) and owed its DDP_RESULT line\n"), partial.stderr
    odd = subprocess.run([sys.executable, str(verify), sys.executable, "-c", "print('DDP_RANK {\"rank\": -1}')"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert odd.returncode == 1
    assert odd.stderr == ("DDP check failed: the check's DDP_RANK line needs rank, local_rank and local_world_size "
                          "(whole numbers, local_rank below local_world_size; restart, if there, a whole number): "
                          '{"rank": -1}\n'), odd.stderr
    # The scaling benchmark's own workload prints SCALING_RESULT, which its caller reads: nothing is owed here.
    own = subprocess.run([sys.executable, str(verify), sys.executable, "-c", "pass"], capture_output=True, text=True,
                         timeout=60, env={**env, "DDP_OWN_WORKLOAD": "1"})
    assert own.returncode == 0, own.stderr


def pytorchjob_node(tmp_path: Path, rank: str, ranks: str, result: str = "") -> subprocess.CompletedProcess[str]:
    """The verifier around TORCHRUN_NODE in pod RANK of a PyTorchJob of 2 nodes x 2 processes (gloo): the operator's
    RANK, no completion index, and the node rank in the command as the PyTorchJob gives it."""
    verify = write_verifier(tmp_path)
    stand_in = tmp_path / "torchrun_node.py"
    stand_in.write_text(TORCHRUN_NODE)
    env = {k: v for k, v in os.environ.items() if k not in ("JOB_COMPLETION_INDEX", "DDP_NODES", "DDP_OWN_WORKLOAD")}
    env |= {"DDP_EXPECT_WORLD_SIZE": "4", "DDP_EXPECT_BACKEND": "gloo", "RANK": rank}
    return subprocess.run([sys.executable, str(verify), sys.executable, str(stand_in), ranks, result, "2",
                           "--node-rank={node_rank}"], capture_output=True, text=True, timeout=60, env=env)


def test_a_pytorchjobs_master_without_rank_0s_result_fails(tmp_path: Path) -> None:
    """The operator reports the Master's outcome alone. Rank 0 on a Worker (c10d's choice) left the Master passing
    ("rank 0 ran on another node") while the Worker that failed rank 0's checks restarted in place: the job read
    Succeeded. Now the PyTorchJob's Master is node rank 0 and owes rank 0's result whatever its DDP_RANK lines say;
    a Worker passes without it, naming the Master; the Master judges the result it ran."""
    master = pytorchjob_node(tmp_path, "0", "2,3")
    assert master.returncode == 1, master.stdout
    assert master.stderr == ("DDP check failed: node rank 0 (RANK=0: the PyTorchJob's Master, whose outcome is the "
                             "job's) runs global rank 0, which ended without its DDP_RESULT line\n"), master.stderr
    assert "DDP check passed" not in master.stdout and "rank 0 ran on another node" not in master.stdout
    worker = pytorchjob_node(tmp_path, "1", "2,3")
    assert worker.returncode == 0, worker.stderr
    assert worker.stdout.endswith("verify_ddp.py: node rank 1 (RANK); global rank 0 runs on node rank 0 (the "
                                  "PyTorchJob's Master), whose verifier checks its DDP_RESULT\n"), worker.stdout
    passed = pytorchjob_node(tmp_path, "0", "0,1", GOOD)
    assert passed.returncode == 0 and "DDP check passed: world size 4, gloo" in passed.stdout, passed.stderr
    bad = pytorchjob_node(tmp_path, "0", "0,1", GOOD.replace('"identical": true', '"identical": false'))
    assert bad.returncode == 1 and bad.stderr == "DDP check failed: ranks ended with different parameters\n"


@pytest.mark.host_torch
def test_the_pytorchjobs_command_gives_its_master_rank_0_under_real_torchrun(tmp_path: Path) -> None:
    """The PyTorchJob's command (torchrun's static rendezvous, the node rank from RANK) on two nodes of this machine,
    the Worker (RANK=1) started first, around the real ddp_train.py: the Master ran rank 0 and verified its result."""
    job = MultiNodeJob(image="x:1", nodes=2, gpus_per_node=0, check=frameworks.get("pytorch").multinode,
                       join_timeout_s=60)
    port = free_port()
    command = job.command(f"127.0.0.1:{port}", "t", str(REPO / "image-tests/pytorch/scripts"), ranked=True)
    at = command.index("torchrun")
    command[at:at + 1] = [sys.executable, "-m", "torch.distributed.run"]
    command[0] = sys.executable
    write_verifier(tmp_path)
    command[1] = str(tmp_path / "verify_ddp.py")
    env = {k: v for k, v in os.environ.items() if k not in ("JOB_COMPLETION_INDEX", "DDP_NODES", "DDP_OWN_WORKLOAD")}
    env |= {**job.env, "DDP_STEPS": "5", "DDP_BUSBW": "0", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("IMAGETEST_OUT", None)
    nodes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**env, "RANK": rank}) for rank in ("1", "0")]
    (worker, _), (master, _) = outs = [node.communicate(timeout=240) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outs
    assert '"rank": 0' in master and "\nDDP check passed: world size 2, gloo" in master, outs
    assert '"rank": 1' in worker and "global rank 0 runs on node rank 0" in worker, outs


@pytest.mark.host_torch
def test_pytorchs_check_says_its_ranks_on_every_node_under_torchrun(tmp_path: Path) -> None:
    """Two nodes on this machine, each torchrun (one CPU process) inside the verifier around the real ddp_train.py:
    exactly one node saw rank 0 and verified its result; the other passed saying rank 0 ran elsewhere."""
    verify, port = write_verifier(tmp_path), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("JOB_COMPLETION_INDEX", "DDP_NODES", "DDP_OWN_WORKLOAD")}
    env |= {"DDP_EXPECT_WORLD_SIZE": "2", "DDP_EXPECT_BACKEND": "gloo", "DDP_STEPS": "5", "DDP_TIMEOUT_S": "60",
            "DDP_BUSBW": "0", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("IMAGETEST_OUT", None)
    nodes = [subprocess.Popen(
        [sys.executable, str(verify), sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
         "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=t",
         f"--rdzv-conf=join_timeout=60,read_timeout=60,is_host={'true' if i == 0 else 'false'}",
         "--max-restarts=0", str(REPO / "image-tests/pytorch/scripts/ddp_train.py")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    outs = [node.communicate(timeout=240) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outs
    passed = [out for out, _ in outs if "\nDDP check passed: world size 2, gloo" in out]
    elsewhere = [out for out, _ in outs if "rank 0 ran on another node, whose verifier checks its DDP_RESULT" in out]
    assert len(passed) == 1 and len(elsewhere) == 1, outs
    assert '"rank": 0' in passed[0] and '"rank": 1' in elsewhere[0]
