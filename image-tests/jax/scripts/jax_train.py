"""THE multi-process JAX check: N processes (one per node, or several on one machine) join one
`jax.distributed` job, sum known values across every device of every process (`psum`), train a
tiny linear model data-parallel (gradients averaged with `pmean` across all devices) and check
that every process ends with the same parameters. CPU devices talk through gloo (JAX's CPU
collectives), GPUs through NCCL (XLA's GPU collectives), on every local GPU.

Interface (fixed: the multi-node launchers call it exactly so; each flag may come from the
environment instead):

    python3 jax_train.py --coordinator HOST:PORT --num-processes N --process-id I \
        [--steps S] [--init-timeout SECONDS]
    env: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID (flags win)

Process 0 prints exactly one line `DDP_RESULT {json}`, the multi-node check's result contract
(buildtool/contracts/frameworks.py): backend ("gloo" on CPU, "nccl" on GPU), world_size (the
processes that joined), first_loss, last_loss, identical (bool), and JAX's own platform,
process_count, process_id, local_devices, global_devices, psum, psum_expected. Exit 0 only when
the psum is the known sum, the loss fell and the parameters are identical everywhere; otherwise
non-zero, the cause on stderr.

Under the image-tests harness ($IMAGETEST_OUT set) every process also writes
process-<I>.start.json when it starts, process-<I>.json as it goes ({"ok", "ended", "stage",
"error", "where", ...its findings}: the stage it is in, rewritten at each stage, so a process
that jax aborts still tells where) and process-<I>.fault when a fatal signal kills it (jax aborts
the process with SIGABRT when the coordinator or a peer is lost); result.json holds the findings
when it ends. Self-contained (standard library and JAX): a launcher may ship this one file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import traceback

OUT = os.environ.get("IMAGETEST_OUT", "")
DEFAULT_STEPS = 40
DEFAULT_INIT_TIMEOUT_S = 300
FEATURES = 8
BATCH = 64
LR = 0.1
AXIS = "devices"


def write(name: str, data: dict) -> None:
    """A JSON file into the harness's folder, atomically (nothing without the harness)."""
    if not OUT:
        return
    path = os.path.join(OUT, name)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def error_line(exc: BaseException) -> str:
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class Failed(Exception):
    """A check that did not hold (the message is the cause)."""


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coordinator", default=env.get("JAX_COORDINATOR_ADDRESS", ""),
                    help="HOST:PORT of process 0's coordinator (env JAX_COORDINATOR_ADDRESS)")
    ap.add_argument("--num-processes", type=int, default=env.get("JAX_NUM_PROCESSES"),
                    help="how many processes join (env JAX_NUM_PROCESSES)")
    ap.add_argument("--process-id", type=int, default=env.get("JAX_PROCESS_ID"),
                    help="this process, 0..N-1 (env JAX_PROCESS_ID)")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    ap.add_argument("--init-timeout", type=int, default=DEFAULT_INIT_TIMEOUT_S,
                    help="seconds process 0 waits for every process to join (jax's initialization_timeout)")
    args = ap.parse_args(argv)
    host, sep, port = args.coordinator.rpartition(":")
    if not sep or not host or not port.isdigit():
        ap.error(f"--coordinator must be HOST:PORT, not {args.coordinator!r} (or set JAX_COORDINATOR_ADDRESS)")
    if args.num_processes is None or args.process_id is None:
        ap.error("--num-processes and --process-id are required (or JAX_NUM_PROCESSES and JAX_PROCESS_ID)")
    if not 0 <= args.process_id < args.num_processes:
        ap.error(f"--process-id {args.process_id} is not in 0..{args.num_processes - 1}")
    if args.steps < 4 or args.init_timeout < 1:
        ap.error("--steps must be at least 4 and --init-timeout at least 1")
    return args


def mark(found: dict, stage: str) -> None:
    """Write down the stage this process is entering: a process that dies without a Python error
    (jax aborts when the coordinator cannot be reached or a peer dies) leaves where it was."""
    found["stage"] = stage
    write(f"process-{found['process_id']}.json", found)


def run(args: argparse.Namespace, found: dict) -> dict:
    """The check; `found` collects what is known so far (written down even when a step fails)."""
    import jax

    mark(found, "initialize")
    print(f"jax_train: process {args.process_id} of {args.num_processes} joining the coordinator "
          f"{args.coordinator} (init timeout {args.init_timeout} s)", file=sys.stderr, flush=True)
    # CPU devices of different processes talk through gloo; without it a cross-process psum fails.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                               process_id=args.process_id, initialization_timeout=args.init_timeout)
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()
    platform = devices[0].platform
    found.update(platform=platform, backend="nccl" if platform == "gpu" else "gloo",
                 process_count=jax.process_count(), local_devices=jax.local_device_count(),
                 global_devices=len(devices), jax_version=jax.__version__)
    if jax.process_count() != args.num_processes:
        raise Failed(f"{jax.process_count()} processes joined, not {args.num_processes}")
    n = len(devices)
    mesh = Mesh(np.array(devices), (AXIS,))
    spread, whole = NamedSharding(mesh, P(AXIS)), NamedSharding(mesh, P())

    def on_every_device(shape, sharding, value):
        return jax.make_array_from_callback(shape, sharding, lambda index: value[index])

    # psum of device k's value k+1 over every device of every process: n(n+1)/2, never a local sum.
    mark(found, "psum")
    ones = on_every_device((n,), spread, np.arange(1, n + 1, dtype=np.float32))
    total = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, AXIS), mesh=mesh, in_specs=P(AXIS), out_specs=P(),
                                  check_vma=False))(ones)
    found["psum"] = float(np.asarray(total.addressable_shards[0].data)[0])
    found["psum_expected"] = float(n * (n + 1) // 2)

    # Data-parallel SGD: each device its own batch, gradients averaged over all devices (pmean).
    mark(found, "train")
    true_w = jax.numpy.arange(FEATURES, dtype=jax.numpy.float32) / FEATURES

    def step(w, key):
        key = jax.random.fold_in(key[0], jax.lax.axis_index(AXIS))
        x = jax.random.normal(key, (BATCH, FEATURES))
        y = x @ true_w

        def loss_fn(w):
            return jax.numpy.mean((x @ w - y) ** 2)

        loss, grad = jax.value_and_grad(loss_fn)(w)
        grad = jax.lax.pmean(grad, AXIS)
        return w - LR * grad, jax.lax.pmean(loss, AXIS)

    train_step = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P()), out_specs=(P(), P()),
                                       check_vma=False))
    w = on_every_device((FEATURES,), whole, np.zeros(FEATURES, dtype=np.float32))
    losses = []
    for i in range(args.steps):
        key = on_every_device((1, 2), whole, np.asarray(jax.random.key_data(jax.random.PRNGKey(i)))[None])
        w, loss = train_step(w, jax.random.wrap_key_data(key))
        losses.append(float(np.asarray(loss.addressable_shards[0].data)))
    found["first_loss"] = sum(losses[:3]) / 3
    found["last_loss"] = sum(losses[-3:]) / 3

    # Every process's parameters, hashed and gathered: identical means the averaging held.
    mark(found, "verify")
    from jax.experimental import multihost_utils

    local = np.asarray(w.addressable_shards[0].data)
    digest = hashlib.sha256(local.tobytes()).digest()[:8]
    gathered = multihost_utils.process_allgather(np.frombuffer(digest, dtype=np.uint8))
    hashes = [bytes(row).hex() for row in np.asarray(gathered).reshape(args.num_processes, -1)]
    found.update(param_hashes=hashes, identical=len(set(hashes)) == 1)
    return found


def problems(found: dict) -> list[str]:
    wrong = []
    if found.get("psum") != found.get("psum_expected"):
        wrong.append(f"psum over {found.get('global_devices')} devices gave {found.get('psum')}, "
                     f"expected {found.get('psum_expected')}")
    if not found.get("last_loss", 1.0) < 0.5 * found.get("first_loss", 0.0):
        wrong.append(f"loss did not fall: {found.get('first_loss')} -> {found.get('last_loss')}")
    if not found.get("identical"):
        wrong.append(f"processes ended with different parameters: {found.get('param_hashes')}")
    return wrong


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    me = args.process_id
    write(f"process-{me}.start.json", {"process_id": me, "pid": os.getpid(), "host": os.uname()[1]})
    if OUT:  # a fatal signal (SIGSEGV, SIGABRT...) leaves its name in process-N.fault
        import faulthandler

        faulthandler.enable(file=open(os.path.join(OUT, f"process-{me}.fault"), "w"))  # noqa: SIM115 - kept open
    found: dict = {"process_id": me, "num_processes": args.num_processes, "coordinator": args.coordinator,
                   "init_timeout_s": args.init_timeout, "ok": False, "ended": False, "stage": "import", "error": "",
                   "where": ""}
    try:
        run(args, found)
        wrong = problems(found)
        if wrong:
            raise Failed("; ".join(wrong))
        found["ok"] = True
        found["stage"] = "done"
    except BaseException as exc:  # noqa: BLE001 - recorded, then reported on stderr and in the exit code
        frames = traceback.extract_tb(exc.__traceback__)
        found["error"] = error_line(exc)
        found["error_type"] = type(exc).__name__
        found["where"] = f"{frames[-1].filename}:{frames[-1].lineno}" if frames and not isinstance(exc, Failed) else ""
    found["ended"] = True
    write(f"process-{me}.json", found)
    write("result.json", found)
    if found["ok"] and me == 0:
        keys = ("backend", "platform", "process_count", "process_id", "local_devices", "global_devices", "psum",
                "psum_expected", "first_loss", "last_loss", "identical")
        line = {"world_size": found.get("process_count"), **{k: found.get(k) for k in keys}}
        print("DDP_RESULT " + json.dumps(line), flush=True)
    if not found["ok"]:
        print(f"jax_train: process {me} failed at {found['stage']}: {found['error']}", file=sys.stderr, flush=True)
        return 1
    return 0


def leave(code: int) -> None:
    """os._exit(CODE) without losing output: Python's buffers and C stdio's, where NCCL writes its log when
    NCCL_DEBUG_FILE is unset (to a pipe stdout is block-buffered, and os._exit skips the C library's flush)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)   # fflush(NULL): every C stdio stream of the process
    except (OSError, AttributeError):    # no C library to ask (not Linux): nothing of NCCL's to lose either
        pass
    os._exit(code)


if __name__ == "__main__":
    # Skip interpreter teardown: the distributed client's shutdown barrier would wait (up to its
    # shutdown timeout) for a peer that already failed; everything is written down by now.
    leave(main())
