"""Fixtures for tests that run inside an image.

`buildtool validate` writes a target file (image, digest, cell, run flags, expectations,
deadline) and runs `pytest image-tests/<groups> --target FILE --results FILE`. One container
per image per run is started from the cell's run profile and shared by every test that can
share it; tests that need more (a second rendezvous node, a TensorBoard of the other framework)
start their own, and all of them are removed at the end, on interrupts too.

Concurrency (`buildtool validate --jobs N`, pytest-xdist): each worker has its own containers; what
may run together is declared per test and enforced by one lock (lanes.py). The controller records
every test's result (xdist hands it each report), merges what workers learnt about the image (figures,
facts) and writes the results; the image's deadline is one instant for all of them.

Results: a test counts as passed only when its call phase passed. A test that was running
when the session was interrupted (SIGTERM, Ctrl-C, the deadline's backstop) is recorded as
failed, with the interruption as its message; tests never started because the image's
deadline was spent fail with "not run: ...".
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import harness  # noqa: E402
import lanes  # noqa: E402
from harness import Container, check_client_setting, install_signal_cleanup, remove_all, skip, warm_up  # noqa: E402
from infra import host_of, pip_list  # noqa: E402

from buildtool.contracts import skips  # noqa: E402
from buildtool.contracts.target import load_target  # noqa: E402

_RESULTS: list[dict[str, Any]] = []
_FIGURES: dict[str, Any] = {}
_FACTS: dict[str, Any] = {}
_TARGET: dict[str, Any] = {}
_INTERRUPTED: list[str] = []
_SCHEDULE: dict[str, dict[str, Any]] = {}   # test id -> lane, access, why, started, ended (epoch seconds)
_WORKERS: list[dict[str, Any]] = []          # what each xdist worker reported when it ended
_CONTAINER: list[bool] = []                  # this process has started (or tried to start) its main container
_COLD: list[bool] = []                       # this process measures the image's cold start (lanes.py)
_HOLDING: list[tuple[lanes.Held, str, pytest.Item]] = []  # the running test: the lock it holds, the mode it declares
NOT_RUN = "not run: "


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--target", help="target JSON written by `buildtool validate`")
    parser.addoption("--results", help="write per-test results and figures here (JSON)")


def pytest_configure(config: pytest.Config) -> None:
    check_client_setting()
    install_signal_cleanup()
    if config.getoption("--target", None):
        _TARGET.update(_load_target(config))
        harness.set_image_env(_TARGET.get("image_env") or {},
                              [*_TARGET.get("run_flags", []), *_TARGET.get("extra_run_flags", [])])
        harness.SLOWDOWN = int(_TARGET.get("slowdown") or 1)
        handed = getattr(config, "workerinput", {}).get("image_tests_deadline")
        if handed:   # an xdist worker: the controller's deadline, the same instant (one monotonic clock)
            harness.DEADLINE.total_s, harness.DEADLINE.ends_at = handed
        else:
            harness.set_deadline(float(_TARGET.get("probe_budget_s") or 0), float(_TARGET.get("deadline_s") or 0))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: every worker stops probes at the deadline this process set, not its own start's."""
    node.workerinput["image_tests_deadline"] = [harness.DEADLINE.total_s, harness.DEADLINE.ends_at]


def _lane(config: pytest.Config) -> str:
    return str(getattr(config, "workerinput", {}).get("workerid", "main"))


def _lock_dir(config: pytest.Config) -> Path:
    """One folder for every worker of this run: beside the target file, named by the run."""
    path = Path(config.getoption("--target"))
    return path.parent / f"lanes-{_load_target(config).get('run_id', 'run')}"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """Run the test under the lock its declaration asks for (lanes.py), from setup to teardown."""
    if not item.config.getoption("--target", None):
        yield
        return
    target = _load_target(item.config)
    gpu_skip = item.get_closest_marker("gpu") is not None and not target.get("runner_gpus")  # no fixture runs
    cold = ("main" in getattr(item, "fixturenames", ()) and not gpu_skip and not _CONTAINER and not _COLD
            and lanes.claim_cold_start(_lock_dir(item.config)))
    if cold:
        _COLD.append(True)
    mode, why = lanes.access(item, target)
    item.user_properties += [("lane", _lane(item.config)), ("access", mode), ("access_why", why),
                             ("gpu", item.get_closest_marker("gpu") is not None)]   # the marker, as defined.json
    with lanes.hold(_lock_dir(item.config), lanes.EXCLUSIVE if cold else mode) as held:
        _HOLDING[:] = [(held, mode, item)]
        try:
            yield
        finally:
            _HOLDING.clear()


def _warm() -> None:
    """The cold start is measured: the test that started the container holds the lock as it declares."""
    if _HOLDING:
        held, declared, item = _HOLDING[0]
        if held.mode != declared:   # declared shared: exclusive only while the cold start was measured
            item.user_properties.append(("cold_start_until", time.time()))
            held.share()

def pytest_unconfigure(config: pytest.Config) -> None:
    remove_all()


def _load_target(config: pytest.Config) -> dict[str, Any]:
    if _TARGET:
        return _TARGET
    path = config.getoption("--target")
    if not path:
        pytest.exit("image-tests need --target FILE (run them with `buildtool validate IMAGE`)", returncode=4)
    return load_target(Path(path))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "ulimit_name" in metafunc.fixturenames:
        names = sorted(_load_target(metafunc.config).get("ulimits", {}))
        metafunc.parametrize("ulimit_name", names, ids=names)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture: a spent deadline means not run; a GPU check without GPUs is a skip,
    even when the fixtures it needs would fail (they never start)."""
    if item.get_closest_marker("gpu") is not None and not _load_target(item.config).get("runner_gpus"):
        target = _load_target(item.config)
        what = item.get_closest_marker("gpu").kwargs.get("what") or item.name
        # Not run where the cell wants GPUs: a CUDA image, or a run profile with GPUs (validate names why it has none).
        if target.get("needs_gpu") or target.get("gpu_problem"):
            why = target.get("gpu_problem") or "nvidia-smi found none"
            skip(skips.NO_GPU_ON_RUNNER, f"no usable GPU on this runner ({why}): {what} not run")
        skip(skips.GPU_NOT_IN_CELL, f"the cell's run profile has no GPUs: {what} does not apply")
    if harness.DEADLINE.spent():
        pytest.fail(NOT_RUN + harness.DEADLINE.describe(), pytrace=False)


@pytest.fixture(scope="session")
def target(pytestconfig: pytest.Config) -> dict[str, Any]:
    return _load_target(pytestconfig)


@pytest.fixture(scope="session")
def runner_gpus(target: dict[str, Any]) -> list[dict[str, str]]:
    return list(target.get("runner_gpus") or [])


@pytest.fixture(scope="session")
def require_gpu(runner_gpus: list[dict[str, str]], target: dict[str, Any]):
    def _require(what: str) -> None:
        if runner_gpus:
            return
        if target.get("needs_gpu") or target.get("gpu_problem"):   # as pytest_runtest_setup says it
            why = target.get("gpu_problem") or "nvidia-smi found none"
            skip(skips.NO_GPU_ON_RUNNER, f"no usable GPU on this runner ({why}): {what} not run")
        skip(skips.GPU_NOT_IN_CELL, f"the cell's run profile has no GPUs: {what} does not apply")
    return _require


@pytest.fixture(scope="session")
def figures() -> dict[str, Any]:
    return _FIGURES


@pytest.fixture(scope="session")
def facts() -> dict[str, Any]:
    """What the image reported about itself that the verdict keeps (the framework's full version)."""
    return _FACTS


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shared")
    path.chmod(0o1777)
    return path


@pytest.fixture(scope="session")
def out_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where probes write their records and results (mounted at /imagetests-out in every container)."""
    path = tmp_path_factory.mktemp("probes")
    path.chmod(0o1777)
    return path


@pytest.fixture(scope="session")
def main(target: dict[str, Any], shared_dir: Path, out_root: Path):
    """The container of the image under test, started exactly as users are told to run it, its
    framework imported once first (the cold start, recorded in the verdict; later probes run warm).
    Its checks are about one host (the host's network, 127.0.0.1 between its processes); the checks
    across nodes start containers of their own on the run's bridge network (`bridge`)."""
    flags = [*target["run_flags"], *target.get("extra_run_flags", [])]
    _CONTAINER.append(True)   # tests that need it run alone until it is warm (lanes.py)
    container = Container(target["image"], flags, run_id=target["run_id"], shared=shared_dir, out_root=out_root,
                          framework=target["framework"])
    try:
        cold = warm_up(container, target["framework_info"]["module"])
        if _COLD:   # the other workers' containers start with the image in the page cache: not a cold start
            _FACTS["cold_start"] = cold
            _warm()
        yield container
    finally:
        container.remove()


@pytest.fixture(scope="session")
def host(main):
    """The testinfra host of `main` (infra.py): `host.file(...)`, `host.pip`, `host.user()`, `host.environment()`,
    `host.mount_point(...)`, `host.socket(...)`, `host.run(...)`, each command run as the image's default user in
    its working directory, without a login shell, under the image's deadline."""
    return host_of(main)


@pytest.fixture(scope="session")
def pip_packages(host) -> dict[str, str]:
    """Every Python distribution of the image, as the `pip` on its PATH lists them (normalised name -> version)."""
    return pip_list(host)


@pytest.fixture(scope="session")
def bridge(target: dict[str, Any]) -> str:
    """The run's bridge network (made by validate, one per run): a container started on it has a network
    namespace of its own and reaches the others by their container names, as nodes do."""
    if not target.get("network"):
        pytest.fail("no bridge network for this run (the target names none): the checks across nodes run on the "
                    "network `buildtool validate` makes for each run", pytrace=False)
    return str(target["network"])


@pytest.fixture(scope="session")
def contents(main, target) -> dict[str, Any]:
    """What the image really contains (scripts/contents.py), read once per image."""
    info = target["framework_info"]
    spec = {"module": info["module"], "gpu_count_expr": info["gpu_count_expr"],
            "cuda_expr": info.get("cuda_build_expr") or "''"}
    probe = main.python("contents.py", json.dumps(spec), step=f"import {info['module']} and read its version")
    found = probe.result
    assert probe.ok and isinstance(found, dict) and "stage" not in found, probe.cause() or "no result"
    if found.get("framework_version"):
        _FACTS["framework_version"] = found["framework_version"]  # the full string, local part included
    return found


@pytest.fixture(scope="session")
def start_container(target: dict[str, Any], shared_dir: Path, out_root: Path):
    """Start more containers (peers); all removed when the session ends."""
    started: list[Container] = []

    def _start(image: str, extra: list[str] | None = None, hint: str = "peer", gpus: bool = False,
               warm: str = "", framework: str | None = None, network: str = "host") -> Container:
        """`warm`: the framework module of another image, imported once first (as `main` does);
        `framework`: whose scripts it gets beside the common ones (default: the image under test's);
        `network`: the run's bridge network (`bridge`) for a node of its own (default: the host's)."""
        flags = [f for f in target["run_flags"] if gpus or not f.startswith("--gpus")] + list(extra or [])
        container = Container(image, flags, run_id=target["run_id"], shared=shared_dir, name_hint=hint,
                              out_root=out_root, framework=framework or target["framework"], network=network)
        started.append(container)
        if warm:
            warm_up(container, warm)
        return container

    try:
        yield _start
    finally:
        for container in started:
            container.remove()


def _message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = str(crash.message) if crash is not None else str(report.longrepr or "")
    # pytest prefixes assertion messages with the exception type and appends the failed expression.
    for prefix in ("AssertionError: ", "Failed: "):
        text = text.removeprefix(prefix)
    return text.split("\nassert ", 1)[0]


_IDS: dict[str, str] = {}


def test_id(item: pytest.Item) -> str:
    """`<group>/<file>::<name>`: relative to image-tests/, whatever pytest took as its rootdir
    (which depends on the paths on its command line), so ids and groups are the same for every run."""
    name = item.nodeid.split("::", 1)[1] if "::" in item.nodeid else item.name
    return f"{item.path.resolve().relative_to(HERE).as_posix()}::{name}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: before -k deselects, so every defined test is checked.
    unmarked = [item.nodeid for item in items
                if "require_gpu" in getattr(item, "fixturenames", ()) and item.get_closest_marker("gpu") is None]
    if unmarked:  # the verdict's list of GPU tests comes from the marker: it must be complete
        raise pytest.UsageError(f"tests using require_gpu must be marked @pytest.mark.gpu: {', '.join(unmarked)}")
    for item in items:
        _IDS[item.nodeid] = test_id(item)


def _entry(nodeid: str, gpu: bool) -> dict[str, Any]:
    ident = _IDS.get(nodeid, nodeid)
    entry = next((r for r in _RESULTS if r["id"] == ident), None)
    if entry is None:
        # "running" until a phase decides: an interrupted test must never read as passed.
        entry = {"id": ident, "group": ident.split("/", 1)[0], "result": "running", "duration_s": 0.0,
                 "message": "", "skip_code": "", "skip_subject": "", "skip_reason": "", "gpu": gpu}
        _RESULTS.append(entry)
    return entry


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _entry(nodeid, False)


def _schedule(report: pytest.TestReport, ident: str) -> None:
    props = dict(report.user_properties)
    slot = _SCHEDULE.setdefault(ident, {"id": ident, "lane": props.get("lane", ""), "access": props.get("access", ""),
                                        "why": props.get("access_why", ""), "started": report.start,
                                        "ended": report.stop})
    slot["started"], slot["ended"] = min(slot["started"], report.start), max(slot["ended"], report.stop)
    if "cold_start_until" in props:
        slot["cold_start_until"] = props["cold_start_until"]


def _intervals() -> list[dict[str, Any]]:
    """Each test's interval and the lock mode it held; a test that measured the cold start held it
    alone until then, as its own interval (`<id> (cold start)`)."""
    out = []
    for slot in _SCHEDULE.values():
        entry = dict(slot)
        until = entry.pop("cold_start_until", None)
        if until is not None:
            out.append({**entry, "id": f"{entry['id']} (cold start)", "access": lanes.EXCLUSIVE,
                        "why": lanes.COLD_START, "ended": until})
            entry["started"] = until
        out.append(entry)
    return sorted(out, key=lambda s: s["started"])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Marked gpu (never a folder or other name `gpu` among pytest's keywords): the controller of xdist workers has
    # reports, not items, so the worker hands the marker over with the report.
    gpu = bool(dict(report.user_properties).get("gpu"))
    entry = _entry(report.nodeid, gpu)
    _schedule(report, entry["id"])
    entry["gpu"] = entry["gpu"] or gpu
    entry["duration_s"] = round(entry["duration_s"] + report.duration, 3)
    if report.skipped and entry["result"] != "failed":   # a skip after the failure (in teardown) never hides it
        entry["result"] = "skipped"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else _message(report)
        code, subject, text = skips.parse_skip(str(reason).removeprefix("Skipped: "))
        entry.update(skip_code=code, skip_subject=subject, skip_reason=text)
    elif report.failed:
        message = _message(report)
        if harness.DEADLINE.spent() and "deadline" not in message and not message.startswith(NOT_RUN):
            # Cut by the deadline (its probe stopped, its ranks signalled): the test's own words then describe
            # the signal, not why it came.
            message = f"the image's deadline ran out while it ran ({harness.DEADLINE.describe_total()}): {message}"
        where = "" if report.when == "call" or message.startswith(NOT_RUN) else f"(in {report.when}) "
        if entry["result"] != "failed":  # the first failure is the cause; a teardown error adds to it
            entry["message"] = (where + message)[:4000]
        entry["result"] = "failed"
    elif report.when == "call" and entry["result"] == "running":
        entry["result"] = "passed"


@pytest.hookimpl(tryfirst=True)
def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    _INTERRUPTED.append(str(excinfo.value) or "KeyboardInterrupt")


def _learnt() -> dict[str, Any]:
    return {"figures": _FIGURES, "facts": _FACTS, "spent_by": harness.DEADLINE.spent_by}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: a worker ended; keep what it learnt about the image (a worker that crashed
    or was killed has nothing: its tests are failed by their reports)."""
    text = (getattr(node, "workeroutput", None) or {}).get("image_tests")
    if text:
        _WORKERS.append(json.loads(text))


def _merge_workers() -> None:
    """Figures and facts of every worker (one of them measured the cold start)."""
    for learnt in _WORKERS:
        _FIGURES.update(learnt["figures"])
        for key, value in learnt["facts"].items():
            _FACTS.setdefault(key, value)
        harness.DEADLINE.spent_by = harness.DEADLINE.spent_by or learnt["spent_by"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput"):
        # An xdist worker: the controller writes the results (it holds every test's reports).
        config.workeroutput["image_tests"] = json.dumps(_learnt())  # type: ignore[attr-defined]
        return
    _merge_workers()
    why = _INTERRUPTED[0] if _INTERRUPTED else f"pytest exit {int(exitstatus)}"
    for entry in _RESULTS:
        if entry["result"] == "running":
            entry["result"] = "failed"
            entry["message"] = f"interrupted while running ({why}); never finished, so never passed"
    path = session.config.getoption("--results")
    if path:
        data = {"tests": _RESULTS, "figures": _FIGURES, "facts": _FACTS, "exitstatus": int(exitstatus),
                "interrupted": _INTERRUPTED[0] if _INTERRUPTED else "",
                "deadline_s": harness.DEADLINE.total_s, "deadline_spent_by": harness.DEADLINE.spent_by,
                "schedule": _intervals()}
        tmp = Path(f"{path}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)  # never half-written
