"""DDP inside one container: torchrun starts one process per GPU with NCCL, or two processes
with gloo when there is no GPU. The loss must fall and every rank must end with identical
parameters; on GPUs the all-reduce bus bandwidth is recorded as a figure."""

from __future__ import annotations

import pytest
from harness import Result, free_port

_CAUSES = ("timed out", "Timeout", "Connection refused", "unreachable", "No route to host",
           "Connection reset", "failed to connect", "Connection closed")


def reach_failure(result: Result, addr: str) -> str:
    lines = [line.strip() for line in result.text.splitlines() if any(c in line for c in _CAUSES)]
    hint = "(check MASTER_ADDR, the network and that the port is open between ranks)"
    if result.rc != 0 and lines:
        return f"DDP ranks could not reach each other through {addr}: {lines[-1][:300]} {hint}"
    if result.rc == 124 and "DDP_RESULT" not in result.out:
        return (f"DDP ranks could not reach each other through {addr}: no result within "
                f"{result.seconds:.0f}s, killed {hint}")
    return ""


@pytest.fixture(scope="module")
def ddp_run(main, target, runner_gpus):
    nproc = len(runner_gpus) if runner_gpus else 2
    port = free_port()
    addr = f"{target.get('ddp_master_addr', '127.0.0.1')}:{port}"
    timeout = float(target.get("ddp_timeout_s", 120))  # rendezvous and collectives
    cmd = ["torchrun", "--nnodes", "1", "--nproc-per-node", str(nproc), "--rdzv-backend", "static",
           "--master-addr", addr.split(":")[0], "--master-port", str(port),
           "--rdzv-conf", f"timeout={int(timeout)}", "/imagetests/ddp_train.py"]
    result = main.exec(cmd, timeout=timeout + 120, env={"DDP_TIMEOUT_S": str(int(timeout))})
    cause = reach_failure(result, addr)
    assert not cause, cause
    found = result.payload("DDP_RESULT")
    assert result.rc == 0 and found, f"torchrun DDP failed (exit {result.rc}):\n{result.tail()}"
    found["nproc"] = nproc
    return found


def test_ddp_loss_falls(ddp_run):
    assert ddp_run["last_loss"] < 0.5 * ddp_run["first_loss"], (
        f"DDP loss did not fall: {ddp_run['first_loss']:.4f} -> {ddp_run['last_loss']:.4f}")


def test_ddp_ranks_end_identical(ddp_run):
    assert ddp_run["world_size"] == ddp_run["nproc"], f"expected {ddp_run['nproc']} ranks, got {ddp_run['world_size']}"
    assert ddp_run["identical"], f"ranks ended with different parameters: {ddp_run['param_hashes']}"


def test_ddp_nccl_allreduce_busbw(ddp_run, require_gpu, figures):
    require_gpu("NCCL DDP and all-reduce bus bandwidth")
    assert ddp_run["backend"] == "nccl", f"DDP on GPUs used {ddp_run['backend']}, not NCCL"
    figures["allreduce_busbw_GBps"] = ddp_run["figures"]["busbw_GBps"]
    figures["allreduce_algbw_GBps"] = ddp_run["figures"]["algbw_GBps"]
    figures["allreduce_bytes"] = ddp_run["figures"]["allreduce_bytes"]
    figures["allreduce_ranks"] = ddp_run["world_size"]
