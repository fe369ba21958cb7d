"""JAX's profiler traces a few training steps into LOGDIR (jax.profiler.trace: an XPlane under
LOGDIR/plugins/profile/<run>/, what TensorBoard's profile plugin reads), the traced step named
with jax.profiler.StepTraceAnnotation and its function with a name of its own (OP_NAME) so the
trace can be searched for it. LOGDIR may be relative to the image's working directory, as a
user's training writes. Writes result.json: {"ok", "error", "logdir" (absolute), "runs",
"files", "op_name", "step_name"}."""

from __future__ import annotations

import glob
import os
import sys

from probe_io import error_line, result

OP_NAME = "imgtest_jax_train_step"   # the traced function's name: its jit shows up in the trace
STEP_NAME = "imgtest_step"
STEPS = 5


def main() -> int:
    logdir = sys.argv[1]
    out = {"ok": False, "error": "", "logdir": os.path.abspath(logdir), "runs": [], "files": [],
           "op_name": OP_NAME, "step_name": STEP_NAME}
    try:
        import jax
        import jax.numpy as jnp

        x = jax.random.normal(jax.random.PRNGKey(0), (256, 64))
        true_w = jnp.arange(64, dtype=jnp.float32) / 64

        def imgtest_jax_train_step(w):
            loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - x @ true_w) ** 2))(w)
            return w - 0.1 * grad, loss

        assert imgtest_jax_train_step.__name__ == OP_NAME
        step = jax.jit(imgtest_jax_train_step)
        w = jnp.zeros(64)
        w, loss = step(w)  # compiled before the trace, as a user's warm-up step
        loss.block_until_ready()
        with jax.profiler.trace(logdir):
            for i in range(STEPS):
                with jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=i):
                    w, loss = step(w)
                    loss.block_until_ready()
        root = os.path.join(logdir, "plugins", "profile")
        out["runs"] = sorted(os.listdir(root)) if os.path.isdir(root) else []
        out["files"] = sorted(glob.glob(os.path.join(root, "*", "*.xplane.pb")))
        out["ok"] = bool(out["files"])
        if not out["ok"]:
            out["error"] = f"jax.profiler.trace wrote no .xplane.pb under {os.path.abspath(root)}"
    except Exception as exc:  # noqa: BLE001 - the test names it
        out["error"] = error_line(exc)
    result(out)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
