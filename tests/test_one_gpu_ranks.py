"""On a runner with exactly one GPU, torchrun runs one rank per GPU (one rank) and JAX one process on one device: the
checks whose point is data moving between ranks passed there although nothing moved (one parameter hash is identical
to itself; an all_reduce over one rank returns its input). Each now skips as `one-gpu-on-runner`, not run, so the
verdict is incomplete and release needs a multi-GPU verdict that passed it; on CPU (gloo, two ranks) and on two GPUs
each still runs. The image tests themselves run here against stand-in ranks (rank files as torchrun's ranks and
jax_train.py's processes write them); nothing of this ran on a GPU."""

from __future__ import annotations

import ast
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from buildtool.contracts import skips

IMAGE_TESTS = Path(__file__).resolve().parent.parent / "image-tests"
for _folder in ("", "pytorch", "jax"):
    sys.path.insert(0, str(IMAGE_TESTS / _folder))
import harness  # noqa: E402

with warnings.catch_warnings():   # their `gpu` and `devices` marks are image-tests' own (image-tests/conftest.py)
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    import test_collectives as collectives_tests
    import test_ddp as ddp_tests
    import test_distributed as jax_tests
    import test_fsdp as fsdp_tests

GPU = {"index": "0", "name": "NVIDIA H100 80GB HBM3"}


def _arg(argv: list[str], flag: str) -> int:
    return int(argv[argv.index(flag) + 1])


class StandInRanks:
    """A container whose torchrun and jax_train.py end well on every rank, writing what healthy ranks write; each
    probe in a folder of its own."""

    def __init__(self, tmp_path: Path, devices: int) -> None:
        self.tmp_path, self.devices, self.calls = tmp_path, devices, 0

    def _dir(self) -> Path:
        self.calls += 1
        folder = self.tmp_path / f"probe-{self.calls}"
        folder.mkdir()
        return folder

    def run(self, argv: list[str], step: str, quiet: float = 0, env: dict[str, str] | None = None) -> harness.Probe:
        folder = self._dir()
        if argv[0] == "torchrun":
            return self._torchrun(argv, step, folder)
        index, count = _arg(argv, "--process-id"), _arg(argv, "--num-processes")
        state = {"ended": True, "ok": True, "stage": "done", "platform": "gpu", "backend": "nccl",
                 "process_count": count, "global_devices": self.devices, "psum": 6.0, "psum_expected": 6.0,
                 "first_loss": 1.0, "last_loss": 0.1, "identical": True, "param_hashes": ["h"]}
        (folder / f"process-{index}.start.json").write_text("{}")
        (folder / f"process-{index}.json").write_text(json.dumps(state))
        return harness.Probe(step=step, argv=argv, rc=0, dir=folder)

    def _torchrun(self, argv: list[str], step: str, folder: Path) -> harness.Probe:
        nproc = _arg(argv, "--nproc-per-node")
        backend = "gloo" if self.devices == 0 else "nccl"
        checks = {"all_reduce_sum": {"ok": True, "got": 1, "want": 1}}
        for rank in range(nproc):
            (folder / f"rank-{rank}.start.json").write_text("{}")
            ended = {"ok": True, "backend": backend, "world_size": nproc, "checks": checks}   # as collectives.py writes
            (folder / f"rank-{rank}.json").write_text(json.dumps(ended))
        result = {"world_size": nproc, "backend": backend, "identical": True, "param_hashes": ["h"] * nproc,
                  "first_loss": 1.0, "last_loss": 0.1, "matches_reference": True, "max_abs_diff": 0.0,
                  "losses": [1.0, 0.5]}
        return harness.Probe(step=step, argv=argv, rc=0, dir=folder, result=result)


def _ran(check: Any, *args: Any) -> str:
    """'passed', or the skip message."""
    try:
        check(*args)
    except pytest.skip.Exception as skipped:
        return str(skipped.msg)
    return "passed"


def _checks(tmp_path: Path, devices: int) -> dict[str, str]:
    """test id -> 'passed' or the skip message, of each check that needs data to move between ranks."""
    main = StandInRanks(tmp_path, devices)
    gpus = [{**GPU, "index": str(i)} for i in range(devices)]
    target: dict[str, Any] = {}
    ddp = ddp_tests.ddp_run.__wrapped__(main, target, gpus)
    fsdp = fsdp_tests.fsdp_run.__wrapped__(main, target, gpus)
    found = {"pytorch/test_ddp.py::test_ddp_ranks_end_identical": _ran(ddp_tests.test_ddp_ranks_end_identical, ddp)}
    for name in ("test_fsdp_shards_gather_the_same_parameters_on_every_rank",
                 "test_fsdp_gradient_reduction_matches_unsharded_training", "test_fsdp_loss_falls"):
        found[f"pytorch/test_fsdp.py::{name}"] = _ran(getattr(fsdp_tests, name), fsdp)
    if devices:
        def require_gpu(what: str) -> None:
            return None
        found["pytorch/test_collectives.py::test_collectives_give_known_results_with_nccl"] = _ran(
            collectives_tests.test_collectives_give_known_results_with_nccl, main, gpus, require_gpu)
        found["jax/test_distributed.py::test_nccl_across_all_gpus"] = _ran(jax_tests.test_nccl_across_all_gpus, main,
                                                                          gpus, require_gpu)
    return found


MOVING = ("pytorch/test_ddp.py::test_ddp_ranks_end_identical",
          "pytorch/test_fsdp.py::test_fsdp_shards_gather_the_same_parameters_on_every_rank",
          "pytorch/test_fsdp.py::test_fsdp_gradient_reduction_matches_unsharded_training",
          "pytorch/test_fsdp.py::test_fsdp_loss_falls",
          "pytorch/test_collectives.py::test_collectives_give_known_results_with_nccl",
          "jax/test_distributed.py::test_nccl_across_all_gpus")


def test_on_one_gpu_each_check_of_data_moving_between_ranks_skips_as_not_run(tmp_path: Path) -> None:
    """Before: each passed on one GPU (one rank, nothing moved)."""
    found = _checks(tmp_path, 1)
    assert sorted(found) == sorted(MOVING)
    for test_id, outcome in found.items():
        code, _, text = skips.parse_skip(outcome)
        assert code == skips.ONE_GPU_ON_RUNNER.code, (test_id, outcome)
        assert text.startswith("one GPU on this runner: ") and "(not run, not passed)" in text, (test_id, text)
        assert "two or more GPUs" in text, (test_id, text)
        assert skips.misplaced(code, test_id, gpu=False) is None, test_id   # the gate lets these ids carry it


@pytest.mark.parametrize("devices", [0, 2])
def test_on_cpu_and_on_two_gpus_they_still_run(tmp_path: Path, devices: int) -> None:
    found = _checks(tmp_path, devices)
    assert found and set(found.values()) == {"passed"}, found
    assert len(found) == (len(MOVING) if devices else 4)


def _emitters_of_one_gpu() -> set[str]:
    """`file::test` of every image test whose own body skips with skips.ONE_GPU_ON_RUNNER."""
    found = set()
    for path in IMAGE_TESTS.rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and any(
                    isinstance(call, ast.Call) and ast.unparse(call.func) == "skip" and call.args
                    and ast.unparse(call.args[0]) == "skips.ONE_GPU_ON_RUNNER" for call in ast.walk(node)):
                found.add(f"{path.relative_to(IMAGE_TESTS)}::{node.name}")
    return found


def test_the_code_lists_exactly_the_checks_that_skip_with_it() -> None:
    assert set(skips.ONE_GPU_ON_RUNNER.tests) == _emitters_of_one_gpu() == {
        *MOVING, "pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw"}
    # Not marked gpu (they also run with gloo on CPU), they may carry it; no other test may.
    assert skips.ONE_GPU_ON_RUNNER.allows("pytorch/test_ddp.py::test_ddp_ranks_end_identical", gpu=False)
    assert not skips.ONE_GPU_ON_RUNNER.allows("pytorch/test_ddp.py::test_ddp_loss_falls", gpu=False)
    assert not skips.ONE_GPU_ON_RUNNER.allows("common/test_contents.py::test_gpus_visible", gpu=True)
