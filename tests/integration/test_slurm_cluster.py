"""The generated SLURM scripts on a real SLURM: munged, slurmctld and slurmd n1, n2, n3 on this machine
(tests/slurmcluster), real containers (runc through SLURM's oci.conf, and an `apptainer` stand-in that runs
runc), the real pytorch-cpu test image made into a bundle by `buildtool bundle`.

One cluster and one bundle for the module. Every job has a time limit and every wait a bound; at the end no
job, container or process of the cluster is left (the cluster fixture asserts it).

Cost here (2 cores): about 30 s to unpack the bundle, then 10-30 s per job; see the module's report line.
"""

from __future__ import annotations

import contextlib
import json
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from buildtool.common import docker_cli
from buildtool.common.net import free_port
from buildtool.contracts import names
from buildtool.launch.slurm import Outcome, parse_output
from buildtool.launch.slurmjobs import JobEnd, cancel, job_fields, run_job, submit, wait
from tests.slurmcluster import LocalSlurm, hosts_file, missing_tools

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_images  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "image-tests" / "pytorch" / "scripts"   # the DDP check
FIXTURE_FW = ROOT / "tests" / "fixtures" / "frameworks" / "fixturefw"   # a coordinator check (fixture_train.py)
REGISTRY = "127.0.0.1:5000"
PROFILE_SHM = 8 << 30          # the test image's run profile: shm_size 8g, stack 64 MiB, memlock unlimited
JOB_BOUND_S = 240              # no job here needs more; each also has a SLURM time limit


def _buildtool(*args: str, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "buildtool", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def workspace() -> Iterator[Path]:
    """Where the cluster and the bundle live. Not pytest's tmp_path: its parents are private (0700), and munged's
    socket needs o+x on every parent. The bundle goes to `ram/`, a tmpfs of its own when this process may mount
    one: deleting its 37 000 files from this machine's disk (ext4 with discard) took 68 s, from tmpfs under 1 s.
    It is mounted before the cluster starts, so n3's private mount namespace sees it too."""
    folder = Path(tempfile.mkdtemp(prefix="t-slurm-", dir="/tmp"))
    folder.chmod(0o755)
    ram = folder / "ram"
    ram.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4g,mode=755", "t-slurm-bundle", str(ram)],
                             capture_output=True, timeout=30).returncode == 0
    try:
        yield folder
    finally:
        started = time.monotonic()
        if mounted:
            subprocess.run(["umount", str(ram)], check=True, capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
        print(f"\nworkspace removed in {time.monotonic() - started:.1f} s (bundle on tmpfs: {mounted})",
              file=sys.stderr)


@pytest.fixture(scope="module")
def cluster(workspace: Path) -> Iterator[LocalSlurm]:
    missing = missing_tools()
    assert not missing, f"missing {' '.join(missing)}: run scripts/setup-tests.sh (it installs them)"
    started = time.monotonic()
    slurm = LocalSlurm(workspace / "cluster")
    slurm.start()
    print(f"\nslurm: up in {time.monotonic() - started:.1f} s", file=sys.stderr)
    try:
        yield slurm
    finally:
        started = time.monotonic()
        left = slurm.containers()
        stragglers = slurm.stop()
        after = slurm.leftovers()
        print(f"\nslurm: stopped in {time.monotonic() - started:.1f} s", file=sys.stderr)
        assert not left, f"containers left running: {left}"
        assert not stragglers, f"processes outlived the cluster's daemons: {stragglers}"
        assert not after, f"processes still running: {after}"


@contextlib.contextmanager
def _pushed(kind: str, cell_name: str, version: str) -> Iterator[str]:
    """A CPU test image (tests/integration/fixture_images.py) in a registry namespace of our own."""
    local = fixture_images.ensure(kind)
    repo = names.dev_repo(f"{REGISTRY}/t-slurm-{secrets.token_hex(4)}", cell_name)
    ref = f"{repo}:{names.dev_tag(local.split(':')[-1], version)}"
    docker_cli.docker("tag", local, ref, check=True, timeout=60)
    try:
        started = time.monotonic()
        push = docker_cli.docker("push", ref, timeout=900)
        assert push.returncode == 0, push.stderr[-2000:]
        print(f"\nimage: pushed in {time.monotonic() - started:.1f} s", file=sys.stderr)
        yield ref
    finally:
        started = time.monotonic()
        docker_cli.docker("rmi", ref, timeout=120)
        _, _, rest = ref.partition("/")
        repo, _, tag = rest.rpartition(":")
        head = requests.head(f"http://{REGISTRY}/v2/{repo}/manifests/{tag}", timeout=30, headers={
            "Accept": "application/vnd.docker.distribution.manifest.v2+json"})
        digest = head.headers.get("Docker-Content-Digest")
        if digest:
            requests.delete(f"http://{REGISTRY}/v2/{repo}/manifests/{digest}", timeout=30)
        print(f"\nimage: removed in {time.monotonic() - started:.1f} s", file=sys.stderr)


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    """The pytorch CPU test image."""
    with _pushed("pytorch", "pytorch-cpu", "2.13") as ref:
        yield ref


def _memlock_override() -> list[str]:
    """The test image's profile asks for memlock unlimited; a machine without CAP_SYS_RESOURCE (this one) cannot
    grant more than its own hard limit, so the bundle is made with that, as a site with such nodes would."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return [] if hard == resource.RLIM_INFINITY else ["--ulimit", f"memlock={hard}"]


def _bundle(workspace: Path, image: str, name: str) -> Iterator[Path]:
    hosts = workspace / "hosts"
    hosts.write_text(hosts_file())
    dest = workspace / "ram" / name
    started = time.monotonic()
    made = _buildtool("bundle", image, str(dest), "--hosts", str(hosts), *_memlock_override(), "--json", timeout=1200)
    assert made.returncode == 0, made.stderr[-3000:]
    print(f"\n{name}: {time.monotonic() - started:.1f} s", file=sys.stderr)
    yield dest
    left = list((dest / "jobs").iterdir())
    assert not left, f"job folders left in the bundle: {left}"


@pytest.fixture(scope="module")
def bundle(workspace: Path, image: str) -> Iterator[Path]:
    yield from _bundle(workspace, image, "bundle")


@pytest.fixture(scope="module")
def jax_bundle(workspace: Path) -> Iterator[Path]:
    """The jax CPU test image as an OCI bundle (its own tmpfs folder beside the pytorch one)."""
    with _pushed("jax", "jax-cpu", "0.10") as ref:
        yield from _bundle(workspace, ref, "jax-bundle")


def _generate(tmp_path: Path, image: str, *args: str, name: str = "ddp-check", framework: str = "pytorch") -> Path:
    """`buildtool slurm` for two CPU nodes. --framework: a bundle folder has no matrix cell to name its framework
    (the image is the pytorch-cpu test image; for a matrix image it agrees with the cell's)."""
    script = tmp_path / f"{name}.sbatch"
    made = _buildtool("slurm", image, "--nodes", "2", "--gpus-per-node", "0", "--time", "00:04:00", "--name", name,
                      "--rdzv-port", str(free_port()), "--framework", framework, "--out", str(script), *args)
    assert made.returncode == 0, made.stderr
    return script


def _submit(cluster: LocalSlurm, script: Path, cwd: Path, *args: str, path: str | None = None,
            scripts: Path = SCRIPTS) -> tuple[JobEnd, Outcome]:
    env = {**cluster.env, "SCRIPTS_DIR": str(scripts)}
    if path:
        env["PATH"] = f"{path}:{env['PATH']}"
    end = run_job(script, cwd=cwd, timeout_s=JOB_BOUND_S, env=env, args=args)
    print(f"\n{script.name}: job {end.job_id} {end.state} in {end.seconds:.1f} s", file=sys.stderr)
    return end, parse_output(end.output)


def test_bundle_config_follows_the_run_profile(bundle: Path, image: str) -> None:
    config = json.loads((bundle / "config.json").read_text())
    assert config["process"]["terminal"] is False
    assert {ns["type"] for ns in config["linux"]["namespaces"]} == {"mount", "ipc"}  # no pid, network, uts
    assert config["root"] == {"path": "rootfs", "readonly": True}
    rlimits = {r["type"]: r["hard"] for r in config["process"]["rlimits"]}
    assert rlimits["RLIMIT_STACK"] == 67108864 and "RLIMIT_NOFILE" not in rlimits  # umoci's 1024 is gone
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    assert rlimits["RLIMIT_MEMLOCK"] == (2**64 - 1 if hard == resource.RLIM_INFINITY else hard)
    mounts = {m["destination"]: m for m in config["mounts"]}
    assert f"size={PROFILE_SHM}" in mounts["/dev/shm"]["options"]
    assert mounts["/etc/hosts"]["source"] == str(bundle / "hosts")
    assert mounts["/opt/dl-images/jobs"]["source"] == str(bundle / "jobs") and "ro" in mounts["/opt/dl-images/jobs"][
        "options"]
    assert (bundle / "rootfs" / "opt" / "venv" / "bin" / "torchrun").exists()
    meta = json.loads((bundle / "dl-images-bundle.json").read_text())
    assert meta["image"] == image and meta["digest"].startswith("sha256:") and meta["shm_size"] == "8g"
    assert "run-profile label" in meta["profile_source"]
    again = _buildtool("bundle", image, str(bundle))
    assert again.returncode == 2 and "exists" in again.stderr and (bundle / "config.json").is_file()


def test_oci_runtime_two_nodes_ddp_check_passes(cluster: LocalSlurm, bundle: Path, tmp_path: Path,
                                               late_jobs: dict[str, str]) -> None:
    script = _generate(tmp_path, str(bundle), "--runtime", "oci", "--join-timeout", "60")
    end, outcome = _submit(cluster, script, tmp_path)
    assert end.state == "COMPLETED" and outcome.passed, end.output[-3000:]
    assert outcome.world_size == 2 and outcome.result and outcome.result["nnodes"] == 2
    assert outcome.result["identical"] and outcome.result["last_loss"] < outcome.result["first_loss"]
    assert outcome.reason.startswith("DDP check passed: world size 2, gloo, transport Socket"), outcome.reason
    assert not (bundle / "jobs" / f"ddp-check-{end.job_id}").exists(), "the job folder must be removed"
    assert not [c for c in cluster.containers() if f".{end.job_id}." in c]


@pytest.mark.parametrize("own_name", [False, True], ids=["no-node-names", "own-name-only"])
def test_node_names_that_do_not_resolve_in_the_containers(cluster: LocalSlurm, bundle: Path, tmp_path: Path,
                                                          own_name: bool) -> None:
    """Issue 23 (6): this job's containers get a hosts file without the other nodes' names (the `hosts` fault;
    with or without the container's own), as on a cluster whose node names are not in DNS. The old script's
    rendezvous at `n1:PORT` failed there: with no names, n2's torchrun died on its own hostname (socket.gaierror
    in torch's is-this-my-host check); with its own name only, n2 retried `n1` until the join timeout. The batch
    script now resolves the nodes' NodeAddr (127.0.0.1 here) up front; the first node of the job's list hosts the
    store (is_host, said by the verifier) and each agent publishes its node's address (--local-addr)."""
    name = f"unresolved-{'own' if own_name else 'none'}"
    for node, addr in (("n1", "127.0.1.1"), ("n2", "127.0.1.2")):
        cluster.fault(name, node, "hosts", "127.0.0.1 localhost\n" + (f"{addr} {node}\n" if own_name else ""))
    # The fault holds: in this job's containers the other node's name resolves nowhere.
    probe = tmp_path / "probe.sbatch"
    probe.write_text(f"#!/bin/bash\n#SBATCH --job-name={name}\n#SBATCH --nodes=1\n#SBATCH --nodelist=n2\n"
                     f"#SBATCH --time=00:02:00\n#SBATCH --output={tmp_path}/probe-%j.out\nsrun --export=NONE "
                     f"--container={bundle} getent hosts localhost n1 n2 || echo \"getent exit $?\"\n")
    end = run_job(probe, cwd=tmp_path, timeout_s=JOB_BOUND_S, env=cluster.env)
    assert end.state == "COMPLETED" and "getent exit 2" in end.output, end.output
    resolved = [line.split() for line in end.output.splitlines() if line[:1].isdigit()]
    assert resolved == [["127.0.0.1", "localhost"], *([["127.0.1.2", "n2"]] if own_name else [])], end.output
    script = _generate(tmp_path, str(bundle), "--runtime", "oci", "--join-timeout", "60", name=name)
    end, outcome = _submit(cluster, script, tmp_path)
    assert end.state == "COMPLETED" and outcome.passed, end.output[-3000:]
    assert "rendezvous at 127.0.0.1:" in end.output and "(node n1)" in end.output
    assert outcome.world_size == 2 and outcome.result and outcome.result["nnodes"] == 2


def _project_with_fixture_framework(folder: Path) -> Path:
    """This checkout's matrix, templates and image-tests, plus the fixture framework's folder."""
    project = folder / "project"
    project.mkdir()
    shutil.copy2(ROOT / "matrix.yaml", project / "matrix.yaml")
    shutil.copytree(ROOT / "templates", project / "templates")
    shutil.copytree(ROOT / "image-tests", project / "image-tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(FIXTURE_FW, project / "image-tests" / "fixturefw")
    return project


@pytest.mark.parametrize("runtime", ["oci", "apptainer"])
def test_two_nodes_coordinator_check_passes(cluster: LocalSlurm, bundle: Path, tmp_path: Path, runtime: str) -> None:
    """A coordinator framework's check (one process per node, told its process id and the first node's
    coordinator: what JAX's jax_train.py takes) on two nodes in SLURM's OCI containers, and in the apptainer
    stand-in's (given a .sif path: an image the matrix does not know, so --framework names its framework).

    The framework is the fixture one (tests/fixtures/frameworks/fixturefw: `multinode: {script: fixture_train.py,
    launcher: coordinator}`), whose script is a plain-socket stand-in run by the pytorch CPU image's python3. This
    proves the launcher's wiring: each node's process id resolved inside its container from the job's node list
    and the container's hostname (not SLURM_PROCID, which 22.05 gets wrong in OCI containers), process 0 on the
    first node hosting the coordinator, the others reaching it, the verifier checking the result. It does not
    prove JAX: when a JAX image is at hand, its framework.yaml `multinode` section is all the launcher needs."""
    project = _project_with_fixture_framework(tmp_path)
    sif = "/shared/images/fixturefw.sif"
    path = str(cluster.apptainer_standin({sif: bundle})) if runtime == "apptainer" else None
    script = _generate(tmp_path, str(bundle) if runtime == "oci" else sif, "--runtime", runtime, "--join-timeout",
                       "60", "--shm-size", "1g", "--matrix", str(project / "matrix.yaml"), name="coordinator",
                       framework="fixturefw")
    assert "fixture_train.py" in script.read_text() and "torchrun --" not in script.read_text()
    end, outcome = _submit(cluster, script, tmp_path, path=path, scripts=FIXTURE_FW / "scripts")
    assert end.state == "COMPLETED" and outcome.passed, end.output[-3000:]
    assert outcome.result and outcome.result["hosts"] == ["n1", "n2"]   # process 0 on n1, process 1 on n2
    assert outcome.world_size == 2 and outcome.result["identical"]
    assert outcome.reason.startswith("DDP check passed: world size 2, gloo, transport Socket"), outcome.reason
    assert not (bundle / "jobs" / f"coordinator-{end.job_id}").exists(), "the job folder must be removed"


def test_two_nodes_jax_check_passes_in_oci_containers(cluster: LocalSlurm, jax_bundle: Path, tmp_path: Path) -> None:
    """JAX's own multi-node check (image-tests/jax: `multinode: {script: jax_train.py, launcher: coordinator}`)
    on two nodes in SLURM's OCI containers of the jax CPU image: jax.distributed joined through the first
    node's coordinator, gloo collectives across the nodes, the verifier checking process 0's DDP_RESULT."""
    script = _generate(tmp_path, str(jax_bundle), "--runtime", "oci", "--join-timeout", "60", name="jax-check",
                       framework="jax")
    text = script.read_text()
    assert "jax_train.py" in text and "--coordinator" in text and "torchrun --" not in text
    end, outcome = _submit(cluster, script, tmp_path, scripts=ROOT / "image-tests" / "jax" / "scripts")
    assert end.state == "COMPLETED" and outcome.passed, end.output[-3000:]
    assert outcome.result and outcome.result["process_count"] == 2 and outcome.result["global_devices"] >= 2
    assert outcome.result["psum"] == outcome.result["psum_expected"]
    assert outcome.world_size == 2 and outcome.result["identical"]
    assert outcome.result["last_loss"] < outcome.result["first_loss"]
    assert outcome.reason.startswith("DDP check passed: world size 2, gloo, transport Socket"), outcome.reason
    assert not (jax_bundle / "jobs" / f"jax-check-{end.job_id}").exists(), "the job folder must be removed"


def test_apptainer_script_with_a_runc_standin(cluster: LocalSlurm, bundle: Path, image: str, tmp_path: Path) -> None:
    standin = cluster.apptainer_standin({image: bundle})
    script = _generate(tmp_path, image, "--runtime", "apptainer", "--join-timeout", "60")
    end, outcome = _submit(cluster, script, tmp_path, path=str(standin))
    assert end.state == "COMPLETED" and outcome.passed, end.output[-3000:]
    assert outcome.world_size == 2
    assert not list(tmp_path.glob(".ddp-check-*")), "the job folder must be removed"


@pytest.fixture(scope="module")
def late_jobs(cluster: LocalSlurm, bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The two late-node jobs, submitted together as soon as the first test asks: they spend most of their
    time waiting, so they run beside the tests that follow. n1 starts late: it hosts the c10d store, so n2
    waits for it to appear, as on a cluster where the head node pulls its image slowly. Beyond the join
    timeout (8 s), n2 gives up after two connection attempts of 8 s and a random pause of at most 8 s, well
    before n1's store appears (40 s and its start-up later)."""
    jobs = {}
    for name, join_timeout, delay in (("late-within", "40", "12"), ("late-beyond", "8", "40")):
        folder = tmp_path_factory.mktemp(name)
        script = _generate(folder, str(bundle), "--runtime", "oci", "--join-timeout", join_timeout, name=name)
        cluster.fault(name, "n1", "delay", delay)
        jobs[name] = submit(script, cwd=folder, env=cluster.env | {"SCRIPTS_DIR": str(SCRIPTS)})
    return jobs


def _wait(cluster: LocalSlurm, job: str) -> tuple[JobEnd, Outcome]:
    end = wait(job, timeout_s=JOB_BOUND_S, env=cluster.env)
    print(f"\njob {job} {end.state} after {end.seconds:.1f} s of waiting here", file=sys.stderr)
    return end, parse_output(end.output)


def test_late_node_within_the_join_timeout_passes(cluster: LocalSlurm, late_jobs: dict[str, str]) -> None:
    end, outcome = _wait(cluster, late_jobs["late-within"])
    assert end.state == "COMPLETED" and outcome.passed, end.output[-3000:]
    assert outcome.world_size == 2


def test_late_node_beyond_the_join_timeout_fails_naming_the_rendezvous(cluster: LocalSlurm,
                                                                       late_jobs: dict[str, str]) -> None:
    # With torch's default read_timeout (60 s) n2 would have waited for n1's store and passed: the failure
    # here also shows that read_timeout follows the join timeout.
    end, outcome = _wait(cluster, late_jobs["late-beyond"])
    assert end.state == "FAILED" and not outcome.passed, end.output[-3000:]
    assert outcome.rendezvous_timeout, outcome.reason
    assert "not every node joined within the join timeout of 8 s" in outcome.reason


def test_node_killed_mid_run_ends_the_job_and_is_named(cluster: LocalSlurm, bundle: Path, tmp_path: Path) -> None:
    script = _generate(tmp_path, str(bundle), "--runtime", "oci", "--join-timeout", "60", "--steps", "200000",
                       name="killed")
    env = {**cluster.env, "SCRIPTS_DIR": str(SCRIPTS)}
    job = submit(script, cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 120
        victim = None
        # The training step is step 2: step 0 checks the nodes' architecture against the bundle's, step 1 /dev/shm.
        while victim is None and time.monotonic() < deadline:
            victim = next((c for c in cluster.containers() if c.startswith(f"n2.root.{job}.2.")), None)
            time.sleep(0.5)
        assert victim, f"job {job}'s training container never started on n2"
        time.sleep(8)  # into the training loop (it runs for minutes at 200000 steps)
        assert job_fields(job, env).get("JobState") == "RUNNING"
        subprocess.run(["runc", f"--root={cluster.root}/runc", "kill", victim, "KILL"], check=True, timeout=30)
        deadline = time.monotonic() + 120
        while job_fields(job, env).get("JobState") not in ("FAILED", "COMPLETED", "CANCELLED", "TIMEOUT"):
            assert time.monotonic() < deadline, "the job did not end after a node was killed"
            time.sleep(0.5)
    finally:
        cancel(job, env)
    fields = job_fields(job, env)
    output = Path(fields["StdOut"]).read_text()
    outcome = parse_output(output)
    assert fields["JobState"] == "FAILED" and not outcome.passed, output[-3000:]
    assert outcome.failed_node == "n2" and "on node n2" in outcome.reason, outcome.reason
    assert "--kill-on-bad-exit stopped the other nodes" in outcome.reason


def test_shm_below_the_profile_on_a_node_apptainer(cluster: LocalSlurm, bundle: Path, image: str,
                                                   tmp_path: Path) -> None:
    # n3's /dev/shm is 64 MiB (its slurmd has a mount namespace of its own); apptainer shares the node's.
    standin = cluster.apptainer_standin({image: bundle})
    script = _generate(tmp_path, image, "--runtime", "apptainer")
    end, outcome = _submit(cluster, script, tmp_path, "--partition=smallshm", path=str(standin))
    assert end.state == "FAILED" and not outcome.passed, end.output[-3000:]
    assert outcome.failed_node == "n3"
    assert outcome.reason == f"error: /dev/shm on n3 is {64 << 20} bytes, need {PROFILE_SHM} as the run profile says"
    assert "DDP_RESULT" not in end.output  # refused before training


def test_shm_below_the_profile_on_a_node_oci(cluster: LocalSlurm, bundle: Path, tmp_path: Path) -> None:
    script = _generate(tmp_path, str(bundle), "--runtime", "oci", name="small-shm")
    cluster.fault("small-shm", "n2", "shm", "64m")
    end, outcome = _submit(cluster, script, tmp_path)
    assert end.state == "FAILED" and not outcome.passed, end.output[-3000:]
    assert outcome.failed_node == "n2"
    assert outcome.reason == f"error: /dev/shm on n2 is {64 << 20} bytes, need {PROFILE_SHM} as the run profile says"


def test_scaling_over_one_and_two_slurm_nodes(cluster: LocalSlurm, bundle: Path, tmp_path: Path) -> None:
    """DDP and FSDP side by side over 1 and 2 nodes (issue 42), one job per strategy and node count. The two-node
    runs' containers cannot resolve node names (the `hosts` fault, as in
    test_node_names_that_do_not_resolve_in_the_containers): the scaling job runs torchrun through the
    verifier, which gives it is_host and the node's address; before, n2's torchrun died on its own hostname."""
    for job in ("ddp-scaling-2n", "fsdp-scaling-2n"):
        for node in ("n1", "n2"):
            cluster.fault(job, node, "hosts", "127.0.0.1 localhost\n")
    metrics = tmp_path / "metrics"
    run = _buildtool("scaling", "--launcher", "slurm", "--runtime", "oci", "--image", str(bundle), "--nodes", "2,1",
                     "--strategy", "ddp,fsdp", "--subset-size", "1024", "--epochs", "2", "--time", "00:04:00",
                     "--timeout", "240", "--rdzv-port", str(free_port()), "--metrics-dir", str(metrics),
                     env=cluster.env, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    for strategy in ("ddp", "fsdp"):
        data = json.loads((metrics / strategy / "scaling.json").read_text())
        assert data["strategy"] == strategy and data["status"] == "ran"
        assert data["unit"] == "nodes" and data["launcher"]["kind"] == "slurm" and data["launcher"]["runtime"] == "oci"
        runs = data["runs"]
        assert [r["count"] for r in runs] == [1, 2]
        for r in runs:
            assert r["backend"] == "gloo" and r["identical"] is True and r["losses"][-1] < r["losses"][0]
            assert r["wall_clock_s"] > r["time_per_epoch_s"] > 0 and len(r["peak_memory_mb"]) == r["count"]
            if strategy == "fsdp":   # the sharded model equals the same steps trained unsharded
                assert r["matches_reference"] is True
        assert runs[0]["speedup"] == 1.0
        for name in ("time_per_epoch.png", "speedup.png", "scaling.csv"):
            assert (metrics / strategy / name).stat().st_size > 0
        outputs = sorted(p.name for p in (metrics / "jobs").glob(f"{strategy}-scaling-*.out"))
        assert len(outputs) == 2, outputs
        assert f"{strategy}   1 nodes:" in run.stdout and f"{strategy}   2 nodes:" in run.stdout
    comparison = json.loads((metrics / "comparison.json").read_text())
    assert comparison["strategies"] == ["ddp", "fsdp"] and [r["count"] for r in comparison["rows"]] == [2, 2]
    for name in ("time_per_epoch.png", "speedup.png", "comparison.md"):
        assert (metrics / name).stat().st_size > 0
