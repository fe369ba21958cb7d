"""Locks: parsing, the drift check, the framework/tools split and the uv arguments (no network)."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import docker.errors
import pytest
import requests

from buildtool.common.errors import UserError
from buildtool.contracts import locks
from buildtool.imagebuild import lock
from buildtool.imagebuild.pipconfig import HostPip, uv_index_env
from buildtool.matrix.loader import load_matrix
from tests.conftest import fixture_matrix
from tests.pylocks import one_wheel, pylock

ROOT = Path(__file__).resolve().parents[1]
HEAD = 'lock-version = "1.0"\ncreated-by = "uv"\n'


def _cell(key: str = "pytorch-cpu:2.13"):
    return next(c for c in fixture_matrix().cells if c.key == key)


def _lock_text(cell, entries: dict[str, str], part: str = locks.TOOLS_LOCK) -> str:
    return pylock(one_wheel(entries), {"inputs": lock.fingerprint(cell, part), "python": cell.python,
                                       "platform": lock.cell_platform(cell, None).wheel_platform})


def test_parse_lock_reads_entries_hashes_and_inputs():
    """uv's pylock.toml (each file's name, URL and sha256) and the table `buildtool lock` adds."""
    text = (HEAD + '\n[[packages]]\nname = "Torch"\nversion = "2.13.0+cpu"\n'
            'wheels = [{ url = "file:///opt/wheels/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl", '
            'hashes = { sha256 = "' + "1" * 64 + '" } }]\n'
            '\n[[packages]]\nname = "typing_extensions"\nversion = "4.16.0"\n'
            'sdist = { url = "https://files.example/typing_extensions-4.16.0.tar.gz", hashes = { sha256 = "'
            + "3" * 64 + '" } }\n'
            'wheels = [{ url = "https://files.example/typing_extensions-4.16.0-py3-none-any.whl", '
            'hashes = { sha256 = "' + "2" * 64 + '" } }]\n'
            '\n[tool.dl-images]\ninputs = "sha256:' + "b" * 64 + '"\npython = "3.11"\n'
            'platform = "x86_64-manylinux_2_28"\n')
    parsed = locks.parse_lock(text)
    assert parsed.inputs == "sha256:" + "b" * 64
    assert (parsed.python, parsed.platform, parsed.glibc) == ("3.11", "x86_64-manylinux_2_28", "")
    assert parsed.versions() == {"torch": "2.13.0+cpu", "typing-extensions": "4.16.0"}
    assert len(parsed.entries["typing-extensions"].hashes) == 2      # the wheel's and the sdist's
    assert parsed.entries["torch"].wheels[0].name == "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


SHA = '{ sha256 = "' + "a" * 64 + '" }'


@pytest.mark.parametrize("text, message", [
    ("numpy==2.0 --hash=sha256:" + "a" * 64 + "\n", "not TOML"),                # uv's requirements output
    ('lock-version = "2.0"\n', "lock-version is '2.0', not PEP 751's"),
    (HEAD + '[[packages]]\nname = "numpy"\n', "a package without a name and version: 'numpy'"),
    (HEAD + '[[packages]]\nname = "numpy"\nversion = "2.0"\nwheels = [{ url = "https://x/numpy-2.0-py3-none-any.whl"'
     ' }]\n', "numpy 2.0: numpy-2.0-py3-none-any.whl has no sha256"),
    (HEAD + '[[packages]]\nname = "numpy"\nversion = "2.0"\nwheels = [{ url = "https://x/n.whl", hashes = '
     '{ sha256 = "abc" } }]\n', "numpy 2.0: n.whl has no sha256"),
    (HEAD + '[[packages]]\nname = "numpy"\nversion = "2.0"\ndirectory = { path = "." }\n',
     "numpy 2.0 has no wheel or sdist with a hash"),
    (HEAD + f'[[packages]]\nname = "numpy"\nversion = "2.0"\nsdist = {{ url = "https://x/n.tar.gz", hashes = {SHA} }}\n'
     f'[[packages]]\nname = "NumPy"\nversion = "2.0"\nsdist = {{ url = "https://x/n.tar.gz", hashes = {SHA} }}\n',
     "numpy is listed twice"),
])
def test_parse_lock_refuses_what_cannot_be_installed_with_hashes(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        locks.parse_lock(text)


@pytest.mark.parametrize("text, message", [
    (HEAD + '[[packages]]\nname = "a"\nversion = "1"\nsdist = "x"\n', "a 1: sdist is not a table (found a string)"),
    (HEAD + '[packages]\nname = "a"\n', "packages is not an array (found a table)"),
    (HEAD + 'packages = [1]\n', "a [[packages]] entry is not a table (found an integer)"),
    (HEAD + 'tool = "x"\n', "tool is not a table (found a string)"),
    (HEAD + '[tool]\ndl-images = 3\n', "tool.dl-images is not a table (found an integer)"),
    (HEAD + '[[packages]]\nname = "a"\nversion = "1"\nwheels = "x"\n', "a 1: wheels is not an array (found a string)"),
    (HEAD + '[[packages]]\nname = "a"\nversion = "1"\nwheels = ["x"]\n',
     "a 1: a wheel is not a table (found a string)"),
    (HEAD + '[[packages]]\nname = "a"\nversion = "1"\nsdist = { url = "https://x/a.tar.gz", hashes = "x" }\n',
     "a 1: a.tar.gz: hashes is not a table (found a string)"),
])
def test_parse_lock_names_a_field_of_the_wrong_toml_type(text, message):
    """A hand-edited lock with a string where a table belongs: the ValueError callers turn into "run make
    lock", naming the field (was an AttributeError from the first .get(), a traceback)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        locks.parse_lock(text)


WHEEL = '[[packages]]\nname = "a"\nversion = "1"\n[[packages.wheels]]\n'


@pytest.mark.parametrize("text, message", [
    (HEAD + WHEEL + f"url = 5\nhashes = {SHA}\n", "a 1: a file's url is not a string (found an integer)"),
    (HEAD + WHEEL + f"url = 0\nname = \"a-1-py3-none-any.whl\"\nhashes = {SHA}\n",
     "a 1: a file's url is not a string (found an integer)"),
    (HEAD + WHEEL + f"path = 5\nhashes = {SHA}\n", "a 1: a file's path is not a string (found an integer)"),
    (HEAD + WHEEL + f'name = ["x"]\nurl = "https://x/a-1-py3-none-any.whl"\nhashes = {SHA}\n',
     "a 1: a file's name is not a string (found an array)"),
    (HEAD + WHEEL + 'url = "https://x/a-1-py3-none-any.whl"\nhashes = { sha256 = ' + "1" * 64 + " }\n",
     "a 1: a-1-py3-none-any.whl: hashes.sha256 is not a string (found an integer)"),
])
def test_parse_lock_refuses_a_file_field_that_is_not_a_string(text, message):
    """A file's url, path, name and sha256 are strings: another TOML type is refused naming the field (was turned
    into text: `url = 5` read as the file "5", `name = ["x"]` as "['x']"), like `glibc = 2.30`."""
    with pytest.raises(ValueError, match=re.escape(message)):
        locks.parse_lock(text)


def _write(tmp_path: Path, cell, framework: dict[str, str] | None, tools: dict[str, str]) -> None:
    folder = (tmp_path / cell.dockerfile).parent
    folder.mkdir(parents=True)
    if framework is not None:
        (folder / locks.FRAMEWORK_LOCK).write_text(_lock_text(cell, framework, locks.FRAMEWORK_LOCK))
    (folder / locks.TOOLS_LOCK).write_text(_lock_text(cell, tools))


GOOD_FW = {"torch": "2.13.0+cpu", "sympy": "1.14.0"}
GOOD_TOOLS = {"tensorboard": "2.21.0", "torch-tb-profiler": "0.4.3", "pip": "26.3", "numpy": "2.4.6"}


def test_check_passes_on_consistent_locks(tmp_path: Path):
    cell = _cell()
    _write(tmp_path, cell, GOOD_FW, GOOD_TOOLS)
    assert lock.check_cell(tmp_path, cell) == []
    assert lock.locked_versions(tmp_path, cell)["torch"] == "2.13.0+cpu"


def test_check_names_a_stale_lock_after_a_matrix_change(tmp_path: Path):
    cell = _cell()
    _write(tmp_path, cell, GOOD_FW, GOOD_TOOLS)
    bumped = replace(cell, packages=(("tensorboard", "2.20.0"), ("torch-tb-profiler", "0.4.3")))
    problems = lock.check_cell(tmp_path, bumped)
    assert any("pylock.tools.toml is stale" in p and "make lock FRAMEWORK=pytorch-cpu:2.13" in p for p in problems)
    assert not any("pylock.framework.toml is stale" in p for p in problems)  # a tool bump leaves it alone
    assert any("pins tensorboard==2.20.0 but the lock has 2.21.0" in p for p in problems)


def test_check_names_missing_files_packages_and_overlaps(tmp_path: Path):
    cell = _cell()
    tools = {k: v for k, v in GOOD_TOOLS.items() if k != "torch-tb-profiler"} | {"sympy": "1.14.0"}
    _write(tmp_path, cell, GOOD_FW, tools)
    problems = lock.check_cell(tmp_path, cell)
    assert any("the lock has no torch-tb-profiler" in p for p in problems)
    assert any("sympy in both lock files" in p for p in problems)
    (tmp_path / cell.dockerfile).parent.joinpath(locks.FRAMEWORK_LOCK).unlink()
    assert lock.check_cell(tmp_path, cell) == [
        f"{Path(cell.dockerfile).parent / locks.FRAMEWORK_LOCK} is missing; run `make lock FRAMEWORK={cell.key}`"]
    with pytest.raises(UserError, match="is missing"):
        lock.locked_versions(tmp_path, cell)


@pytest.mark.parametrize("requirements", [("torch[opt-einsum]==2.13.0+cpu",), ("torch>=2.13,<2.14",),
                                          ("torch~=2.13.0",), ("torch[opt-einsum] >=2.13; python_version >= '3.9'",)])
def test_check_reads_extras_and_ranges_as_the_matrix_does(tmp_path: Path, requirements: tuple[str, ...]):
    """The matrix accepts any PEP 508 requirement that names a version: after `make lock` the check finds the
    distribution whatever extras the requirement names, and a range is met by a locked version inside it (was:
    "the lock has no torch[opt-einsum]", "the lock has no torch>=2.13,<2.14" with the package locked)."""
    cell = replace(_cell(), framework_requirements=requirements)
    _write(tmp_path, cell, GOOD_FW, GOOD_TOOLS)
    assert lock.check_cell(tmp_path, cell) == []
    outside = replace(cell, framework_requirements=("torch[opt-einsum]>=2.14",))
    (tmp_path / cell.dockerfile).parent.joinpath(locks.FRAMEWORK_LOCK).write_text(
        _lock_text(outside, GOOD_FW, locks.FRAMEWORK_LOCK))
    (tmp_path / cell.dockerfile).parent.joinpath(locks.TOOLS_LOCK).write_text(_lock_text(outside, GOOD_TOOLS))
    assert lock.check_cell(tmp_path, outside) == [
        "pytorch-cpu:2.13: the matrix pins torch[opt-einsum]>=2.14 but the lock has 2.13.0+cpu; "
        "run `make lock FRAMEWORK=pytorch-cpu:2.13`"]
    assert lock._locked_and_known(tmp_path, outside)[1] >= {"torch", "tensorboard", "pip"}


def test_check_evaluates_a_requirements_markers_against_each_locks_platform(tmp_path: Path):
    """A requirement whose PEP 508 marker is false on a lock's platform is one uv leaves out of that lock: the check
    demanded it anyway ("the lock has no arm-only" on the linux/amd64 locks of a cell built for both). Each
    platform's lock is checked against the requirements whose markers hold there (its machine, the lock's python)."""
    cell = replace(_cell(), platforms=("linux/amd64", "linux/arm64"), emulation_factor=8, framework_requirements=(
        "torch==2.13.0+cpu", "arm-only==1.0; platform_machine == 'aarch64'",
        "x86-only==2.0; platform_machine == 'x86_64'", "old-python==3.0; python_version < '3.10'"))
    locked = {"linux/amd64": {"x86-only": "2.0"}, "linux/arm64": {"arm-only": "1.0"}}

    def write(platform: str, framework: dict[str, str]) -> None:
        folder = (tmp_path / cell.dockerfile).parent / lock.cell_platform(cell, platform).architecture
        folder.mkdir(parents=True, exist_ok=True)
        for part, entries in ((locks.FRAMEWORK_LOCK, {**GOOD_FW, **framework}), (locks.TOOLS_LOCK, GOOD_TOOLS)):
            (folder / part).write_text(pylock(one_wheel(entries), {
                "inputs": lock.fingerprint(cell, part, platform), "python": cell.python,
                "platform": lock.cell_platform(cell, platform).wheel_platform}))

    for platform, framework in locked.items():
        write(platform, framework)
    assert lock.check_cell(tmp_path, cell) == []
    # A marker that holds on the lock's platform is still demanded, at its version.
    write("linux/arm64", {"arm-only": "1.1"})
    assert lock.check_cell(tmp_path, cell) == [
        "pytorch-cpu:2.13: the matrix pins arm-only==1.0; platform_machine == 'aarch64' but the lock has 1.1; "
        "run `make lock FRAMEWORK=pytorch-cpu:2.13`"]
    write("linux/arm64", {})
    assert lock.check_cell(tmp_path, cell) == [
        "pytorch-cpu:2.13: the lock has no arm-only; run `make lock FRAMEWORK=pytorch-cpu:2.13`"]


def test_ngc_cells_lock_only_their_tools():
    cell = _cell("pytorch-ngc:25.10")
    assert lock.is_ngc(cell)
    assert list(lock.lock_paths(Path("/r"), cell)) == [locks.TOOLS_LOCK]
    assert lock.tool_requirements(cell) == ["tensorboard==2.21.0", "torch-tb-profiler==0.4.3"]


def test_index_arguments_keep_host_settings_and_drop_unreachable_indexes():
    cell = _cell()
    host = HostPip(extra_index_urls=("file:///opt/pypi/simple",), find_links=("/opt/wheels",))
    args, skipped = lock.index_args(host, cell.index_url, cell.extra_index_urls, reachable=lambda url: False)
    assert skipped == ["https://download.pytorch.org/whl/cpu"]
    assert args == ["--index-strategy", "unsafe-best-match", "--extra-index-url", "file:///opt/pypi/simple",
                    "--find-links", "/opt/wheels"]
    args, skipped = lock.index_args(host, cell.index_url, cell.extra_index_urls, reachable=lambda url: True)
    assert "https://download.pytorch.org/whl/cpu" in args and not skipped


def test_compile_splits_one_resolution_into_framework_and_tools(monkeypatch):
    """The framework lock is the framework's closure at the full resolution's versions; the rest are tools (uv
    leaves the framework's packages out: --no-emit-package); on NGC cells the base's packages are left out and
    passed as constraints. Versions are resolved for the platform's lower cap, the files listed up to the newest."""
    calls: list[list[str]] = []
    current: list = []
    full = {"torch": "2.13.0+cpu", "sympy": "1.14.0", "numpy": "2.4.6", "tensorboard": "2.21.0",
            "torch-tb-profiler": "0.4.3", "pip": "26.3"}

    def fake_uv(argv: list[str], env: dict[str, str], cwd: Path) -> None:
        calls.append(argv)
        out = argv[argv.index("-o") + 1]
        omitted = {argv[i + 1] for i, arg in enumerate(argv) if arg == "--no-emit-package"}
        names = ["torch", "sympy"] if argv[-1] == "framework.in" else [n for n in full if n not in omitted]
        if argv[-1] != "framework.in":
            assert (cwd / argv[-1]).read_text().split() == (lock.framework_requirements(current[0])
                                                            + lock.tool_requirements(current[0]))
        (cwd / out).write_text(pylock(one_wheel({n: full[n] for n in names})))

    monkeypatch.setattr(lock, "_run_uv", fake_uv)
    monkeypatch.setattr(lock, "uv_binary", lambda: "uv")
    cell = _cell()
    current.append(cell)
    texts = lock.compile_cell(cell, HostPip(), lock.Pins(), base=None, log=print,
                              reachable=lambda url: True)
    assert locks.parse_lock(texts[locks.FRAMEWORK_LOCK]).versions() == {"torch": "2.13.0+cpu", "sympy": "1.14.0"}
    assert set(locks.parse_lock(texts[locks.TOOLS_LOCK]).versions()) == {"numpy", "tensorboard", "torch-tb-profiler",
                                                                         "pip"}
    assert locks.parse_lock(texts[locks.TOOLS_LOCK]).inputs == lock.fingerprint(cell)
    assert "--upgrade" in calls[0] and calls[0][calls[0].index("--format") + 1] == "pylock.toml"
    assert calls[0][calls[0].index("--python-version") + 1] == "3.11"
    assert [c[c.index("--python-platform") + 1] for c in calls] == ["x86_64-manylinux_2_28", "x86_64-manylinux_2_40",
                                                                     "x86_64-manylinux_2_40"]
    assert [c[-1] for c in calls] == ["matrix.in", "framework.in", "matrix.in"]

    calls.clear()
    ngc = _cell("pytorch-ngc:25.10")
    current[0] = ngc
    full["numpy"] = "1.26.4"
    base = lock.BaseFacts(python="3.12", packages={"torch": "2.13.0+cpu", "numpy": "1.26.4", "sympy": "1.14.0"},
                          constraints="torch==2.13.0+cpu\n", standin=True)
    texts = lock.compile_cell(ngc, HostPip(), lock.Pins(upgrade=("tensorboard",)), base=base, log=print,
                              reachable=lambda url: True)
    assert list(texts) == [locks.TOOLS_LOCK]
    assert set(locks.parse_lock(texts[locks.TOOLS_LOCK]).versions()) == {"tensorboard", "torch-tb-profiler", "pip"}
    assert "STAND-IN" in texts[locks.TOOLS_LOCK]
    assert calls[0][calls[0].index("--upgrade-package") + 1] == "tensorboard"
    assert "--constraint" in calls[0]
    assert {calls[-1][i + 1] for i, arg in enumerate(calls[-1]) if arg == "--no-emit-package"} == set(base.packages)


def test_uv_pin_follows_the_toolkits_lock(tmp_path: Path):
    (tmp_path / "templates").mkdir()
    shutil.copy(ROOT / "templates" / locks.UV_LOCK, tmp_path / "templates" / locks.UV_LOCK)
    shutil.copy(ROOT / "requirements.lock", tmp_path / "requirements.lock")
    assert lock.uv_pin_problems(tmp_path) == []
    text = (tmp_path / "requirements.lock").read_text()
    (tmp_path / "requirements.lock").write_text(re.sub(r"(?m)^uv==.*$", "uv==9.9.9", text))
    assert lock.uv_pin_problems(tmp_path) == ["templates/uv.lock pins uv 0.13.9 but requirements.lock pins 9.9.9; "
                                              "run `make lock`"]


def test_a_requirements_lock_without_a_uv_pin_is_a_problem(tmp_path: Path):
    """No uv pin in requirements.lock: nothing says which uv the toolkit installs (was: no problem at all)."""
    (tmp_path / "templates").mkdir()
    shutil.copy(ROOT / "templates" / locks.UV_LOCK, tmp_path / "templates" / locks.UV_LOCK)
    text = (ROOT / "requirements.lock").read_text()
    (tmp_path / "requirements.lock").write_text(re.sub(r"(?m)^uv==.*\n", "", text))
    assert lock.uv_pin_problems(tmp_path) == ["requirements.lock pins no uv (a `uv==` line; templates/uv.lock has uv "
                                              "0.13.9): pin the uv the toolkit installs, then run `make lock`"]

def test_check_fails_on_a_pin_bump_until_the_lock_follows(project: Path, run_cli):
    """A tool pin lives in the lock, not the Dockerfile: only the lock check sees the bump."""
    matrix = project / "matrix.yaml"
    assert run_cli("check", "--offline", "--matrix", str(matrix))[0] == 0
    matrix.write_text(matrix.read_text().replace('tensorboard: "2.21.0"', 'tensorboard: "2.20.0"'))
    code, out, err = run_cli("check", "--offline", "--matrix", str(matrix))
    assert code == 1
    assert "lock: dockerfiles/pytorch/pytorch-cpu/2.13/pylock.tools.toml is stale" in err
    assert "the matrix pins tensorboard==2.20.0 but the lock has 2.21.0" in err
    assert "pylock.framework.toml is stale" not in err   # a tool bump leaves the framework's lock alone


def test_lock_refuses_an_unknown_package_before_resolving(project: Path, run_cli):
    code, _, err = run_cli("lock", "-f", "pytorch-cpu:2.13", "--package", "no-such-package",
                           "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and "--package no-such-package: not in the lock of pytorch-cpu:2.13" in err


def test_lock_refuses_a_package_no_selected_cell_lists_before_resolving(project: Path, monkeypatch):
    """With several cells selected, a --package none of their locks lists (a typo) is one line naming it, before
    anything is resolved (was: nothing upgraded and each cell said "lock up to date"); one some cell lists is
    upgraded where it is known."""
    cells = [c for c in load_matrix(project / "matrix.yaml", project / "templates").cells if not lock.is_ngc(c)]
    assert len(cells) > 1
    monkeypatch.setattr(lock, "compile_cell", lambda *args, **kwargs: pytest.fail("resolved"))
    with pytest.raises(UserError, match=rf"^--package no-such-package: in the lock of none of the {len(cells)} "
                                        r"selected cells \(pytorch-cpu:2.13, "):
        lock.lock_cells(project, cells, {}, ("numpy", "No_Such.Package"), print, host=HostPip())
    upgraded: list[tuple[str, ...] | None] = []

    def compile_cell(cell, host, pins, **kwargs):  # noqa: ANN001, ANN003, ANN202
        upgraded.append(pins.upgrade)
        raise UserError("stop")

    monkeypatch.setattr(lock, "compile_cell", compile_cell)
    with pytest.raises(UserError, match="^stop$"):
        lock.lock_cells(project, cells, {}, ("numpy",), print, host=HostPip())
    assert upgraded == [("numpy",)]

class _Container:
    """A container of the Docker SDK whose wait raises `fails` (None: exits 0); records its removal."""
    short_id = "c0ffee"

    def __init__(self, fails: Exception | None):
        self.fails, self.removed = fails, False

    def start(self) -> None:
        pass

    def wait(self, timeout: int) -> dict:
        if self.fails is not None:
            raise self.fails
        return {"StatusCode": 0}

    def logs(self, **_) -> bytes:
        return b""

    def remove(self, force: bool) -> None:
        self.removed = force


@pytest.mark.parametrize(("fails", "says"), [
    (requests.exceptions.ReadTimeout("UnixHTTPConnectionPool(host='localhost', port=None): Read timed out."),
     "python in b:1 did not finish within 120s"),
    (docker.errors.APIError("500 Server Error", explanation="container is marked for removal"),
     "python in b:1 failed in the engine: container is marked for removal"),
    (None, "its package probe printed 'nothing' (IndexError), not the probe's JSON"),
], ids=["timeout", "engine-error", "no-output"])
def test_a_base_probe_that_times_out_or_fails_is_one_line_naming_the_base(monkeypatch, fails, says):
    """A probe of the base that runs past its timeout, that the engine refuses, or that prints nothing: one line
    naming the base (was: a ReadTimeout, APIError or IndexError traceback); the container is removed."""
    from buildtool.common.errors import FailedError
    from buildtool.imagebuild import contents, engine

    made: list[_Container] = []
    create = lambda *args, **kwargs: made.append(_Container(fails)) or made[-1]  # noqa: E731
    monkeypatch.setattr(engine, "sdk", lambda: type("Sdk", (), {"containers": type("C", (), {"create": create})})())
    monkeypatch.setattr(engine, "image_attrs", lambda ref: {})
    monkeypatch.setattr(engine, "image_labels", lambda ref: {})
    with pytest.raises(FailedError) as caught:
        lock.base_facts("b:1")
    assert "b:1" in str(caught.value) and says in str(caught.value) and "\n" not in str(caught.value)
    assert made[-1].removed
    if fails is not None:
        with pytest.raises(FailedError, match="^the package probe failed in b:1: ") as caught:
            contents.probe(ROOT, "b:1")
        assert made[-1].removed and "\n" not in str(caught.value)


@pytest.mark.parametrize("value", ["typing_extensions", "PyYAML", "zope.interface", "numpy,typing_extensions"])
def test_lock_package_takes_python_names_and_comma_lists(value: str) -> None:
    """--package names Python distributions (PEP 508 names: capitals, '_', '.'), one or a comma list."""
    from buildtool.contracts.arguments import check_argument

    check_argument("lock", "package", [value])


@pytest.mark.parametrize("value", ["", "a b", "-x", "x-", "a,", ",a", "a,,b", "x;id", "a==1", "numpy[extra]"])
def test_lock_package_refuses_what_is_no_python_name(value: str) -> None:
    from buildtool.contracts.arguments import check_argument

    with pytest.raises(UserError, match="--package .*is not a Python package name"):
        check_argument("lock", "package", [value])


def test_lock_splits_a_comma_list_of_python_names(project: Path, run_cli):
    """The comma list reaches lock, which splits and normalizes it (it was refused as no Debian name)."""
    code, _, err = run_cli("lock", "-f", "pytorch-cpu:2.13", "--package", "No_Such.Package,Other_One",
                           "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and "--package no-such-package, other-one: not in the lock of pytorch-cpu:2.13" in err


@pytest.mark.parametrize("text, message", [
    (HEAD + '[tool.dl-images]\nglibc = 2.30\n', "tool.dl-images.glibc is not a string (found a float)"),
    (HEAD + '[tool.dl-images]\npython = 3.1\n', "tool.dl-images.python is not a string (found a float)"),
    (HEAD + '[tool.dl-images]\ninputs = ["sha256:x"]\n', "tool.dl-images.inputs is not a string (found an array)"),
    (HEAD + '[tool.dl-images]\nplatform = true\n', "tool.dl-images.platform is not a string (found a boolean)"),
])
def test_parse_lock_refuses_a_tool_field_that_is_not_a_string(text, message):
    """[tool.dl-images]'s fields were turned into text whatever their TOML type: a hand-edited `glibc = 2.30` (a
    float) read as "2.3", the glibc the wheels' platform is made from (render.dockerfiles), silently wrong."""
    with pytest.raises(ValueError, match=re.escape(message)):
        locks.parse_lock(text)


def test_a_failed_resolution_names_no_index_token(tmp_path: Path) -> None:
    """uv masks an index URL's password in its errors, not a token in its query: `make lock` against an index
    given as `...?token=...` that failed printed the token in its one line (`Failed to fetch: ...?token=...`)."""
    import sys

    uv = tmp_path / "uv.py"
    uv.write_text("import sys\nsys.stderr.write('error: Request failed after 3 retries\\n"
                  "  cause: Failed to fetch: https://pkgs.example/simple/numpy/?token=ab%2Bcd123\\n"
                  "  cause: error sending request for url (https://pkgs.example/simple/numpy/?token=ab%2Bcd123)\\n"
                  "  cause: client error (Connect)\\n  cause: tcp connect error\\n')\nsys.exit(2)\n")
    with pytest.raises(lock.FailedError) as failed:
        lock._run_uv([sys.executable, str(uv), "--index-url", "https://u:pw%2F1@pkgs.example/simple",
                      "--extra-index-url", "https://pkgs.example/simple?token=ab%2Bcd123", "-o", "x", "in"],
                     {}, tmp_path)
    said = str(failed.value)
    assert "ab%2Bcd123" not in said and "ab+cd123" not in said
    assert "Failed to fetch: https://pkgs.example/simple/numpy/?token=****" in said


FAKE_UV = """#!{python}
import json, os, sys
json.dump({{"argv": sys.argv, "env": {{k: v for k, v in os.environ.items() if k.startswith("UV_")}}}},
          open({out!r}, "w"))
sys.exit(2)
"""


def test_index_credentials_never_ride_on_uvs_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make lock` ran uv with `--index-url https://user:PASSWORD@host/simple` (and tokens of extra indexes and
    find-links) on its command line, which every local user reads in /proc/<pid>/cmdline (`ps -ef`) while uv
    runs. Now the locations reach uv in its environment (readable by the same user only), in the same order."""
    import sys

    out = tmp_path / "ran.json"
    uv = tmp_path / "uv"
    uv.write_text(FAKE_UV.format(python=sys.executable, out=str(out)))
    uv.chmod(0o755)
    monkeypatch.setattr(lock, "uv_binary", lambda: str(uv))
    monkeypatch.setattr(lock, "uv_version", lambda: "0.13.9")
    secrets = ("pw-s3cr3t", "extraTOKEN9", "linkTOKEN7")
    host = HostPip(index_url=f"https://user:{secrets[0]}@pkgs.example/simple",
                   extra_index_urls=(f"https://pkgs.example/extra/simple?token={secrets[1]}",),
                   find_links=(f"https://pkgs.example/links/?sig={secrets[2]}", "/opt/wheels"))
    cell = _cell()
    extra = [*cell.extra_index_urls, *host.extra_index_urls]   # the cell's, then the host's
    for make, extras in ((lambda: lock.compile_cell(cell, host, lock.Pins(), base=None, log=print,
                                                    reachable=lambda url: True), extra),
                         (lambda: lock.write_uv_lock(tmp_path, host), list(host.extra_index_urls))):
        out.unlink(missing_ok=True)
        with pytest.raises(lock.FailedError):
            make()
        ran = json.loads(out.read_text())
        assert not [arg for arg in ran["argv"] for secret in secrets if secret in arg], ran["argv"]
        assert not {"--index-url", "--extra-index-url", "--find-links"} & set(ran["argv"])
        assert ran["argv"][ran["argv"].index("--index-strategy") + 1] == "unsafe-best-match"
        assert ran["env"]["UV_INDEX_URL"] == host.index_url
        assert ran["env"]["UV_EXTRA_INDEX_URL"].split(" ") == extras
        assert ran["env"]["UV_FIND_LINKS"].split(",") == list(host.find_links)


def test_an_index_of_the_hosts_uv_environment_is_not_read_and_its_token_never_shown(tmp_path: Path) -> None:
    """`make lock` ran uv with the host's whole environment: a UV_EXTRA_INDEX_URL (or UV_INDEX, ...) set there was
    resolved from besides the host's pip settings and the cell's (what the docs and the builds name), and its token,
    which no scrubber knew, was printed whole in the failure (`Failed to fetch: ...?token=...`). Those variables are
    not handed to uv now; the locations the toolkit gives it still are."""
    import sys

    uv = tmp_path / "uv.py"
    uv.write_text("import os, sys\nsys.stderr.write('error: Request failed\\n  cause: Failed to fetch: ' + ' '.join("
                  "os.environ.get(n, '-') for n in ('UV_EXTRA_INDEX_URL', 'UV_INDEX', 'UV_INDEX_URL')) + '\\n')\n"
                  "sys.exit(2)\n")
    env = {"UV_EXTRA_INDEX_URL": "https://pkgs.example/simple?token=hostTOKEN42",
           "UV_INDEX": "private=https://pkgs.example/other?token=hostTOKEN43", "UV_CACHE_DIR": str(tmp_path)}
    with pytest.raises(lock.FailedError) as failed:
        lock._run_uv([sys.executable, str(uv), "--index-url", "https://pypi.example/simple", "-o", "x", "in"], env,
                     tmp_path)
    said = str(failed.value)
    assert "hostTOKEN" not in said, said
    assert said.endswith("Failed to fetch: - - https://pypi.example/simple"), said


def test_a_location_uv_would_split_in_its_environment_is_refused() -> None:
    """uv splits UV_FIND_LINKS at commas and UV_EXTRA_INDEX_URL at spaces: such a location is named, not split."""
    with pytest.raises(UserError, match=r"^package location /opt/wheels,v2 holds ','"):
        uv_index_env(["uv", "--find-links", "/opt/wheels,v2", "in"])
    assert uv_index_env(["uv", "--extra-index-url", "a", "--find-links", "b", "--extra-index-url", "c", "x"]) == (
        ["uv", "x"], {"UV_EXTRA_INDEX_URL": "a c", "UV_FIND_LINKS": "b"})


def test_checks_drift_is_printed_as_difflib_made_it(project: Path, run_cli):
    """`check` printed its unified diff through rich, which turned a tab into spaces and `:ok:` into an emoji: the
    diff showed lines the files do not have. It is difflib's text now."""
    dockerfile = project / "dockerfiles" / "pytorch" / "pytorch-cpu" / "2.13" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "# hand edit:\tx :ok: y\n")
    code, out, err = run_cli("check", "--offline", "--matrix", str(project / "matrix.yaml"))
    assert code == 1, err
    assert "\n-# hand edit:\tx :ok: y\n" in out, out


def test_an_entry_whose_marker_is_false_for_the_locks_platform_is_refused_as_uv_skips_it(tmp_path: Path):
    """PEP 751: `uv pip install -r pylock.toml` leaves out a package whose `marker` is false. The lock reader ignored
    markers, so such an entry passed the check and went into the image's labels as installed (push then failed:
    "differs from its lock"). Now every reader of the cell's locks refuses it, naming the package and the marker;
    a marker true there (uv writes `sys_platform == 'linux'`) is read as before, and one that is no PEP 508 marker
    (uv refuses it) is refused by the parser."""
    cell = _cell()
    _write(tmp_path, cell, GOOD_FW, GOOD_TOOLS)
    path = (tmp_path / cell.dockerfile).parent / locks.TOOLS_LOCK
    text = path.read_text()
    path.write_text(text.replace('name = "numpy"\n', 'name = "numpy"\nmarker = "sys_platform == \'linux\'"\n'))
    assert lock.check_cell(tmp_path, cell) == []
    path.write_text(text.replace('name = "numpy"\n', 'name = "numpy"\nmarker = "python_full_version >= \'3.99\'"\n'))
    rel = path.relative_to(tmp_path)
    said = (f"{rel}: numpy 2.4.6 has the marker \"python_full_version >= '3.99'\", false on linux/amd64 with Python "
            f"{cell.python}, so uv does not install it; run `make lock FRAMEWORK={cell.key}`")
    assert lock.check_cell(tmp_path, cell) == [said]
    with pytest.raises(UserError) as raised:
        lock.locked_versions(tmp_path, cell)
    assert str(raised.value) == said
    with pytest.raises(ValueError, match=r"numpy 2.4.6: marker 'python_full_version >> 3' is not a PEP 508 marker"):
        locks.parse_lock(text.replace('name = "numpy"\n', 'name = "numpy"\nmarker = "python_full_version >> 3"\n'))


def test_lock_writes_nothing_of_a_cell_whose_base_is_out_of_reach(project: Path, run_cli, monkeypatch,
                                                                  no_registry_backoff: None) -> None:
    """`make lock` wrote a cell's new Python locks (pylock.*.toml), then stopped at its apt lock when the base could
    not be read (exit 2), leaving the Python locks changed and the apt lock and Dockerfile not. Now a cell's locks
    are all resolved before any file of it is written: on that failure nothing is; with the base there, all are."""
    from buildtool.imagebuild import aptlock
    from buildtool.registry.transport import TransportConnectionError
    from tests.conftest import snapshot

    monkeypatch.delenv("BASE_MIRROR", raising=False)
    monkeypatch.setattr(lock, "write_uv_lock", lambda *args, **kwargs: None)
    monkeypatch.setattr(HostPip, "from_host", classmethod(lambda cls, python=None: HostPip()))
    monkeypatch.setattr(lock, "compile_cell", lambda cell, host, pins, **kwargs: {
        name: _lock_text(cell, {name.split(".")[1]: "9.9.9"}, name) for name in lock.lock_paths(project, cell)})
    monkeypatch.setattr("buildtool.registry.client.RegistryClient._send",   # the base's registry: out of reach
                        lambda *a, **k: (_ for _ in ()).throw(TransportConnectionError("refused")))
    matrix = str(project / "matrix.yaml")
    before = snapshot(project)
    code, _, err = run_cli("lock", "-f", "pytorch-cpu:2.13", "--matrix", matrix)
    assert code == 2 and "cannot read the base " in err and "set BASE_MIRROR" in err, err
    assert snapshot(project) == before
    # The base reachable (its apt lock a stand-in that resolves to what is committed): the Python locks are written.
    monkeypatch.setattr(aptlock, "lock_texts", lambda *args: {})
    code, out, err = run_cli("lock", "-f", "pytorch-cpu:2.13", "--matrix", matrix)
    assert code == 0, err
    assert "wrote dockerfiles/pytorch/pytorch-cpu/2.13/pylock.tools.toml" in out
    assert "9.9.9" in (project / "dockerfiles/pytorch/pytorch-cpu/2.13/pylock.tools.toml").read_text()
