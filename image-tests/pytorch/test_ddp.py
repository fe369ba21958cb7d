"""DDP inside one container: torchrun starts one process per GPU with NCCL, or two processes
with gloo when there is no GPU. The loss must fall and every rank must end with identical
parameters; rank 0 saves a checkpoint in the image's working directory, as its user; on GPUs
the all-reduce bus bandwidth is recorded as a figure. A failure names the failing rank's own
first error line (ranks.py), not torchrun's summary of who was killed afterwards."""

from __future__ import annotations

import pytest
import ranks
from harness import free_port

DDP_TIMEOUT_S = 60.0   # default for the ranks' rendezvous and collective timeout (target: ddp_timeout_s)
DDP_RUN_S = 60.0       # on top of it: two Python start-ups, importing torch, 40 steps
BUSBW_S = 180.0        # on GPUs, on top of that: the all-reduce bus bandwidth measurement


@pytest.fixture(scope="module")
def ddp_run(main, target, runner_gpus):
    nproc = len(runner_gpus) if runner_gpus else 2
    port = free_port()
    addr = f"{target.get('ddp_master_addr', '127.0.0.1')}:{port}"
    timeout = float(target.get("ddp_timeout_s", DDP_TIMEOUT_S))  # rendezvous and collectives
    cmd = ["torchrun", "--nnodes", "1", "--nproc-per-node", str(nproc), "--rdzv-backend", "static",
           "--master-addr", addr.split(":")[0], "--master-port", str(port),
           "--rdzv-conf", f"timeout={int(timeout)}", "/imagetests/ddp_train.py"]
    what = f"torchrun DDP ({nproc} ranks)"
    probe = main.run(cmd, step=what, timeout=timeout + DDP_RUN_S + (BUSBW_S if runner_gpus else 0),
                     env={"DDP_TIMEOUT_S": str(int(timeout)), **ranks.LAUNCHER_ENV})
    cause = ranks.cause(probe, what, addr)
    assert not cause, cause
    found = probe.result
    assert probe.ok and isinstance(found, dict), f"{what}: rank 0 wrote no result ({probe.cause()})"
    found["nproc"] = nproc
    return found


def test_ddp_loss_falls(ddp_run):
    assert ddp_run["last_loss"] < 0.5 * ddp_run["first_loss"], (
        f"DDP loss did not fall: {ddp_run['first_loss']:.4f} -> {ddp_run['last_loss']:.4f}")


def test_ddp_ranks_end_identical(ddp_run):
    assert ddp_run["world_size"] == ddp_run["nproc"], f"expected {ddp_run['nproc']} ranks, got {ddp_run['world_size']}"
    assert ddp_run["identical"], f"ranks ended with different parameters: {ddp_run['param_hashes']}"


def test_ddp_checkpoint_saved_in_workdir(ddp_run):
    saved = ddp_run.get("checkpoint") or {}
    assert saved.get("ok"), (f"rank 0 could not save a checkpoint in the image's working directory as its user: "
                             f"{saved.get('error') or 'no checkpoint attempted'} ({saved.get('path')})")


@pytest.mark.gpu(what="NCCL DDP and all-reduce bus bandwidth")
def test_ddp_nccl_allreduce_busbw(ddp_run, require_gpu, figures):
    require_gpu("NCCL DDP and all-reduce bus bandwidth")
    assert ddp_run["backend"] == "nccl", f"DDP on GPUs used {ddp_run['backend']}, not NCCL"
    figures["allreduce_busbw_GBps"] = ddp_run["figures"]["busbw_GBps"]
    figures["allreduce_algbw_GBps"] = ddp_run["figures"]["algbw_GBps"]
    figures["allreduce_bytes"] = ddp_run["figures"]["allreduce_bytes"]
    figures["allreduce_ranks"] = ddp_run["world_size"]
