"""Image platforms: the `os/arch` names the matrix, BuildKit and OCI indexes use, and which of them this
machine runs natively (the rest run under QEMU user emulation, registered through binfmt_misc).

One list, so the matrix, the build, validation and release agree on what a platform is; anything else is
refused by name (fail closed), never mapped to a default.
"""

from __future__ import annotations

import platform as _host
from dataclasses import dataclass
from pathlib import Path

from buildtool.common.errors import UserError

DEFAULT: tuple[str, ...] = ("linux/amd64",)


@dataclass(frozen=True)
class Platform:
    name: str        # linux/amd64: BuildKit's --platform, the matrix's value
    os: str          # OCI image index `platform.os`
    architecture: str  # OCI `platform.architecture`, BuildKit's TARGETARCH, Debian's arch, the lock folder
    machine: str     # what `uname -m` (Python's platform.machine()) prints inside the image
    wheel_platform: str  # uv's --python-platform for this platform's locks
    qemu: str        # the binfmt_misc entry that runs it on another host
    elf_machine: int  # e_machine of its ELF files (the ELF psABI: 62 x86-64, 183 AArch64)

    @property
    def descriptor(self) -> dict[str, str]:
        """The `platform` object of an OCI index entry."""
        return {"architecture": self.architecture, "os": self.os}


KNOWN: dict[str, Platform] = {
    "linux/amd64": Platform("linux/amd64", "linux", "amd64", "x86_64", "x86_64-manylinux_2_28", "qemu-x86_64", 62),
    "linux/arm64": Platform("linux/arm64", "linux", "arm64", "aarch64", "aarch64-manylinux_2_28", "qemu-aarch64", 183),
}


class UnknownPlatform(UserError, ValueError):
    """A platform name the table does not know: the CLI's one-line error (exit 2) where nothing else catches it."""


def get(name: str) -> Platform:
    try:
        return KNOWN[name]
    except KeyError:
        raise UnknownPlatform(f"unknown platform {name!r}; one of {', '.join(KNOWN)}") from None


def from_descriptor(descriptor: dict[str, object] | None) -> Platform:
    """The platform an OCI index entry (or an image config) declares; unknown ones are refused."""
    if descriptor is not None and not isinstance(descriptor, dict):   # a registry's JSON: any type at all
        raise UnknownPlatform(f"platform {str(descriptor)[:60]!r} is not an OCI platform object; one of "
                              f"{', '.join(KNOWN)}")
    descriptor = descriptor or {}
    name = f"{descriptor.get('os', '')}/{descriptor.get('architecture', '')}"
    if descriptor.get("variant") and (name, descriptor["variant"]) != ("linux/arm64", "v8"):   # OCI's arm64 is v8
        name += f"/{descriptor['variant']}"
    return get(name)


def is_attestation(entry: dict[str, object]) -> bool:
    """An index entry BuildKit adds for an image's attestations (platform unknown/unknown): not an image."""
    annotations, platform = entry.get("annotations"), entry.get("platform")
    return (isinstance(annotations, dict) and annotations.get("vnd.docker.reference.type") == "attestation-manifest"
            and platform == {"os": "unknown", "architecture": "unknown"})


def host() -> Platform:
    """The platform this machine runs natively."""
    machine = _host.machine()
    for known in KNOWN.values():
        if known.machine == machine:
            return known
    raise UnknownPlatform(f"this machine's architecture {machine!r} is none of {', '.join(KNOWN)}")


def emulated(name: str) -> bool:
    """Whether an image of this platform runs under emulation here."""
    return get(name).machine != host().machine


def binfmt_problem(name: str, root: str = "/proc/sys/fs/binfmt_misc") -> str | None:
    """Why this machine cannot run images of `name` (None: it can, natively or through QEMU with flag F)."""
    if not emulated(name):
        return None
    entry = get(name).qemu
    try:
        text = (Path(root) / entry).read_text(encoding="utf-8")
    except OSError:
        return (f"{name} runs under QEMU here and binfmt_misc has no {entry} entry; run "
                "`bash scripts/setup-tests.sh` (installs qemu-user-static and registers it)")
    lines = text.splitlines()
    if not lines or lines[0].strip() != "enabled":
        return f"binfmt_misc entry {entry} is disabled; run `update-binfmts --enable {entry}`"
    flags = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("flags:")), "")
    if "F" not in flags:
        return (f"binfmt_misc entry {entry} lacks flag F (has {flags or 'none'!r}), so containers cannot open "
                "its interpreter; reinstall qemu-user-static")
    return None
