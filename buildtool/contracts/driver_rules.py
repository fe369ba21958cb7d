"""Which host NVIDIA driver may run a GPU cell, and which published rule says so.

Two rules, applied in order:
1. native: the driver supports the image's CUDA itself (nvidia-smi's "CUDA Version", else the
   driver number against CUDA_MIN_DRIVER, NVIDIA's CUDA Toolkit release notes);
2. NGC forward compatibility: NGC's release notes admit some older data-center driver branches,
   through the CUDA forward-compatibility package NGC images ship in /usr/local/cuda/compat.
   Only NGC cells (pip cells like pytorch-cuda carry no compat package and no such promise), only
   data-center GPUs (NVIDIA's CUDA Compatibility guide, "Forward Compatibility": data-center GPUs,
   select NGC Server Ready RTX SKUs, Jetson; we cannot tell those RTX SKUs by name, so RTX and
   GeForce are refused), and only the branches and minimums NGC names for that release.

Every decision carries the sentence that names its rule; validate logs it and the verdict keeps it,
and the catalogue (docs/images.md) prints `forward_compat_summary`, so docs and code say the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from buildtool.contracts.gpu import check_cuda, min_driver

COMPAT_DIR = "/usr/local/cuda/compat"


@dataclass(frozen=True)
class ForwardCompat:
    """NGC's forward-compatibility promise of one NGC release: branch -> first admitted driver."""

    cuda: str
    branches: tuple[tuple[int, str], ...]
    source: str
    unverified: str = ""    # why these minimums are not confirmed by a page NVIDIA publishes ('' when they are)


_NGC_12_8 = (
    # "Release 25.01 is based on CUDA 12.8.0.038 ... if you are running on a data center GPU (for example,
    # T4 or any other data center GPU), you can use NVIDIA driver release 470.57 (or later R470), 525.85
    # (or later R525), 535.86 (or later R535), or 545.23 (or later R545)." Verified in NVIDIA's Triton
    # Inference Server 25.01 release notes (same 25.01 CUDA 12.8.0.038 release train); the PyTorch 25.01
    # and TensorFlow 25.01/25.02 pages themselves were not readable from here (assumed identical).
    (470, "470.57"), (525, "525.85"), (535, "535.86"), (545, "545.23"),
)
_NGC_13_0 = (
    # CUDA 13.0 releases (25.08 and later): "requires NVIDIA Driver release 580 or later. However, if you are
    # running on a data center GPU ... 535.261 (or later R535), 550.163 (or later R550), 570.172 (or later
    # R570)". NOT VERIFIED from here: these figures come from the issue's quotation of the NGC release notes;
    # the one NGC 25.10 page found (SGLang 25.10) still prints the 12.8-era list, evidently copied. These
    # minimums are the higher (stricter) of the two, so they can only refuse more, never admit more.
    (535, "535.261"), (550, "550.163"), (570, "570.172"),
)
# Searched again for issue 49 (docs/gpu.md, "Unverified"): NVIDIA's Forward Compatibility guide
# (docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html) names the package (cuda-compat-13-0) but no
# minimum per branch; the PyTorch/TensorFlow/JAX 25.10 release notes are not held; SGLang 25.10's
# (docs.nvidia.com/deeplearning/frameworks/sglang-release-notes/rel-25-10.html) lists 470.57, 525.85, 535.86 and 550.54,
# a list that also says "not forward-compatible with CUDA 12.8", so copied from the 12.8 era; NVIDIA's data-center
# driver matrix (docs.nvidia.com/datacenter/tesla/drivers/supported-drivers-and-cuda-toolkit-versions.html) lists R550
# as end of life. So no published figure confirms these minimums, and every decision by this rule says so.
_NGC_13_0_UNVERIFIED = ("NGC 25.10's forward-compatibility minimums (R535 >= 535.261, R550 >= 550.163, R570 >= "
                        "570.172) are unverified: no NVIDIA page read here states them (NVIDIA's Forward "
                        "Compatibility guide names none for CUDA 13; SGLang 25.10's notes print the CUDA 12.8-era "
                        "list); confirm them in that release's Driver Requirements before relying on them")

# NGC release (YY.MM of nvcr.io/nvidia/<framework>:YY.MM-...) -> its published rule. A matrix cell on an
# NGC release missing here is refused at load (matrix.schema), so nothing falls back to a guess.
NGC_FORWARD_COMPAT: dict[str, ForwardCompat] = {
    "25.01": ForwardCompat("12.8", _NGC_12_8, "NGC 25.01 release notes, Driver Requirements"),
    "25.02": ForwardCompat("12.8", _NGC_12_8, "NGC 25.02 release notes, Driver Requirements"),
    "25.10": ForwardCompat("13.0", _NGC_13_0, "NGC 25.10 release notes, Driver Requirements (as quoted; unverified)",
                           unverified=_NGC_13_0_UNVERIFIED),
}

# Data-center GPU families by the model word nvidia-smi prints after "NVIDIA "/"Tesla "
# ("NVIDIA A100-SXM4-80GB" -> A100, "Tesla T4" -> T4). GeForce, RTX and Quadro names never match.
DATACENTER_MODELS = frozenset({
    "T4", "V100", "A2", "A10", "A16", "A30", "A40", "A100", "A800", "L4", "L20", "L40", "L40S",
    "H20", "H100", "H800", "H200", "GH200", "B100", "B200", "GB200", "B300", "GB300",
})
_MODEL_WORD = re.compile(r"^(?:NVIDIA|Tesla) (?P<word>[A-Z]+[0-9]+[A-Z]*)(?:[- ]|$)")


# The driver floor of each CUDA release on NVIDIA's arm64 server drivers (SBSA: Grace Hopper GH200, Grace
# Blackwell GB200; not Jetson/Tegra, whose drivers come with L4T): the driver NVIDIA bundles with that CUDA
# release's Linux SBSA installer, as contracts.gpu.CUDA_MIN_DRIVER is the x86_64 one's. A CUDA release missing
# here is refused on arm64 by name (never the x86_64 figure assumed).
SBSA_MIN_DRIVER: dict[str, tuple[str, str]] = {
    "13.0": ("580.65.06", "NVIDIA's CUDA 13.0.0 installer for Linux SBSA bundles driver 580.65.06 "
                          "(developer.download.nvidia.com/compute/cuda/13.0.0/local_installers/"
                          "cuda_13.0.0_580.65.06_linux_sbsa.run), the same as for x86_64 "
                          "(cuda_13.0.0_580.65.06_linux.run; CUDA 13.0 release notes: >= 580.65.06)"),
}
ARCHITECTURES = ("amd64", "arm64")   # contracts.platforms' architectures with a driver table


def min_driver_on(cuda: str, architecture: str) -> tuple[str, str]:
    """(first driver that runs CUDA `cuda` natively on `architecture`, where NVIDIA says so); ValueError naming
    an architecture or a CUDA release with no documented floor."""
    if architecture == "amd64":
        return min_driver(cuda), "NVIDIA CUDA Toolkit release notes (Linux x86_64 driver versions)"
    if architecture == "arm64":
        try:
            return SBSA_MIN_DRIVER[check_cuda(cuda)]
        except KeyError:
            raise ValueError(f"CUDA {cuda} has no documented arm64 (SBSA) driver floor in "
                             f"buildtool/contracts/driver_rules.py (known: {', '.join(SBSA_MIN_DRIVER)}); add it "
                             "from NVIDIA's Linux SBSA installer of that release") from None
    raise ValueError(f"no driver floors for architecture {architecture!r} (known: {', '.join(ARCHITECTURES)})")


@dataclass(frozen=True)
class DriverDecision:
    admitted: bool
    rule: str            # the sentence that names the rule which admitted or refused the driver


def ngc_rule(release: str) -> ForwardCompat:
    """The forward-compatibility rule of an NGC release; ValueError naming the release if unknown."""
    try:
        return NGC_FORWARD_COMPAT[release]
    except KeyError:
        raise ValueError(f"NGC release {release} has no forward-compatibility rule in "
                         f"buildtool/contracts/driver_rules.py (known: {', '.join(NGC_FORWARD_COMPAT)}); "
                         "add it from that release's 'Driver Requirements' section") from None


def is_datacenter(gpu_name: str) -> bool:
    match = _MODEL_WORD.match(gpu_name.strip())
    return match is not None and match.group("word") in DATACENTER_MODELS


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"[0-9]+", version))


def _branches(rule: ForwardCompat) -> str:
    return ", ".join(f"R{branch} >= {first}" for branch, first in rule.branches)


def forward_compat_summary(release: str) -> str:
    """What the catalogue and the refusals say about an NGC release's forward compatibility."""
    rule = ngc_rule(release)
    return (f"on data-center GPUs (not GeForce/RTX) NGC {release} also admits {_branches(rule)} through "
            f"CUDA forward compatibility (the compat package the image ships in {COMPAT_DIR})"
            + (" (minimums unverified: no NVIDIA page read here states them)" if rule.unverified else ""))


def decide(cuda: str, driver: str, cuda_driver: str, gpu_names: list[str], ngc: str | None,
           architecture: str) -> DriverDecision:
    """Whether this host's driver may run an image of `cuda` (`ngc`: the cell's NGC release, None for
    pip cells) on a host of `architecture` (the GPU runner's own: GPU checks never run emulated), and the
    rule that decided. An unknown driver version, or an architecture or CUDA with no documented floor, is
    refused, never assumed new."""
    try:
        need, _ = min_driver_on(cuda, architecture)
    except ValueError as exc:
        return DriverDecision(False, f"refused: {exc}")
    have = f"driver {driver or '?'}" + (f" (CUDA {cuda_driver})" if cuda_driver else "")
    fix = f"install NVIDIA driver {need} or newer"
    if not driver and not cuda_driver:
        return DriverDecision(False, f"refused: nvidia-smi reported no driver version, so CUDA {cuda} cannot be "
                                     f"checked; {fix}")
    said = (("driver version", driver), ("CUDA version", cuda_driver))
    unreadable = [f"{name} {value[:40]!r}" for name, value in said if value and not _numbers(value)]
    if unreadable:   # a broken driver's `N/A`: never compared as if it were a version
        return DriverDecision(False, f"refused: nvidia-smi reported the {' and the '.join(unreadable)}, not a version, "
                                     f"so CUDA {cuda} cannot be checked; {fix}")
    native = (_numbers(cuda_driver)[:2] >= _numbers(cuda)[:2]) if cuda_driver else _numbers(driver) >= _numbers(need)
    if native:
        on = " on arm64 (SBSA)" if architecture == "arm64" else ""
        return DriverDecision(True, f"{have} admitted: it supports CUDA {cuda} natively (CUDA {cuda} needs "
                                    f"driver {need} or newer{on})")
    too_old = f"refused: {have} is too old for CUDA {cuda}"
    if ngc is None:
        return DriverDecision(False, f"{too_old}, and forward compatibility does not apply to this image (only "
                                     f"NGC images ship and support the CUDA compat package); {fix}")
    rule = ngc_rule(ngc)
    if not driver:
        return DriverDecision(False, f"{too_old}; nvidia-smi gave no driver version to match against NGC {ngc}'s "
                                     f"forward-compatibility rule; {fix}")
    others = [name for name in gpu_names if not is_datacenter(name)]
    if others or not gpu_names:
        named = ", ".join(sorted(set(others))) or "no GPU listed"
        return DriverDecision(False, f"{too_old}; NGC {ngc}'s forward-compatibility rule applies to data-center "
                                     f"GPUs only, and {named} is not one; {fix}")
    branch = _numbers(driver)[0]
    first = dict(rule.branches).get(branch)
    caveat = f" ({rule.unverified})" if rule.unverified else ""
    if first is None:
        return DriverDecision(False, f"{too_old}; R{branch} is not a forward-compatible branch for CUDA "
                                     f"{rule.cuda} (NGC {ngc} names {_branches(rule)}); {fix}{caveat}")
    if _numbers(driver) < _numbers(first):
        return DriverDecision(False, f"{too_old}; NGC {ngc}'s forward-compatibility rule needs R{branch} "
                                     f">= {first}; update the R{branch} driver or {fix}{caveat}")
    return DriverDecision(True, f"driver {driver} admitted by NGC {ngc}'s forward-compatibility rule for "
                                f"data-center GPUs (R{branch} >= {first}; CUDA compat package in {COMPAT_DIR})"
                                f"{caveat}")
