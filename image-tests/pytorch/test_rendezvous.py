"""Multi-node rendezvous: two containers act as two nodes on the host network and join through
torchrun's c10d rendezvous (`--nnodes 2`), train DDP together and agree on parameters. The
join timeout defaults to 900 s (a cold node may still be pulling the image) and is set by the
target (`buildtool validate --rdzv-join-timeout`); a missing peer must fail with a clear
timeout message, not hang."""

from __future__ import annotations

import re
import threading
import time
import uuid

from harness import Result, free_port

_TIMEOUT_WORDS = re.compile(r"RendezvousTimeoutError|timed out|timeout", re.IGNORECASE)


def torchrun_2nodes(port: int, join_timeout: float, is_host: bool, run: str) -> list[str]:
    conf = f"join_timeout={int(join_timeout)},is_host={'true' if is_host else 'false'}"
    return ["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run,
            "--rdzv-conf", conf, "--max-restarts", "0", "/imagetests/ddp_train.py"]


def stop_torchrun(container, run: str) -> None:
    """SIGTERM the torchrun of rendezvous `run` in `container` (images need not ship pkill)."""
    me = '[ "${p#/proc/}" = "$$" ] && continue'  # not this shell, whose command line matches too
    script = (f'for p in /proc/[0-9]*; do {me}; tr "\\0" " " < "$p/cmdline" 2>/dev/null '
              f'| grep -q -- "--rdzv-id {run} " && kill -TERM "${{p#/proc/}}"; done; true')
    container.exec(["bash", "-c", script], timeout=30)


def timeout_message(result: Result, waited: float, port: int) -> str:
    lines = [line.strip() for line in result.text.splitlines() if _TIMEOUT_WORDS.search(line)]
    detail = lines[-1][:300] if lines else result.tail(2)
    return (f"rendezvous timed out after {waited:.0f}s: the second node never joined 127.0.0.1:{port} "
            f"(--nnodes 2); {detail}")


def test_two_nodes_rendezvous_and_agree(main, target, start_container):
    join = float(target.get("rdzv_join_timeout_s", 900))
    port = free_port()
    peer = start_container(target["image"], target.get("peer_run_flags", []), hint="node1", gpus=True)
    results: dict[str, Result] = {}
    env = {"DDP_STEPS": "20", "DDP_TIMEOUT_S": "120"}
    # On a GPU runner each node takes its own GPU (NCCL); with fewer than two, the nodes use gloo.
    gpus = target.get("runner_gpus") or []
    node_env = [{**env, "CUDA_VISIBLE_DEVICES": str(i)} if len(gpus) >= 2 else {**env, "DDP_DEVICE": "cpu"}
                for i in range(2)]

    run = f"imgtest-{uuid.uuid4().hex[:8]}"  # both nodes must name the same rendezvous

    def node(name, container, is_host):
        results[name] = container.exec(torchrun_2nodes(port, join, is_host, run), timeout=join + 180,
                                       env=node_env[0 if is_host else 1])

    started = time.monotonic()
    threads = [threading.Thread(target=node, args=("node0", main, True)),
               threading.Thread(target=node, args=("node1", peer, False))]
    for thread in threads:
        thread.start()
    # When one node fails, stop the other at once: it would wait out the join timeout or
    # torchrun's exit barrier (300 s) for a peer that is gone.
    while all(thread.is_alive() for thread in threads):
        time.sleep(0.2)
    if results.get("node0") and results["node0"].rc != 0:
        peer.remove()
    if results.get("node1") and results["node1"].rc != 0:
        stop_torchrun(main, run)
    for thread in threads:
        thread.join()
    waited = time.monotonic() - started
    node0 = results["node0"]
    if node0.rc != 0 and _TIMEOUT_WORDS.search(node0.text):
        raise AssertionError(timeout_message(node0, waited, port))
    if any(result.rc != 0 for result in results.values()):
        raise AssertionError("two-node DDP failed: " + "; ".join(
            f"{name} exit {result.rc}:\n{result.tail(8)}" for name, result in results.items()))
    # Global rank 0 (which prints the result) may land on either node.
    found = node0.payload("DDP_RESULT") or results["node1"].payload("DDP_RESULT")
    assert found, f"no node printed a DDP result:\n{node0.tail()}\n{results['node1'].tail()}"
    assert found["world_size"] == 2, f"expected 2 ranks across 2 nodes, got {found['world_size']}"
    assert found["identical"], f"the nodes ended with different parameters: {found['param_hashes']}"
    assert found["last_loss"] < 0.5 * found["first_loss"], f"loss did not fall: {found}"


def test_missing_peer_fails_with_clear_timeout(main, target):
    join = float(target.get("missing_peer_timeout_s", 10))
    port = free_port()
    started = time.monotonic()
    result = main.exec(torchrun_2nodes(port, join, True, f"imgtest-{uuid.uuid4().hex[:8]}"), timeout=join + 120,
                       env={"DDP_TIMEOUT_S": "30"})
    waited = time.monotonic() - started
    assert result.rc not in (0, 124), (
        f"torchrun with a missing peer {'hung' if result.rc == 124 else 'succeeded'} (exit {result.rc}) "
        f"instead of failing after the {join:.0f}s join timeout")
    assert _TIMEOUT_WORDS.search(result.text), (
        f"torchrun failed after {waited:.0f}s without naming the join timeout: {result.tail(3)}")
