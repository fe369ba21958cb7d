"""Issue 39 finding 5: `make gpu-smoke` judges the bus bandwidth as validate does. It passed any peak above
0; now the floor of contracts.busbw for the GPUs' exact model and interconnect (`nvidia-smi topo -m`, the fake
one of tests/gpu_sim.py) applies, and a broken NVLink or an unreadable topology fails naming what was seen.
The DDP probe is a stand-in that writes the result the in-image script writes (no GPU here: not run on one)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.gpu_sim import FakeGpus, fake_nvidia_smi
from tests.test_gpu_smoke import load_smoke

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvidia_smi"
H100 = "NVIDIA H100 80GB HBM3"


class StubRunner:
    """Runs nothing: the DDP probe 'wrote' a result with this peak."""

    def __init__(self, folder: Path, peak: float, ranks: int) -> None:
        self.folder, self.peak, self.ranks = folder, peak, ranks

    def py(self) -> list[str]:
        return ["python3"]

    def script(self, name: str) -> str:
        return name

    def probe(self, step, argv, timeout, env=None):  # noqa: ANN001, ANN201
        gpu_smoke = load_smoke()
        sizes = [{"bytes": (8 << 20) << i, "busbw_GBps": self.peak} for i in range(8)]
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "result.json").write_text(json.dumps({
            "backend": "nccl", "world_size": self.ranks, "identical": True, "first_loss": 1.0, "last_loss": 0.1,
            "busbw": {"backend": "nccl", "ranks": self.ranks, "peak_GBps": self.peak, "sizes": sizes}}))
        return gpu_smoke.Ran(0, False, timeout, "", self.folder)


def smoke_busbw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, topo: str, peak: float) -> dict:
    gpus = [{"index": str(i), "name": H100, "driver": "580.65.06"} for i in range(8)]
    fake_nvidia_smi(tmp_path / "bin", FakeGpus(count=8, name=H100, driver="580.65.06", topo=topo))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    gpu_smoke = load_smoke()
    _, busbw = gpu_smoke.check_ddp(StubRunner(tmp_path / "out", peak, 8), 8, 60, gpu_smoke.busbw_floor(gpus))
    return busbw


def test_a_peak_below_validates_floor_fails_the_smoke(tmp_path, monkeypatch):
    """5 GB/s on eight NVLink H100s: the old smoke passed it (any peak above 0)."""
    found = smoke_busbw(tmp_path, monkeypatch, (FIXTURES / "h100_sxm.topo.txt").read_text(), 5.0)
    assert found["status"] == "failed" and found["reason"] == "peak 5.0 GB/s is below the floor 112.5 GB/s for H100 SXM"
    assert found["figures"]["busbw_floor_GBps"] == 112.5


def test_a_healthy_peak_passes_with_the_floor_recorded(tmp_path, monkeypatch):
    found = smoke_busbw(tmp_path, monkeypatch, (FIXTURES / "h100_sxm.topo.txt").read_text(), 360.0)
    assert found["status"] == "passed" and found["figures"]["busbw_interconnect"] == "NVLink", found


@pytest.mark.parametrize(("fixture", "why"), [
    ("h100_sxm_nvlink_down", "8x H100 SXM read as PCIe: 28 of 28 GPU pairs joined only through PCIe"),
    ("h100_sxm_unreadable", "the interconnect of 8x H100 SXM could not be read (no GPU0 column header"),
])
def test_a_broken_or_unreadable_topology_fails_the_smoke(tmp_path, monkeypatch, fixture, why):
    found = smoke_busbw(tmp_path, monkeypatch, (FIXTURES / f"{fixture}.topo.txt").read_text(), 360.0)
    assert found["status"] == "failed" and found["reason"].startswith(why), found


def test_gpus_of_two_models_have_no_floor_rather_than_the_first_ones(tmp_path, monkeypatch):
    """Before: the floor (and its fault) was the first GPU's model alone, so an H100 SXM beside an L40S, joined by
    PCIe, failed as "NVLink is down" on an SXM baseboard; now GPUs of several models get no floor, saying why."""
    fake_nvidia_smi(tmp_path / "bin", FakeGpus(count=2, name=H100, driver="580.65.06",
                                               topo=(FIXTURES / "h100_pcie.topo.txt").read_text()))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    floor = load_smoke().busbw_floor([{"index": "0", "name": H100}, {"index": "1", "name": "NVIDIA L40S"}])
    assert (floor.fault, floor.floor_GBps, floor.model) == ("", None, None)
    assert floor.note == ("no floor for these GPUs: they are of 2 models (NVIDIA H100 80GB HBM3, NVIDIA L40S); "
                          "floors are per model (buildtool/contracts/busbw.py)")


def test_a_peak_that_is_no_finite_number_is_named_not_taken_for_an_unexpected_table(tmp_path, monkeypatch):
    """The table the in-image script writes is JSON, which holds NaN: a NaN peak failed the smoke as an 'unexpected
    table' listing its sizes, which are as expected; the reason now names the peak, as validate's check does."""
    found = smoke_busbw(tmp_path, monkeypatch, (FIXTURES / "h100_sxm.topo.txt").read_text(), float("nan"))
    assert found["status"] == "failed"
    assert found["reason"] == "peak nan GB/s is no measurement (not a finite number of GB/s)"
