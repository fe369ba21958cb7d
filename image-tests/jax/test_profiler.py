"""JAX's profiler (jax.profiler.trace) writes a trace of a few training steps where a user's
training writes it (the image's working directory, as its user); TensorBoard in the image, with
its profile plugin (tensorboard-plugin-profile / xprof), lists the run, offers the trace viewer,
serves the trace, and the trace holds the traced steps and the jitted step function; the plugin's
frontend (the tab a browser opens) is served. Queried over HTTP from inside the container
(scripts/tb_query.py --mode profile)."""

from __future__ import annotations

import re
import uuid

import pytest
from harness import frontend_problems

pytestmark = pytest.mark.shared(why="a trace and TensorBoard queries in the worker's container")

LOGDIR = f"imgtest-jax-profile-{uuid.uuid4().hex[:6]}"  # relative: the image's working directory
TB_START_S = 60          # TensorBoard start-up and the run appearing (tb_query.py's own bound)
TB_QUIET_S = TB_START_S + 30
PLUGIN = "profile"
DISTS = ("tensorboard-plugin-profile", "xprof")
UI_PAGES = ("trace_viewer_index.html", "bundle.js")  # bundle.js: index.html loads it from a script
TRACE_TOOL = "trace_viewer@"
STEPS = 5                # jax_profile.py traces this many steps


@pytest.fixture(scope="module")
def traced(main):
    probe = main.python("jax_profile.py", LOGDIR, step="jax.profiler.trace writing a trace")
    found = probe.result
    assert isinstance(found, dict) and found.get("ok"), (
        f"jax.profiler could not write its trace in the image's working directory: "
        f"{(found or {}).get('error') or probe.cause()}")
    return found


def _missing(served: dict) -> str:
    return f"TensorBoard did not load the {PLUGIN} plugin: {served.get('plugin_missing') or 'reason unknown'}"


@pytest.fixture(scope="module")
def served(main, traced):
    run = traced["runs"][0]
    args = ["--logdir", LOGDIR, "--mode", "profile", "--run", run, "--timeout", str(TB_START_S), "--ui", PLUGIN,
            *[x for page in UI_PAGES for x in ("--ui-page", page)], "--expect-plugin", PLUGIN,
            *[x for dist in DISTS for x in ("--plugin-dist", dist)]]
    probe = main.python("tb_query.py", *args, step="TensorBoard serving the JAX trace", quiet=TB_QUIET_S)
    found = probe.result
    assert isinstance(found, dict), probe.cause()
    assert found["started"], f"TensorBoard could not serve the trace: {found.get('error') or probe.cause()}"
    return dict(found, run=run)


def test_jax_profiler_writes_xplane(traced):
    assert traced["files"] and all(f.endswith(".xplane.pb") for f in traced["files"]), (
        f"jax.profiler.trace wrote no .xplane.pb under {traced['logdir']}/plugins/profile: {traced['files']}")


def test_profile_plugin_lists_the_run(served):
    assert PLUGIN in served["plugins"], _missing(served)
    status, runs = served["runs"]
    assert status == 200 and isinstance(runs, list) and served["run"] in runs, (
        f"the {PLUGIN} plugin does not list the run {served['run']!r}: {status} {runs}")


def test_profile_plugin_offers_the_trace_viewer(served):
    if "tools" not in served:
        raise AssertionError(_missing(served) if PLUGIN not in served["plugins"] else f"no run: {served['runs']}")
    status, tools = served["tools"]
    # The plugin's JSON list of tools, never the text of a page answered 200 that names the tool.
    assert status == 200 and isinstance(tools, list) and TRACE_TOOL in tools, (
        f"the run's tools {tools} lack the trace viewer ({TRACE_TOOL})")


# Events that every trace has, whatever ran: the viewer's metadata.
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index", "process_labels"}
# An XLA operation as the trace names it: `dot`, `dot.1`, `add_multiply_fusion`, `wrapped_reduce-window`.
XLA_OP = re.compile(r"[a-z][a-z0-9_\-]*(\.\d+)?")


def xla_operations(names: set[str], traced: dict) -> list[str]:
    skip = METADATA | {traced["op_name"]}
    return sorted(n for n in names if XLA_OP.fullmatch(n) and n not in skip and not n.startswith(traced["step_name"]))


def test_trace_holds_the_traced_steps(served, traced):
    """The trace viewer's events hold every traced step (StepTraceAnnotation), the jitted step
    function's execution (PjitFunction(<name>)) and the XLA operations it ran (its `dot`s and
    fusions: what the viewer draws inside each step), not just an empty profile."""
    if "trace" not in served:
        raise AssertionError(_missing(served) if PLUGIN not in served["plugins"]
                             else f"no trace served: runs {served.get('runs')}, hosts {served.get('hosts')}")
    trace = served["trace"]
    assert trace["status"] == 200 and not trace.get("error"), (
        f"the trace viewer's data for host {trace.get('host')} answered {trace['status']}: {trace.get('error')}")
    names = set(trace["names"])
    steps = {f"{traced['step_name']} {i}" for i in range(STEPS)}
    function = f"PjitFunction({traced['op_name']})"
    missing = sorted(steps - names) + ([function] if function not in names else [])
    assert not missing, (f"the trace ({trace['events']} events) lacks {missing}: "
                         f"names seen {sorted(names)[:20]}")
    assert xla_operations(names, traced), (
        f"the trace ({trace['events']} events) holds no XLA operation of the jitted step (no dot or fusion), only "
        f"{sorted(names)[:20]}: the profiler recorded the steps but not what ran in them")


def test_profile_plugin_frontend_served(served):
    """The Profile tab a browser opens: blank when the plugin's static files are gone."""
    if PLUGIN not in served["plugins"]:
        raise AssertionError(_missing(served))
    broken = frontend_problems(served, PLUGIN, UI_PAGES)
    assert not broken, f"the {PLUGIN} tab would not render in a browser: " + "; ".join(broken)
