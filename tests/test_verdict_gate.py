"""The verdict must cover what the matrix defines for the cell; no waiver covers these rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from buildtool.contracts import skips
from buildtool.contracts.verdict import parse_verdict
from buildtool.release.gates import check_version, spelling_problems, verdict_problems
from tests.conftest import fixture_matrix
from tests.signing import result, verdict

REPO = Path(__file__).resolve().parent.parent
CELLS = {c.key: c for c in fixture_matrix().cells}
CPU, CUDA, NGC = CELLS["pytorch-cpu:2.13"], CELLS["pytorch-cuda:2.13"], CELLS["pytorch-ngc:25.10"]
D1 = "sha256:" + "1" * 64
# A releaser who waives everything they can: every waivable code, by name (a waiver names a code, issue 48).
ALL = tuple(c.code for c in skips.CODES.values() if c.waivable)


def problems(cell, body, **kw):  # noqa: ANN001, ANN201
    """The gate's problems with `body`, parsed as release parses a signed verdict."""
    return verdict_problems(cell, D1, parse_verdict(body, "test verdict"), kw.pop("accept", ALL), **kw)


def test_a_complete_verdict_passes() -> None:
    assert problems(CPU, verdict(CPU, D1)) == []


def test_default_reports_folder_regression_group_image_tests_is_refused() -> None:
    """Issue 11, item 1: with reports inside the project, ids began `image-tests/...` and every test's
    group was `image-tests`; such a verdict names groups the cell does not have."""
    tests = [result("image-tests/common/test_x.py::test_a"), result("image-tests/pytorch/test_y.py::test_b")]
    body = verdict(CPU, D1, tests=tests, groups=["image-tests"])
    found = problems(CPU, body)
    assert any("ran groups image-tests" in p and "common, pytorch" in p for p in found)
    assert any("outside the cell's groups" in p for p in found)


@pytest.mark.parametrize(("change", "message"), [
    ({"selection": {"expression": "shm", "deselected": []}}, "ran a selection (-k 'shm')"),
    ({"selection": {"expression": None, "deselected": ["common/test_x.py::test_z"]}}, "deselected 1 test(s)"),
    ({"groups": ["common"]}, "did not run the group(s) pytorch that the matrix gives pytorch-cpu:2.13 (it ran "
                             "common; the cell's groups are common, pytorch)"),
    ({"defined_tests": []}, "lists no defined tests"),
    ({"result": "incomplete"}, "is 'incomplete'"),
    ({"result": "failed"}, "is 'failed'"),
    ({"cell": "pytorch-cuda:2.13"}, "is for cell 'pytorch-cuda:2.13'"),
    ({"digest": "sha256:" + "2" * 64}, "names digest sha256:2222"),
])
def test_coverage_rules_refuse_and_no_waiver_covers_them(change: dict, message: str) -> None:
    body = verdict(CPU, D1)
    body.update(change)
    found = problems(CPU, body)
    assert any(message in p for p in found), found


def test_every_defined_test_needs_a_result_and_nothing_else_may_appear() -> None:
    body = verdict(CPU, D1)
    body["defined_tests"] = [*body["defined_tests"], "pytorch/test_ddp.py::test_ddp_loss_falls"]
    assert any("1 defined test(s) have no result" in p and "test_ddp_loss_falls" in p for p in problems(CPU, body))
    body = verdict(CPU, D1)
    body["tests"] = [*body["tests"], result("pytorch/test_ddp.py::test_extra")]
    assert any("results for tests its groups do not define" in p for p in problems(CPU, body))
    body = verdict(CPU, D1)
    body["tests"][0]["group"] = "image-tests"
    assert any("group does not match the test id" in p for p in problems(CPU, body))


def test_defined_tests_are_compared_with_this_checkouts_collection() -> None:
    body = verdict(CPU, D1)
    same = {i: False for i in body["defined_tests"]}
    assert problems(CPU, body, local_tests=same) == []
    more = {**same, "pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw": True}
    [found] = problems(CPU, body, local_tests=more)
    assert "differ from what this checkout's image-tests" in found and "missing pytorch/test_ddp.py" in found


def test_gpu_cell_needs_every_gpu_test_passed_and_no_waiver_helps() -> None:
    tests = [result("common/test_x.py::test_a"), result("pytorch/test_ddp.py::test_nccl", "skipped",
                                                        "no-gpu-on-runner", "no GPU", gpu=True)]
    found = problems(CUDA, verdict(CUDA, D1, tests=tests))
    assert any("1 GPU test(s) of GPU cell pytorch-cuda:2.13 did not pass" in p for p in found)
    # The GPU flag of this checkout's collection counts even when the verdict does not carry it.
    tests = [result("common/test_x.py::test_a"), result("pytorch/test_ddp.py::test_nccl", "failed")]
    local = {"common/test_x.py::test_a": False, "pytorch/test_ddp.py::test_nccl": True}
    found = problems(NGC, verdict(NGC, D1, "failed", tests=tests), local_tests=local)
    assert any("GPU test(s) of GPU cell" in p and "test_nccl" in p for p in found)
    # On a CPU cell a GPU test skipped as not in the cell is what the matrix expects.
    tests = [result("common/test_x.py::test_a"), result("pytorch/test_ddp.py::test_nccl", "skipped",
                                                        "gpu-not-in-cell", "no GPUs in the profile", gpu=True)]
    assert problems(CPU, verdict(CPU, D1, tests=tests)) == []


# -- versions --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("given", "normal"), [("v1.0", "1.0"), ("1.0", "1.0"), ("1.0.0", "1.0.0"),
                                               ("V2.1-RC1", "2.1rc1"), ("2026.01.5", "2026.1.5")])
def test_versions_are_taken_in_pep440_normal_form(given: str, normal: str) -> None:
    assert check_version(given) == normal


def test_a_version_released_under_another_spelling_is_refused() -> None:
    from packaging.version import Version

    released = {Version("1.0"): "pytorch-cpu:2.13-1.0"}
    [problem] = spelling_problems("1.0.0", released, "pytorch-cpu:2.13")
    assert "already exists as pytorch-cpu:2.13-1.0" in problem and "use --version 1.0" in problem
    assert spelling_problems("1.0", released, "x") == [] and spelling_problems("1.1", released, "x") == []


# -- issue 20, hole 4: a skip code is judged per test, not per cell ---------------------------------

@pytest.mark.parametrize(("test_id", "code", "gpu"), [
    ("pytorch/test_ddp.py::test_ddp_loss_falls", "gpu-not-in-cell", False),        # gloo DDP, not a GPU test
    ("common/test_contents.py::test_extra_packages", "gpu-not-in-cell", False),
    ("pytorch/test_ddp.py::test_ddp_loss_falls", "no-pinned-packages", False),      # expected on a bare cell
    ("pytorch/test_ddp.py::test_ddp_loss_falls", "no-peer-image", False),           # waivable, but not this test
    ("common/test_contents.py::test_gpus_visible", "one-gpu-on-runner", True),      # only the bus bandwidth test
    ("pytorch/test_ddp.py::test_ddp_loss_falls", "ulimit-not-granted", False),
])
def test_a_skip_code_this_test_cannot_carry_is_refused_naming_test_and_code(test_id: str, code: str,
                                                                            gpu: bool) -> None:
    import dataclasses

    tests = [result("common/test_x.py::test_a"), result(test_id, "skipped", code, "does not apply", gpu=gpu)]
    bare = dataclasses.replace(CPU, packages=())
    found = problems(bare, verdict(bare, D1, tests=tests))
    assert any(test_id in p and f"[{code}]" in p and "may not carry" in p for p in found), found


def test_the_gpu_marker_comes_from_this_checkouts_collection_when_known() -> None:
    """A verdict that calls a gloo test `gpu` to make its gpu-not-in-cell skip pass: the checkout's
    collection says it is not marked gpu."""
    tests = [result("common/test_x.py::test_a"),
             result("pytorch/test_ddp.py::test_ddp_loss_falls", "skipped", "gpu-not-in-cell", "no GPUs", gpu=True)]
    body = verdict(CPU, D1, tests=tests)
    local = {"common/test_x.py::test_a": False, "pytorch/test_ddp.py::test_ddp_loss_falls": False}
    found = problems(CPU, body, local_tests=local)
    assert any("pytorch/test_ddp.py::test_ddp_loss_falls" in p and "[gpu-not-in-cell]" in p for p in found), found
    # the same skip of a test the collection marks gpu is what the matrix expects on a CPU cell
    assert problems(CPU, body, local_tests={**local, "pytorch/test_ddp.py::test_ddp_loss_falls": True}) == []


@pytest.mark.parametrize(("test_id", "code", "gpu"), [
    ("common/test_contents.py::test_gpus_visible", "gpu-not-in-cell", True),
    ("common/test_cross_tensorboard.py::test_other_tensorboard_reads_our_events", "no-peer-image", False),
    ("common/test_run_profile.py::test_ulimit[memlock]", "ulimit-not-granted", False),
])
def test_a_code_its_test_may_carry_is_judged_as_before(test_id: str, code: str, gpu: bool) -> None:
    tests = [result("common/test_x.py::test_a"), result(test_id, "skipped", code, "x", gpu=gpu, subject="memlock")]
    assert problems(CPU, verdict(CPU, D1, tests=tests)) == []          # expected, or waived by ALL


# -- issue 20, hole 5: a GPU cell's verdict must carry a usable GPU inventory that agrees ----------

BUSBW = "pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw"
H100 = {"index": "0", "name": "NVIDIA H100 80GB HBM3", "driver": "550.54", "memory_mib": 81559}


def gpu_verdict(gpus: list[dict], usable: bool | None = True, busbw: dict | None = None,
                busbw_result: str = "passed", skip: str = "") -> dict:
    tests = [result("common/test_x.py::test_a"), result("common/test_contents.py::test_gpus_visible", gpu=True),
             result(BUSBW, busbw_result, skip, "one GPU" if skip else "", gpu=True)]
    body = verdict(CUDA, D1, tests=tests)
    body["runner"] = {"hostname": "gpu-1", "gpu_runner": True, "gpus": gpus, "driver": "550.54", "cuda_driver": "12.4",
                      "gpus_usable": usable, "gpu_problem": ""}
    body["gpu_tests"] = [t["id"] for t in tests if t["gpu"]]
    if busbw is not None:
        body["figures"] = {"allreduce_busbw": busbw, "allreduce_busbw_GBps": busbw.get("peak_GBps", 1.0)}
    return body


def two(name: str = H100["name"]) -> list[dict]:
    return [{**H100, "name": name}, {**H100, "index": "1", "name": name}]


def test_a_gpu_verdict_with_an_agreeing_inventory_passes() -> None:
    assert problems(CUDA, gpu_verdict(two(), busbw={"ranks": 2, "gpu_model": H100["name"], "peak_GBps": 300.0})) == []


@pytest.mark.parametrize(("body", "cause"), [
    # the audit's verdict: GPU tests `passed`, no GPU listed, GPUs not usable (an edited conftest)
    (gpu_verdict([], usable=False, busbw={"ranks": 2, "gpu_model": "NVIDIA H100", "peak_GBps": 300.0}),
     "runner lists no GPU"),
    (gpu_verdict(two(), usable=False, busbw={"ranks": 2, "gpu_model": H100["name"], "peak_GBps": 300.0}),
     "the runner's GPUs were not usable (gpus_usable is False)"),
    (gpu_verdict(two(), usable=None, busbw={"ranks": 2, "gpu_model": H100["name"], "peak_GBps": 300.0}),
     "the runner's GPUs were not usable (gpus_usable is None)"),
    (gpu_verdict([{**H100, "name": ""}, {**H100, "index": "1"}], busbw={"ranks": 2, "gpu_model": H100["name"]}),
     "runner lists a GPU without a model name"),
    (gpu_verdict(two(), busbw={"ranks": 4, "gpu_model": H100["name"], "peak_GBps": 300.0}),
     "the bus-bandwidth test ran on 4 GPUs, but the runner lists 2"),
    (gpu_verdict(two(), busbw={"ranks": 2, "gpu_model": "NVIDIA A100-SXM4-80GB", "peak_GBps": 300.0}),
     "the bus-bandwidth test reports GPU model 'NVIDIA A100-SXM4-80GB', but the runner lists NVIDIA H100 80GB HBM3"),
    (gpu_verdict(two()), f"{BUSBW} passed but the verdict has no allreduce_busbw figure"),
    (gpu_verdict(two(), busbw_result="skipped", skip="one-gpu-on-runner"),
     "skipped as one-gpu-on-runner, but the runner lists 2 GPUs"),
])
def test_a_gpu_verdict_whose_inventory_is_empty_unusable_or_disagrees_is_refused(body: dict, cause: str) -> None:
    found = problems(CUDA, body)
    assert any(cause in p for p in found), found


def test_a_cpu_cell_needs_no_gpu_inventory() -> None:
    assert problems(CPU, verdict(CPU, D1)) == []


# -- the cell's groups, all of them (issue 21: fail closed) ------------------------------------------

def test_a_verdict_that_ran_fewer_groups_than_the_cell_names_is_refused_naming_them() -> None:
    tests = [result("common/test_x.py::test_common")]
    found = problems(CPU, verdict(CPU, D1, tests=tests, groups=["common"]))
    assert any("did not run the group(s) pytorch that the matrix gives pytorch-cpu:2.13" in p for p in found), found


def test_release_gates_on_the_cells_groups_even_where_the_checkout_lacks_a_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """image-tests at the image's revision has no pytorch/ folder, and the verdict ran `common` alone
    (what validate did when it dropped a group without a folder): release refuses it, naming the group,
    instead of comparing the verdict with the groups that folder happens to have."""
    from buildtool.matrix.plan import CellPlan
    from buildtool.release import gather, promote
    from buildtool.release.model import Evidence
    from buildtool.release.testcode import KnownCode
    from buildtool.validate import collect, verdicts
    from tests.signing import CODE, KEY, trusted

    folder = tmp_path / "image-tests"
    (folder / "common").mkdir(parents=True)
    tests = [result("common/test_x.py::test_common")]
    body = verdict(CPU, D1, tests=tests, groups=["common"])
    chosen = verdicts.Found(artifact="sha256:" + "a" * 64, verdict=parse_verdict(body, "test"),
                            keyid=KEY.public().keyid, referrer=None)
    monkeypatch.setattr(verdicts, "find_verdicts", lambda *args, **kwargs: verdicts.Findings(found=[chosen]))
    monkeypatch.setattr(collect, "defined_tests", lambda cell, tests_dir, code=None: {t["id"]: False for t in tests})
    plan = CellPlan(cell=CPU, revision="0123456789ab", dev_repo="127.0.0.1:5000/pytorch-cpu-dev",
                    dev_tag="0123456789ab-2.13", release_repo="127.0.0.1:5000/pytorch-cpu",
                    release_tags=("2.13-0.1.0",), moving_tags=(), base=CPU.base)
    item = Evidence(D1)
    options = promote.ReleaseOptions("0.1.0", "0123456789ab", trusted=trusted(),
                                     known_code=KnownCode({CODE: ("image-tests at the image's revision", folder)}))
    gather._gate_verdict(None, item, plan, "pytorch-cpu-dev", options, False)  # type: ignore[arg-type]
    assert any(f"image-tests at the image's revision has no folder {folder / 'pytorch'}/ for the group pytorch "
               "of pytorch-cpu:2.13" in p for p in item.problems), item.problems
    assert any("did not run the group(s) pytorch that the matrix gives pytorch-cpu:2.13" in p
               for p in item.problems), item.problems


def test_a_busbw_figure_of_megabyte_ranks_or_model_is_named_bounded() -> None:
    """The busbw figure's `ranks` is the image's output (its table) and went into release's refusal whole, as did a
    `gpu_model` of the wrong type: a figure of megabytes made a refusal of megabytes. Now both are cut, their
    length said."""
    body = gpu_verdict(two(), busbw={"ranks": "8" * 1_000_000, "gpu_model": ["H"] * 1_000_000, "peak_GBps": 300.0})
    found = [p for p in problems(CUDA, body) if "bus-bandwidth test" in p]
    assert len(found) == 2 and all(len(p) < 1000 and "characters)" in p for p in found), [p[:300] for p in found]
    assert found[0].startswith("the bus-bandwidth test ran on '8888")
