"""torch.profiler with tensorboard_trace_handler, read back through TensorBoard's
pytorch_profiler plugin (torch-tb-profiler) over HTTP from inside the container."""

from __future__ import annotations

import pytest

LOGDIR = "/tmp/imgtest-profiler"
RUN = "run1"
EMPTY_BOUND_S = 60
NO_PLUGIN = "the pytorch_profiler plugin is not loaded (is torch-tb-profiler installed?)"


@pytest.fixture(scope="module")
def profiled(main):
    result = main.python("torch_profile.py", LOGDIR, RUN, timeout=180)
    assert result.rc == 0 and "PROFILE_OK" in result.out, f"torch.profiler run failed:\n{result.tail()}"
    return result.out


@pytest.fixture(scope="module")
def served(main, profiled):
    result = main.python("tb_query.py", "--logdir", LOGDIR, "--mode", "profiler", "--run", RUN,
                         "--timeout", "120", timeout=180)
    found = result.payload("TB_RESULT")
    assert found, f"TensorBoard query failed (exit {result.rc}):\n{result.tail()}"
    assert found["started"], f"TensorBoard did not start (exit {found.get('exit_code')}):\n{found.get('log_tail')}"
    return found


def test_profiler_writes_trace(profiled):
    assert ".pt.trace.json" in profiled, f"no Chrome trace written by tensorboard_trace_handler: {profiled}"


def test_profiler_plugin_active(served):
    assert "pytorch_profiler" in served["plugins"], (
        "TensorBoard has no pytorch_profiler plugin (is torch-tb-profiler installed?); "
        f"plugins: {sorted(served['plugins'])}")
    status, body = served["runs"]["status"], served["runs"]["body"]  # present when the plugin is
    assert status == 200 and RUN in body.get("runs", []), f"the profiler plugin does not list {RUN!r}: {status} {body}"


def test_profiler_views(served, runner_gpus):
    assert "views" in served, f"no views: the run was not listed ({served.get('runs', NO_PLUGIN)})"
    status, views = served["views"]
    expected = {"Overview", "Operator", "Trace"} | ({"Kernel"} if runner_gpus else set())
    assert status == 200 and expected <= set(views), f"profiler views {views} lack {sorted(expected - set(views))}"


def test_profiler_worker_overview(served):
    status, workers = served.get("workers", [0, None])
    assert status == 200 and workers, (f"no workers listed for {RUN}: {status} {workers}"
                                       if "runs" in served else NO_PLUGIN)
    status, keys = served.get("overview", [0, None])
    assert status == 200 and "steps" in keys, f"worker overview not served: {status} {keys}"


def test_profiler_cuda_kernels(served, require_gpu):
    require_gpu("CUDA activity in the profiler (Kernel view, GPU device type)")
    envs = {e["title"]: e["value"] for e in served.get("environments") or []}
    assert envs.get("Device Type") == "GPU", f"the profile shows no GPU activity: {envs}"


def test_tensorboard_answers_on_empty_logdir(main):
    main.exec("mkdir -p /tmp/imgtest-empty", timeout=30)
    result = main.python("tb_query.py", "--logdir", "/tmp/imgtest-empty", "--mode", "empty",
                         "--timeout", str(EMPTY_BOUND_S), timeout=EMPTY_BOUND_S + 30)
    found = result.payload("TB_RESULT")
    assert result.rc != 124 and found, f"TensorBoard on an empty log folder hung past {EMPTY_BOUND_S}s"
    assert found["started"], f"TensorBoard did not start on an empty log folder:\n{found.get('log_tail')}"
    runs = found.get("profiler_runs")
    assert runs is not None, f"TensorBoard on an empty log folder: {NO_PLUGIN}"
    assert runs["status"] == 200 and found["answered_s"] <= EMPTY_BOUND_S, (
        f"the pytorch_profiler plugin did not answer on an empty log folder within {EMPTY_BOUND_S}s: {runs}")
