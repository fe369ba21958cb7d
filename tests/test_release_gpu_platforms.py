"""Release of a GPU cell built for linux/amd64 and linux/arm64 (pytorch-cuda on x86 and Grace Hopper nodes,
issue 38): the index is refused until each platform's manifest has a passing verdict from a GPU runner of that
platform. The arm64 verdict that CPU runners can make here (under QEMU, GPU checks not run: incomplete) never
counts, nor does a native arm64 run without GPUs; both named by platform. In-memory registry, no engine."""

from __future__ import annotations

from collections.abc import Callable

from tests import signing
from tests.test_release_platforms import MULTI_GPU, Dev
from tests.test_verdict_gate import gpu_verdict, two

GH200 = "NVIDIA GH200 480GB"


def _gpu_evidence(dev: Dev, digest: str, platform: str, gpu: str, emulated: bool = False) -> None:
    body = gpu_verdict(two(gpu), busbw={"ranks": 2, "gpu_model": gpu, "peak_GBps": 300.0})
    dev.evidence(digest, platform, verdict=False)
    full = signing.verdict(MULTI_GPU, digest, tests=body["tests"], runner=body["runner"], figures=body["figures"],
                           gpu_tests=body["gpu_tests"], platform=platform, emulated=emulated)
    signing.attest(dev.client, dev.repo, digest, full)   # type: ignore[arg-type]


def _cpu_evidence(dev: Dev, digest: str, platform: str, emulated: bool) -> None:
    """What validate writes on a CPU runner for a GPU cell: CPU checks passed, GPU checks not run."""
    body = gpu_verdict([], usable=None, skip="no GPU on this runner", busbw_result="skipped")
    body["runner"] = {**body["runner"], "gpu_runner": False, "gpus": [], "driver": "", "cuda_driver": ""}
    dev.evidence(digest, platform, verdict=False)
    full = signing.verdict(MULTI_GPU, digest, "incomplete", tests=body["tests"], runner=body["runner"],
                           gpu_tests=body["gpu_tests"], platform=platform, emulated=emulated)
    signing.attest(dev.client, dev.repo, digest, full)   # type: ignore[arg-type]


def _release(arm_evidence: Callable[[Dev, str], None]) -> tuple[list[str], str]:
    """An index of an amd64 image that passed on its GPU runner and an arm64 image with `arm_evidence`:
    what release finds, and the arm64 image's digest."""
    dev = Dev(MULTI_GPU)
    amd, arm = dev.image("amd64"), dev.image("arm64")
    _gpu_evidence(dev, amd, "linux/amd64", "NVIDIA H100 80GB HBM3")
    arm_evidence(dev, arm)
    dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    return dev.gather().problems, arm


def test_both_platforms_passed_on_their_own_gpu_runners_is_ready() -> None:
    problems, _ = _release(lambda dev, arm: _gpu_evidence(dev, arm, "linux/arm64", GH200))
    assert problems == []


def test_the_arm64_verdict_made_under_qemu_on_a_cpu_runner_is_refused_naming_arm64() -> None:
    problems, _ = _release(lambda dev, arm: _cpu_evidence(dev, arm, "linux/arm64", emulated=True))
    arm64 = [p for p in problems if p.startswith("linux/arm64")]
    assert arm64, problems
    assert any("under emulation" in p and "native linux/arm64 GPU runner" in p for p in arm64), arm64
    assert not any(p.startswith("linux/amd64") for p in problems), problems


def test_a_native_arm64_run_without_gpus_is_refused_naming_arm64() -> None:
    problems, arm = _release(lambda dev, arm: _cpu_evidence(dev, arm, "linux/arm64", emulated=False))
    assert f"linux/arm64: verdict of {arm} is 'incomplete'" in problems, problems
    assert any(p.startswith("linux/arm64: the verdict's runner lists no GPU") for p in problems), problems
    assert not any("under emulation" in p for p in problems), problems
    assert not any(p.startswith("linux/amd64") for p in problems), problems
