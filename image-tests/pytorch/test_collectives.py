"""Collectives give the known result (scripts/collectives.py under torchrun): all_reduce SUM and
MAX, broadcast and all_gather of tensors built from the rank numbers. On CPU with gloo (two
ranks); on GPUs with NCCL, one rank per GPU. DDP's own checks may pass with a collective that
silently does nothing; these may not."""

from __future__ import annotations

import pytest
import ranks
from harness import free_port, skip

from buildtool.contracts import skips

pytestmark = pytest.mark.devices(why="collectives over the ranks' devices")

COLLECTIVE_TIMEOUT_S = 60  # a rank waits this long for the others before gloo/NCCL fails with its own error
COLLECTIVES_QUIET_S = COLLECTIVE_TIMEOUT_S + 30  # idle ranks are hung only after that error had its chance


def run_collectives(main, nproc: int, device: str) -> tuple[str, dict]:
    port = free_port()
    what = f"collectives on {nproc} ranks ({'NCCL' if device == 'cuda' else 'gloo'})"
    cmd = ["torchrun", "--nnodes", "1", "--nproc-per-node", str(nproc), "--rdzv-backend", "static",
           "--master-addr", "127.0.0.1", "--master-port", str(port), "/imagetests/collectives.py"]
    env = {"DDP_TIMEOUT_S": str(COLLECTIVE_TIMEOUT_S), **ranks.LAUNCHER_ENV,
           **({"DDP_DEVICE": "cpu"} if device == "cpu" else {})}
    probe = main.run(cmd, step=what, quiet=COLLECTIVES_QUIET_S, env=env)
    cause = ranks.cause(probe, what, f"127.0.0.1:{port}")
    assert not cause, cause
    found = ranks.read(probe).ended
    assert len(found) == nproc, f"{what}: {len(found)} of {nproc} ranks reported ({probe.cause() or 'no error'})"
    # Each rank's expected results come from the world size it reports: ranks that each formed a group of their own
    # (world 1) get their own input back and call it right. The world is the ranks torchrun started, or nothing moved.
    alone = {rank: e.get("world_size") for rank, e in sorted(found.items()) if e.get("world_size") != nproc}
    assert not alone, (f"{what}: not every rank joined one group of {nproc}: "
                       + ", ".join(f"rank {rank} reports world size {size}" for rank, size in alone.items())
                       + "; the collectives moved nothing between the ranks")
    return what, found


def wrong_results(what: str, found: dict) -> list[str]:
    wrong = []
    for rank, entry in sorted(found.items()):
        for name, check in sorted((entry.get("checks") or {}).items()):
            if not check["ok"]:
                wrong.append(f"{name} on rank {rank} gave {check['got']}, expected {check['want']}")
    return wrong


def test_collectives_give_known_results_on_cpu(main):
    what, found = run_collectives(main, 2, "cpu")
    assert all(e.get("backend") == "gloo" for e in found.values()), f"{what}: backends {found}"
    wrong = wrong_results(what, found)
    assert not wrong, f"{what}: " + "; ".join(wrong)


@pytest.mark.gpu(what="NCCL collectives (all_reduce, broadcast, all_gather)")
def test_collectives_give_known_results_with_nccl(main, runner_gpus, require_gpu):
    require_gpu("NCCL collectives (all_reduce, broadcast, all_gather)")
    what, found = run_collectives(main, len(runner_gpus), "cuda")
    assert all(e.get("backend") == "nccl" for e in found.values()), f"{what}: not NCCL: {found}"
    wrong = wrong_results(what, found)
    assert not wrong, f"{what}: " + "; ".join(wrong)
    if len(runner_gpus) < 2:   # an all_reduce over one rank returns its input: a collective that does nothing passes
        skip(skips.ONE_GPU_ON_RUNNER, ranks.one_rank_why("NCCL's all_reduce, broadcast and all_gather giving the "
                                                         "known results"))
