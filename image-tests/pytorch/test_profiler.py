"""torch.profiler with tensorboard_trace_handler, read back through TensorBoard's
pytorch_profiler plugin (torch-tb-profiler) over HTTP from inside the container: its JSON API
(runs, views, worker overview) and its frontend (the module TensorBoard loads for the tab, its
index.html and what that page loads, the trace viewer), as a browser would fetch them. Traces
are written where a user's training writes them: in the image's working directory, as its user.
What a user looks at is checked, not only that a view exists: the Trace view's trace holds the
operator events of every traced step (and GPU kernels on GPUs), the Overview's step chart has a
row of time for each traced step, and the Operator view lists the model's operators."""

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
    # A JSON object's keys (tb_query.py), never the text of a page answered 200 that happens to say "steps".
    assert status == 200 and isinstance(keys, list) and "steps" in keys, f"worker overview not served: {status} {keys}"


def test_profiler_frontend_served(served):
    """The tab a browser opens: blank when the plugin's static files are gone, though its API answers."""
    if PLUGIN not in served["plugins"]:
        raise AssertionError(_missing(served))
    broken = frontend_problems(served, PLUGIN, UI_PAGES)
    assert not broken, f"the {PLUGIN} tab would not render in a browser: " + "; ".join(broken)


def _trace(served: dict) -> dict:
    if "trace" not in served:
        raise AssertionError(_missing(served) if PLUGIN not in served["plugins"]
                             else f"the Trace view was not reached: runs {served.get('runs')}, "
                                  f"workers {served.get('workers')}")
    trace = served["trace"]
    assert trace["status"] == 200 and not trace.get("error"), (
        f"the Trace view's data answered {trace['status']}: {trace.get('error')}")
    return trace


def test_profiler_trace_holds_operator_events(served, profiled):
    """The Trace view draws the traced steps with the operators run in them: a trace of metadata events
    only (no operator or kernel activity) lists every view and draws nothing."""
    trace = _trace(served)
    steps = [f"ProfilerStep#{n}" for n in profiled["steps"]]
    empty = [step for step in steps if not trace["steps"].get(step)]
    assert not empty, (
        f"the profiler trace holds no operator events in {', '.join(empty)} "
        f"({trace['events']} events: {trace['categories']}; steps with operators: {trace['steps']}): "
        "torch.profiler recorded no operator activity, so the Overview, Operator and Trace views show nothing")
    missing = sorted(set(profiled["operators"]) - set(trace["operator_names"]))
    assert not missing, f"the profiler trace lacks the model's operators {missing}: {trace['operator_names'][:20]}"


def test_profiler_overview_shows_the_traced_steps(served, profiled):
    """The Overview's step-time chart: one row per traced step, with time in it."""
    if "overview_steps" not in served:
        raise AssertionError(f"worker overview not served: {served.get('overview') or _missing(served)}")
    rows = served["overview_steps"]
    wanted = [str(n) for n in profiled["steps"]]
    timed = [step for step, total in rows if total > 0]
    assert [step for step, _ in rows] == wanted and timed == wanted, (
        f"the Overview's step chart shows {rows or 'no rows'} instead of steps {', '.join(wanted)} with their time: "
        "the trace holds no step of the profiled run")


def test_profiler_operator_view_lists_the_operators(served, profiled):
    """The Operator view's table: the model's operators, each with its calls."""
    if "operators" not in served:
        raise AssertionError(f"the Operator view was not reached: {served.get('overview') or _missing(served)}")
    status, rows = served["operators"]
    called = {name for name, calls in rows if calls}
    missing = sorted(set(profiled["operators"]) - called)
    assert status == 200 and not missing, (
        f"the Operator view lists {len(rows)} operators ({status}) and lacks {missing}: the trace holds no operator "
        f"events of the traced steps")


@pytest.mark.gpu(what="CUDA activity in the profiler (Kernel view, GPU device type)")
def test_profiler_cuda_kernels(served, require_gpu):
    require_gpu("CUDA activity in the profiler (Kernel view, GPU device type)")
    envs = {e["title"]: e["value"] for e in served.get("environments") or []}
    assert envs.get("Device Type") == "GPU", f"the profile shows no GPU activity: {envs}"
    trace = _trace(served)
    assert trace["kernels"], f"the profiler trace holds no GPU kernel events ({trace['categories']})"
    status, rows = served.get("kernels") or [0, []]
    assert status == 200 and rows, f"the Kernel view lists no kernels ({status}): {rows}"


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
    body = runs["body"]   # the plugin's own answer: {"runs": [...], ...}, not any page answered 200
    listed = isinstance(body, dict) and isinstance(body.get("runs"), list)
    assert runs["status"] == 200 and listed and found["answered_s"] <= EMPTY_BOUND_S, (
        f"the {PLUGIN} plugin did not answer on an empty log folder within {EMPTY_BOUND_S}s: {runs}")
