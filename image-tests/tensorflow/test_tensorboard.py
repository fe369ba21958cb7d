"""TensorFlow writes scalars and a profile; TensorBoard in the image starts, serves the scalars
and has the profile plugin loaded. GPUs are visible to TensorFlow where there are GPUs."""

from __future__ import annotations

import pytest

LOGDIR = "/tmp/imgtest-tf"
RUN = "train"


@pytest.fixture(scope="module")
def written(main):
    result = main.python("tf_write.py", LOGDIR, RUN, timeout=240)
    assert result.rc == 0 and "TF_WRITE_OK" in result.out, f"TensorFlow could not write summaries:\n{result.tail()}"
    return int(result.out.split("TF_WRITE_OK")[-1].split()[0])


@pytest.fixture(scope="module")
def served(main, written):
    result = main.python("tb_query.py", "--logdir", LOGDIR, "--mode", "scalars", "--run", RUN, "--tag", "loss",
                         "--timeout", "120", timeout=180)
    found = result.payload("TB_RESULT")
    assert found, f"TensorBoard query failed (exit {result.rc}):\n{result.tail()}"
    if not found["started"]:
        tail = (found.get("log_tail") or "").strip().splitlines()
        cause = next((line for line in reversed(tail) if "Error" in line), tail[-1] if tail else "no output")
        raise AssertionError(f"TensorBoard crashed on start (exit {found.get('exit_code')}): {cause}")
    return found


def test_tf_writes_profile(main, written):
    found = main.exec(f"ls {LOGDIR}/plugins/profile/*/*.xplane.pb", timeout=30)
    assert found.rc == 0, f"tf.profiler.experimental wrote no .xplane.pb under {LOGDIR}/plugins/profile"


def test_tensorboard_serves_scalars(served):
    status, values = served["scalars"]
    assert status == 200 and isinstance(values, list) and len(values) == 10, (
        f"TensorBoard does not serve the loss scalars: tags={served['tags']} scalars={served['scalars']}")


def test_profile_plugin_loaded(served):
    assert "profile" in served["plugins"], (
        f"TensorBoard has no profile plugin (is tensorboard-plugin-profile installed?): {sorted(served['plugins'])}")


def test_tensorflow_sees_gpus(written, runner_gpus, require_gpu):
    require_gpu("TensorFlow GPU visibility")
    assert written == len(runner_gpus), f"TensorFlow sees {written} GPUs, the runner has {len(runner_gpus)}"
