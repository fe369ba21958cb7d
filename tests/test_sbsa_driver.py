"""The driver floor on arm64 GPU runners (Grace Hopper GH200, Grace Blackwell: NVIDIA's SBSA drivers), issue 38:
validate decides with the runner's own architecture, and a CUDA release without a documented SBSA floor is
refused on arm64 by name, never given the x86_64 figure."""

from __future__ import annotations

import pytest

from buildtool.common.errors import FailedError
from buildtool.contracts import driver_rules, platforms
from buildtool.validate import probe
from tests.conftest import REPO

GH200 = "NVIDIA GH200 480GB"


def test_cuda_13_on_arm64_needs_the_driver_nvidias_sbsa_installer_bundles() -> None:
    floor, source = driver_rules.min_driver_on("13.0", "arm64")
    assert floor == "580.65.06"
    assert "cuda_13.0.0_580.65.06_linux_sbsa.run" in source
    ok = driver_rules.decide("13.0", "580.65.06", "", [GH200], None, "arm64")
    assert ok.admitted and "driver 580.65.06 or newer on arm64 (SBSA)" in ok.rule
    old = driver_rules.decide("13.0", "575.57.08", "", [GH200], None, "arm64")
    assert not old.admitted
    assert "driver 575.57.08 is too old for CUDA 13.0" in old.rule and "580.65.06" in old.rule


def test_a_cuda_release_without_an_sbsa_floor_is_refused_on_arm64_by_name() -> None:
    """12.8 has an x86_64 floor (570.26) but none here for SBSA: a new enough driver is still refused there."""
    assert driver_rules.decide("12.8", "570.26", "", [GH200], None, "amd64").admitted
    refused = driver_rules.decide("12.8", "999.1", "", [GH200], None, "arm64")
    assert not refused.admitted
    assert "CUDA 12.8 has no documented arm64 (SBSA) driver floor" in refused.rule


def test_an_architecture_without_driver_floors_is_refused_naming_it() -> None:
    refused = driver_rules.decide("13.0", "999.1", "", [GH200], None, "riscv64")
    assert not refused.admitted and "no driver floors for architecture 'riscv64'" in refused.rule


def test_every_sbsa_floor_is_a_cuda_release_with_an_x86_64_floor_and_names_its_source() -> None:
    for cuda, (floor, source) in driver_rules.SBSA_MIN_DRIVER.items():
        assert driver_rules.min_driver_on(cuda, "amd64")[0]
        assert f"cuda_{cuda}.0_{floor}_linux_sbsa.run" in source


def test_validate_decides_with_the_runners_own_architecture(monkeypatch: pytest.MonkeyPatch) -> None:
    from buildtool.matrix.loader import load_matrix

    [cell] = [c for c in load_matrix(REPO / "matrix.yaml").cells if c.key == "pytorch-cuda:2.13"]
    inventory = probe.Inventory([probe.Gpu(index="0", name=GH200, driver="575.57.08")], driver="575.57.08")
    monkeypatch.setattr(probe.platforms, "host", lambda: platforms.get("linux/arm64"))
    with pytest.raises(FailedError, match=r"cannot validate pytorch-cuda:2.13 here: refused: driver 575.57.08 is too "
                                          r"old for CUDA 13.0.*580.65.06"):
        probe.check_cell_gpus(cell, inventory)
    good = probe.Inventory([probe.Gpu(index="0", name=GH200, driver="580.95.05")], driver="580.95.05")
    assert "on arm64 (SBSA)" in probe.check_cell_gpus(cell, good)
