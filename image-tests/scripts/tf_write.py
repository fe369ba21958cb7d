"""TensorFlow writes scalars (tf.summary) into LOGDIR/RUN and, unless --no-profile, a profile
(tf.profiler.experimental) of a few steps into LOGDIR. Prints `TF_WRITE_OK <gpus>`."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402


def main() -> int:
    logdir, run = sys.argv[1], sys.argv[2]
    with_profile = "--no-profile" not in sys.argv
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
    print(f"TF_WRITE_OK {len(tf.config.list_physical_devices('GPU'))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
