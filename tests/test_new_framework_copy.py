"""Adding a framework to the real repository is its folder, its matrix entry and generated files; no toolkit change.

A copy of what `buildtool render` and `buildtool check` read (matrix.yaml, templates/, image-tests/,
dockerfiles/, docs/, .github/) and of the toolkit (buildtool/ and the framework tests), byte for byte,
gets a throwaway framework: image-tests/toyfw/ (framework.yaml, one test, scripts/ with its events
writer), numpy standing in for its module, and one CPU pip cell in matrix.yaml. Its locks are what
`make lock` would write, put together offline from the jax-cpu cell's (same base, Python and platform:
the apt lock is byte-identical, numpy and the tools are taken from its entries) under the toy cell's own
matrix fingerprints. Then in the copy `buildtool render` writes only generated files, `buildtool check
--offline` passes, and the framework tests (tests/test_framework_folder.py, tests/test_launchers.py) pass
with the copy's toolkit, which knows the toy framework from its folder alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from buildtool.contracts.locks import FRAMEWORK_LOCK, TOOLS_LOCK, parse_lock
from buildtool.imagebuild.lock import fingerprint
from buildtool.matrix.loader import load_matrix
from tests.pylocks import from_entries

REPO = Path(__file__).resolve().parent.parent
# What render and check read, and the toolkit with the tests that are about frameworks.
COPIED = ("matrix.yaml", "templates", "image-tests", "dockerfiles", "docs", ".github", ".hadolint.yaml",
          "pyproject.toml", "buildtool")
TESTS = ("__init__.py", "conftest.py", "fixtures", "test_framework_folder.py", "test_launchers.py")
GENERATED = ("dockerfiles/", "docs/images.md", ".github/workflows/")
LOCKS_FROM = "dockerfiles/jax/jax-cpu/0.10/amd64"     # a pip cell on the same base, Python and platform

FRAMEWORK_YAML = """\
# A throwaway framework for tests/test_new_framework_copy.py: numpy stands in for its module.
name: toyfw
title: ToyFW
module: numpy
distributions: [numpy]
gpu_count: "0"
events_writer: [toy_events.py]
"""
TEST_TOYFW = '''\
"""toyfw's image-tests group: its module is the version the cell claims."""


def test_toy_framework_module_answers(main, target):
    result = main.exec(["python3", "-c", "import numpy; print(numpy.__version__)"])
    assert result.rc == 0 and result.out.strip() == target["expect"]["framework_claims"][0]["value"], result.text
'''
TOY_EVENTS = '''\
"""toyfw's events writer: ten "loss" scalars into LOGDIR/RUN with TensorBoard's own event writer."""

import os
import sys

from probe_io import error_line, result

if __name__ == "__main__":
    try:
        import numpy as np
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        writer = EventFileWriter(os.path.join(sys.argv[1], sys.argv[2]))
        losses = [float(v) for v in 1.0 / (np.arange(10) + 1)]
        for step, loss in enumerate(losses):
            value = Summary.Value(tag="loss", simple_value=loss)
            writer.add_event(Event(step=step, wall_time=0.0, summary=Summary(value=[value])))
        writer.close()
        result({"ok": True, "error": "", "values": losses})
    except Exception as exc:  # noqa: BLE001 - the test names it
        result({"ok": False, "error": error_line(exc)})
        sys.exit(1)
'''


def _numpy_version() -> str:
    return parse_lock((REPO / LOCKS_FROM / FRAMEWORK_LOCK).read_text()).entries["numpy"].version


def _matrix_entry(numpy: str) -> str:
    return f"""
  - name: toyfw-cpu
    framework: toyfw
    accelerator: cpu
    template: images/pip.Dockerfile.j2
    base: docker.io/library/debian:bookworm-slim
    tests: [common, toyfw]
    use: A throwaway framework that proves a framework is its folder and its matrix entry.
    oci:
      licenses: BSD-3-Clause
    run:
      gpus: none
    versions:
      - version: "{numpy}"
        default: true
        framework_version: "{numpy}"
        framework_requirements: ["numpy=={numpy}"]
"""


def _copy(root: Path) -> None:
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    (root / "tests").mkdir(parents=True)
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=skip)
        else:
            shutil.copy2(source, root / name)
    for name in TESTS:
        source = REPO / "tests" / name
        if source.is_dir():
            shutil.copytree(source, root / "tests" / name, ignore=skip)
        else:
            shutil.copy2(source, root / "tests" / name)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _write_locks(root: Path) -> None:
    """The toy cell's locks, as `make lock` would write them: jax-cpu's apt lock (the same base and apt
    packages, so the same inputs), numpy alone in pylock.framework.toml, jax-cpu's tools (whose closure leaves
    numpy to the framework lock) in pylock.tools.toml, each under the toy cell's own fingerprint."""
    matrix = load_matrix(root / "matrix.yaml", root / "templates", tests_dir=root / "image-tests")
    [cell] = matrix.select("toyfw")
    folder = root / Path(cell.dockerfile).parent
    folder.mkdir(parents=True)
    source = REPO / LOCKS_FROM
    for name in ("apt.lock", "base.dpkg", "debs.sha256"):
        shutil.copy2(source / name, folder / name)
    framework = parse_lock((source / FRAMEWORK_LOCK).read_text()).entries
    tools = parse_lock((source / TOOLS_LOCK).read_text()).entries
    assert "numpy" not in tools
    for name, entries in ((FRAMEWORK_LOCK, {"numpy": framework["numpy"]}), (TOOLS_LOCK, tools)):
        (folder / name).write_text(f"# GENERATED FILE - DO NOT EDIT. Refresh with `make lock FRAMEWORK={cell.key}`.\n"
                                   + from_entries(entries, {"inputs": fingerprint(cell, name), "python": cell.python,
                                                            "platform": "x86_64-manylinux_2_28"}))


def test_a_new_framework_in_a_copy_of_the_repository_needs_no_toolkit_change(tmp_path: Path, run_cli) -> None:
    root = tmp_path / "repo"
    _copy(root)
    code, out, err = run_cli("check", "--offline", "--matrix", str(root / "matrix.yaml"))
    assert code == 0, f"the copy itself does not pass the check:\n{out}\n{err}"
    before = _files(root)

    toy = root / "image-tests" / "toyfw"
    (toy / "scripts").mkdir(parents=True)
    (toy / "framework.yaml").write_text(FRAMEWORK_YAML)
    (toy / "test_toyfw.py").write_text(TEST_TOYFW)
    (toy / "scripts" / "toy_events.py").write_text(TOY_EVENTS)
    numpy = _numpy_version()
    (root / "matrix.yaml").write_text((root / "matrix.yaml").read_text() + _matrix_entry(numpy))
    _write_locks(root)

    code, out, err = run_cli("render", "--matrix", str(root / "matrix.yaml"))
    assert code == 0, err
    after = _files(root)
    changed = {rel for rel in after if before.get(rel) != after[rel]} | (set(before) - set(after))
    edited = {"matrix.yaml", "image-tests/toyfw/framework.yaml", "image-tests/toyfw/test_toyfw.py",
              "image-tests/toyfw/scripts/toy_events.py"}
    assert edited <= changed
    assert all(rel.startswith(GENERATED) for rel in changed - edited), sorted(changed - edited)
    dockerfile = (root / f"dockerfiles/toyfw/toyfw-cpu/{numpy}/Dockerfile").read_text()
    assert "rendered from templates/images/pip.Dockerfile.j2" in dockerfile
    assert f"# ToyFW {numpy} (cpu) and its dependencies (pylock.framework.toml)." in dockerfile
    catalogue = (root / "docs/images.md").read_text()
    assert f"| `toyfw-cpu` | {numpy} (default) | toyfw {numpy} |" in catalogue
    assert "| ToyFW | `image-tests/toyfw/` | `toyfw-cpu` | none | `plain` | `python` |" in catalogue
    assert "toyfw-cpu" in "".join(p.read_text() for p in (root / ".github" / "workflows").glob("*.yml"))

    code, out, err = run_cli("check", "--offline", "--matrix", str(root / "matrix.yaml"))
    assert code == 0, f"{out}\n{err}"

    # The copy's own toolkit (its buildtool/, first on the path) and framework tests, on the copy's folders.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    where = subprocess.run([sys.executable, "-c", "import buildtool; print(buildtool.__file__)"], cwd=root, env=env,
                           capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert Path(where).is_relative_to(root), where
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "0",
                           "tests/test_framework_folder.py", "tests/test_launchers.py"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # The folder-derived lists reached the toy framework: the matrix without its folder is refused, naming it.
    assert "test_the_real_matrix_without_a_framework_folder_is_refused_at_load[toyfw] PASSED" in proc.stdout
