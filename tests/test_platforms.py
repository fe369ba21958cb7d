"""The platform table: names the matrix, BuildKit and OCI indexes share, and whether this machine can run one."""

from __future__ import annotations

from pathlib import Path

import pytest

from buildtool.contracts import platforms


def test_known_platforms_map_to_oci_buildkit_and_uname_names():
    arm = platforms.get("linux/arm64")
    assert (arm.os, arm.architecture, arm.machine) == ("linux", "arm64", "aarch64")
    assert arm.descriptor == {"architecture": "arm64", "os": "linux"}
    assert platforms.from_descriptor({"os": "linux", "architecture": "arm64", "variant": "v8"}) == arm
    assert platforms.from_descriptor({"os": "linux", "architecture": "amd64"}).machine == "x86_64"


@pytest.mark.parametrize("name", ["linux/arm46", "linux/s390x", "windows/amd64", "", "linux"])
def test_an_unknown_platform_is_refused_by_name(name: str):
    with pytest.raises(platforms.UnknownPlatform, match=f"unknown platform {name!r}"):
        platforms.get(name)


def test_an_unknown_descriptor_is_refused_not_taken_for_amd64():
    with pytest.raises(platforms.UnknownPlatform, match="'linux/riscv64'"):
        platforms.from_descriptor({"os": "linux", "architecture": "riscv64"})
    with pytest.raises(platforms.UnknownPlatform):
        platforms.from_descriptor(None)


@pytest.mark.parametrize("variant", ["v9", "v7", "banana"])
def test_an_arm64_variant_other_than_v8_is_refused_by_name(variant: str):
    """Before, any variant of arm64 was taken for linux/arm64 (a v9-only image would be released as arm64, to run
    on v8 cores); OCI's arm64 variant is v8, the others are other platforms."""
    with pytest.raises(platforms.UnknownPlatform, match=f"unknown platform 'linux/arm64/{variant}'"):
        platforms.from_descriptor({"os": "linux", "architecture": "arm64", "variant": variant})


def _foreign() -> str:
    return next(name for name, p in platforms.KNOWN.items() if p.machine != platforms.host().machine)


def test_the_native_platform_needs_no_emulation(tmp_path: Path):
    native = platforms.host().name
    assert not platforms.emulated(native)
    assert platforms.binfmt_problem(native, root=str(tmp_path)) is None


def test_binfmt_entry_missing_disabled_or_without_flag_f_is_named(tmp_path: Path):
    foreign = _foreign()
    entry = tmp_path / platforms.get(foreign).qemu
    assert platforms.emulated(foreign)
    assert "has no " + entry.name + " entry; run `bash scripts/setup-tests.sh`" in str(
        platforms.binfmt_problem(foreign, root=str(tmp_path)))
    entry.write_text("disabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\n")
    assert "is disabled" in str(platforms.binfmt_problem(foreign, root=str(tmp_path)))
    entry.write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: P\n")
    assert "lacks flag F (has 'P')" in str(platforms.binfmt_problem(foreign, root=str(tmp_path)))
    entry.write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\noffset 0\n")
    assert platforms.binfmt_problem(foreign, root=str(tmp_path)) is None


def test_only_buildkits_attestation_entry_counts_as_not_an_image():
    assert platforms.is_attestation({"platform": {"os": "unknown", "architecture": "unknown"},
                                     "annotations": {"vnd.docker.reference.type": "attestation-manifest"}})
    assert not platforms.is_attestation({"platform": {"os": "unknown", "architecture": "unknown"}})
    assert not platforms.is_attestation({"annotations": {"vnd.docker.reference.type": "something-else"}})
    assert not platforms.is_attestation({"platform": {"os": "linux", "architecture": "arm64"},
                                         "annotations": {"vnd.docker.reference.type": "attestation-manifest"}})


def test_a_machine_of_an_unknown_architecture_is_one_line_not_a_traceback(monkeypatch: pytest.MonkeyPatch,
                                                                           capfd: pytest.CaptureFixture[str]) -> None:
    """Before, UnknownPlatform was a bare ValueError: `build` (or validate) on a riscv64 runner ended in a
    traceback instead of the CLI's one-line error naming the architecture."""
    from buildtool.cli import main

    monkeypatch.setattr(platforms._host, "machine", lambda: "riscv64")
    with pytest.raises(SystemExit) as exited:
        main(["build", "--framework", "pytorch-cpu"])
    assert exited.value.code == 2
    assert "error: this machine's architecture 'riscv64' is none of linux/amd64, linux/arm64" in capfd.readouterr().err
