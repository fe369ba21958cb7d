"""torch.profiler with tensorboard_trace_handler, read back through TensorBoard's
pytorch_profiler plugin (torch-tb-profiler) over HTTP from inside the container: its JSON API
(runs, views, worker overview) and its frontend (the module TensorBoard loads for the tab, its
index.html and what that page loads, the trace viewer), as a browser would fetch them. Traces
are written where a user's training writes them: in the image's working directory, as its user."""

from __future__ import annotations

import uuid

import pytest
from harness import frontend_problems

pytestmark = pytest.mark.shared(why="a trace and TensorBoard queries in the worker's container")

LOGDIR = f"imgtest-profiler-{uuid.uuid4().hex[:6]}"  # relative: the image's working directory
RUN = "run1"
TB_START_S = 60          # TensorBoard start-up and the run appearing (tb_query.py's own bound)
EMPTY_BOUND_S = 60
TB_QUIET_S = TB_START_S + 30  # tb_query waits on TensorBoard; it is hung only after its own bound had its chance
PLUGIN = "pytorch_profiler"
UI_PAGES = ("trace_viewer_full.html", "trace_embedding.html")


@pytest.fixture(scope="module")
def profiled(main):
    probe = main.python("torch_profile.py", LOGDIR, RUN, step="torch.profiler writing a trace")
    found = probe.result
    assert isinstance(found, dict) and found.get("ok"), (
        f"torch.profiler could not write its trace in the image's working directory: "
        f"{(found or {}).get('error') or probe.cause()}")
    return found


def _missing(served: dict) -> str:
    return f"TensorBoard did not load the {PLUGIN} plugin: {served.get('plugin_missing') or 'reason unknown'}"


@pytest.fixture(scope="module")
def served(main, profiled):
    args = ["--logdir", LOGDIR, "--mode", "profiler", "--run", RUN, "--timeout", str(TB_START_S), "--ui", PLUGIN,
            *[x for page in UI_PAGES for x in ("--ui-page", page)], "--expect-plugin", PLUGIN,
            "--plugin-dist", "torch-tb-profiler"]
    probe = main.python("tb_query.py", *args, step="TensorBoard serving the profile", quiet=TB_QUIET_S)
    found = probe.result
    assert isinstance(found, dict), probe.cause()
    assert found["started"], f"TensorBoard could not serve the profile: {found.get('error') or probe.cause()}"
    return found


def test_profiler_writes_trace(profiled):
    assert any(f.endswith(".pt.trace.json") for f in profiled["files"]), (
        f"no Chrome trace written by tensorboard_trace_handler in {profiled['logdir']}: {profiled['files']}")


def test_profiler_plugin_active(served):
    assert PLUGIN in served["plugins"], _missing(served)
    status, body = served["runs"]["status"], served["runs"]["body"]  # present when the plugin is
    assert status == 200 and RUN in body.get("runs", []), f"the profiler plugin does not list {RUN!r}: {status} {body}"


def test_profiler_views(served, runner_gpus):
    assert "views" in served, (f"no views: the run was not listed ({served['runs']})" if "runs" in served
                               else _missing(served))
    status, views = served["views"]
    expected = {"Overview", "Operator", "Trace"} | ({"Kernel"} if runner_gpus else set())
    assert status == 200 and expected <= set(views), f"profiler views {views} lack {sorted(expected - set(views))}"


def test_profiler_worker_overview(served):
    if "runs" not in served:
        raise AssertionError(_missing(served))
    status, workers = served.get("workers", [0, None])
    assert status == 200 and workers, f"no workers listed for {RUN}: {status} {workers}"
    status, keys = served.get("overview", [0, None])
    assert status == 200 and "steps" in keys, f"worker overview not served: {status} {keys}"


def test_profiler_frontend_served(served):
    """The tab a browser opens: blank when the plugin's static files are gone, though its API answers."""
    if PLUGIN not in served["plugins"]:
        raise AssertionError(_missing(served))
    broken = frontend_problems(served, PLUGIN, UI_PAGES)
    assert not broken, f"the {PLUGIN} tab would not render in a browser: " + "; ".join(broken)


@pytest.mark.gpu(what="CUDA activity in the profiler (Kernel view, GPU device type)")
def test_profiler_cuda_kernels(served, require_gpu):
    require_gpu("CUDA activity in the profiler (Kernel view, GPU device type)")
    envs = {e["title"]: e["value"] for e in served.get("environments") or []}
    assert envs.get("Device Type") == "GPU", f"the profile shows no GPU activity: {envs}"


@pytest.mark.exclusive(why=f"a timing check: TensorBoard must answer within {EMPTY_BOUND_S}s")
def test_tensorboard_answers_on_empty_logdir(main):
    empty = f"imgtest-empty-{uuid.uuid4().hex[:6]}"
    probe = main.python("tb_query.py", "--logdir", empty, "--mkdir", "--mode", "empty", "--timeout",
                        str(EMPTY_BOUND_S), "--expect-plugin", PLUGIN, "--plugin-dist", "torch-tb-profiler",
                        step="TensorBoard on an empty log folder", quiet=EMPTY_BOUND_S + 30)
    found = probe.result
    assert isinstance(found, dict), probe.cause()
    assert found["started"], f"TensorBoard could not start on an empty log folder: {found.get('error')}"
    runs = found.get("profiler_runs")
    assert runs is not None, _missing(found)
    assert runs["status"] == 200 and found["answered_s"] <= EMPTY_BOUND_S, (
        f"the {PLUGIN} plugin did not answer on an empty log folder within {EMPTY_BOUND_S}s: {runs}")
