"""Image checks that passed on an image with the fault they look for, each shown failing here against a stand-in
(rank files and results as the image's probes write them, TensorBoard's answers as tb_query.py records them) with no
engine."""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest

IMAGE_TESTS = Path(__file__).resolve().parent.parent / "image-tests"
for _folder in ("", "pytorch"):
    sys.path.insert(0, str(IMAGE_TESTS / _folder))
import harness  # noqa: E402

with warnings.catch_warnings():   # their marks are image-tests' own (image-tests/conftest.py)
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    import test_ddp as ddp_tests
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
