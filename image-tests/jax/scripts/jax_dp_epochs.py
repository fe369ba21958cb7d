"""JAX sharded data parallelism over processes (jax.distributed + jax.sharding), timing every epoch: the scaling
benchmark's JAX worker (`buildtool scaling --strategy jax-dp`) and the image's JAX data-parallel check
(test_dp.py) both run this file.

    python3 jax_dp_epochs.py --spawn N     # starts N processes of itself on this machine (coordinator on
                                           # 127.0.0.1, a free port) and exits with the first failure's code
    python3 jax_dp_epochs.py               # one process of the job: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
                                           # JAX_PROCESS_ID from the environment

Multi-process, not several CPU devices of one process: every process owns one CPU device (gloo between
processes, JAX's CPU collectives; NCCL between GPUs), as DDP's ranks each own one core. A `Mesh` over every
process's devices with one axis `data`; the global batch (SCALING_BATCH per process) is sharded along it
(`jax.make_array_from_process_local_data`), the parameters replicated; one jitted step computes the mean loss
over the global batch, so XLA all-reduces the gradients. The same model (256 -> 512 -> 512 -> 1 MLP, SGD lr
0.01), data subset, batch per rank and epochs as the PyTorch strategies (its own initial weights). Every epoch
ends with a barrier across processes, so its time is the slowest process's.

At the end every process hashes its replica of the parameters (`identical`: all the same), and process 0 replays
the training in one process on its own device, unsharded, on the same global batches (`matches_reference`,
`max_abs_diff`): gradients averaged across processes or not. Process 0 prints `SCALING_RESULT <json>` (backend,
world_size, epoch_times_s, losses, identical, matches_reference, max_abs_diff, peak_memory_mb per process).
Under the image-tests harness ($IMAGETEST_OUT set) process 0 also writes result.json and every process
process-<I>.json (ok, or its first error line). Self-contained (standard library, numpy and JAX).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import socket
import subprocess
import sys
import time
import traceback

OUT = os.environ.get("IMAGETEST_OUT", "")
LR = 0.01
AXIS = "data"
REFERENCE_TOLERANCE = 1e-3
INIT_TIMEOUT_S = int(os.environ.get("JAX_DP_INIT_TIMEOUT_S", "120"))
# One core per process, as DDP's ranks (XLA's CPU client otherwise spreads each process over every core).
ONE_CORE = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def write(name: str, data: dict) -> None:
    if OUT:
        path = os.path.join(OUT, name)
        with open(path + ".tmp", "w") as fh:
            json.dump(data, fh)
        os.replace(path + ".tmp", path)


def spawn(count: int) -> int:
    """N processes of this file on this machine; the first non-zero exit ends the others."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": str(count),
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {ONE_CORE}".strip()}
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__)], env={**env, "JAX_PROCESS_ID": str(i)})
             for i in range(count)]
    code = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed:
                code = failed[0]
                break
            time.sleep(0.2)
        code = code or next((p.returncode for p in procs if p.returncode), 0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return code


def init_params(np):  # noqa: ANN001 - numpy, imported late
    rng = np.random.default_rng(0)
    sizes = [(256, 512), (512, 512), (512, 1)]
    return [(rng.uniform(-1, 1, size=s).astype(np.float32) / np.sqrt(s[0]), np.zeros(s[1], np.float32))
            for s in sizes]


def main() -> dict:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
                               num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                               process_id=int(os.environ["JAX_PROCESS_ID"]), initialization_timeout=INIT_TIMEOUT_S)
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    samples = int(os.environ.get("SCALING_SAMPLES", "4096"))
    epochs = int(os.environ.get("SCALING_EPOCHS", "3"))
    batch = int(os.environ.get("SCALING_BATCH", "64"))
    verify = os.environ.get("SCALING_VERIFY", "1") == "1"
    world, me = jax.process_count(), jax.process_index()
    devices = jax.devices()
    mesh = Mesh(np.array(devices), (AXIS,))
    sharded, replicated = NamedSharding(mesh, P(AXIS)), NamedSharding(mesh, P())

    x = np.random.default_rng(0).standard_normal((samples, 256)).astype(np.float32)
    y = (x[:, :10] * 2.0).sum(axis=1, keepdims=True)
    steps = samples // (batch * len(devices))

    def loss_fn(params, xb, yb):
        h = xb
        for i, (w, b) in enumerate(params):
            h = h @ w + b
            if i < len(params) - 1:
                h = jax.nn.relu(h)
        return jnp.mean((h - yb) ** 2)

    def step(params, xb, yb):
        loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb)
        return jax.tree.map(lambda p, g: p - LR * g, params, grads), loss

    train = jax.jit(step, out_shardings=(replicated, replicated))
    # Each process gives its own copy (equal by construction): device_put's cross-process equality check
    # of a numpy array failed here with gloo on equal arrays (jax 0.10.2).
    params = jax.tree.map(lambda a: jax.make_array_from_callback(a.shape, replicated, lambda index: a[index]),
                          init_params(np))

    def batches(epoch):
        """Step k's global batch, as (steps, devices * batch) indices: device d holds [d*batch:(d+1)*batch]."""
        order = np.random.default_rng(epoch).permutation(samples)[:steps * batch * len(devices)]
        return order.reshape(steps, len(devices) * batch)

    local = [d.id for d in jax.local_devices()]
    mine = [devices.index(d) for d in devices if d.id in local]
    epoch_times, losses = [], []
    for epoch in range(epochs):
        order = batches(epoch)
        multihost_utils.sync_global_devices(f"epoch-{epoch}-start")
        start = time.perf_counter()
        total = 0.0
        for k in range(steps):
            index = np.concatenate([order[k, d * batch:(d + 1) * batch] for d in mine])
            xb = jax.make_array_from_process_local_data(sharded, x[index])
            yb = jax.make_array_from_process_local_data(sharded, y[index])
            params, loss = train(params, xb, yb)
            total += float(loss)
        multihost_utils.sync_global_devices(f"epoch-{epoch}-end")
        epoch_times.append(time.perf_counter() - start)
        losses.append(total / max(1, steps))

    flat = np.concatenate([np.asarray(a.addressable_shards[0].data).ravel() for a in jax.tree.leaves(params)])
    digest = np.frombuffer(hashlib.sha256(flat.tobytes()).digest()[:8], dtype=np.uint8)
    peak = np.array([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024], dtype=np.float32)
    hashes = np.asarray(multihost_utils.process_allgather(digest)).reshape(world, -1)
    peaks = np.asarray(multihost_utils.process_allgather(peak)).reshape(world)
    platform = devices[0].platform
    result = {"strategy": "jax-dp", "backend": "nccl" if platform == "gpu" else "gloo", "world_size": world,
              "devices": len(devices), "samples": samples, "batch": batch, "epoch_times_s": epoch_times,
              "losses": losses, "param_hashes": [bytes(h).hex() for h in hashes],
              "identical": len({bytes(h) for h in hashes}) == 1,
              "peak_memory_mb": [round(float(p), 1) for p in peaks], "jax_version": jax.__version__}
    if verify and me == 0:
        ref = [(w.copy(), b.copy()) for w, b in init_params(np)]
        one = jax.jit(step)
        cpu = jax.local_devices()[0]
        ref = jax.device_put(ref, cpu)
        for epoch in range(epochs):
            order = batches(epoch)
            for k in range(steps):
                ref, _ = one(ref, jax.device_put(x[order[k]], cpu), jax.device_put(y[order[k]], cpu))
        mine_flat = np.concatenate([np.asarray(a).ravel() for a in jax.tree.leaves(ref)])
        diff = float(np.abs(mine_flat - flat).max())
        result.update(max_abs_diff=diff, matches_reference=diff <= REFERENCE_TOLERANCE)
    if me == 0:
        write("result.json", result)
        print("SCALING_RESULT " + json.dumps(result), flush=True)
    multihost_utils.sync_global_devices("done")
    return result


def guarded() -> int:
    me = os.environ.get("JAX_PROCESS_ID", "0")
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - every failure is written down, then re-raised
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        write(f"process-{me}.json", {"process": me, "ok": False, "error": f"{type(exc).__name__}: {first}",
                                     "where": f"{where.filename}:{where.lineno}" if where else ""})
        raise
    write(f"process-{me}.json", {"process": me, "ok": True})
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--spawn"]:
        sys.exit(spawn(int(sys.argv[2])))
    code = guarded()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # jax's gloo threads may abort in interpreter teardown after the work is done
