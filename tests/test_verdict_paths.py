"""Where verdicts are read from: never from a folder an image under test can write (the probes folders)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from buildtool.common.errors import UserError
from buildtool.contracts import gpu
from buildtool.contracts.verdict import Gpu, verdict_paths
from buildtool.report.verdict_files import load_verdicts
from buildtool.validate import runner
from buildtool.validate.pytest_run import probes_dir
from tests.signing import complete

KEY = "pytorch-cuda:2.13"
H100 = "NVIDIA H100 80GB HBM3"


def _verdict(started: str, peak: float) -> dict:
    return complete({"cell": KEY, "digest": "sha256:" + "ab" * 32, "started": started,
                     "runner": {"gpus": [{"index": str(i), "name": H100} for i in range(8)]},
                     "figures": {gpu.BUSBW_FIGURE: {"peak_GBps": peak}},
                     "tests": [{"id": "pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw", "gpu": True,
                                "result": "passed"}]})


def _write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _planted(reports: Path) -> list[Path]:
    """What a container could leave under /imagetests-out (and the shared folder) of a run: the probes folder
    validate gives pytest as its basetemp, which earlier runs' files outlive."""
    probes = probes_dir(reports / "pytorch-cuda-2.13" / "0123456789ab", "run1")
    return [_write(probes / "probes0" / "x" / "verdict.json", _verdict("2026-01-09T00:00:00+00:00", 1.0)),
            _write(probes / "shared0" / "pytorch-cuda_2.13.verdict.json", _verdict("2026-01-10T00:00:00+00:00", 1.0))]


def test_a_verdict_planted_in_a_probes_folder_is_no_night_of_the_busbw_baseline(tmp_path):
    reports = tmp_path / "reports"
    own = _write(reports / "pytorch-cuda-2.13" / "0123456789ab" / "verdict.json",
                 _verdict("2026-01-01T00:00:00+00:00", 400.0))
    planted = _planted(reports)
    inventory = runner.Inventory([Gpu(index=str(i), name=H100) for i in range(8)])
    found = runner.busbw_baseline([reports], KEY, inventory)
    assert found["peaks"] == [400.0] and found["nights"] == 1   # the planted 1.0 GB/s would halve the median
    assert verdict_paths(reports) == [own] and not set(planted) & set(verdict_paths(reports))


def test_the_report_reads_no_verdict_from_a_probes_folder(tmp_path):
    reports = tmp_path / "reports"
    _planted(reports)
    with pytest.raises(UserError, match="holds no verdict file"):
        load_verdicts(reports)
