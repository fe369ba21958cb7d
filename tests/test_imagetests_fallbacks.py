"""Image checks that passed on an image with the fault they look for, each shown failing here against a stand-in
(rank files and results as the image's probes write them, TensorBoard's answers as tb_query.py records them) with no
engine."""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest

IMAGE_TESTS = Path(__file__).resolve().parent.parent / "image-tests"
for _folder in ("", "pytorch", "jax"):
    sys.path.insert(0, str(IMAGE_TESTS / _folder))
import harness  # noqa: E402

with warnings.catch_warnings():   # their marks are image-tests' own (image-tests/conftest.py)
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    import processes
    import test_ddp as ddp_tests
    import test_distributed as jax_tests
    import test_fsdp as fsdp_tests

GPUS = [{"index": str(i), "name": "NVIDIA H100 80GB HBM3"} for i in range(2)]


class FallenBackRanks:
    """torchrun whose ranks all end well with `backend` (gloo: torch in the image saw no GPU and every rank trained on
    the CPU, as ddp_train.py and fsdp_epochs.py then do), writing what such ranks write."""

    def __init__(self, folder: Path, backend: str) -> None:
        self.folder, self.backend = folder, backend

    def run(self, argv: list[str], step: str, quiet: float = 0, env: dict[str, str] | None = None) -> harness.Probe:
        folder = Path(tempfile.mkdtemp(prefix="probe-", dir=self.folder))
        nproc = int(argv[argv.index("--nproc-per-node") + 1])
        for rank in range(nproc):
            (folder / f"rank-{rank}.start.json").write_text("{}")
            (folder / f"rank-{rank}.json").write_text(json.dumps({"rank": str(rank), "ok": True}))
        result = {"backend": self.backend, "world_size": nproc, "identical": True, "param_hashes": ["h"] * nproc,
                  "first_loss": 1.0, "last_loss": 0.1, "matches_reference": True, "max_abs_diff": 0.0,
                  "losses": [1.0, 0.5], "checkpoint": {"ok": True, "path": "/w/c.pt", "error": ""}}
        return harness.Probe(step=step, argv=argv, rc=0, dir=folder, result=result)


def _fsdp_checks(fsdp: dict[str, Any]) -> None:
    fsdp_tests.test_fsdp_shards_gather_the_same_parameters_on_every_rank(fsdp)
    fsdp_tests.test_fsdp_gradient_reduction_matches_unsharded_training(fsdp)
    fsdp_tests.test_fsdp_loss_falls(fsdp)


def test_fsdp_and_ddp_ranks_that_fell_back_to_gloo_on_a_gpu_runner_fail_naming_it(tmp_path: Path) -> None:
    """Before: on a runner with two GPUs, ranks that all ran gloo on the CPU passed every FSDP check (and DDP's loss,
    parameter and checkpoint checks): only DDP's bus-bandwidth test looked at the backend."""
    main = FallenBackRanks(tmp_path, "gloo")
    for fixture, name in ((fsdp_tests.fsdp_run, "FSDP"), (ddp_tests.ddp_run, "DDP")):
        with pytest.raises(AssertionError) as failed:
            _fsdp_checks(fixture.__wrapped__(main, {}, GPUS)) if name == "FSDP" else \
                ddp_tests.test_ddp_loss_falls(fixture.__wrapped__(main, {}, GPUS))
        assert str(failed.value) == (
            f"torchrun {name} (2 ranks): the ranks used gloo, not nccl: torch in the image saw no GPU "
            "(torch.cuda.is_available() was False), so the ranks ran on the CPU instead of the runner's 2 GPUs")


def test_ranks_with_nccl_on_gpus_and_gloo_on_cpu_still_pass(tmp_path: Path) -> None:
    _fsdp_checks(fsdp_tests.fsdp_run.__wrapped__(FallenBackRanks(tmp_path, "nccl"), {}, GPUS))
    _fsdp_checks(fsdp_tests.fsdp_run.__wrapped__(FallenBackRanks(tmp_path, "gloo"), {}, []))
    ddp_tests.test_ddp_loss_falls(ddp_tests.ddp_run.__wrapped__(FallenBackRanks(tmp_path, "gloo"), {}, []))


def test_ranks_that_used_nccl_where_the_run_has_no_gpu_fail(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"^torchrun FSDP \(2 ranks\): the ranks used nccl, not gloo$"):
        fsdp_tests.fsdp_run.__wrapped__(FallenBackRanks(tmp_path, "nccl"), {}, [])


def _load(relative: str, name: str) -> Any:
    """An image-tests module by its path (pytorch/ and jax/ both have a test_profiler.py)."""
    spec = importlib.util.spec_from_file_location(name, IMAGE_TESTS / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
        spec.loader.exec_module(module)
    return module


torch_profiler = _load("pytorch/test_profiler.py", "imagetests_torch_profiler")
jax_profiler = _load("jax/test_profiler.py", "imagetests_jax_profiler")
PAGE = "<html><body>Error: no steps, see trace_viewer@ and run 2026_12_07_10_22_46</body></html>"   # answered 200
RUN = "2026_12_07_10_22_46"


class EmptyLogdir:
    """A container whose tb_query.py found the plugin loaded and its /runs answering `body` with 200."""

    def __init__(self, body: object) -> None:
        self.body = body

    def python(self, script: str, *args: str, step: str, quiet: float = 0) -> harness.Probe:
        found = {"started": True, "plugins": {"pytorch_profiler": False}, "answered_s": 1.5,
                 "profiler_runs": {"status": 200, "body": self.body}}
        return harness.Probe(step=step, argv=[script, *args], rc=0, result=found)


def test_tensorboard_answers_read_from_a_page_answered_200_fail() -> None:
    """Before: each passed, reading `"steps" in` / `"trace_viewer@" in` / `run in` the text of a page TensorBoard (or
    whatever answered in its place) sent with 200, and taking any 200 as the profiler plugin's /runs answer."""
    served = {"plugins": {"pytorch_profiler": True}, "runs": {"status": 200, "body": {"runs": ["run1"]}},
              "workers": [200, ["worker0"]], "overview": [200, PAGE]}
    with pytest.raises(AssertionError, match=r"^worker overview not served: 200 <html>"):
        torch_profiler.test_profiler_worker_overview(served)
    with pytest.raises(AssertionError, match=r"^the pytorch_profiler plugin did not answer on an empty log folder "):
        torch_profiler.test_tensorboard_answers_on_empty_logdir(EmptyLogdir(PAGE))
    jax_served = {"plugins": {"profile": True}, "run": RUN, "runs": [200, PAGE], "tools": [200, PAGE]}
    with pytest.raises(AssertionError, match=r"^the profile plugin does not list the run "):
        jax_profiler.test_profile_plugin_lists_the_run(jax_served)
    with pytest.raises(AssertionError, match=r"^the run's tools <html>.* lack the trace viewer \(trace_viewer@\)$"):
        jax_profiler.test_profile_plugin_offers_the_trace_viewer(jax_served)


def test_tensorboard_answers_as_the_plugins_send_them_still_pass() -> None:
    torch_profiler.test_profiler_worker_overview({"runs": {}, "workers": [200, ["w"]], "overview": [200, ["steps"]]})
    torch_profiler.test_tensorboard_answers_on_empty_logdir(EmptyLogdir({"runs": [], "loading": False}))
    jax_served = {"plugins": {"profile": True}, "run": RUN, "runs": [200, [RUN]], "tools": [200, ["trace_viewer@"]]}
    jax_profiler.test_profile_plugin_lists_the_run(jax_served)
    jax_profiler.test_profile_plugin_offers_the_trace_viewer(jax_served)


def _jax_processes(tmp_path: Path, psums: list[float]) -> list[Any]:
    """Processes of one jax_train.py job as processes.read finds them: each ran to the end (a process whose own check
    failed exits 1 with error_type Failed, as jax_train.py does), process i reading the sum psums[i] of 6.0."""
    found = []
    for index, psum in enumerate(psums):
        folder = tmp_path / f"process-{index}"
        folder.mkdir()
        ok = psum == 6.0
        state = {"ended": True, "ok": ok, "stage": "done" if ok else "verify", "platform": "cpu", "backend": "gloo",
                 "process_count": len(psums), "global_devices": 3, "local_devices": 1, "psum": psum,
                 "psum_expected": 6.0, "first_loss": 1.0, "last_loss": 0.1, "identical": True,
                 "param_hashes": ["h"] * len(psums), **({} if ok else {"error_type": "Failed", "error": "psum"})}
        (folder / f"process-{index}.start.json").write_text("{}")
        (folder / f"process-{index}.json").write_text(json.dumps(state))
        probe = harness.Probe(step=f"process {index}", argv=[], rc=0 if ok else 1, dir=folder)
        found.append(processes.read(probe, index))
    return found


def test_a_jax_psum_that_reached_process_0_only_fails_naming_the_process(tmp_path: Path) -> None:
    """Before: passed; process 1's own psum was wrong (it failed its check and exited 1), but run_job counts a
    process whose checks failed as completed and the psum checks read process 0's findings alone."""
    found = _jax_processes(tmp_path, [6.0, 2.0])
    assert not [p for p in found if processes.cause(p, "two JAX processes")]   # run_job lets them through
    want = ("psum over 3 devices: process 0 got the known sum but process 1 got 2.0, expected 6.0 (the sum did not "
            "reach every process)")
    for check in (jax_tests.test_psum_across_processes_gives_known_sum, jax_tests.test_two_containers_train_and_agree):
        with pytest.raises(AssertionError) as failed:
            check(found)
        assert str(failed.value).split("\n", 1)[0] == want   # the first line, as the verdict keeps it


def test_jax_psums_known_on_every_process_still_pass(tmp_path: Path) -> None:
    found = _jax_processes(tmp_path, [6.0, 6.0])
    jax_tests.test_psum_across_processes_gives_known_sum(found)
    jax_tests.test_two_containers_train_and_agree(found)
