"""Emulated arm64 containers get an arm64 CPU identity (issue 38): under QEMU on an x86 host the host's CPU
sysfs shows through, without MIDR_EL1, and torch's oneDNN segfaults at `import torch` (measured with torch
2.13.0 aarch64). Validate mounts a Neoverse V2 (Grace) CPU sysfs into emulated arm64 containers only; the
Dockerfile's smoke import mounts the same identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from buildtool.contracts import emulation, platforms
from tests.conftest import REPO


def test_an_emulated_arm64_container_mounts_a_neoverse_v2_cpu_sysfs(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platforms, "host", lambda: platforms.get("linux/amd64"))
    [flag] = emulation.run_flags("linux/arm64", tmp_path / "cpu")
    assert flag == f"--volume={tmp_path / 'cpu'}:/sys/devices/system/cpu:ro"
    for cpu in ("cpu0", "cpu1"):
        assert (tmp_path / "cpu" / cpu / "regs/identification/midr_el1").read_text() == "0x00000000410fd4f0\n"
    assert (tmp_path / "cpu" / "online").read_text() == "0-1\n"


@pytest.mark.parametrize(("host", "image"), [("linux/arm64", "linux/arm64"), ("linux/amd64", "linux/amd64"),
                                             ("linux/arm64", "linux/amd64")])
def test_native_runs_and_emulated_amd64_get_no_cpu_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            host: str, image: str) -> None:
    monkeypatch.setattr(platforms, "host", lambda: platforms.get(host))
    assert emulation.run_flags(image, tmp_path / "cpu") == []
    assert not (tmp_path / "cpu").exists()


def test_the_dockerfiles_smoke_import_sees_the_same_cpu_identity() -> None:
    text = (REPO / "dockerfiles/pytorch/pytorch-cuda/2.13/Dockerfile").read_text()
    assert f"echo {emulation.NEOVERSE_V2_MIDR} > \"/cpu/cpu${{cpu}}/regs/identification/midr_el1\"" in text
    assert f"for cpu in {' '.join(str(c) for c in range(emulation.CPUS))}; do" in text
    assert "--mount=type=bind,from=cpu-identity,source=/cpu,target=/sys/devices/system/cpu" in text
