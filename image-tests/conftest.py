"""Fixtures for tests that run inside an image.

`buildtool validate` writes a target file (image, digest, cell, run flags, expectations) and
runs `pytest image-tests/<groups> --target FILE --results FILE`. One container per image
per run is started from the cell's run profile and shared by every test that can share it;
tests that need more (a second rendezvous node, a TensorBoard of the other framework) start
their own, and all of them are removed at the end, on interrupts too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import Container, install_signal_cleanup, remove_all, skip  # noqa: E402

from buildtool.contracts import skips  # noqa: E402
from buildtool.contracts.target import load_target  # noqa: E402

_RESULTS: list[dict[str, Any]] = []
_FIGURES: dict[str, Any] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--target", help="target JSON written by `buildtool validate`")
    parser.addoption("--results", help="write per-test results and figures here (JSON)")


def pytest_configure(config: pytest.Config) -> None:
    install_signal_cleanup()


def pytest_unconfigure(config: pytest.Config) -> None:
    remove_all()


def _load_target(config: pytest.Config) -> dict[str, Any]:
    path = config.getoption("--target")
    if not path:
        pytest.exit("image-tests need --target FILE (run them with `buildtool validate IMAGE`)", returncode=4)
    return load_target(Path(path))



def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "ulimit_name" in metafunc.fixturenames:
        names = sorted(_load_target(metafunc.config).get("ulimits", {}))
        metafunc.parametrize("ulimit_name", names, ids=names)


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
        if target.get("needs_gpu"):
            skip(skips.NO_GPU_ON_RUNNER, f"no GPU on this runner (nvidia-smi found none): {what} not run")
        skip(skips.GPU_NOT_IN_CELL, f"the cell's run profile has no GPUs: {what} does not apply")
    return _require


@pytest.fixture(scope="session")
def figures() -> dict[str, Any]:
    return _FIGURES


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shared")
    path.chmod(0o1777)
    return path


@pytest.fixture(scope="session")
def main(target: dict[str, Any], shared_dir: Path):
    """The container of the image under test, started exactly as users are told to run it."""
    flags = [*target["run_flags"], *target.get("extra_run_flags", [])]
    container = Container(target["image"], flags, run_id=target["run_id"], shared=shared_dir)
    try:
        yield container
    finally:
        container.remove()


@pytest.fixture(scope="session")
def start_container(target: dict[str, Any], shared_dir: Path):
    """Start more containers (peers); all removed when the session ends."""
    started: list[Container] = []

    def _start(image: str, extra: list[str] | None = None, hint: str = "peer", gpus: bool = False) -> Container:
        flags = [f for f in target["run_flags"] if gpus or not f.startswith("--gpus")] + list(extra or [])
        container = Container(image, flags, run_id=target["run_id"], shared=shared_dir, name_hint=hint)
        started.append(container)
        return container

    try:
        yield _start
    finally:
        for container in started:
            container.remove()


def _message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    return str(report.longrepr or "")


_IDS: dict[str, str] = {}


def test_id(item: pytest.Item) -> str:
    """`<group>/<file>::<name>`: relative to image-tests/, whatever pytest took as its rootdir
    (which depends on the paths on its command line), so ids and groups are the same for every run."""
    name = item.nodeid.split("::", 1)[1] if "::" in item.nodeid else item.name
    return f"{item.path.resolve().relative_to(HERE).as_posix()}::{name}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        _IDS[item.nodeid] = test_id(item)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    ident = _IDS.get(report.nodeid, report.nodeid)
    entry = next((r for r in _RESULTS if r["id"] == ident), None)
    if entry is None:
        entry = {"id": ident, "group": ident.split("/", 1)[0], "result": "passed", "duration_s": 0.0,
                 "message": "", "skip_code": "", "skip_subject": "", "skip_reason": "",
                 "gpu": "gpu" in report.keywords}
        _RESULTS.append(entry)
    entry["duration_s"] = round(entry["duration_s"] + report.duration, 3)
    if report.skipped:
        entry["result"] = "skipped"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else _message(report)
        code, subject, text = skips.parse_skip(str(reason).removeprefix("Skipped: "))
        entry.update(skip_code=code, skip_subject=subject, skip_reason=text)
    elif report.failed:
        entry["result"] = "failed"
        where = "" if report.when == "call" else f"(in {report.when}) "
        entry["message"] = (where + _message(report))[:2000]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = session.config.getoption("--results")
    if path:
        Path(path).write_text(json.dumps({"tests": _RESULTS, "figures": _FIGURES, "exitstatus": int(exitstatus)},
                                         indent=1))
