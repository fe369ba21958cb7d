"""JAX across processes (scripts/jax_train.py, the script the multi-node launchers run): two
processes join one jax.distributed job through a coordinator, a psum over every device of every
process gives the known sum, data-parallel SGD (gradients averaged with pmean) makes the loss fall,
and every process ends with the same parameters. On CPU the processes talk through gloo; on GPUs
through NCCL, over every GPU of the runner. Processes of one container (two processes of one
machine, the coordinator on 127.0.0.1) and of two containers, each in its own network namespace
on the run's bridge network, the coordinator named by its container's name (two nodes, as the
launchers run them: a setting that only works on one host fails here). A process whose peer never
comes fails within its init timeout instead of hanging.
Decided from the files each process writes (processes.py); the one printed line that counts is
the launchers' `DDP_RESULT {json}` contract, checked against those files."""

from __future__ import annotations

import json
import threading

import processes
import pytest
from harness import Probe, free_port, skip

from buildtool.contracts import skips

pytestmark = pytest.mark.devices(why="JAX processes training over the devices")

SCRIPT = "/imagetests/jax_train.py"
INIT_TIMEOUT_S = 120     # a process waits this long for the others to join (a cold peer imports jax first)
MISSING_INIT_TIMEOUT_S = 10
# A process waiting for its peers shows no CPU or I/O for up to its init timeout (then jax aborts it);
# the supervisor calls it hung only this much later.
QUIET_MARGIN_S = 60
STEPS = "40"
LAUNCHER_KEYS = {"backend", "platform", "process_count", "process_id", "local_devices", "global_devices", "psum",
                 "psum_expected", "first_loss", "last_loss", "identical"}   # and world_size, the process count


def jax_train(coordinator: str, n: int, i: int, init_timeout: int = INIT_TIMEOUT_S) -> list[str]:
    return ["python3", SCRIPT, "--coordinator", coordinator, "--num-processes", str(n),
            "--process-id", str(i), "--steps", STEPS, "--init-timeout", str(init_timeout)]


def stop(container, coordinator: str) -> None:
    """SIGTERM the jax_train processes of coordinator HOST:PORT in `container`."""
    container.run(["python3", "-I", "-S", "/imagetests/stop_run.py", coordinator, "--coordinator"],
                  step="stop the other JAX process")


def run_job(where: list, what: str, envs: list[dict[str, str]], init_timeout: int = INIT_TIMEOUT_S,
            host: str = "127.0.0.1") -> list[processes.Process]:
    """Process i of len(where) in container where[i], all started together, the coordinator on `host`
    (process 0's container; 127.0.0.1 when all run in one); when one fails the others are stopped at
    once (they would wait out their heartbeat timeout for a peer that is gone)."""
    coordinator = f"{host}:{free_port()}"
    n = len(where)
    probes: dict[int, Probe] = {}

    def one(i: int) -> None:
        probes[i] = where[i].run(jax_train(coordinator, n, i, init_timeout), step=f"{what}: process {i}",
                                 quiet=init_timeout + QUIET_MARGIN_S, env=envs[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    stopped: set[int] = set()
    while any(t.is_alive() for t in threads):
        failed = [i for i, p in list(probes.items()) if processes.cause(processes.read(p, i), what)]
        if failed:
            for i, thread in enumerate(threads):
                if thread.is_alive() and i not in stopped:
                    stop(where[i], coordinator)
                    stopped.add(i)
        threads[0].join(0.2)
    for thread in threads:
        thread.join()
    found = [processes.read(probes[i], i) for i in range(n)]
    causes = {p.index: processes.cause(p, what) for p in found}
    # A process we stopped because another failed is not a cause; it is named last, if at all.
    first = {i: c for i, c in causes.items() if c and i not in stopped} or {i: c for i, c in causes.items() if c}
    assert not first, "; ".join(first.values()) + (
        f" (stopped process {', '.join(map(str, sorted(stopped)))} after that)" if stopped else "")
    return found


def cpu_env() -> dict[str, str]:
    # The CPU check stays on CPU on a GPU runner too (the GPU check below is NCCL's).
    return {"JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="module")
def two_processes(main):
    return run_job([main, main], "two JAX processes in one container (gloo)", [cpu_env(), cpu_env()])


@pytest.fixture(scope="module")
def two_containers(target, start_container, bridge):
    # Both nodes' containers run before the job starts (nothing left to pull), so a node joins within the init
    # timeout a cold import needs; a shorter join timeout (validate --rdzv-join-timeout) shortens it. A join that
    # cannot succeed (a proxy taking the coordinator's gRPC) then fails in 120 s, not the 900 s a launcher gives a
    # node still pulling the image, which spent the image's whole deadline.
    join = min(int(target.get("rdzv_join_timeout_s", 900)), INIT_TIMEOUT_S)
    # Two nodes of their own on the bridge network (the main container is on the host's network).
    first = start_container(target["image"], hint="jax-node0", network=bridge)
    peer = start_container(target["image"], target.get("peer_run_flags", []), hint="jax-node1", network=bridge)
    return run_job([first, peer], "two JAX processes in two containers (gloo)", [cpu_env(), cpu_env()], join,
                   host=first.name)


def result(found: list[processes.Process]) -> dict:
    return found[0].state


def other_psums(found: list[processes.Process]) -> str:
    """The processes after process 0 whose own psum is not the known sum ('' when none): each process reads the sum
    from its own devices, and one whose checks failed still counts as completed (processes.py), so a psum that reached
    process 0 only passed where process 0's findings alone were read."""
    wrong = [f"process {p.index} got {p.state.get('psum')}, expected {p.state.get('psum_expected')}"
             for p in found[1:] if p.state.get("psum") != p.state.get("psum_expected")]
    return (f"psum over {found[0].state.get('global_devices')} devices: process 0 got the known sum but "
            + "; ".join(wrong) + " (the sum did not reach every process)") if wrong else ""


def test_psum_across_processes_gives_known_sum(two_processes):
    r = result(two_processes)
    assert r["process_count"] == 2 and r["global_devices"] >= 2, (
        f"{r['process_count']} processes with {r['global_devices']} devices joined, expected 2 processes")
    assert r["psum"] == r["psum_expected"], (
        f"psum over {r['global_devices']} devices of 2 processes gave {r['psum']}, expected {r['psum_expected']} "
        "(the values of another process's devices were not summed)")
    wrong = other_psums(two_processes)
    assert not wrong, wrong


def test_cpu_collectives_are_gloo(two_processes):
    r = result(two_processes)
    assert r["platform"] == "cpu" and r["backend"] == "gloo", (
        f"the CPU processes ran on {r['platform']} with {r['backend']}, not cpu with gloo")


def test_loss_falls_with_averaged_gradients(two_processes):
    r = result(two_processes)
    assert r["last_loss"] < 0.5 * r["first_loss"], f"loss did not fall: {r['first_loss']} -> {r['last_loss']}"


def test_processes_end_with_identical_parameters(two_processes):
    hashes = {p.index: p.state.get("param_hashes") for p in two_processes}
    assert all(p.state.get("identical") for p in two_processes), (
        f"the processes ended with different parameters: {hashes[0]}")


def test_process0_prints_the_launcher_result_line(two_processes):
    """The multi-node launchers read exactly one `DDP_RESULT {json}` line from process 0 (the contract every
    framework's multi-node check keeps: backend, world_size, first_loss, last_loss, identical)."""
    lines = [line for line in two_processes[0].probe.out.splitlines() if line.startswith("DDP_RESULT ")]
    assert len(lines) == 1, f"process 0 printed {len(lines)} DDP_RESULT lines, not 1"
    printed = json.loads(lines[0].removeprefix("DDP_RESULT "))
    assert set(printed) == LAUNCHER_KEYS | {"world_size"}, (
        f"DDP_RESULT keys {sorted(printed)} are not {sorted(LAUNCHER_KEYS | {'world_size'})}")
    recorded = two_processes[0].state
    assert printed == {"world_size": recorded["process_count"], **{k: recorded[k] for k in LAUNCHER_KEYS}}, (
        f"DDP_RESULT {printed} is not what process 0 recorded")
    assert not [line for line in two_processes[1].probe.out.splitlines() if line.startswith("DDP_RESULT")], (
        "process 1 printed a DDP_RESULT line; only process 0 may")


def test_two_containers_train_and_agree(two_containers):
    """Two containers on the run's bridge network as two nodes, as the multi-node launchers run it."""
    r = result(two_containers)
    assert r["process_count"] == 2 and r["psum"] == r["psum_expected"], (
        f"psum over 2 containers gave {r['psum']}, expected {r['psum_expected']}")
    wrong = other_psums(two_containers)
    assert not wrong, wrong
    assert r["last_loss"] < 0.5 * r["first_loss"], f"loss did not fall: {r['first_loss']} -> {r['last_loss']}"
    assert r["identical"], f"the containers ended with different parameters: {r.get('param_hashes')}"


@pytest.mark.shared(why="no peer comes, so no step runs and no device is used; its port is its own")
def test_missing_process_fails_within_init_timeout(main):
    probe = main.run(jax_train(f"127.0.0.1:{free_port()}", 2, 0, MISSING_INIT_TIMEOUT_S),
                     step="a JAX process waiting for a peer that never comes",
                     quiet=MISSING_INIT_TIMEOUT_S + QUIET_MARGIN_S, env=cpu_env())
    assert not probe.error and not probe.not_found, probe.cause()
    found = processes.read(probe, 0)
    assert not probe.cut, (f"{probe.hung()} (at {found.stage}) instead of failing after its "
                           f"{MISSING_INIT_TIMEOUT_S} s init timeout")
    assert probe.rc != 0, "a JAX process whose peer never joined succeeded (exit 0)"
    assert found.stage == "initialize" and not found.state.get("ok"), (
        f"a JAX process whose peer never joined failed at {found.stage}, not while joining: "
        f"{processes.cause(found, 'jax_train')}")


@pytest.mark.gpu(what="JAX NCCL collectives and training over every GPU")
def test_nccl_across_all_gpus(main, runner_gpus, require_gpu):
    require_gpu("JAX NCCL collectives and training over every GPU")
    gpus = [str(i) for i in range(len(runner_gpus))]   # as the container (--gpus all) numbers them
    n = 2 if len(gpus) >= 2 else 1
    envs = [{"CUDA_VISIBLE_DEVICES": ",".join(gpus[i::n])} for i in range(n)]
    found = run_job([main] * n, f"{n} JAX processes over {len(gpus)} GPUs (NCCL)", envs)
    r = result(found)
    assert r["platform"] == "gpu" and r["backend"] == "nccl", f"JAX ran on {r['platform']}, not on the GPUs"
    assert r["global_devices"] == len(gpus), f"JAX saw {r['global_devices']} GPUs, the runner has {len(gpus)}"
    assert r["psum"] == r["psum_expected"], f"psum over {len(gpus)} GPUs gave {r['psum']}, not {r['psum_expected']}"
    wrong = other_psums(found)
    assert not wrong, wrong
    assert r["last_loss"] < 0.5 * r["first_loss"], f"loss did not fall: {r['first_loss']} -> {r['last_loss']}"
    assert r["identical"], f"the processes ended with different parameters: {r.get('param_hashes')}"
    if len(gpus) < 2:   # one process on one device: its psum is its own value, nothing moved between devices
        skip(skips.ONE_GPU_ON_RUNNER, "one GPU on this runner: one JAX process on one device, so no data moved "
             "between devices through NCCL and the psum and averaged gradients were not shown (not run, not "
             "passed); validate on a runner with two or more GPUs")
