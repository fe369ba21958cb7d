"""JAX sharded data parallelism inside one container (issue 42): scripts/jax_dp_epochs.py, the scaling benchmark's
jax-dp workload, started as two processes of one jax.distributed job (`--spawn 2`, coordinator on 127.0.0.1, one
CPU device each, gloo between them; on CPU on GPU runners too). A Mesh over both processes' devices, the global
batch sharded along it, parameters replicated, one jitted step: XLA all-reduces the gradients. Every process ends
with the same parameters, and they are the same (within 1e-3) as the same steps replayed in one process on the
whole global batches: gradients really averaged across processes. Decided from result.json and each process's
process-<I>.json (its own first error line)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.devices(why="JAX processes training over the devices")

# Two epochs of 8 steps (512 samples, 32 per process per step); a process waits up to 120 s for its peer.
DP_ENV = {"SCALING_SAMPLES": "512", "SCALING_EPOCHS": "2", "SCALING_BATCH": "32", "SCALING_VERIFY": "1",
          "JAX_PLATFORMS": "cpu", "JAX_DP_INIT_TIMEOUT_S": "120"}
QUIET_S = 120 + 60


@pytest.fixture(scope="module")
def dp_run(main):
    what = "JAX sharded data parallel (2 processes, gloo)"
    probe = main.run(["python3", "/imagetests/jax_dp_epochs.py", "--spawn", "2"], step=what, quiet=QUIET_S,
                     env=DP_ENV)
    errors = [f"{name}: {p.get('error')} (at {p.get('where')})" for name, p in sorted(probe.jsons("process-*.json")
                                                                                       .items()) if not p.get("ok")]
    assert not errors, f"{what} failed: " + "; ".join(errors)
    assert probe.ok and isinstance(probe.result, dict), f"{what}: process 0 wrote no result ({probe.cause()})"
    return probe.result


def test_jax_dp_processes_end_with_identical_parameters(dp_run):
    assert dp_run["world_size"] == 2 and dp_run["devices"] == 2, (
        f"JAX data parallel: {dp_run['world_size']} processes with {dp_run['devices']} devices, expected 2 and 2")
    assert dp_run["identical"], (
        f"JAX data parallel: processes ended with different parameters: {dp_run['param_hashes']}")


def test_jax_dp_gradients_are_averaged_across_processes(dp_run):
    assert dp_run.get("matches_reference"), (
        f"JAX data parallel gradient averaging is wrong: the parameters differ from the same steps in one process "
        f"by up to {dp_run.get('max_abs_diff')} (tolerance 1e-3)")
