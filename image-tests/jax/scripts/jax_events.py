"""JAX training writes its loss as TensorBoard scalars into LOGDIR/RUN, for TensorBoard in this or
another image to read. JAX has no summary writer of its own and the image has no TensorFlow or
torch, so this is what a JAX user does: TensorBoard's own pure-Python event writer
(tensorboard.summary.writer.event_file_writer) with a scalar Summary proto, the loss computed by
JAX. Writes result.json: {"ok", "error", "files", "values"}."""

from __future__ import annotations

import glob
import os
import sys
import time

from probe_io import error_line, result

STEPS = 10


def main() -> int:
    logdir = os.path.join(sys.argv[1], sys.argv[2])
    out = {"ok": False, "error": "", "files": [], "values": []}
    try:
        import jax
        import jax.numpy as jnp
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        w = jnp.zeros(4)
        true_w = jnp.arange(4, dtype=jnp.float32) / 4
        x = jax.random.normal(jax.random.PRNGKey(0), (32, 4))

        @jax.jit
        def step(w):
            loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - x @ true_w) ** 2))(w)
            return w - 0.1 * grad, loss

        writer = EventFileWriter(logdir)
        for i in range(STEPS):
            w, loss = step(w)
            value = float(loss)
            out["values"].append(value)
            summary = Summary(value=[Summary.Value(tag="loss", simple_value=value)])
            writer.add_event(Event(wall_time=time.time(), step=i, summary=summary))
        writer.close()
        out["files"] = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
        out["ok"] = bool(out["files"])
        if not out["ok"]:
            out["error"] = f"the event writer left no events.out.tfevents.* file in {os.path.abspath(logdir)}"
    except Exception as exc:  # noqa: BLE001 - the test names it
        out["error"] = error_line(exc)
    result(out)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
