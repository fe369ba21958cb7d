"""What a container of an emulated platform needs to be told that QEMU user emulation does not tell it.

An arm64 process under QEMU on an x86 host sees the host's CPU sysfs (/sys/devices/system/cpu): no
`regs/identification/midr_el1`, so torch's oneDNN (xbyak_aarch64) finds no MIDR_EL1 and segfaults at
`import torch` (torch 2.13.0 aarch64 under Debian 12's qemu-user-static, measured; QEMU then hangs).
Emulated arm64 containers get a read-only CPU sysfs of two Arm Neoverse V2 cores (Grace's), the same tree the
Dockerfile's smoke import mounts (templates/parts/native.j2). Native runs get nothing: their CPU is real.
"""

from __future__ import annotations

from pathlib import Path

from buildtool.contracts import platforms

# MIDR_EL1 of Arm Neoverse V2 (implementer 0x41, part 0xd4f), the core of NVIDIA Grace.
NEOVERSE_V2_MIDR = "0x00000000410fd4f0"
CPUS = 2


def cpu_sysfs(folder: Path) -> Path:
    """Write the emulated arm64 CPU sysfs into `folder` (replacing what was there); returns it."""
    for cpu in range(CPUS):
        ident = folder / f"cpu{cpu}" / "regs" / "identification"
        ident.mkdir(parents=True, exist_ok=True)
        (ident / "midr_el1").write_text(NEOVERSE_V2_MIDR + "\n")
        (ident / "revidr_el1").write_text("0x0000000000000000\n")
    for name in ("online", "possible", "present"):
        (folder / name).write_text(f"0-{CPUS - 1}\n")
    return folder


def run_flags(platform: str, folder: Path) -> list[str]:
    """Extra `docker run` flags for containers of `platform` run emulated here ([] when native, or a platform
    whose containers need nothing); `folder` holds the CPU sysfs they mount."""
    if not platforms.emulated(platform) or platforms.get(platform).architecture != "arm64":
        return []
    return [f"--volume={cpu_sysfs(folder)}:/sys/devices/system/cpu:ro"]
