"""Unit tests of `buildtool validate`'s pure parts: expectations, run flags, results (no engine)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from buildtool.common.errors import UserError
from buildtool.common.refs import has_registry
from buildtool.contracts import label_keys
from buildtool.validate.collect import image_tests_hash
from buildtool.validate.runner import (
    expectations,
    find_cell,
    overall_result,
    run_flags,
)
from tests.conftest import fixture_matrix


@pytest.fixture(scope="module")
def matrix():
    return fixture_matrix()


def cell_of(matrix, key):
    return next(c for c in matrix.cells if c.key == key)


def test_expectations_from_cell_and_label(matrix):
    cell = cell_of(matrix, "pytorch-cpu:2.13")
    expect = expectations(cell, {label_keys.FRAMEWORK_VERSION: "2.12.0+cpu"})
    assert expect["python"] == "3.11"
    assert expect["standin"] is False
    assert [{k: c[k] for k in ("source", "value", "local_pattern")} for c in expect["framework_claims"]] == [
        {"source": "matrix cell pytorch-cpu:2.13", "value": "2.13.0+cpu", "local_pattern": "cpu"},
        {"source": f"label {label_keys.FRAMEWORK_VERSION}", "value": "2.12.0+cpu", "local_pattern": "cpu"},
    ]
    assert expect["packages"] == {"tensorboard": "2.21.0", "torch-tb-profiler": "0.4.3"}


def test_standin_compares_against_standin_version_and_says_so(matrix):
    cell = cell_of(matrix, "pytorch-ngc:25.10")
    labels = {label_keys.STANDIN: "true", label_keys.STANDIN_FRAMEWORK: "2.13.0+cpu",
              label_keys.FRAMEWORK_VERSION: "2.9.0a0"}
    expect = expectations(cell, labels)
    (claim,) = expect["framework_claims"]
    assert claim["value"] == "2.13.0+cpu"
    assert "stand-in" in claim["note"] and "2.9.0a0" in claim["note"]
    assert expect["python"] == "" and "stand-in" in expect["python_skip_reason"]


def test_standin_without_its_version_label_is_bad_input(matrix):
    with pytest.raises(UserError, match=f"stand-in image without {re.escape(label_keys.STANDIN_FRAMEWORK)};"):
        expectations(cell_of(matrix, "pytorch-ngc:25.10"), {label_keys.STANDIN: "true"})


def test_gpus_flag_only_where_the_runner_has_gpus(matrix):
    ngc = cell_of(matrix, "pytorch-ngc:25.10")
    gpu = [{"index": "0", "name": "H100", "driver": "550"}]
    assert not any(f.startswith("--gpus") for f in run_flags(ngc, {}, [], print))
    assert "--gpus=all" in run_flags(ngc, {}, gpu, print)
    cpu = cell_of(matrix, "pytorch-cpu:2.13")
    assert not any(f.startswith("--gpus") for f in run_flags(cpu, {}, gpu, print))
    assert "--shm-size=8g" in run_flags(cpu, {}, [], print)


@pytest.mark.parametrize(("label", "said"), [
    ("[]", "is a JSON list, not the run profile's object; ignored"),
    ('"8g"', "is a JSON str, not the run profile's object; ignored"),
    ("{", "is not JSON; ignored"),
])
def test_a_run_profile_label_that_is_not_an_object_is_named_for_what_it_is(matrix, label, said):
    """A label that is JSON but not an object was logged as "not JSON" (an AttributeError caught as a JSON error)."""
    lines: list[str] = []
    cpu = cell_of(matrix, "pytorch-cpu:2.13")
    assert "--shm-size=8g" in run_flags(cpu, {label_keys.RUN_PROFILE: label}, [], lines.append)
    assert lines == [f"note: label {label_keys.RUN_PROFILE} {said}"]


def test_cell_from_label_or_bad_input(matrix):
    assert find_cell(matrix, {label_keys.CELL: "tensorflow-cpu:2.21"}, None, "x").key == "tensorflow-cpu:2.21"
    assert find_cell(matrix, {}, "pytorch-cpu:2.13", "x").key == "pytorch-cpu:2.13"
    with pytest.raises(UserError, match=f"no {label_keys.CELL} label"):
        find_cell(matrix, {}, None, "img")
    with pytest.raises(UserError, match="not in the matrix"):
        find_cell(matrix, {label_keys.CELL: "pytorch-cpu:9.9"}, None, "img")


def test_skipped_never_counts_as_passed():
    skipped = {"result": "skipped"}
    assert overall_result(0, [skipped, skipped]) == "failed"
    assert overall_result(0, [{"result": "passed"}, skipped]) == "passed"
    assert overall_result(1, [{"result": "passed"}, {"result": "failed"}]) == "failed"
    assert overall_result(2, [{"result": "passed"}]) == "failed"


def test_registry_references():
    assert has_registry("127.0.0.1:5000/pytorch-cpu-dev:abc-2.13")
    assert has_registry("localhost/x:y") and has_registry("ghcr.io/a/b:c")
    assert not has_registry("t-imgtest-pytorch:abc") and not has_registry("library/debian:12")


def test_test_code_hash_follows_the_test_code(tmp_path):
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "test_a.py").write_text("x = 1\n")
    first = image_tests_hash(tmp_path)
    (tmp_path / "common" / "test_a.py").write_text("x = 2\n")
    assert image_tests_hash(tmp_path) != first and first.startswith("sha256:")


@pytest.mark.parametrize(("args", "message"), [
    (["validate"], "error: name the images to validate: IMAGE..., --framework X or --all (exactly one)"),
    (["validate", "img:1", "--all"],
     "error: name the images to validate: IMAGE..., --framework X or --all (exactly one)"),
    (["validate", "img:1", "--peer", "jax=img:2"],
     "error: --peer 'jax=img:2' must be FRAMEWORK=IMAGE with FRAMEWORK one of pytorch, tensorflow"),
    (["validate", "--framework", "no-such-image"], "error: unknown FRAMEWORK='no-such-image'; choose one of: all, "),
])
def test_bad_input_exits_2(run_cli, fixture_project: Path, args, message):
    code, out, err = run_cli(*args, "--matrix", str(fixture_project / "matrix.yaml"))
    assert code == 2, err
    assert out == ""
    [line] = err.strip().splitlines()
    assert line.startswith(message), line


def test_unreachable_registry_exits_2(run_cli, fixture_project: Path, no_registry_backoff):
    code, _, err = run_cli("validate", "127.0.0.1:9/pytorch-cpu-dev:x-2.13",
                           "--matrix", str(fixture_project / "matrix.yaml"))
    assert code == 2 and "unreachable" in err, err


def test_cell_groups_are_the_cells_and_a_group_without_a_folder_is_named(matrix, tmp_path: Path) -> None:
    """Issue 21: a group with no folder is an error naming it, never dropped from what runs."""
    from buildtool.validate.collect import cell_groups

    cell = cell_of(matrix, "pytorch-cpu:2.13")
    (tmp_path / "common").mkdir()
    with pytest.raises(UserError) as caught:
        cell_groups(cell, tmp_path)
    assert str(caught.value) == (f"pytorch-cpu:2.13 names the test group pytorch, but there is no folder "
                                 f"{tmp_path / 'pytorch'}/; every group a cell names is a folder of image-tests")
    (tmp_path / "pytorch").mkdir()
    assert cell_groups(cell, tmp_path) == ["common", "pytorch"]


@pytest.mark.parametrize(("value", "said"), [
    ('["torch==2.13.0"]', "is '[\"torch==2.13.0\"]', not a JSON object of package versions"),
    ("null", "is 'null', not a JSON object of package versions"),
    ('{"torch": 2.13}', "every version must be text ('{\"torch\": 2.13}')"),
])
def test_a_packages_label_that_is_json_but_no_object_of_text_versions_is_bad_input(matrix, value, said):
    """Read as the build and release read it (contracts.image_labels): it was taken for no label (a skip saying the
    image has none) or, with a number for a version, a pydantic traceback after the engine probes."""
    with pytest.raises(UserError) as caught:
        expectations(cell_of(matrix, "pytorch-cpu:2.13"), {label_keys.PACKAGES: value})
    assert str(caught.value) == (f"label {label_keys.PACKAGES} of the image{':' if 'every' in said else ''} {said}"
                                 "; rebuild it with `buildtool build`")


def test_a_selection_pytest_would_refuse_is_bad_input_before_anything_runs(run_cli, fixture_project: Path,
                                                                           monkeypatch):
    """`-k` that pytest cannot parse: one line, exit 2, before the image is pulled or a runner probed (pytest exited
    4 after all that, and the verdict was signed and stored as `failed`, the newest, blocking a release)."""
    from buildtool.validate import runner

    monkeypatch.setattr(runner, "gpu_inventory", lambda: pytest.fail("the runner was probed"))
    monkeypatch.setattr(runner, "resolve", lambda *a, **k: pytest.fail("the image was resolved"))
    code, out, err = run_cli("validate", "img:1", "-k", "test_ddp and (", "--matrix",
                             str(fixture_project / "matrix.yaml"))
    assert code == 2, err
    [line] = err.strip().splitlines()
    assert line == ("error: -k 'test_ddp and (' is not a pytest selection expression (at column 15: expected not OR "
                    "left parenthesis OR identifier; got end of input); test names joined by and, or, not and "
                    "parentheses"), line


@pytest.mark.parametrize("flag", ["True", "yes", "1", "false "])
def test_a_standin_flag_neither_true_nor_false_is_refused_by_every_reader(matrix, monkeypatch, flag):
    """validate's expectations and label checks and the lock's base probe read `standin == "true"`: `True` or `yes`
    made a stand-in a real NGC image (its upstream claims checked, its stand-in version ignored), while
    ImageLabels (build, release) refused it. Every reader now refuses it, naming the label."""
    from buildtool.imagebuild import engine, lock
    from buildtool.validate.labels import label_checks

    cell = cell_of(matrix, "pytorch-ngc:25.10")
    labels = {label_keys.STANDIN: flag, label_keys.STANDIN_FRAMEWORK: "2.13.0+cpu"}
    said = f"label {label_keys.STANDIN}={flag!r} is neither true nor false"
    with pytest.raises(UserError, match=f"^the image's {re.escape(said)}; rebuild it with `buildtool build`$"):
        expectations(cell, labels)
    with pytest.raises(UserError, match=f"^the image's {re.escape(said)}"):
        label_checks(matrix, cell, labels, Path(__file__).resolve().parent.parent / "templates")
    monkeypatch.setattr(engine, "image_attrs", lambda ref: {})
    monkeypatch.setattr(engine, "run_output", lambda ref, argv, **kw: '{"packages": {}, "python": "3.12"}\n')
    monkeypatch.setattr(engine, "image_labels", lambda ref: labels)
    with pytest.raises(UserError, match=f"^base b:1: {re.escape(said)}$"):
        lock.base_facts("b:1")


@pytest.mark.parametrize(("flag", "standin"), [("true", True), ("false", False), ("", False), (None, False)])
def test_a_standin_flag_as_the_builder_writes_it_or_none_reads_the_same_everywhere(matrix, flag, standin):
    from buildtool.contracts.image_labels import ImageLabels

    labels = {label_keys.STANDIN_FRAMEWORK: "2.13.0+cpu", **({} if flag is None else {label_keys.STANDIN: flag})}
    assert expectations(cell_of(matrix, "pytorch-ngc:25.10"), labels)["standin"] is standin
    assert bool(ImageLabels.parse(labels).standin) is standin


def test_a_run_profile_labels_shm_size_is_logged_on_one_bounded_line(matrix):
    """The image's run-profile label is anyone's who may push, and its shm_size was logged as written: a newline in it
    forged a line of validate's log (`result: passed`), and its length had no bound; now it is one line of at most
    40 characters (an ordinary value shown as before)."""
    lines: list[str] = []
    cpu = cell_of(matrix, "pytorch-cpu:2.13")
    forged = '{"shm_size": "4g\\nresult: passed' + "x" * 100 + '"}'
    run_flags(cpu, {label_keys.RUN_PROFILE: forged}, [], lines.append)
    run_flags(cpu, {label_keys.RUN_PROFILE: '{"shm_size": "4g"}'}, [], lines.append)
    assert lines == ["note: the image was built with run profile shm_size=4g result: passed" + "x" * 23
                     + ", the matrix now says 8g; testing the matrix's",
                     "note: the image was built with run profile shm_size=4g, the matrix now says 8g; testing the "
                     "matrix's"]


@pytest.mark.parametrize("imports", ["torch", [{"module": "torch"}], [{"module": "torch", "seconds": float("nan")}]])
def test_a_cold_start_record_the_image_wrote_malformed_is_named_in_the_verdict(matrix, tmp_path, imports):
    """The cold start's imports are what the image's own probe printed; one of another shape (a string, no time,
    NaN) made make_verdict raise pydantic's ValidationError, a traceback and no verdict. Now the verdict
    records the cold start's error naming what is wrong, and no import."""
    import datetime as dt
    import json

    from buildtool.validate.options import Options
    from buildtool.validate.run_plan import RunOutcome, RunPlan, make_verdict
    from buildtool.validate.runner import Inventory, Resolved

    (tmp_path / "defined.json").write_text(json.dumps({"defined": [{"id": "common/a.py::t", "gpu": False}],
                                                       "deselected": []}))
    image = Resolved("r", "r@d", "sha256:" + "1" * 64, "h", "repo", {})
    plan = RunPlan("r", image, cell_of(matrix, "pytorch-cpu:2.13"), matrix, Options(), Inventory([]), flags=[],
                   tree=Path(__file__).resolve().parent.parent / "image-tests", groups=["common"])
    cold = {"image": "r", "imports": imports, "seconds": 56.0, "cpu_s": 9.0, "read_bytes": 0, "error": ""}
    run = RunOutcome(dt.datetime.now(dt.UTC).isoformat(), 1.0, 0,
                     {"tests": [{"id": "common/a.py::t", "group": "common", "result": "passed"}],
                      "facts": {"cold_start": cold}}, tmp_path / "defined.json")
    made = make_verdict(plan, run, ("sha256:" + "5" * 64, ""), "sha256:" + "c" * 64)
    assert made.cold_start is not None and made.cold_start.imports == []
    assert made.cold_start.error.startswith("the cold start's record is not one validate can read: `imports")
    assert made.result == "passed" and "\n" not in made.cold_start.error and len(made.cold_start.error) < 300


def test_a_figure_the_image_measured_as_nan_is_written_as_null(matrix, tmp_path):
    """A figure is what the image's tests measured (the busbw table is the image's output): a NaN or Infinity went
    into verdict.json and the signed statement as `NaN`, which no JSON reader but Python's takes (tools/sigstore-verify
    runs JSON.parse on it). Now it is written as null, as JSON.stringify writes NaN, and the verdict is valid JSON."""
    import datetime as dt
    import json

    from buildtool.validate.options import Options
    from buildtool.validate.run_plan import RunOutcome, RunPlan, make_verdict
    from buildtool.validate.runner import Inventory, Resolved

    (tmp_path / "defined.json").write_text(json.dumps({"defined": [{"id": "common/a.py::t", "gpu": False}],
                                                       "deselected": []}))
    image = Resolved("r", "r@d", "sha256:" + "1" * 64, "h", "repo", {})
    plan = RunPlan("r", image, cell_of(matrix, "pytorch-cpu:2.13"), matrix, Options(), Inventory([]), flags=[],
                   tree=Path(__file__).resolve().parent.parent / "image-tests", groups=["common"])
    figures = {"busbw_GBps": float("nan"), "table": {"sizes": [{"busbw_GBps": float("inf")}, {"busbw_GBps": 2.5}]}}
    run = RunOutcome(dt.datetime.now(dt.UTC).isoformat(), 1.0, 0,
                     {"tests": [{"id": "common/a.py::t", "group": "common", "result": "passed"}], "figures": figures},
                     tmp_path / "defined.json")
    made = make_verdict(plan, run, ("sha256:" + "5" * 64, ""), "sha256:" + "c" * 64)
    assert made.figures == {"busbw_GBps": None, "table": {"sizes": [{"busbw_GBps": None}, {"busbw_GBps": 2.5}]}}
    json.dumps(made.to_json(), allow_nan=False)
