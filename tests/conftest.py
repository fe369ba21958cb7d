"""Shared fixtures for the toolkit's own tests."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from buildtool.cli import main
from buildtool.cli.console import Project
from buildtool.cli.generate import all_outputs
from buildtool.contracts import frameworks
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.schema import Matrix
from buildtool.render.dockerfiles import write_outputs

REPO = Path(__file__).resolve().parent.parent
# What the unit tests run against: a frozen matrix with its locks (tests/fixtures/project/).
FIXTURE_PROJECT = REPO / "tests" / "fixtures" / "project"
FIXTURE_MATRIX = FIXTURE_PROJECT / "matrix.yaml"
# The machine's temporary folder, as it is before the session gives each process a folder of its own (below):
# where the processes of a run meet (a lock).
SYSTEM_TMP = Path(tempfile.gettempdir())


def fixture_frameworks() -> set[str]:
    """The frameworks the fixture matrix's images use (pytorch, tensorflow)."""
    import yaml

    return {image["framework"] for image in yaml.safe_load(FIXTURE_MATRIX.read_text())["images"]}


def copy_fixture_image_tests(dest: Path) -> Path:
    """The checkout's image-tests/ with only the fixture matrix's frameworks (and common, scripts):
    the fixture project's framework table, so a framework folder added to the checkout (its
    image-tests/<name>/) moves no unit test."""
    keep = fixture_frameworks()
    top = REPO / "image-tests"

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = set(shutil.ignore_patterns("__pycache__")(folder, names))
        if Path(folder) == top:
            skipped |= {n for n in names if (top / n / frameworks.FRAMEWORK_FILE).is_file() and n not in keep}
        return skipped

    shutil.copytree(top, dest, ignore=ignore)
    return dest


@functools.cache
def fixture_image_tests() -> Path:
    """One read-only copy per session of copy_fixture_image_tests, for loading the fixture matrix."""
    import atexit
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="dl-images-fixture-tests-"))
    atexit.register(shutil.rmtree, root, True)
    return copy_fixture_image_tests(root / "image-tests")

# Tools the dev extra installs (shellcheck, check-jsonschema, hadolint) live beside the interpreter
# running the tests; `make test` runs `.venv/bin/python -m pytest` without activating the venv.
_BIN = str(Path(sys.executable).parent)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")


@pytest.fixture(scope="session", autouse=True)
def _private_config(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keys and caches the toolkit keeps per user (the local dev signing key, the collected-tests
    cache) go to this session's own folders: tests never touch the user's ~/.config or ~/.cache.
    Subprocesses inherit them."""
    config = tmp_path_factory.mktemp("xdg-config")
    # The machine's pip settings (its local wheel folders and indexes: `pip config list`), which `make lock`
    # resolved the committed locks with and a build serves to BuildKit: a lock names each file where they found
    # it. Copied, so the user's own file is only read.
    user_pip = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "pip" / "pip.conf"
    if user_pip.is_file():
        (config / "pip").mkdir()
        shutil.copy(user_pip, config / "pip" / "pip.conf")
    os.environ["XDG_CONFIG_HOME"] = str(config)
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    os.environ.pop("DL_IMAGES_SIGNING_KEY", None)


# What a marker's need is, for the needs the tests themselves can see. A test marked with a need that
# is missing fails here, naming it: tests are deselected by marker (`make test-fast`), never skipped.
CHROMIUM = ("chromium", "chromium-browser")
SIGSTORE_JS_NODE = Path(__file__).resolve().parents[1] / "tools/sigstore-verify/node_modules/.bin/node"


def _missing_needs(item: pytest.Item) -> list[str]:
    missing = []
    if item.get_closest_marker("host_torch") and importlib.util.find_spec("torch") is None:
        missing.append(f"torch is not importable by {sys.executable} (pip install -e '.[scaling]')")
    if item.get_closest_marker("browser") and not any(shutil.which(name) for name in CHROMIUM):
        missing.append("headless Chromium is not on PATH (apt-get install -y chromium)")
    if item.get_closest_marker("sigstore_js") and not SIGSTORE_JS_NODE.is_file():
        missing.append(f"{SIGSTORE_JS_NODE} is not installed (bash scripts/setup-tests.sh runs npm ci in "
                       "tools/sigstore-verify)")
    for mark in item.iter_markers("tools"):
        if not mark.args:
            missing.append("@pytest.mark.tools names no tool")
        missing += [f"{name} is not on PATH (pip install -e '.[dev]')" for name in mark.args if not shutil.which(name)]
    return missing


def pytest_runtest_setup(item: pytest.Item) -> None:
    missing = _missing_needs(item)
    if missing:
        marks = sorted({m.name for m in item.iter_markers()} & {"host_torch", "browser", "tools", "sigstore_js"})
        pytest.fail(f"this test needs what is missing here: {'; '.join(missing)}; install it, or deselect the "
                    f"test with -m 'not {' and not '.join(marks)}' (make test-fast)", pytrace=False)


@pytest.fixture(autouse=True)
def _frameworks_of_this_checkout():
    """Loading a fixture project's matrix makes its image-tests folders the framework table; the
    next test starts from this checkout's again (read when it first asks for it: most tests never do)."""
    yield
    if frameworks._LOADED_FROM != [frameworks.DEFAULT_TESTS_DIR]:
        frameworks.point_at(frameworks.DEFAULT_TESTS_DIR)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root (outside .git), to prove a failed command wrote nothing."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.parts}


@functools.cache
def fixture_matrix() -> Matrix:
    """The fixture matrix (tests/fixtures/project/matrix.yaml) with the real templates: what unit
    tests look cells up in, so a new cell in the real matrix.yaml moves none of them."""
    return load_matrix(FIXTURE_MATRIX, REPO / "templates", display="matrix.yaml", tests_dir=fixture_image_tests())


@pytest.fixture(scope="session")
def fixture_project(tmp_path_factory: pytest.TempPathFactory, _private_config: None) -> Path:
    """The fixture project, complete and read-only by convention: the fixture matrix and its locks,
    the real templates/, image-tests/ (its frameworks only: copy_fixture_image_tests) and .hadolint.yaml,
    and the generated files rendered from them once per session (Dockerfiles, docs/images.md,
    .github/workflows/), as `make render` writes them; one commit, so commands that name the git
    revision run there."""
    root = tmp_path_factory.mktemp("fixture") / "project"
    shutil.copytree(FIXTURE_PROJECT, root)
    shutil.copytree(REPO / "templates", root / "templates")
    shutil.copy2(REPO / ".hadolint.yaml", root / ".hadolint.yaml")
    # Every test group a cell names must be a folder beside the matrix (checked when it loads).
    copy_fixture_image_tests(root / "image-tests")
    project = Project(root=root, matrix_path=root / "matrix.yaml")
    write_outputs(root, all_outputs(project, load_matrix(root / "matrix.yaml", root / "templates")))
    _commit(root)
    # Each test copies this tree: its commit packed and no sample hooks keep that (and pytest's
    # removal of old tmp folders) to a few files.
    subprocess.run(["git", "-C", str(root), "gc", "-q"], check=True, capture_output=True, timeout=60)
    shutil.rmtree(root / ".git" / "hooks")
    return root


@pytest.fixture
def project(tmp_path: Path, fixture_project: Path) -> Path:
    """A writable copy of the fixture project (never the real matrix), committed in a git repo."""
    root = tmp_path / "project"
    shutil.copytree(fixture_project, root)      # with its .git: a copy costs less than a commit
    return root


def _commit(root: Path) -> None:
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-qm", "fixture"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def no_registry_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registry calls retry as they do for users (every attempt made), without the backoff's 7.5 s of
    sleeping: for tests of what an unreachable registry gives."""
    from buildtool.registry import client

    monkeypatch.setattr(client.RetryPolicy, "__init__",
                        functools.partialmethod(client.RetryPolicy.__init__, first_delay=0.0, max_delay=0.0))


@pytest.fixture
def netrc_default_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A netrc (NETRC) whose `default` entry gives every host a login; returns its password, which must never be
    sent where the test says it must not go."""
    netrc = tmp_path / "netrc"
    netrc.write_text("default login someone password hunter2\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    return "hunter2"


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]):
    """Run `buildtool ARGS` in-process; returns (exit code, stdout, stderr)."""

    def _run(*args: str) -> tuple[int, str, str]:
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


# tests/test_fresh_clone_fast.py runs test-fast's tests (in a fresh copy) for `make test`, and leaves the run's
# summary line in this file under the basetemp of the process it ran in (an xdist worker's, under the session's).
SUMMARY_FILE = "make-test-fast-summary.txt"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    for found in sorted([*base.glob(SUMMARY_FILE), *base.glob(f"*/{SUMMARY_FILE}")]):
        terminalreporter.write_line(found.read_text().strip())


# `make test` runs on several xdist workers with --dist loadgroup. An integration module's tests stay
# on one worker: they share what their module and session fixtures made (a four-cell build and push,
# a SLURM cluster, a tiny project), which a second worker would make again beside the first. These
# modules' tests each stand alone (a fixture image and one validation) and spread over the workers.
SPREAD_INTEGRATION_MODULES = {"test_image_faults"}
# Groups sent to the workers first, before the rest in xdist's own order (most tests first; the Makefile turns
# xdist's reordering off and this hook does it): test_fresh_machines is one test of about 16 minutes (two private
# engines build pytorch-cpu from empty caches, needing nothing of the others), and as the last group of one test
# it started an hour into a 72-minute run and ended it alone (timeline of a run at 42daed3, docs/testing.md).
FIRST_GROUPS = ("test_fresh_machines",)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    scopes = {}
    for item in items:
        module = item.path.stem
        if item.path.parent.name == "integration" and module not in SPREAD_INTEGRATION_MODULES:
            item.add_marker(pytest.mark.xdist_group(module))
        scopes[item] = module if item.get_closest_marker("xdist_group") else item.nodeid
    sizes, first_seen = Counter(scopes.values()), {}
    for item in items:
        first_seen.setdefault(scopes[item], len(first_seen))
    # xdist's loadscope order (the groups with the most tests first, the rest as collected), FIRST_GROUPS ahead.
    items.sort(key=lambda i: (scopes[i] not in FIRST_GROUPS, -sizes[scopes[i]], first_seen[scopes[i]]))


@pytest.hookimpl(trylast=True)  # after pytest's tmp_path plugin has set up the session's folders
def pytest_configure(config: pytest.Config) -> None:
    # Folders the code under test makes for itself (tempfile.mkdtemp, removed by an exit handler), at collection
    # too, go under this session's own folder: xdist kills a worker that is slow to exit (10 s on a loaded
    # machine) before its exit handlers run, which left them in TMPDIR. pytest keeps no public handle on the
    # session's TempPathFactory before the first fixture; `_tmp_path_factory` is the one its plugin sets.
    tempfile.tempdir = str(config._tmp_path_factory.mktemp("tmp"))  # type: ignore[attr-defined]
    # image-tests' own markers (image-tests/pytest.ini): unit tests import their modules, whose
    # `pytestmark` would otherwise warn here. They mark nothing this suite collects.
    for line in ("shared: image-tests: may run beside other shared tests",
                 "devices: image-tests: uses the run's GPUs", "exclusive: image-tests: always runs alone"):
        config.addinivalue_line("markers", line)
