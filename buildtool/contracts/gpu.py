"""What GPU images and GPU runners agree on: the CUDA a cell needs, the driver that runs it,
how a runner declares that it must have GPUs, and the bus-bandwidth figure's shape.

Imported by the matrix (CUDA versions it accepts), the catalogue (minimum drivers), validate
(runner checks) and image-tests (minimum drivers, the figure's name). Which driver a cell admits, and by
which rule, is contracts.driver_rules; bus-bandwidth floors are contracts.busbw.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

from buildtool.common.errors import UserError

# A runner that must have usable GPUs: `buildtool validate --require-gpu`, or this variable set
# to 1/true/yes (the generated nightly workflow sets it on its GPU jobs).
REQUIRE_GPU_ENV = "DL_IMAGES_REQUIRE_GPU"

# Linux x86_64 driver of each CUDA toolkit's GA release (NVIDIA's CUDA Toolkit release notes,
# "CUDA Toolkit and Corresponding Driver Versions"). The driver must support the image's CUDA:
# NVIDIA_REQUIRE_CUDA makes the container toolkit refuse older ones.
CUDA_MIN_DRIVER: dict[str, str] = {
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}

CUDA_RE = re.compile(r"^(?P<major>[0-9]{2})\.(?P<minor>[0-9])\Z")

# Docker's message when the engine has no NVIDIA runtime (the NVIDIA Container Toolkit) for --gpus; Docker 29 asks
# CDI first and, finding no vendor's spec, says so (the third).
NO_RUNTIME_MARKERS = ("could not select device driver", "unknown or invalid runtime name: nvidia",
                      "failed to discover gpu vendor from cdi")   # matched lower-cased
TOOLKIT_FIX = ("install the NVIDIA Container Toolkit and register it with the engine "
               "(`nvidia-ctk runtime configure --runtime=docker`, then restart dockerd; for CDI, "
               "`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`)")
# nvidia-container-cli's refusal when NVIDIA_REQUIRE_CUDA is not met by the host driver.
DRIVER_TOO_OLD_MARKERS = ("unsatisfied condition: cuda", "please update your driver")

# The verdict figure of the all-reduce bus bandwidth; its floors and the nightly window are in contracts.busbw.
BUSBW_FIGURE = "allreduce_busbw"


def require_gpu_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """DL_IMAGES_REQUIRE_GPU; a value that is neither yes nor no is refused: a misspelt `ture` on a GPU runner
    would otherwise turn its no-GPU check off (fail closed)."""
    value = (environ if environ is not None else os.environ).get(REQUIRE_GPU_ENV, "").strip().lower()
    if value not in ("", "0", "false", "no", "off", "1", "true", "yes", "on"):
        raise UserError(f"{REQUIRE_GPU_ENV}={value[:40]!r} is neither yes (1, true, yes, on) nor no (0, false, no, "
                        "off, or unset)")
    return value in ("1", "true", "yes", "on")


def check_cuda(cuda: str) -> str:
    """`cuda` if it is a CUDA version this project knows a minimum driver for, else ValueError."""
    if not CUDA_RE.match(cuda):
        raise ValueError(f"{cuda!r} is not a CUDA version like 12.8 or 13.0")
    if cuda not in CUDA_MIN_DRIVER:
        raise ValueError(f"CUDA {cuda} has no known minimum driver; known: {', '.join(CUDA_MIN_DRIVER)} "
                         "(add it to buildtool/contracts/gpu.py from NVIDIA's CUDA release notes)")
    return cuda


def min_driver(cuda: str) -> str:
    return CUDA_MIN_DRIVER[check_cuda(cuda)]


def cuda_tag(cuda: str) -> str:
    """`13.0` -> `cu130`, `12.8` -> `cu128`: the local version PyPI/PyTorch CUDA wheels carry."""
    return "cu" + check_cuda(cuda).replace(".", "")


def busbw_peak(figures: Mapping[str, Any]) -> float | None:
    """The peak bus bandwidth of a verdict's figures (GB/s), or None (also for NaN, Infinity or a bool)."""
    figure = figures.get(BUSBW_FIGURE)
    peak = figure.get("peak_GBps") if isinstance(figure, Mapping) else None
    if isinstance(peak, int | float) and not isinstance(peak, bool) and math.isfinite(peak):
        return float(peak)
    return None
