"""GPU runners without a GPU: version semantics with real version strings, CUDA and drivers,
the matrix's GPU fields, rendered NVIDIA variables, the runner's inventory from a fake
nvidia-smi, the verdict's result rules, bus-bandwidth baselines, and the measuring code itself
(gloo on the host's torch)."""

from __future__ import annotations

import importlib
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.common.errors import FailedError, MatrixError, UserError
from buildtool.common.sizes import SizeError, doubling
from buildtool.contracts import driver_rules, gpu, label_keys, versions
from buildtool.contracts.verdict import Gpu, Selection, derive_result
from buildtool.matrix.loader import parse_matrix
from buildtool.render.catalogue import render_catalogue
from buildtool.render.dockerfiles import render_outputs
from buildtool.validate import runner
from tests.conftest import fixture_matrix
from tests.gpu_sim import NO_RUNTIME, NVML_MISMATCH, FakeGpus, engine_shim, runner_env
from tests.signing import complete

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def matrix():
    return fixture_matrix()


def cell(matrix, key):
    return next(c for c in matrix.cells if c.key == key)


# -- version semantics ------------------------------------------------------------------------------

def rule(matrix, key, claim=None):
    c = cell(matrix, key)
    return versions.expectation(claim or c.framework_version, scheme="torch" if c.framework == "pytorch" else "plain",
                                accelerator=c.accelerator, cuda=c.cuda, ngc=versions.ngc_release(c.base))


@pytest.mark.parametrize(("key", "actual"), [
    ("pytorch-cpu:2.13", "2.13.0+cpu"),                       # PyTorch's CPU wheel
    ("pytorch-cuda:2.13", "2.13.0+cu130"),                    # PyPI's CUDA 13.0 wheel
    ("pytorch-ngc:25.10", "2.9.0a0+50eac811a6.nv25.10"),      # NGC PyTorch 25.10
    ("pytorch-ngc:25.01", "2.6.0a0+ecf3bae40a.nv25.01"),      # NGC PyTorch 25.01
    ("tensorflow-ngc:25.02", "2.17.0"),                       # NGC TensorFlow 25.02
    ("tensorflow-cpu:2.21", "2.21.0"),                        # PyPI tensorflow-cpu
])
def test_real_versions_of_each_kind_pass(matrix, key, actual):
    c = cell(matrix, key)
    assert versions.problems(actual, c.framework_version, rule(matrix, key)) == []


@pytest.mark.parametrize(("key", "actual", "why"), [
    ("pytorch-cuda:2.13", "2.13.0+cpu", "build +cpu is not the cell's +cu130"),     # the CPU wheel slipped in
    ("pytorch-cuda:2.13", "2.13.0+cu128", "build +cu128 is not the cell's +cu130"),
    ("pytorch-cuda:2.13", "2.13.0", "build no local part is not the cell's +cu130"),
    ("pytorch-cuda:2.13", "2.12.1+cu130", "version 2.12.1 is not 2.13.0"),
    ("pytorch-cpu:2.13", "2.13.0+cu130", "build +cu130 is not the cell's +cpu"),
    ("pytorch-ngc:25.10", "2.9.0a0+50eac811a6.nv25.09", "nv25.10"),               # another container release
    ("pytorch-ngc:25.10", "2.9.0+50eac811a6.nv25.10", "version 2.9.0 is not 2.9.0a0"),
    ("pytorch-ngc:25.10", "2.9.0a0+cpu", "is not the cell's"),
    ("pytorch-ngc:25.01", "2.6.0a0+ecf3bae40a.nv25.10", "nv25.01"),
    ("tensorflow-cpu:2.21", "2.21.0+cu128", "no local part"),
    ("tensorflow-ngc:25.02", "2.18.0", "version 2.18.0 is not 2.17.0"),
])
def test_wrong_versions_fail_and_say_why(matrix, key, actual, why):
    found = versions.problems(actual, cell(matrix, key).framework_version, rule(matrix, key))
    assert found and why in "; ".join(found), found


def test_release_part_compares_as_versions_not_strings():
    expect = versions.Expectation("cu130", "+cu130")
    assert versions.problems("2.13.0+cu130", "2.13", expect) == []
    assert versions.problems("2.13.1+cu130", "2.13", expect) == ["version 2.13.1 is not 2.13"]
    assert versions.problems("not-a-version", "2.13", expect)[0].startswith("not a PEP 440 version")


def test_ngc_tensorflow_may_carry_its_release_and_claims_keep_their_local_part(matrix):
    assert versions.problems("2.17.0+nv25.2", "2.17.0", rule(matrix, "tensorflow-ngc:25.02")) == []
    # A claim with a local part (a stand-in's label, pytorch-cpu's matrix value) is matched exactly.
    standin = versions.expectation("2.13.0+cpu", scheme="torch", accelerator="cpu", cuda=None, ngc=None)
    assert versions.problems("2.13.0+cpu", "2.13.0+cpu", standin) == []
    assert versions.problems("2.13.0+cu130", "2.13.0+cpu", standin)


# A framework built from its git tree on NGC (JAX): jax's version.py spells such a build
# `<release>.devYYYYMMDD+<commit>`; PyPI's wheels are plain releases.
def source_rule(ngc):
    return versions.expectation("0.7.2", scheme=versions.SOURCE, accelerator="cuda" if ngc else "cpu",
                                cuda="13.0" if ngc else None, ngc=ngc)


@pytest.mark.parametrize(("ngc", "actual"), [
    (None, "0.7.2"),                                # PyPI's jax
    ("25.10", "0.7.2"),                             # a release build on NGC
    ("25.10", "0.7.2.dev20251013+1a2b3c4d"),        # built from the release's tree
    ("25.10", "0.7.2.dev20251013+1a2b3c4d.nv25.10"),
    ("25.10", "0.7.2+nv25.10"),
    ("25.10", "0.7.2+0123456789abcdef0123456789abcdef01234567"),
])
def test_source_scheme_accepts_what_a_source_build_reports(ngc, actual):
    assert versions.problems(actual, "0.7.2", source_rule(ngc)) == []


@pytest.mark.parametrize(("ngc", "actual", "why"), [
    (None, "0.7.2.dev20251013", "version 0.7.2.dev20251013 is not 0.7.2"),   # off NGC, only the release
    (None, "0.7.2+1a2b3c4d", "build +1a2b3c4d is not the cell's no local part"),
    ("25.10", "0.7.3.dev20251013+1a2b3c4d", "version 0.7.3.dev20251013 is not 0.7.2"),  # the next release's tree
    ("25.10", "0.7.1", "version 0.7.1 is not 0.7.2"),
    ("25.10", "0.7.2rc1.dev1+1a2b3c4d", "is not 0.7.2"),                        # a pre-release is not the release
    ("25.10", "0.7.2+1a2b3c4d.nv25.09", "nv25.10"),                              # another container release
    ("25.10", "0.7.2+cpu", "is not the cell's"),
    ("25.10", "0.7.2+abc", "is not the cell's"),                                 # too short for a commit
])
def test_source_scheme_refuses_other_releases_and_builds(ngc, actual, why):
    found = versions.problems(actual, "0.7.2", source_rule(ngc))
    assert found and why in "; ".join(found), found


def test_a_dev_release_passes_only_where_the_scheme_allows_source_builds():
    plain = versions.expectation("0.7.2", scheme=versions.PLAIN, accelerator="cuda", cuda="13.0", ngc="25.10")
    assert versions.problems("0.7.2.dev20251013", "0.7.2", plain) == ["version 0.7.2.dev20251013 is not 0.7.2"]
    assert versions.problems("0.7.2.dev20251013", "0.7.2", source_rule("25.10")) == []
    # A claim that is itself a dev release is matched exactly.
    assert versions.problems("0.7.2.dev20251014", "0.7.2.dev20251013", source_rule("25.10"))


def test_validate_writes_the_rule_into_the_target(matrix):
    claims = runner.expectations(cell(matrix, "pytorch-cuda:2.13"), {})["framework_claims"]
    assert claims[0]["local_pattern"] == "cu130" and "CUDA 13.0" in claims[0]["local_text"]
    ngc = runner.expectations(cell(matrix, "pytorch-ngc:25.10"), {})["framework_claims"][0]
    assert "nv25" in ngc["local_pattern"]
    standin = runner.expectations(cell(matrix, "pytorch-ngc:25.10"), {
        label_keys.STANDIN: "true", label_keys.STANDIN_FRAMEWORK: "2.13.0+cpu"})
    assert standin["framework_claims"][0]["local_pattern"] == "cpu"


# -- CUDA, drivers, the matrix and what is rendered ---------------------------------------------------

def test_cuda_tags_and_minimum_drivers():
    assert gpu.cuda_tag("13.0") == "cu130" and gpu.cuda_tag("12.8") == "cu128"
    assert gpu.min_driver("13.0") == "580.65.06" and gpu.min_driver("12.8") == "570.26"
    with pytest.raises(ValueError, match="no known minimum driver"):
        gpu.min_driver("14.2")
    with pytest.raises(ValueError, match="not a CUDA version"):
        gpu.check_cuda("13")


@pytest.mark.parametrize(("driver", "cuda_driver", "ok"), [
    ("580.65.06", "13.0", True), ("590.10", "13.1", True), ("550.54.14", "12.4", False),
    ("575.51.03", "12.9", False), ("580.65.06", "", True), ("570.26", "", False), ("", "", False),
])
def test_driver_check_for_cuda_13_on_a_pip_cell(driver, cuda_driver, ok):
    """Native support only (pytorch-cuda carries no compat package); an unknown driver is refused."""
    decision = driver_rules.decide("13.0", driver, cuda_driver, ["NVIDIA H100 80GB HBM3"], None, "amd64")
    assert decision.admitted == ok, decision.rule
    if not ok:
        assert "install NVIDIA driver 580.65.06 or newer" in decision.rule


def test_every_gpu_cell_declares_cuda_and_no_cpu_cell_does(matrix):
    for c in matrix.cells:
        assert (c.cuda is not None) == c.needs_gpu, c.key


def _matrix_text(gpu_lines: str, accelerator: str = "cuda") -> str:
    return f"""schema: 1
source: https://example.org/x
images:
  - name: g
    framework: pytorch
    accelerator: {accelerator}
    template: images/pip.Dockerfile.j2
    base: docker.io/library/debian:bookworm-slim
    python: "3.11"
    tests: [common, pytorch]
    use: u
    run: {{shm_size: 1g, ipc: private, ulimits: {{}}, gpus: all}}
    versions:
      - version: "1.0"
        default: true
        framework_version: 2.13.0
{gpu_lines}"""


@pytest.mark.parametrize(("lines", "accelerator", "message"), [
    ("", "cuda", "needs its CUDA version"),
    ('        cuda: "13.0"\n', "cpu", "only GPU cells"),
    ('        cuda: "14.7"\n', "cuda", "no known minimum driver"),
    ('        cuda: "13"\n', "cuda", "not a CUDA version"),
    ('        cuda: "13.0"\n        busbw_floor_GBps: {H100: 100}\n', "cuda", "buildtool/contracts/busbw.py"),
])
def test_matrix_gpu_field_errors_name_file_line_and_key(tmp_path, lines, accelerator, message):
    path = tmp_path / "matrix.yaml"
    path.write_text(_matrix_text(lines, accelerator))
    from buildtool.matrix.yamlsource import load_yaml

    with pytest.raises(MatrixError, match=message) as caught:
        parse_matrix(load_yaml(path))
    assert caught.value.line and caught.value.key.startswith("images[0].versions[0].")


def test_gpu_images_carry_the_nvidia_variables_and_cpu_images_do_not(matrix):
    files = render_outputs(matrix, REPO / "templates").files
    for c in matrix.cells:
        text = files[c.dockerfile].decode()
        if c.needs_gpu:
            assert f"NVIDIA_REQUIRE_CUDA=${{NVIDIA_REQUIRE_CUDA:-cuda>={c.cuda}}}" in text, c.key
            assert "NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES:-all}" in text
            assert "NVIDIA_DRIVER_CAPABILITIES=${NVIDIA_DRIVER_CAPABILITIES:-compute,utility}" in text
            assert f'{label_keys.CUDA}="{c.cuda}"' in text
        else:
            assert "NVIDIA_" not in text and label_keys.CUDA not in text, c.key


def test_catalogue_states_cuda_and_minimum_driver(matrix):
    text = render_catalogue(matrix)
    section = text.split("### pytorch-cuda:2.13")[1].split("###")[0]
    assert "- CUDA: 13.0; host NVIDIA driver 580.65.06 or newer" in section
    assert "NVIDIA Container Toolkit" in section
    assert "CUDA:" not in text.split("### pytorch-cpu:2.13")[1].split("###")[0]


# -- the runner's inventory -------------------------------------------------------------------------

def test_inventory_from_nvidia_smi(tmp_path, monkeypatch):
    env = runner_env(tmp_path, FakeGpus(count=4, name="NVIDIA H200", driver="580.82.07", cuda="13.0"))
    monkeypatch.setenv("PATH", env["PATH"])
    found = runner.gpu_inventory()
    assert [g.name for g in found.gpus] == ["NVIDIA H200"] * 4 and found.gpus[0].memory_mib == 81559
    assert (found.driver, found.cuda_driver, found.problem) == ("580.82.07", "13.0", "")


def test_inventory_says_why_there_is_none(tmp_path, monkeypatch):
    env = runner_env(tmp_path / "a", FakeGpus(broken=NVML_MISMATCH))
    monkeypatch.setenv("PATH", env["PATH"])
    found = runner.gpu_inventory()
    assert found.gpus == [] and NVML_MISMATCH in found.problem and "exit 9" in found.problem
    monkeypatch.setenv("PATH", runner_env(tmp_path / "b", None)["PATH"])
    assert "nvidia-smi not found" in runner.gpu_inventory().problem
    with pytest.raises(FailedError, match="declared a GPU runner.*nvidia-smi not found"):
        runner.require_gpus(runner.gpu_inventory())


def test_require_gpu_fails_before_touching_engine_or_registry(run_cli, tmp_path, monkeypatch, no_registry_backoff):
    """The image is on an unreachable registry: reaching it would be exit 2; a declared GPU runner
    without GPUs stops first, with exit 1."""
    monkeypatch.setenv("PATH", runner_env(tmp_path, FakeGpus(broken=NVML_MISMATCH))["PATH"])
    args = ["validate", "127.0.0.1:9/pytorch-cuda-dev:x-2.13", "--matrix", str(REPO / "matrix.yaml")]
    code, _, err = run_cli(*args, "--require-gpu")
    assert code == 1 and "declared a GPU runner" in err and NVML_MISMATCH in err, err
    monkeypatch.setenv("DL_IMAGES_REQUIRE_GPU", "yes")
    code, _, err = run_cli(*args)
    assert code == 1 and "declared a GPU runner" in err, err
    monkeypatch.setenv("DL_IMAGES_REQUIRE_GPU", "0")
    code, _, err = run_cli(*args)
    assert code == 2 and "unreachable" in err, err   # not declared: it goes on, and meets the registry


def test_engine_without_nvidia_runtime_is_a_failure_naming_the_toolkit(tmp_path, monkeypatch):
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/bash\nfor a in \"$@\"; do case \"$a\" in --gpus*) "
                    f"echo {NO_RUNTIME!r} >&2; exit 125;; esac; done\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("DOCKER_CLIENT", str(fake))
    flags, dropped = runner.probe_flags("img", ["--shm-size=8g"], print)
    assert flags == ["--shm-size=8g"] and dropped == []
    with pytest.raises(FailedError) as caught:
        runner.probe_flags("img", ["--shm-size=8g", "--gpus=all"], print, "13.0")
    assert "NVIDIA Container Toolkit" in str(caught.value) and "could not select device driver" in str(caught.value)


def test_refusals_are_told_apart():
    old = ("nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.0, please update your "
           "driver to a newer version, or use an earlier cuda container: unknown")
    assert "580.65.06 or newer" in runner.gpu_start_problem(old, "13.0")
    assert "NVIDIA Container Toolkit" in runner.gpu_start_problem(NO_RUNTIME, "13.0")
    other = runner.gpu_start_problem("nvidia-container-cli: initialization error: nvml error: driver not loaded", None)
    assert "driver not loaded" in other and "check the NVIDIA driver" in other


def test_dockers_cdi_refusal_without_the_toolkit_names_the_toolkit():
    """Docker 29 asks CDI for --gpus and, with no vendor's spec (no toolkit), answers this (as users report it,
    ShaneIsrael/fireshare#689): it got the generic "check the NVIDIA driver" hint, not the toolkit's fix."""
    cdi = ("docker: Error response from daemon: failed to discover GPU vendor from CDI: no known GPU vendor found\n\n"
           "Run 'docker run --help' for more information")
    problem = runner.gpu_start_problem(cdi, "13.0")
    assert "NVIDIA Container Toolkit" in problem and "nvidia-ctk cdi generate" in problem, problem
    assert "no known GPU vendor found" in problem and "check the NVIDIA driver" not in problem, problem


def test_shim_refuses_gpus_with_dockers_message(tmp_path):
    shim = engine_shim(tmp_path, "refuse", docker="/bin/echo")
    refused = subprocess.run([str(shim), "run", "--gpus=all", "img"], capture_output=True, text=True, timeout=30)
    assert refused.returncode == 125 and "could not select device driver" in refused.stderr
    dropped = subprocess.run([str(engine_shim(tmp_path / "d", "drop", docker="/bin/echo")), "run", "--gpus", "all",
                              "img"], capture_output=True, text=True, timeout=30)
    assert dropped.stdout.split() == ["run", "img"]


# -- the verdict's result --------------------------------------------------------------------------

GPU_TESTS = ["common/t.py::test_gpus_visible", "pytorch/t.py::test_busbw"]
OTHER = ["common/t.py::test_version", "pytorch/t.py::test_ddp"]


def _tests(gpu_result: str, selected: list[str]) -> list[dict]:
    return [{"id": i, "result": gpu_result if i in GPU_TESTS else "passed"} for i in selected]


@pytest.mark.parametrize(("gpu_result", "deselect"), list(itertools.product(
    ["skipped", "passed"], [[], GPU_TESTS[:1], GPU_TESTS, OTHER[:1]])))
def test_a_gpu_cell_is_passed_only_when_every_gpu_test_passed(gpu_result, deselect):
    """Every combination of a selection and GPU outcomes: `passed` needs all GPU tests passed and
    nothing deselected; otherwise `incomplete` (nothing failed)."""
    defined = OTHER + GPU_TESTS
    selected = [i for i in defined if i not in deselect]
    result, reasons = derive_result(0, _tests(gpu_result, selected), defined=defined,
                                    selection=Selection(expression="x" if deselect else None, deselected=deselect),
                                    gpu_cell=True, gpu_tests=GPU_TESTS,
                                    gpu_problem="nvidia-smi not found")
    if gpu_result == "passed" and not deselect:
        assert (result, reasons) == ("passed", [])
    else:
        assert result == "incomplete" and reasons
    if gpu_result == "skipped" or set(deselect) & set(GPU_TESTS):
        assert any("GPU test(s)" in r for r in reasons)


def test_result_rules_for_failures_and_cpu_cells():
    defined = OTHER + GPU_TESTS
    cpu = _tests("skipped", defined)   # a CPU cell's GPU tests skip as gpu-not-in-cell
    assert derive_result(0, cpu, defined=defined, selection=Selection(), gpu_cell=False,
                         gpu_tests=GPU_TESTS) == ("passed", [])
    failed = [*cpu[:-1], {"id": GPU_TESTS[-1], "result": "failed"}]
    assert derive_result(1, failed, defined=defined, selection=Selection(), gpu_cell=True,
                         gpu_tests=GPU_TESTS)[0] == "failed"
    missing = derive_result(0, cpu[1:], defined=defined, selection=Selection(), gpu_cell=False,
                            gpu_tests=GPU_TESTS)
    assert missing[0] == "incomplete" and "neither ran nor were deselected" in missing[1][0]
    only_skips = derive_result(0, _tests("skipped", GPU_TESTS), defined=defined,
                               selection=Selection(expression="gpu", deselected=OTHER), gpu_cell=True,
                               gpu_tests=GPU_TESTS)
    assert only_skips[0] == "failed"   # nothing passed at all
    assert derive_result(2, cpu, defined=defined, selection=Selection(), gpu_cell=False,
                         gpu_tests=GPU_TESTS)[0] == "failed"


# -- bus bandwidth: baselines and the measuring code ------------------------------------------------

def _verdict(cell_key: str, started: str, peak: float, model: str = "NVIDIA H100 80GB HBM3", count: int = 8,
             check: str = "passed", schema: int = 4) -> dict:
    return complete({"schema": schema, "cell": cell_key, "digest": f"sha256:{started}", "started": started,
                     "runner": {"gpus": [{"index": str(i), "name": model} for i in range(count)]},
                     "figures": {gpu.BUSBW_FIGURE: {"peak_GBps": peak}},
                     "tests": [{"id": "pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw", "gpu": True,
                                "result": check}]})


def test_baseline_is_the_median_of_passing_verdicts_of_the_cell_on_the_same_gpus(tmp_path):
    key = "pytorch-cuda:2.13"
    files = {
        "a/verdict.json": _verdict(key, "2026-01-01T00:00:00+00:00", 400.0),
        "b/verdict.json": _verdict(key, "2026-01-03T00:00:00+00:00", 380.0, schema=5),
        "c/verdict.json": _verdict(key, "2026-01-04T00:00:00+00:00", 90.0, check="failed"),   # a fallen night
        "d/verdict.json": _verdict(key, "2026-01-05T00:00:00+00:00", 700.0, model="NVIDIA H200"),
        "e/verdict.json": _verdict(key, "2026-01-06T00:00:00+00:00", 200.0, count=4),
        "f/verdict.json": _verdict("pytorch-ngc:25.10", "2026-01-07T00:00:00+00:00", 410.0),
        "g/verdict.json": _verdict(key, "2026-01-08T00:00:00+00:00", 10.0, schema=1),
        "h/verdict.json": _verdict(key, "2026-01-09T00:00:00+00:00", 10.0, schema=3),    # no longer read
        "prev/pytorch-cuda_2.13.verdict.json": _verdict(key, "2026-01-02T00:00:00+00:00", 390.0),
    }
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(json.dumps(data))
    (tmp_path / "broken.verdict.json").write_text("{not json")
    inventory = runner.Inventory([Gpu(index=str(i), name="NVIDIA H100 80GB HBM3") for i in range(8)])
    found = runner.busbw_baseline([tmp_path, tmp_path / "missing"], key, inventory)
    # a, prev and b qualify (the failed night, other GPUs, another cell, schemas 1 and 3 do not): median 390.
    assert found["median_GBps"] == 390.0 and found["nights"] == 3 and found["window"] == 7
    assert found["peaks"] == [380.0, 390.0, 400.0] and "b/verdict.json" in found["sources"][0]
    assert runner.busbw_baseline([tmp_path], key, runner.Inventory([])) == {}


def _torchrun(tmp_path: Path, env: dict[str, str]) -> dict:
    script = REPO / "image-tests" / "pytorch" / "scripts" / "ddp_train.py"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "DDP_STEPS": "5", "DDP_BUSBW": "1", **env})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("DDP_RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(lines[-1].removeprefix("DDP_RESULT "))["busbw"]


@pytest.mark.host_torch
def test_busbw_measuring_code_runs_on_cpu_with_gloo(tmp_path):
    """The code the GPU runners use (image-tests/pytorch/scripts/ddp_train.py), with gloo and small sizes."""
    table = _torchrun(tmp_path, {"BUSBW_SIZES": ",".join(str(s) for s in doubling("64k", "512k"))})
    assert table["backend"] == "gloo" and table["ranks"] == 2 and (table["warmup"], table["iters"]) == (5, 20)
    assert [r["bytes"] for r in table["sizes"]] == [64 << 10, 128 << 10, 256 << 10, 512 << 10]
    for row in table["sizes"]:
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 * (2 - 1) / 2, rel=1e-3)
        assert row["algbw_GBps"] == pytest.approx(row["bytes"] / (row["time_us"] / 1e6) / 1e9, rel=1e-3)
    assert table["peak_GBps"] == max(r["busbw_GBps"] for r in table["sizes"])


@pytest.mark.host_torch
def test_busbw_time_is_the_slowest_ranks(tmp_path):
    """Rank 1 takes 50 ms longer in every timed iteration; rank 0 alone would not see it."""
    table = _torchrun(tmp_path, {"BUSBW_SIZES": str(64 << 10), "BUSBW_SLOW_RANK": "1:0.05"})
    assert table["sizes"][0]["time_us"] >= 50_000, table


def _import_from(folder: Path, name: str):
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


@pytest.mark.host_torch
def test_default_sizes_are_8mib_to_1gib():
    ddp_train = _import_from(REPO / "image-tests" / "pytorch" / "scripts", "ddp_train")
    sizes = ddp_train.DEFAULT_BUSBW_SIZES
    assert sizes[0] == 8 << 20 and sizes[-1] == 1 << 30 and len(sizes) == 8
    assert ddp_train.parse_sizes("65536,1048576") == [64 << 10, 1 << 20]


@pytest.mark.host_torch   # the script imports torch
@pytest.mark.parametrize("text", ["8M", "64K,1M", "8M:1G", "", "0", "65536,", " 65536", "1e6", "-1", "65536.0"])
def test_the_in_image_script_reads_byte_counts_only(text: str):
    """Sizes with units are the host's grammar (buildtool.common.sizes); the script names what it refuses."""
    ddp_train = _import_from(REPO / "image-tests" / "pytorch" / "scripts", "ddp_train")
    with pytest.raises(SystemExit, match="is not a byte count") as caught:
        ddp_train.parse_sizes(text)
    assert repr(text) in str(caught.value)


def test_the_host_writes_busbw_sizes_with_the_one_size_grammar():
    assert doubling("64k", "512K") == [65536, 131072, 262144, 524288]
    assert doubling("8m", "1g") == [(8 << 20) << i for i in range(8)]
    assert doubling("64k", "100k") == [65536]
    with pytest.raises(SizeError, match="'64KB' is not a size"):
        doubling("64KB", "1m")
    for low, high in (("1m", "64k"), ("0", "1k")):
        with pytest.raises(SizeError, match="above 0 and at most the last"):
            doubling(low, high)


# -- the nightly workflow and the scaling counts ----------------------------------------------------

def test_nightly_shares_one_registry_and_requires_gpus(matrix, tmp_path):
    import yaml

    from buildtool.render.workflows import NIGHTLY_PATH, REGISTRY_CHECK, render_workflows

    doc = yaml.safe_load(render_workflows(matrix)[NIGHTLY_PATH])
    assert doc["env"]["REGISTRY"] == "${{ inputs.registry || vars.REGISTRY }}"
    assert "127.0.0.1" not in json.dumps(doc)
    assert doc["on"]["workflow_dispatch"]["inputs"]["registry"]["type"] == "string"
    for name in ("plan", "build-validate", "scaling", "report"):
        assert doc["jobs"][name]["steps"][0]["run"] == REGISTRY_CHECK, name
    for name in ("build-validate", "scaling"):
        assert doc["jobs"][name]["env"]["DL_IMAGES_REQUIRE_GPU"] == "1"
    validate_job = doc["jobs"]["build-validate"]
    # The history is passed by nightly-validate when there is one (a DL_IMAGES_BASELINE naming the cache's folder
    # was refused on the first night, before the cache held any).
    assert "DL_IMAGES_BASELINE" not in validate_job["env"]
    names = [s.get("name", "") for s in validate_job["steps"]]
    assert names.index("Last nights' verdicts") < names.index("Validate with GPUs and push the signed verdict")
    step = validate_job["steps"][names.index("Validate with GPUs and push the signed verdict")]
    assert "make nightly-validate" in step["run"] and "NIGHTLY_HISTORY=reports/verdict-history" in step["run"]
    assert "NIGHTLY_SCALING_COUNTS=gpus" in doc["jobs"]["scaling"]["steps"][-2]["run"]
    script = tmp_path / "check.sh"
    script.write_text(REGISTRY_CHECK)
    for registry, code in (("", 1), ("127.0.0.1:5000", 1), ("localhost:5000", 1), ("[::1]:5000", 1),
                           ("registry.example.org:5000", 0)):
        proc = subprocess.run(["bash", str(script)], env={**os.environ, "REGISTRY": registry}, capture_output=True,
                              text=True, timeout=30)
        assert proc.returncode == code, (registry, proc.stderr)


@pytest.mark.host_torch
def test_scaling_counts_follow_the_runners_gpus(run_cli, tmp_path, monkeypatch):
    from buildtool.common.errors import UserError
    from buildtool.launch.scaling import check_counts_fit, counts_for_gpus

    assert counts_for_gpus(8) == [1, 2, 4, 8] and counts_for_gpus(1) == [1]
    assert counts_for_gpus(6) == [1, 2, 4, 6] and counts_for_gpus(2) == [1, 2]
    with pytest.raises(FailedError):
        counts_for_gpus(0)
    with pytest.raises(UserError, match="has 4 GPU"):
        check_counts_fit([1, 2, 4, 8], 4)
    # On a runner with 2 GPUs, the nightly's 1,2,4,8 of a GPU cell is refused before anything starts.
    monkeypatch.setenv("PATH", runner_env(tmp_path, FakeGpus(count=2))["PATH"])
    code, _, err = run_cli("scaling", "--cell", "pytorch-cuda:2.13", "--counts", "1,2,4,8", "--out",
                           str(tmp_path / "out"), "--matrix", str(REPO / "matrix.yaml"), "--revision", "abc")
    assert code == 2 and "this runner has 2 GPU(s), so 4, 8 cannot run" in err, err
    monkeypatch.setenv("PATH", runner_env(tmp_path / "none", None)["PATH"])
    code, _, err = run_cli("scaling", "--counts", "gpus", "--launcher", "host", "--out", str(tmp_path / "o"),
                           "--matrix", str(REPO / "matrix.yaml"))
    assert code == 1 and "needs GPUs" in err and "nvidia-smi not found" in err, err


# -- the nightly report ------------------------------------------------------------------------------

def _schema2(cell_key: str, result: str, peak: float | None, started: str, **extra) -> dict:
    sizes = [{"bytes": 8 << 20 << i, "time_us": 100.0 * (i + 1), "algbw_GBps": 50.0 + i, "busbw_GBps": 87.5 + i}
             for i in range(8)]
    figures = {} if peak is None else {gpu.BUSBW_FIGURE: {"backend": "nccl", "ranks": 8, "peak_GBps": peak,
                                                          "sizes": sizes, "gpu_model": "NVIDIA H100 80GB HBM3",
                                                          "floor_GBps": 100.0, **extra},
                                       "allreduce_busbw_GBps": peak}
    return complete({"schema": 4, "digest": "sha256:" + started[-2:] * 32, "image": f"r/{cell_key}", "cell": cell_key,
            "result": result, "started": started, "duration_s": 1.0,
            "runner": {"hostname": "gpu-01", "gpus": [{"index": str(i), "name": "NVIDIA H100 80GB HBM3"}
                                                       for i in range(8)], "driver": "580.65.06",
                       "cuda_driver": "13.0", "gpus_usable": True},
            "incomplete": ["3 GPU test(s) of this GPU cell did not pass on a GPU (nvidia-smi not found)"]
            if result == "incomplete" else [],
            "tests": [{"id": "pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw", "group": "pytorch",
                       "result": "passed" if result == "passed" else "skipped", "gpu": True}],
            "figures": figures})


def test_report_shows_incomplete_verdicts_and_bus_bandwidth_against_last_night():
    """A verdict without a window baseline (older validate) is compared with last night, and says 1 night."""
    from buildtool.report.nightly import build_report, render_html, render_markdown
    from buildtool.report.verdict_files import parse_verdict

    tonight = [_schema2("pytorch-cuda:2.13", "passed", 300.0, "2026-12-02T02:00:00"),
               _schema2("pytorch-ngc:25.10", "incomplete", None, "2026-12-02T02:00:00")]
    last = [_schema2("pytorch-cuda:2.13", "passed", 420.0, "2026-12-01T02:00:00")]
    report = build_report([parse_verdict(v, "x") for v in tonight], [parse_verdict(v, "y") for v in last])
    md = render_markdown(report)
    assert "1 images passed, 0 failed, 1 incomplete" in md
    assert "⚠️ `pytorch-ngc:25.10`: 3 GPU test(s) of this GPU cell did not pass on a GPU" in md
    assert ("| `pytorch-cuda:2.13` | 8x NVIDIA H100 80GB HBM3 | 300.0 GB/s | 100.0 GB/s | 420.0 GB/s (median of 1 "
            "night) | -29% | ❌ fell 29% below the median of 1 night |") in md
    assert "| 8 MiB | 100.0 µs | 50.00 GB/s | 87.50 GB/s |" in md and "| 1 GiB |" in md
    page = render_html(report)
    assert "All-reduce bus bandwidth" in page and "fell 29%" in page and "INCOMPLETE" in page
    assert "images incomplete" in page
    # A verdict that carries its own comparison (validate had a baseline) is shown as it is.
    own = _schema2("pytorch-cuda:2.13", "failed", 60.0, "2026-12-03T02:00:00", previous_GBps=300.0)
    md = render_markdown(build_report([parse_verdict(own, "z")]))
    assert "| 60.0 GB/s | 100.0 GB/s | 300.0 GB/s (median of 1 night) | -80% | ❌ below floor |" in md


@pytest.mark.parametrize("value", ["ture", "Y", "enabled", "2"])
def test_an_unknown_require_gpu_value_is_refused_not_read_as_no(run_cli, tmp_path, monkeypatch, value):
    """A misspelt DL_IMAGES_REQUIRE_GPU on a GPU runner turned its no-GPU check off in silence."""
    from buildtool.contracts.gpu import require_gpu_from_env

    with pytest.raises(UserError, match=f"DL_IMAGES_REQUIRE_GPU={value.lower()!r} is neither yes"):
        require_gpu_from_env({"DL_IMAGES_REQUIRE_GPU": value})
    monkeypatch.setenv("DL_IMAGES_REQUIRE_GPU", value)
    code, out, err = run_cli("validate", "127.0.0.1:9/pytorch-cuda-dev:x-2.13", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and err.strip().splitlines() == [
        f"error: DL_IMAGES_REQUIRE_GPU={value.lower()!r} is neither yes (1, true, yes, on) nor no (0, false, no, off, "
        "or unset)"], err
    assert [require_gpu_from_env({"DL_IMAGES_REQUIRE_GPU": v}) for v in ("", " 0", "False", "no", "off")] == [False] * 5
    assert [require_gpu_from_env({"DL_IMAGES_REQUIRE_GPU": v}) for v in ("1", "TRUE", "yes ", "on")] == [True] * 4
