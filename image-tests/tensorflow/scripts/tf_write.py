"""TensorFlow writes scalars (tf.summary) into LOGDIR/RUN and, unless --no-profile, a profile
(tf.profiler.experimental) of a few steps into LOGDIR, then saves a checkpoint beside them.
LOGDIR may be relative to the image's working directory, as a user's training writes.
Writes result.json: {"ok", "gpus", "logdir" (absolute), "profile_files", "checkpoint", "error"}."""

from __future__ import annotations

import glob
import os
import sys

from probe_io import error_line, result

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> int:
    logdir, run = sys.argv[1], sys.argv[2]
    with_profile = "--no-profile" not in sys.argv
    out = {"ok": False, "logdir": os.path.abspath(logdir), "gpus": None, "error": ""}
    try:
        import tensorflow as tf

        writer = tf.summary.create_file_writer(os.path.join(logdir, run))
        w = tf.Variable(tf.zeros([8, 1]))
        opt = tf.keras.optimizers.SGD(0.1)
        true_w = tf.reshape(tf.range(8, dtype=tf.float32) / 8, [8, 1])
        if with_profile:
            tf.profiler.experimental.start(logdir)
        with writer.as_default():
            for step in range(10):
                x = tf.random.normal([32, 8], seed=step)
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(x @ w - x @ true_w))
                opt.apply_gradients([(tape.gradient(loss, w), w)])
                tf.summary.scalar("loss", loss, step=step)
        if with_profile:
            tf.profiler.experimental.stop()
        writer.flush()
        out["gpus"] = len(tf.config.list_physical_devices("GPU"))
        if with_profile:
            pattern = os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")
            out["profile_files"] = sorted(glob.glob(pattern))
            out["checkpoint"] = tf.train.Checkpoint(w=w).save(os.path.join(logdir, "ckpt", "model"))
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001 - the test names it
        out["error"] = error_line(exc)
    result(out)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
