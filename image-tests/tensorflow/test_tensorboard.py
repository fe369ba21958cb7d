"""TensorFlow writes scalars, a profile and a checkpoint where a user's training writes them (the
image's working directory, as its user); TensorBoard in the image starts, serves the scalars,
has the profile plugin loaded and serves that plugin's frontend (the tab a browser opens), and its
trace viewer shows the operations of the profiled training steps (what a user looks at, not only
that a profile file exists).
GPUs are visible to TensorFlow where there are GPUs."""

from __future__ import annotations

import os
import uuid

import pytest
from harness import frontend_problems

pytestmark = pytest.mark.shared(why="event files, a profile and TensorBoard queries")

LOGDIR = f"imgtest-tf-{uuid.uuid4().hex[:6]}"  # relative: the image's working directory
RUN = "train"
TB_START_S = 60         # TensorBoard start-up and the scalars appearing (tb_query.py's own bound)
PLUGIN = "profile"
UI_PAGES = ("trace_viewer_index.html", "bundle.js")  # bundle.js: index.html loads it from a script
# What every step of tf_write.py's training runs (the trace viewer names them `EagerLocalExecute: <op>`).
STEP_OPS = ("MatMul", "Square", "Mean")


@pytest.fixture(scope="module")
def written(main):
    probe = main.python("tf_write.py", LOGDIR, RUN, step="TensorFlow writing summaries, a profile and a checkpoint")
    found = probe.result
    assert isinstance(found, dict) and found.get("ok"), (
        f"TensorFlow could not write summaries in the image's working directory: "
        f"{(found or {}).get('error') or probe.cause()}")
    return found


def profile_run(written: dict) -> str:
    """The profile plugin's name of the profile tf_write.py wrote (its folder under plugins/profile)."""
    files = written.get("profile_files") or []
    return os.path.basename(os.path.dirname(files[0])) if files else ""


@pytest.fixture(scope="module")
def served(main, written):
    probe = main.python("tb_query.py", "--logdir", LOGDIR, "--mode", "scalars", "--run", RUN, "--tag", "loss",
                        *(["--profile-run", profile_run(written)] if profile_run(written) else []),
                        "--timeout", str(TB_START_S), "--ui", PLUGIN, *[x for p in UI_PAGES for x in ("--ui-page", p)],
                        "--expect-plugin", PLUGIN, "--plugin-dist", "tensorboard-plugin-profile",
                        "--plugin-dist", "xprof", step="TensorBoard serving the scalars",
                        quiet=TB_START_S + 30)
    found = probe.result
    assert isinstance(found, dict), probe.cause()
    assert found["started"], f"TensorBoard could not start: {found.get('error') or probe.cause()}"
    return found


def test_tf_writes_profile(written):
    assert written.get("profile_files"), (
        f"tf.profiler.experimental wrote no .xplane.pb under {written['logdir']}/plugins/profile")


def test_tensorboard_serves_scalars(served):
    status, values = served["scalars"]
    assert status == 200 and isinstance(values, list) and len(values) == 10, (
        f"TensorBoard does not serve the loss scalars: tags={served['tags']} scalars={served['scalars']}")


def test_profile_plugin_loaded(served):
    assert PLUGIN in served["plugins"], (
        f"TensorBoard did not load the {PLUGIN} plugin: {served.get('plugin_missing') or 'reason unknown'}")


def test_profile_plugin_frontend_served(served):
    """The Profile tab a browser opens: blank when the plugin's static files are gone."""
    if PLUGIN not in served["plugins"]:
        raise AssertionError(f"TensorBoard did not load the {PLUGIN} plugin: {served.get('plugin_missing')}")
    broken = frontend_problems(served, PLUGIN, UI_PAGES)
    assert not broken, f"the {PLUGIN} tab would not render in a browser: " + "; ".join(broken)


def test_trace_viewer_shows_the_profiled_steps(served, written):
    """The profile's trace viewer, as a user opens it: the operations the training steps ran."""
    if PLUGIN not in served["plugins"]:
        raise AssertionError(f"TensorBoard did not load the {PLUGIN} plugin: {served.get('plugin_missing')}")
    run = profile_run(written)
    assert run, f"tf.profiler.experimental wrote no .xplane.pb under {written['logdir']}/plugins/profile"
    profile = served.get("profile") or {}
    trace = profile.get("trace")
    assert trace, (f"the {PLUGIN} plugin served no trace of {run}: runs {profile.get('runs')}, "
                   f"hosts {profile.get('hosts')}")
    assert trace["status"] == 200 and not trace.get("error"), (
        f"the trace viewer's data for {run} answered {trace['status']}: {trace.get('error')}")
    names = set(trace["names"])
    missing = [op for op in STEP_OPS if not any(n == op or n.endswith(": " + op) for n in names)]
    assert not missing, (f"the trace of {run} ({trace['events']} events) holds no {', '.join(missing)} of the profiled "
                         f"training steps: names seen {sorted(names)[:20]}")


@pytest.mark.gpu(what="TensorFlow GPU visibility")
def test_tensorflow_sees_gpus(written, runner_gpus, require_gpu):
    require_gpu("TensorFlow GPU visibility")
    assert written["gpus"] == len(runner_gpus), (
        f"TensorFlow sees {written['gpus']} GPUs, the runner has {len(runner_gpus)}")
