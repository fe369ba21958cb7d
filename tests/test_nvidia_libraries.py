"""Issue 39: the cuDNN and NCCL an NGC base's release notes promise are recorded in the matrix and
compared with what the image's libraries report (image-tests/common/test_nvidia_libraries.py).
Here: the version arithmetic, the matrix's rule (an NGC cell without them is refused), what validate
tells the image test, and the in-image probe run on this host against libraries gcc builds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.common.errors import MatrixError
from buildtool.contracts import nvlibs, skips
from buildtool.matrix.loader import load_matrix
from buildtool.validate.targets import expectations
from tests.conftest import fixture_image_tests

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("name", "code", "parts"), [
    ("cudnn", 90700, (9, 7, 0)), ("cudnn", 91400, (9, 14, 0)), ("cudnn", 8907, (8, 9, 7)),
    ("nccl", 22501, (2, 25, 1)), ("nccl", 22707, (2, 27, 7)), ("nccl", 2708, (2, 7, 8)),
])
def test_version_codes_decode_as_the_headers_encode_them(name, code, parts):
    assert nvlibs.decode(name, code) == parts


def test_a_library_that_reports_the_promise_passes_and_another_is_named_with_both_versions():
    assert nvlibs.problem("cudnn", "9.7.0.66", 90700) is None   # the build number (.66) is not reported
    assert nvlibs.problem("nccl", "2.25.1", 22501) is None
    wrong = nvlibs.problem("cudnn", "9.14.0.64", 90600)
    assert wrong == "cuDNN 9.6.0 in the image, the matrix records cuDNN 9.14.0.64 (compared: 9.14.0)"
    assert "NCCL 2.25.1 in the image, the matrix records NCCL 2.27.7" in nvlibs.problem("nccl", "2.27.7", 22501)


@pytest.mark.parametrize("bad", ["9.7", "nine", "9.7.0.66.1", "", "v9.7.0"])
def test_a_promise_that_is_not_a_version_is_refused(bad):
    with pytest.raises(ValueError, match="is not a library version"):
        nvlibs.parse_promise(bad)


@pytest.mark.parametrize("bad", ["9.7.0\n", "9.7.0.66\n", "\u0669.7.0"])
def test_a_promise_with_a_trailing_newline_or_another_scripts_digits_is_refused(bad):
    """`$` matched before a final newline, so `'9.7.0\\n'` was taken for a version (and \\d any Unicode digit)."""
    with pytest.raises(ValueError, match="is not a library version"):
        nvlibs.parse_promise(bad)


def test_a_version_call_that_returns_nothing_is_an_error_not_a_version():
    with pytest.raises(ValueError, match="reported version code 0"):
        nvlibs.decode("cudnn", 0)


def _mini(tmp_path: Path, text: str) -> Path:
    (tmp_path / "matrix.yaml").write_text(text)
    return tmp_path / "matrix.yaml"


def _load(path: Path):
    return load_matrix(path, REPO / "templates", display="matrix.yaml", tests_dir=fixture_image_tests())


MINI = (REPO / "tests" / "fixtures" / "mini" / "matrix.yaml").read_text()


def test_an_ngc_cell_without_its_libraries_is_refused_naming_the_key(tmp_path):
    lines = [line for line in MINI.splitlines(keepends=True) if "libraries:" not in line]
    assert len(lines) == len(MINI.splitlines()) - 1
    with pytest.raises(MatrixError, match=r"libraries: an NGC 25.02 base needs the cuDNN and NCCL its release notes"):
        _load(_mini(tmp_path, "".join(lines)))


@pytest.mark.parametrize(("old", "new", "error"), [
    ('cudnn: "9.7.1.26"', 'cudnn: "9.7"', "is not a library version"),
    ('nccl: "2.25.1"', 'nccl: 2.25', 'libraries.nccl: must be a string; quote it'),
    ('source: "https://', 'source: "ftp://', "a web page's URL"),
    ('nccl: "2.25.1",', 'nccl: "2.25.1", rccl: "6.0.0",', "libraries.rccl: unknown key `rccl`"),
])
def test_a_malformed_promise_is_refused(tmp_path, old, new, error):
    assert MINI.count(old) == 1
    with pytest.raises(MatrixError, match=error):
        _load(_mini(tmp_path, MINI.replace(old, new)))


def test_every_ngc_cell_of_the_real_matrix_records_its_libraries_and_validate_passes_them_on():
    from buildtool.contracts.versions import ngc_release

    matrix = load_matrix(REPO / "matrix.yaml", REPO / "templates", display="matrix.yaml",
                         tests_dir=REPO / "image-tests")
    ngc = [c for c in matrix.cells if ngc_release(c.base)]
    assert {c.key for c in ngc} >= {"pytorch-ngc:25.10", "tensorflow-ngc:25.02", "jax-ngc:25.10"}
    for cell in ngc:
        assert cell.libraries is not None, cell.key
        release = ngc_release(cell.base)
        assert f"rel-{release.replace('.', '-')}.html" in cell.libraries.source, (cell.key, cell.libraries.source)
        expect = expectations(cell, {})
        assert expect["libraries"] == {"cudnn": cell.libraries.cudnn, "nccl": cell.libraries.nccl}
        assert expect["libraries_source"] == cell.libraries.source
    cpu = next(c for c in matrix.cells if c.key == "pytorch-cpu:2.13")
    assert "libraries" not in expectations(cpu, {})


def test_the_skips_are_expected_only_where_the_matrix_says_so():
    matrix = load_matrix(REPO / "matrix.yaml", REPO / "templates", display="matrix.yaml",
                         tests_dir=REPO / "image-tests")
    cells = {c.key: c for c in matrix.cells}
    test_id = "common/test_nvidia_libraries.py::test_nvidia_libraries_are_the_ones_the_base_promises"
    assert skips.judge(cells["pytorch-cpu:2.13"], "no-library-promise", test_id=test_id) == "expected"
    # An NGC cell promises them: a skip saying it does not is refused, and so is a stand-in skip on any cell.
    # Before issue 48 a stand-in skip was expected on every NGC cell (each has a stand-in for CI), so a real NGC
    # image whose verdict skipped the check as a stand-in released; a stand-in is never released anyway.
    assert skips.judge(cells["pytorch-ngc:25.10"], "no-library-promise", test_id=test_id) == "refused"
    assert skips.judge(cells["pytorch-cpu:2.13"], "standin-libraries", test_id=test_id) == "refused"
    assert skips.judge(cells["pytorch-ngc:25.10"], "standin-libraries", test_id=test_id) == "refused"
    assert skips.judge(cells["pytorch-cpu:2.13"], "no-library-promise",
                       test_id="common/test_contents.py::test_python_version") == "refused"


# -- the in-image probe, run here against real shared libraries ------------------------------------------

def _library(folder: Path, name: str, source: str) -> None:
    (folder / f"{name}.c").write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{name}", "-o", str(folder / name),
                    str(folder / f"{name}.c")], check=True, capture_output=True, timeout=120)


def _probe(tmp_path: Path, libs: Path) -> dict:
    out = tmp_path / "out"
    out.mkdir()
    spec = {"module": "json", "libraries": {"cudnn": "libcudnn.so.9", "nccl": "libnccl.so.2"}}
    env = {**os.environ, "LD_LIBRARY_PATH": str(libs), "IMAGETEST_OUT": str(out)}
    subprocess.run([sys.executable, str(REPO / "image-tests" / "scripts" / "nvlibs.py"), json.dumps(spec)],
                   check=True, env=env, cwd=REPO / "image-tests" / "scripts", timeout=60)
    return json.loads((out / "result.json").read_text())


def test_the_probe_reads_each_librarys_own_version_call_through_the_dynamic_loader(tmp_path):
    libs = tmp_path / "libs"
    libs.mkdir()
    _library(libs, "libcudnn.so.9", "#include <stddef.h>\nsize_t cudnnGetVersion(void) { return 91400; }\n")
    _library(libs, "libnccl.so.2", "int ncclGetVersion(int *v) { *v = 22707; return 0; }\n")
    found = _probe(tmp_path, libs)["libraries"]
    assert found["cudnn"] == {"path": str(libs / "libcudnn.so.9"), "code": 91400}
    assert found["nccl"] == {"path": str(libs / "libnccl.so.2"), "code": 22707}


def test_the_probe_names_a_missing_library_and_one_without_its_version_call(tmp_path):
    libs = tmp_path / "libs"
    libs.mkdir()
    _library(libs, "libcudnn.so.9", "int somethingElse(void) { return 1; }\n")
    found = _probe(tmp_path, libs)["libraries"]
    assert found["cudnn"]["missing"].startswith(f"{libs / 'libcudnn.so.9'} does not report a version")
    assert "cudnnGetVersion" in found["cudnn"]["missing"]
    assert found["nccl"]["missing"].startswith("the dynamic loader finds no libnccl.so.2")
