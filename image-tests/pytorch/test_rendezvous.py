"""Multi-node rendezvous: two containers act as two nodes, each in its own network namespace on the
run's bridge network (made by `buildtool validate`), reaching each other by container name, and
join through torchrun's c10d rendezvous (`--nnodes 2`), train DDP together and agree on
parameters. A setting that only works on one host (a gloo or NCCL socket interface pinned to `lo`,
an address on 127.0.0.1) fails here as it would on a cluster. The join timeout defaults to 900 s
(a cold node may still be pulling the image) and is set by the target (`buildtool validate
--rdzv-join-timeout`); the c10d store's read timeout follows it, so a node may arrive that late
(tests/integration/test_late_peer.py shows one arriving after 60 s). Each node gets its own
NCCL_HOSTID, so NCCL never takes the two containers of one machine for one host and bypasses the
network. A missing peer must fail with torchrun's RendezvousTimeoutError, not hang. Both are
decided from what torchrun and the ranks record (ranks.py): the exception's type, never words in
the output, which another failure may print.

The transport between the two nodes is recorded in the verdict (figure `two_node_transport`): on CPU
gloo's TCP (family Socket); on GPUs what NCCL's per-rank log says (contracts/nccl_log.py: the family,
the NICs, GPUDirect RDMA), an empty or missing log failing on its own ("NCCL wrote no log: ...")."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import ranks
from harness import Probe, free_port, redirects

from buildtool.contracts import nccl_log
from buildtool.contracts.rendezvous import rdzv_conf

pytestmark = pytest.mark.devices(why="two-node DDP")

# A node waits for the other without CPU or I/O for up to the join timeout (then for the ranks'
# collective timeout, 120 s); the supervisor calls it hung only this much later.
QUIET_MARGIN_S = 60
TWO_NODE_DDP_TIMEOUT_S = 120


def torchrun_2nodes(endpoint: str, join_timeout: float, is_host: bool, run: str, local_addr: str = "") -> list[str]:
    """torchrun of one of two nodes: `endpoint` is the first node's HOST:PORT, `local_addr` the name (or
    address) by which the other node reaches this one (torch's rendezvous tells nodes apart by it too)."""
    conf = rdzv_conf(join_timeout, is_host=is_host)  # read_timeout follows the join timeout
    return ["torchrun", "--nnodes", "2", "--nproc-per-node", "1",
            *(["--local-addr", local_addr] if local_addr else []), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", run,
            "--rdzv-conf", conf, "--max-restarts", "0", "/imagetests/ddp_train.py"]


def stop_torchrun(container, run: str) -> None:
    """SIGTERM the torchrun of rendezvous `run` in `container` (images need not ship pkill)."""
    container.run(["python3", "-I", "-S", "/imagetests/stop_run.py", run], step="stop the other node")


def never_joined(waited: float, endpoint: str, found: ranks.Ranks) -> str:
    return (f"rendezvous timed out after {waited:.0f}s: the second node never joined {endpoint} "
            f"(--nnodes 2); torchrun: {found.launcher_error}; " + redirects("socket", "proxy"))


def nccl_between_nodes(results: dict[str, Probe]) -> str:
    """What NCCL's per-rank logs (NCCL_DEBUG_FILE, beside the ranks' records) say joined the two nodes; an
    AssertionError naming what is missing or wrong."""
    folders = [probe.dir for probe in results.values() if probe.dir is not None]
    logs = sorted(p for folder in folders for p in folder.glob("nccl-*.log"))
    log = nccl_log.read_files(logs)
    empty = nccl_log.no_log(logs, " and ".join(str(f) for f in folders) or "no node's folder", log)
    assert not empty, empty + " (NCCL_DEBUG=INFO, NCCL_DEBUG_FILE=nccl-RANK.%p.log)"
    shortcut = [f"{p.who} via {via}" for p in log.processes.values() for via in p.local]
    assert not shortcut, ("NCCL took the two nodes for one host and bypassed the network "
                          f"(NCCL_HOSTID not honoured?): {shortcut[:2]}")
    assert log.channels(), ("NCCL's log names no NET channel between the two nodes (`Channel NN/N : ... via NET/...`): "
                            f"{nccl_log.summary(log)}")
    return nccl_log.summary(log)


def test_two_nodes_rendezvous_and_agree(main, target, start_container, bridge, figures):
    join = float(target.get("rdzv_join_timeout_s", 900))
    # Two nodes of their own on the bridge network (the main container is on the host's network).
    first = start_container(target["image"], hint="node0", gpus=True, network=bridge)
    peer = start_container(target["image"], target.get("peer_run_flags", []), hint="node1", gpus=True, network=bridge)
    endpoint = f"{first.name}:{free_port()}"   # the first node, by its name on the run's bridge network
    results: dict[str, Probe] = {}
    run = f"imgtest-{uuid.uuid4().hex[:8]}"  # both nodes must name the same rendezvous
    env = {"DDP_STEPS": "20", "DDP_TIMEOUT_S": str(TWO_NODE_DDP_TIMEOUT_S), "DDP_BUSBW": "0", **ranks.LAUNCHER_ENV}
    # On a GPU runner each node takes its own GPU (NCCL); with fewer than two, the nodes use gloo.
    # Both containers share the host's boot id: a host id per node makes NCCL treat them as two hosts
    # and go through the network, as real nodes do (its debug log, written beside the ranks' records,
    # shows the transport it chose).
    gpus = target.get("runner_gpus") or []
    node_env = [{**env, "CUDA_VISIBLE_DEVICES": str(i), "NCCL_HOSTID": f"{run}-node{i}", "NCCL_DEBUG": "INFO"}
                if len(gpus) >= 2 else {**env, "DDP_DEVICE": "cpu", "NCCL_HOSTID": f"{run}-node{i}"}
                for i in range(2)]

    def node(name, container, is_host):
        results[name] = container.run(torchrun_2nodes(endpoint, join, is_host, run, container.name),
                                      step=f"two-node DDP ({name})",
                                      quiet=max(join, TWO_NODE_DDP_TIMEOUT_S) + QUIET_MARGIN_S,
                                      env=node_env[0 if is_host else 1])

    started = time.monotonic()
    threads = [threading.Thread(target=node, args=("node0", first, True)),
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
        stop_torchrun(first, run)
        stopped.add("node0")
    for thread in threads:
        thread.join()
    waited = time.monotonic() - started
    node0 = results["node0"]
    found0 = ranks.read(node0)
    if found0.launcher_type == ranks.RENDEZVOUS_TIMEOUT:
        raise AssertionError(never_joined(waited, endpoint, found0))
    causes = {name: ranks.cause(probe, f"{name} of two", endpoint) for name, probe in results.items()}
    failed = {name: cause for name, cause in causes.items() if cause}
    # A node we stopped because the other failed is not a cause; it is named last, if at all.
    first = {n: c for n, c in failed.items() if n not in stopped} or failed
    assert not failed, "two-node DDP failed: " + "; ".join(f"{name}: {cause}" for name, cause in first.items()) + (
        f" (stopped {', '.join(sorted(stopped & set(failed)))} after that)" if stopped & set(failed) else "")
    # Global rank 0 (which writes the result) may land on either node.
    found = node0.result or results["node1"].result
    assert isinstance(found, dict), "no node wrote a DDP result"
    assert found["world_size"] == 2, f"expected 2 ranks across 2 nodes, got {found['world_size']}"
    if len(gpus) >= 2:
        assert found["backend"] == "nccl", f"two GPU nodes trained with {found['backend']}, not NCCL"
        figures["two_node_transport"] = nccl_between_nodes(results)
    else:
        assert found["backend"] == "gloo", f"two CPU nodes trained with {found['backend']}, not gloo"
        figures["two_node_transport"] = f"{nccl_log.SOCKET} (gloo: torch's CPU collectives over TCP; NCCL not used)"
    assert found["identical"], f"the nodes ended with different parameters: {found['param_hashes']}"
    assert found["last_loss"] < 0.5 * found["first_loss"], f"loss did not fall: {found}"


@pytest.mark.shared(why="no peer comes, so no rank starts and no device is used; its port is its own")
def test_missing_peer_fails_with_clear_timeout(main, target):
    join = float(target.get("missing_peer_timeout_s", 10))
    probe = main.run(torchrun_2nodes(f"127.0.0.1:{free_port()}", join, True, f"imgtest-{uuid.uuid4().hex[:8]}",
                                     "127.0.0.1"),
                     step="torchrun waiting for a peer that never comes", quiet=join + QUIET_MARGIN_S,
                     env={"DDP_TIMEOUT_S": "30", **ranks.LAUNCHER_ENV})
    assert not probe.error and not probe.not_found, probe.cause()
    assert not probe.cut, f"{probe.hung()} instead of failing after the {join:.0f}s join timeout"
    assert probe.rc != 0, f"torchrun with a missing peer succeeded (exit 0) instead of timing out after {join:.0f}s"
    found = ranks.read(probe)
    assert found.launcher_type == ranks.RENDEZVOUS_TIMEOUT, (
        f"torchrun with a missing peer failed (exit {probe.rc}) without its join timeout: "
        f"{found.launcher_error or ranks.cause(probe, 'torchrun') or 'no error recorded'}")
