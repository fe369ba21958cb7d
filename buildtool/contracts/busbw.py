"""All-reduce bus-bandwidth floors: one table keyed by GPU model and interconnect, and the window of
earlier nights a new figure is compared with.

The model comes from nvidia-smi's exact name (`--query-gpu=name`, `-L`), never a substring: "H200"
must not match "NVIDIA GH200 480GB" or "NVIDIA H200 NVL". The interconnect comes from
`nvidia-smi topo -m`: NV# between every pair of GPUs is NVLink; any pair joined only through PCIe
(PIX, PXB, PHB, NODE, SYS) makes the all-reduce a PCIe one, since a ring is as fast as its slowest
link (an 8-GPU H100 NVL box with bridged pairs is PCIe here). A model or interconnect missing from
the table gets no floor, and says so ("no floor for this model ..."), in the verdict and the report.

Floors are conservative: FLOOR_FRACTION of the documented per-direction link bandwidth (half the
bidirectional figure NVIDIA's datasheets print). nccl-tests' busbw is comparable to that per-direction
hardware bandwidth (nccl-tests doc/PERFORMANCE.md); well-configured NVLink systems reach 70-90% of it,
so a figure below a quarter means NCCL is not using the link (wrong topology, P2P off, a fallback).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NVLINK = "NVLink"
PCIE = "PCIe"
FLOOR_FRACTION = 0.25

# A fall of the peak by more than this below the median of the window fails the check.
MAX_FALL = 0.20
# How many earlier nights (one verdict per night, the newest) the median is taken over.
DEFAULT_WINDOW = 7

# nvidia-smi's exact GPU names -> the model the table knows.
GPU_MODELS: dict[str, str] = {
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H200": "H200 SXM",
    "NVIDIA H200 NVL": "H200 NVL",
    "NVIDIA GH200 480GB": "GH200",
    "NVIDIA B200": "B200",
    "NVIDIA L40S": "L40S",
    "NVIDIA A100-SXM4-80GB": "A100 SXM4",
    "NVIDIA A100-SXM4-40GB": "A100 SXM4",
    "NVIDIA A100 80GB PCIe": "A100 PCIe",
    "NVIDIA A100-PCIE-40GB": "A100 PCIe",
}

_H100 = ("NVIDIA H100 Tensor Core GPU datasheet (SXM: NVLink 900 GB/s; NVL/PCIe: NVLink bridge 600 GB/s; "
         "PCIe Gen5 128 GB/s)")
_H200 = ("NVIDIA H200 Tensor Core GPU datasheet (SXM: NVLink 900 GB/s; NVL: 2-/4-way NVLink bridge 900 GB/s; "
         "PCIe Gen5 128 GB/s)")
_B200 = "NVIDIA HGX B200 / DGX B200 datasheet (fifth-generation NVLink 1.8 TB/s per GPU)"
_L40S = "NVIDIA L40S datasheet (PCIe Gen4 x16 64 GB/s bidirectional; NVLink not supported)"
_A100 = ("NVIDIA A100 Tensor Core GPU datasheet (SXM4: NVLink 600 GB/s; PCIe: NVLink bridge for 2 GPUs 600 GB/s; "
         "PCIe Gen4 64 GB/s)")

_GH200 = ("NVIDIA GH200 Grace Hopper Superchip datasheet (NVLink 900 GB/s between GPUs of GH200 NVL2 and "
          "NVLink-Switch systems; NVLink-C2C 900 GB/s is GPU-CPU)")

# (model, interconnect) -> (documented bidirectional GB/s per GPU, source). A one-GH200 node has no link
# between GPUs (NVLink-C2C joins GPU and CPU): its bus bandwidth is measured across two nodes (the fabric).
LINKS: dict[tuple[str, str], tuple[float, str]] = {
    ("H100 SXM", NVLINK): (900, _H100),
    ("H100 NVL", NVLINK): (600, _H100),
    ("H100 NVL", PCIE): (128, _H100),
    ("H100 PCIe", NVLINK): (600, _H100),
    ("H100 PCIe", PCIE): (128, _H100),
    ("H200 SXM", NVLINK): (900, _H200),
    ("H200 NVL", NVLINK): (900, _H200),
    ("H200 NVL", PCIE): (128, _H200),
    ("B200", NVLINK): (1800, _B200),
    ("GH200", NVLINK): (900, _GH200),
    ("L40S", PCIE): (64, _L40S),
    ("A100 SXM4", NVLINK): (600, _A100),
    ("A100 PCIe", NVLINK): (600, _A100),
    ("A100 PCIe", PCIE): (64, _A100),
}

# (model, interconnect) that must not pass at all: what `nvidia-smi topo -m` shows is a broken machine, not a
# slower one. An SXM board (HGX/DGX baseboard) joins every GPU to every other through NVLink/NVSwitch; PIX,
# NODE or SYS between two of them means NVLink is down (a failed link, Fabric Manager not running), and
# its all-reduce runs at PCIe speed under no floor. L40S has no NVLink at all.
FAULTS: dict[tuple[str, str], str] = {
    **{(model, PCIE): f"{model} GPUs sit on an SXM baseboard where NVLink joins every pair; a PCIe path between "
                      "them means NVLink is down (a failed link, or NVIDIA Fabric Manager not running)"
       for model in ("H100 SXM", "H200 SXM", "B200", "A100 SXM4")},
    ("GH200", PCIE): "GH200 nodes with several GPUs (GH200 NVL2, NVLink-Switch systems) join them by NVLink; a "
                     "PCIe path between them means NVLink is down",
    ("L40S", NVLINK): "L40S supports no NVLink (its datasheet), so an NVLink reading is a misread topology",
}

_PCIE_LINKS = frozenset({"PIX", "PXB", "PHB", "NODE", "SYS"})
_NVLINK_RE = re.compile(r"^NV[0-9]+$")
_GPU_RE = re.compile(r"^GPU[0-9]+$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")   # nvidia-smi underlines the header row


# -- across nodes: the fabric NCCL's network runs on ------------------------------------------------
# NCCL names the network it chose in an INFO line, `NCCL INFO Using network IB` (InfiniBand and RoCE, through
# libibverbs) or `... Using network Socket` (TCP: its fallback when libibverbs or a device is missing).
IB = "IB"
SOCKET = "Socket"
# The cross-node all-reduce's bus bandwidth is bounded by the nodes' network ports, not NVLink: a 2-node ring
# crosses the fabric twice per step, so nccl-tests' busbw approaches the per-direction rate of the ports
# NCCL uses. The floor is FLOOR_FRACTION of ONE port's per-direction rate (a node with 8 ports stays far above).
# fabric -> (documented Gb/s per port, source)
FABRICS: dict[str, tuple[float, str]] = {
    IB: (200, "InfiniBand HDR, 200 Gb/s per port (NVIDIA ConnectX-6 VPI datasheet): the slowest IB rate of "
              "NVIDIA's reference GPU systems (DGX A100: HDR 200 Gb/s; DGX H100/H200: NDR 400 Gb/s)"),
}
# fabric -> why it has no floor (a tested reason, not a silence)
NO_FABRIC_FLOOR: dict[str, str] = {
    SOCKET: "TCP sockets are NCCL's fallback over whatever Ethernet the nodes have (10 to 400 Gb/s, no one "
            "figure to state); a job that asked for InfiniBand (--nccl-ib-hca, --rdma-resource) fails on "
            "sockets by the transport check instead",
}


def fabric_floor(fabric: str) -> tuple[float | None, str]:
    """(floor GB/s, source) of a cross-node fabric, or (None, why not); ValueError for a fabric not declared."""
    if fabric in FABRICS:
        gbits, source = FABRICS[fabric]
        return round(FLOOR_FRACTION * gbits / 8, 2), source
    if fabric in NO_FABRIC_FLOOR:
        return None, NO_FABRIC_FLOOR[fabric]
    raise ValueError(f"fabric {fabric!r} is neither in FABRICS nor in NO_FABRIC_FLOOR (buildtool/contracts/busbw.py)")


def model_of(gpu_name: str) -> str | None:
    return GPU_MODELS.get(gpu_name.strip())


def interconnect(topo: str) -> str:
    """NVLINK or PCIE from `nvidia-smi topo -m` (`--matrix`); ValueError naming what could not be read."""
    return read_topology(topo)[0]


def read_topology(topo: str) -> tuple[str, str]:
    """(NVLINK or PCIE, what was seen: the pairs joined only through PCIe, with their link) from
    `nvidia-smi topo -m`; ValueError naming what could not be read."""
    lines = [_ANSI_RE.sub("", line) for line in topo.splitlines()]
    header = next((line.split("\t") for line in lines if "\tGPU0" in line and not line.startswith("GPU")), None)
    if header is None:
        raise ValueError("no GPU0 column header in the `nvidia-smi topo -m` output")
    columns = [i for i, name in enumerate(header) if _GPU_RE.match(name.strip())]
    links: list[str] = []
    pcie: dict[tuple[str, ...], str] = {}
    rows = 0
    for line in lines:
        cells = line.split("\t")
        if not _GPU_RE.match(cells[0].strip()):
            continue
        rows += 1
        for i in columns:
            link = cells[i].strip() if i < len(cells) else ""
            if link == "X":
                continue
            if not (_NVLINK_RE.match(link) or link in _PCIE_LINKS):
                raise ValueError(f"unknown link {link!r} between {cells[0].strip()} and {header[i].strip()} in "
                                 "`nvidia-smi topo -m`")
            links.append(link)
            pair = tuple(sorted((cells[0].strip(), header[i].strip())))
            if not _NVLINK_RE.match(link) and pair not in pcie:
                pcie[pair] = link
    if rows != len(columns) or rows < 2:
        raise ValueError(f"`nvidia-smi topo -m` lists {rows} GPU rows for {len(columns)} GPU columns; "
                         "an interconnect needs two or more GPUs")
    if not pcie:
        return NVLINK, f"NVLink between all {rows * (rows - 1) // 2} pairs of {rows} GPUs"
    shown = ", ".join(f"{a}-{b} {link}" for (a, b), link in list(pcie.items())[:6])
    more = f" and {len(pcie) - 6} more" if len(pcie) > 6 else ""
    return PCIE, (f"{len(pcie)} of {rows * (rows - 1) // 2} GPU pairs joined only through PCIe "
                  f"(nvidia-smi topo -m: {shown}{more})")


@dataclass(frozen=True)
class Floor:
    """The floor for a runner's GPUs, or why there is none (`note`)."""

    gpu_name: str
    model: str | None
    interconnect: str           # NVLINK, PCIE or "" (unknown)
    floor_GBps: float | None
    expected_GBps: float | None = None   # the documented per-direction bandwidth the floor is a fraction of
    source: str = ""
    note: str = ""
    fault: str = ""             # why the bus-bandwidth check must fail whatever it measures ("" none)

    def as_target(self) -> dict[str, Any]:
        return {"busbw_floor_GBps": self.floor_GBps, "busbw_floor_model": self.model or "",
                "busbw_interconnect": self.interconnect, "busbw_floor_note": self.note,
                "busbw_floor_source": self.source, "busbw_floor_fault": self.fault}


def floor_for(gpu_name: str, link: str, link_problem: str = "", seen: str = "", gpus: int = 2) -> Floor:
    """The floor for `gpus` GPUs named `gpu_name` joined by `link` (SEEN: what topo -m showed), or why none;
    a broken NVLink (FAULTS) or an unreadable topology on a model with floors is a `fault`, never a pass."""
    model = model_of(gpu_name)
    if model is None:
        return Floor(gpu_name, None, link, None, note=f"no floor for this model: nvidia-smi name {gpu_name!r} is "
                                                      "not in the floor table (buildtool/contracts/busbw.py)")
    if gpus < 2:
        return Floor(gpu_name, model, "", None, note=f"no floor on one GPU: one {model} has no link to another GPU; "
                                                     "its bus bandwidth is measured across two nodes")
    if not link:
        why = link_problem or "nvidia-smi topo -m not read"
        floors = sorted(k for m, k in LINKS if m == model)
        fault = (f"the interconnect of {gpus}x {model} could not be read ({why}); {model} has floors for "
                 f"{' and '.join(floors)}, so the check fails rather than pass without one") if floors else ""
        return Floor(gpu_name, model, "", None, fault=fault,
                     note=f"no floor for this model: the interconnect of {model} here is unknown ({why})")
    broken = FAULTS.get((model, link))
    if broken is not None:
        return Floor(gpu_name, model, link, None, fault=f"{gpus}x {model} read as {link}: {seen or 'no detail'}; "
                                                         f"{broken}",
                     note=f"no floor: {model} over {link} is a fault, not a configuration")
    found = LINKS.get((model, link))
    if found is None:
        return Floor(gpu_name, model, link, None, note=f"no floor for this model: {model} over {link} has no "
                                                       "documented figure in buildtool/contracts/busbw.py")
    bidirectional, source = found
    expected = bidirectional / 2
    return Floor(gpu_name, model, link, round(FLOOR_FRACTION * expected, 1), expected_GBps=expected, source=source,
                 note=f"floor {FLOOR_FRACTION:.0%} of {expected:g} GB/s per direction ({model}, {link})")


# -- the window of earlier nights ----------------------------------------------------------------

def window_baseline(history: list[tuple[str, float, str]], window: int = DEFAULT_WINDOW) -> dict[str, Any]:
    """The median peak of the last `window` nights of `history` ((started, peak, source) of earlier
    verdicts; one per night, the newest of that day). {} when there is none. With fewer nights than
    the window it uses what exists and says how many (`nights`)."""
    if window < 1:
        raise ValueError(f"the bus-bandwidth window must be 1 night or more, not {window}")
    nightly: dict[str, tuple[str, float, str]] = {}
    for started, peak, source in history:
        night = started[:10]
        if night not in nightly or started > nightly[night][0]:
            nightly[night] = (started, peak, source)
    chosen = [nightly[night] for night in sorted(nightly, reverse=True)[:window]]
    if not chosen:
        return {}
    return {"median_GBps": float(statistics.median(peak for _, peak, _ in chosen)), "nights": len(chosen),
            "window": window, "peaks": [peak for _, peak, _ in chosen], "sources": [src for _, _, src in chosen]}


def baseline_text(baseline: Mapping[str, Any]) -> str:
    nights = int(baseline.get("nights") or 0)
    window = int(baseline.get("window") or nights)
    short = f" (fewer than the window of {window})" if nights < window else ""
    return f"the median of the last {nights} night{'s' if nights != 1 else ''}{short}"


def problems(peak: float, floor: float | None, floor_model: str, baseline: Mapping[str, Any],
             fault: str = "") -> list[str]:
    """Why a measured peak fails: a fault of the runner's links (Floor.fault), under the floor, or fallen more
    than MAX_FALL below the window's median."""
    found = [fault] if fault else []
    if floor is not None and peak < floor:
        found.append(f"peak {peak:.1f} GB/s is below the floor {floor:g} GB/s for {floor_model}")
    median = baseline.get("median_GBps")
    if isinstance(median, int | float) and median > 0 and peak < (1 - MAX_FALL) * median:
        found.append(f"peak {peak:.1f} GB/s fell {1 - peak / median:.0%} below {median:.1f} GB/s, "
                     f"{baseline_text(baseline)}")
    return found
