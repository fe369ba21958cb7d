"""Issue 39 finding 2: a broken NVLink never passes. An SXM board whose NVLink is down shows PIX/NODE/SYS
between its GPUs in `nvidia-smi topo -m`; it used to be read as PCIe, find no (H100 SXM, PCIe) floor and
pass `test_ddp_nccl_allreduce_busbw` with a note, and an unreadable topology passed the same way. Now both
fail naming what nvidia-smi showed, and every (model, interconnect) has a floor or a stated fault.

The fake nvidia-smi (tests/gpu_sim.py) prints the fixtures under tests/fixtures/nvidia_smi/; the image test
itself (image-tests/pytorch/test_ddp.py) is called with a measured table as the GPU runner would give it.
No GPU here: the image test's GPU path is not run on a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from buildtool.contracts import busbw, gpu
from buildtool.contracts.verdict import Gpu
from buildtool.validate import probe
from tests.gpu_sim import FakeGpus, fake_nvidia_smi
from tests.signing import complete

# test_ddp.py's marks (gpu, devices) are registered by image-tests' own conftest, not this suite's.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "nvidia_smi"


def inventory_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixture: str, name: str,
                 count: int = 8) -> probe.Inventory:
    fake_nvidia_smi(tmp_path / "bin", FakeGpus(count=count, name=name, driver="580.65.06",
                                               topo=(FIXTURES / f"{fixture}.topo.txt").read_text()))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    return probe.gpu_inventory()


def floor_of(found: probe.Inventory) -> busbw.Floor:
    """What validate's target says (validate.targets.build_target's call)."""
    return busbw.floor_for(found.gpus[0].name, found.interconnect, found.interconnect_problem,
                           found.interconnect_seen, gpus=len(found.gpus))


@pytest.fixture(scope="module")
def ddp_test():
    """image-tests/pytorch/test_ddp.py's bus-bandwidth test, as a function."""
    sys.path[:0] = [str(REPO / "image-tests"), str(REPO / "image-tests" / "pytorch")]
    try:
        spec = importlib.util.spec_from_file_location("issue39_test_ddp", REPO / "image-tests/pytorch/test_ddp.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        del sys.path[:2]
    return module.test_ddp_nccl_allreduce_busbw


def run_ddp_test(ddp_test, floor: busbw.Floor, peak: float, ranks: int = 8) -> dict:
    sizes = [{"bytes": (8 << 20) << i, "busbw_GBps": peak} for i in range(8)]
    table = {"backend": "nccl", "ranks": ranks, "peak_GBps": peak, "sizes": sizes}
    figures: dict = {}
    ddp_test({"backend": "nccl", "busbw": table, "world_size": ranks}, lambda what: None,
             floor.as_target(), [{"name": floor.gpu_name}] * ranks, figures)
    return figures


@pytest.mark.parametrize(("fixture", "name", "seen"), [
    ("h100_sxm_nvlink_down", "NVIDIA H100 80GB HBM3",
     "28 of 28 GPU pairs joined only through PCIe (nvidia-smi topo -m: GPU0-GPU1 NODE, GPU0-GPU2 NODE"),
    ("h200_sxm_one_gpu_nvlink_down", "NVIDIA H200",
     "7 of 28 GPU pairs joined only through PCIe (nvidia-smi topo -m: GPU0-GPU3 NODE, GPU1-GPU3 NODE"),
])
def test_an_sxm_board_read_as_pcie_fails_naming_what_was_seen(tmp_path, monkeypatch, ddp_test, fixture, name, seen):
    found = inventory_of(tmp_path, monkeypatch, fixture, name)
    assert found.interconnect == busbw.PCIE and seen in found.interconnect_seen
    floor = floor_of(found)
    assert floor.floor_GBps is None and "NVLink is down" in floor.fault and seen in floor.fault
    # A peak that would clear any PCIe floor still fails: the link, not the figure, is broken.
    with pytest.raises(AssertionError) as failed:
        run_ddp_test(ddp_test, floor, peak=52.0)
    assert f"read as PCIe: {seen}" in str(failed.value) and "Fabric Manager" in str(failed.value)


@pytest.mark.parametrize(("topo", "why"), [
    ("Failed to run topology command: Unknown Error\n", "no GPU0 column header"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-7\nGPU1\t???\t X \t0-7\n", "unknown link '???'"),
])
def test_an_unreadable_topology_on_a_model_with_floors_fails(tmp_path, monkeypatch, ddp_test, topo, why):
    fake_nvidia_smi(tmp_path / "bin", FakeGpus(count=2, name="NVIDIA H100 80GB HBM3", driver="580.65.06", topo=topo))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    found = probe.gpu_inventory()
    assert found.interconnect == "" and why in found.interconnect_problem
    floor = floor_of(found)
    assert floor.fault.startswith("the interconnect of 2x H100 SXM could not be read (") and why in floor.fault
    with pytest.raises(AssertionError, match="so the check fails rather than pass without one"):
        run_ddp_test(ddp_test, floor, peak=300.0, ranks=2)


def test_a_healthy_board_still_passes_and_records_no_fault(tmp_path, monkeypatch, ddp_test):
    floor = floor_of(inventory_of(tmp_path, monkeypatch, "h100_sxm", "NVIDIA H100 80GB HBM3"))
    assert (floor.interconnect, floor.floor_GBps, floor.fault) == (busbw.NVLINK, 112.5, "")
    figures = run_ddp_test(ddp_test, floor, peak=360.0)
    assert figures[gpu.BUSBW_FIGURE]["floor_fault"] == "" and figures[gpu.BUSBW_FIGURE]["floor_GBps"] == 112.5


def test_keys_the_images_table_adds_never_reach_the_figure(tmp_path, monkeypatch, ddp_test):
    """The figure began as the image's whole table: with no baseline of its own, keys the image added
    (`baseline_GBps`, `previous_GBps`, `change`) stayed in it, and the report showed them as the baseline and left
    out its own comparison with the previous night, so an image could hide a drop. Only the table's own keys go in."""
    floor = floor_of(inventory_of(tmp_path, monkeypatch, "h100_sxm", "NVIDIA H100 80GB HBM3"))
    sizes = [{"bytes": (8 << 20) << i, "busbw_GBps": 360.0} for i in range(8)]
    table = {"backend": "nccl", "ranks": 8, "warmup": 5, "iters": 20, "peak_GBps": 360.0, "peak_bytes": 1 << 30,
             "sizes": sizes, "baseline_GBps": 361.0, "baseline_nights": 7, "previous_GBps": 359.0, "change": 0.0}
    figures: dict = {}
    ddp_test({"backend": "nccl", "busbw": table, "world_size": 8}, lambda what: None, floor.as_target(),
             [{"name": floor.gpu_name}] * 8, figures)
    figure = figures[gpu.BUSBW_FIGURE]
    assert not {"baseline_GBps", "baseline_nights", "previous_GBps", "change"} & set(figure), figure
    assert {k: figure[k] for k in ("backend", "ranks", "warmup", "iters", "peak_GBps", "peak_bytes", "sizes")} == {
        k: table[k] for k in ("backend", "ranks", "warmup", "iters", "peak_GBps", "peak_bytes", "sizes")}


MODELS = sorted(set(busbw.GPU_MODELS.values()))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("link", [busbw.NVLINK, busbw.PCIE])
def test_every_model_and_interconnect_has_a_floor_or_a_stated_fault(model, link):
    """No (model, interconnect) falls through to 'no documented figure': a floor, or a fault with its reason."""
    assert ((model, link) in busbw.LINKS) != ((model, link) in busbw.FAULTS), (model, link)
    name = next(n for n, m in busbw.GPU_MODELS.items() if m == model)
    found = busbw.floor_for(name, link, seen="seen", gpus=2)
    assert (found.floor_GBps is not None) != bool(found.fault), found
    assert "no documented figure" not in found.note


def test_gh200_has_an_nvlink_floor_from_its_datasheet_and_one_gpu_says_why_not():
    two = busbw.floor_for("NVIDIA GH200 480GB", busbw.NVLINK, gpus=2)
    assert (two.model, two.floor_GBps) == ("GH200", 112.5) and "GH200" in two.source and "datasheet" in two.source
    one = busbw.floor_for("NVIDIA GH200 480GB", "", "one GPU: no link between GPUs", gpus=1)
    assert one.floor_GBps is None and not one.fault and one.note.startswith("no floor on one GPU: one GH200")


def test_the_trend_compares_an_sxm_read_as_pcie_with_its_nvlink_nights(tmp_path):
    """It used to skip them as 'another interconnect', so a broken NVLink also escaped the night-over-night fall."""
    h100 = "NVIDIA H100 80GB HBM3"
    for day, peak in ((1, 360.0), (2, 350.0), (3, 355.0)):
        data = {"schema": 5, "digest": "sha256:" + "a" * 64, "image": "r/x", "cell": "pytorch-ngc:25.10",
                "result": "passed", "started": f"2026-03-{day:02d}T02:00:00+00:00", "duration_s": 1.0,
                "groups": ["pytorch"], "runner": {"gpus": [{"index": str(i), "name": h100} for i in range(8)]},
                "figures": {gpu.BUSBW_FIGURE: {"peak_GBps": peak, "interconnect": busbw.NVLINK}},
                "tests": [{"id": "pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw", "group": "pytorch",
                           "result": "passed", "gpu": True}]}
        (tmp_path / f"n{day}").mkdir()
        (tmp_path / f"n{day}" / "verdict.json").write_text(json.dumps(complete(data)))
    broken = probe.Inventory([Gpu(index=str(i), name=h100) for i in range(8)], interconnect=busbw.PCIE)
    assert probe.busbw_baseline([tmp_path], "pytorch-ngc:25.10", broken)["median_GBps"] == 355.0
    pcie = probe.Inventory([Gpu(index=str(i), name="NVIDIA H100 NVL") for i in range(8)], interconnect=busbw.PCIE)
    assert probe.busbw_baseline([tmp_path], "pytorch-ngc:25.10", pcie) == {}
