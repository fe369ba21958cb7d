"""Multi-node rendezvous: two containers act as two nodes on the host network and join through
torchrun's c10d rendezvous (`--nnodes 2`), train DDP together and agree on parameters. The
join timeout defaults to 900 s (a cold node may still be pulling the image) and is set by the
target (`buildtool validate --rdzv-join-timeout`); a missing peer must fail with torchrun's
RendezvousTimeoutError, not hang. Both are decided from what torchrun and the ranks record
(ranks.py): the exception's type, never words in the output, which another failure may print."""

from __future__ import annotations

import threading
import time
import uuid

import ranks
from harness import Probe, free_port

TWO_NODE_RUN_S = 180   # on top of the join timeout: start-ups, 20 DDP steps, the exit barrier
MISSING_PEER_RUN_S = 60  # on top of its short join timeout: start-up and torchrun's own shutdown
STOP_TIMEOUT_S = 30


def torchrun_2nodes(port: int, join_timeout: float, is_host: bool, run: str) -> list[str]:
    conf = f"join_timeout={int(join_timeout)},is_host={'true' if is_host else 'false'}"
    return ["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run,
            "--rdzv-conf", conf, "--max-restarts", "0", "/imagetests/ddp_train.py"]


def stop_torchrun(container, run: str) -> None:
    """SIGTERM the torchrun of rendezvous `run` in `container` (images need not ship pkill)."""
    container.run(["python3", "-I", "-S", "/imagetests/stop_run.py", run], step="stop the other node",
                  timeout=STOP_TIMEOUT_S)


def never_joined(waited: float, port: int, found: ranks.Ranks) -> str:
    return (f"rendezvous timed out after {waited:.0f}s: the second node never joined 127.0.0.1:{port} "
            f"(--nnodes 2); torchrun: {found.launcher_error}")


def test_two_nodes_rendezvous_and_agree(main, target, start_container):
    join = float(target.get("rdzv_join_timeout_s", 900))
    port = free_port()
    peer = start_container(target["image"], target.get("peer_run_flags", []), hint="node1", gpus=True)
    results: dict[str, Probe] = {}
    env = {"DDP_STEPS": "20", "DDP_TIMEOUT_S": "120", **ranks.LAUNCHER_ENV}
    # On a GPU runner each node takes its own GPU (NCCL); with fewer than two, the nodes use gloo.
    gpus = target.get("runner_gpus") or []
    node_env = [{**env, "CUDA_VISIBLE_DEVICES": str(i)} if len(gpus) >= 2 else {**env, "DDP_DEVICE": "cpu"}
                for i in range(2)]

    run = f"imgtest-{uuid.uuid4().hex[:8]}"  # both nodes must name the same rendezvous

    def node(name, container, is_host):
        results[name] = container.run(torchrun_2nodes(port, join, is_host, run), step=f"two-node DDP ({name})",
                                      timeout=join + TWO_NODE_RUN_S, env=node_env[0 if is_host else 1])

    started = time.monotonic()
    threads = [threading.Thread(target=node, args=("node0", main, True)),
               threading.Thread(target=node, args=("node1", peer, False))]
    for thread in threads:
        thread.start()
    # When one node fails, stop the other at once: it would wait out the join timeout or
    # torchrun's exit barrier (300 s) for a peer that is gone.
    while all(thread.is_alive() for thread in threads):
        time.sleep(0.2)
    stopped = set()
    if results.get("node0") and not results["node0"].ok:
        peer.remove()
        stopped.add("node1")
    if results.get("node1") and not results["node1"].ok:
        stop_torchrun(main, run)
        stopped.add("node0")
    for thread in threads:
        thread.join()
    waited = time.monotonic() - started
    node0 = results["node0"]
    found0 = ranks.read(node0)
    if found0.launcher_type == ranks.RENDEZVOUS_TIMEOUT:
        raise AssertionError(never_joined(waited, port, found0))
    causes = {name: ranks.cause(probe, f"{name} of two", f"127.0.0.1:{port}") for name, probe in results.items()}
    failed = {name: cause for name, cause in causes.items() if cause}
    # A node we stopped because the other failed is not a cause; it is named last, if at all.
    first = {n: c for n, c in failed.items() if n not in stopped} or failed
    assert not failed, "two-node DDP failed: " + "; ".join(f"{name}: {cause}" for name, cause in first.items()) + (
        f" (stopped {', '.join(sorted(stopped & set(failed)))} after that)" if stopped & set(failed) else "")
    # Global rank 0 (which writes the result) may land on either node.
    found = node0.result or results["node1"].result
    assert isinstance(found, dict), "no node wrote a DDP result"
    assert found["world_size"] == 2, f"expected 2 ranks across 2 nodes, got {found['world_size']}"
    assert found["identical"], f"the nodes ended with different parameters: {found['param_hashes']}"
    assert found["last_loss"] < 0.5 * found["first_loss"], f"loss did not fall: {found}"


def test_missing_peer_fails_with_clear_timeout(main, target):
    join = float(target.get("missing_peer_timeout_s", 10))
    port = free_port()
    probe = main.run(torchrun_2nodes(port, join, True, f"imgtest-{uuid.uuid4().hex[:8]}"),
                     step="torchrun waiting for a peer that never comes", timeout=join + MISSING_PEER_RUN_S,
                     env={"DDP_TIMEOUT_S": "30", **ranks.LAUNCHER_ENV})
    assert not probe.error and not probe.not_found, probe.cause()
    assert not probe.timed_out, f"{probe.hung()} instead of failing after the {join:.0f}s join timeout"
    assert probe.rc != 0, f"torchrun with a missing peer succeeded (exit 0) instead of timing out after {join:.0f}s"
    found = ranks.read(probe)
    assert found.launcher_type == ranks.RENDEZVOUS_TIMEOUT, (
        f"torchrun with a missing peer failed (exit {probe.rc}) without its join timeout: "
        f"{found.launcher_error or ranks.cause(probe, 'torchrun') or 'no error recorded'}")
