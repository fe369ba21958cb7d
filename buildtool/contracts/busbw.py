"""All-reduce bus-bandwidth floors: one table keyed by GPU model and interconnect, and the window of
earlier nights a new figure is compared with.

The model is nvidia-smi's exact name, never a substring ("H200" must not match "NVIDIA GH200 480GB"); the
interconnect is NVLink only when `nvidia-smi topo -m` shows NV# between every pair of GPUs, since a ring is as
fast as its slowest link (an H100 NVL box with bridged pairs is PCIe). docs/gpu.md ("Bus bandwidth") has the rest.

Floors are conservative: FLOOR_FRACTION of the documented per-direction link bandwidth (half the
bidirectional figure NVIDIA's datasheets print). nccl-tests' busbw is comparable to that per-direction
hardware bandwidth (nccl-tests doc/PERFORMANCE.md); well-configured NVLink systems reach 70-90% of it,
so a figure below a quarter means NCCL is not using the link (wrong topology, P2P off, a fallback).
"""

from __future__ import annotations

import datetime as dt
import math
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
# Families of NCCL's networks (contracts.nccl_log.family_of reads them from `Using network NAME`; the same words).
IB = "IB"           # InfiniBand and RoCE through verbs: NCCL's `IB`, HPC-X's `IBext*`, `NCCL RDMA Plugin*`
EFA = "EFA"         # AWS EFA through aws-ofi-nccl: `Libfabric`, `AWS Libfabric`, `OFI` (on libfabric's efa provider)
SOCKET = "Socket"   # TCP: NCCL's fallback when verbs, a plugin or a device is missing
UNKNOWN = "unknown"

# A 2-node all-reduce's bus bandwidth is bounded by the NICs NCCL uses on each node: every NIC carries its own
# channels, so nccl-tests' busbw approaches NICs x per-NIC rate. Measured by NVIDIA on healthy fabrics: 24 GB/s per
# 200 Gb/s NIC and 12 GB/s per 100 Gb/s NIC, 96% of the line rate (sjeaugey, NVIDIA/nccl-tests#119: 4 x 200G,
# target 96 GB/s), 48-49 GB/s per ConnectX-7 NIC at NDR 400 Gb/s (AddyLaddy, NVIDIA/nccl-tests#267). The floor is
# FABRIC_FLOOR_FRACTION of NICs x rate: healthy fabrics reach about 0.96 of it, and the faults it must catch give
# at most a quarter (a fabric at a quarter of its rate, RoCE without lossless settings) or an eighth (one NIC used
# of eight). One GPU drives about one NIC's rate (nccl-tests#232: 1 H100 per node with 4 NICs, busbw 50 GB/s =
# one NIC), so the NICs counted are at most the node's GPUs.
FABRIC_FLOOR_FRACTION = 0.5


@dataclass(frozen=True)
class LinkRate:
    """A documented rate: per NIC (an InfiniBand generation's 4x port), or per instance (EFA: AWS states the
    instance's aggregate EFA bandwidth, shared by its GPUs)."""

    family: str
    name: str
    gbits: float
    per_instance: bool = False
    gpus: int = 0               # an instance's GPUs (its rate is shared by them)
    source: str = ""


_CX6 = "InfiniBand HDR, 200 Gb/s per 4x port (NVIDIA ConnectX-6 VPI datasheet; DGX A100: 8x HDR for compute)"
_CX7 = "InfiniBand NDR, 400 Gb/s per 4x port (NVIDIA ConnectX-7 datasheet; DGX H100/H200: 8x NDR for compute)"
_AWS = ("AWS's instance pages state the aggregate EFA bandwidth; not re-read from here (the search tool held no copy "
        "of AWS's tables): the figure as AWS has published it since the instance's launch; EFA devices per instance "
        "as aws-ofi-nccl's platform table and torchx's named resources count them")
# --fabric-rate NAME -> its documented rate.
LINK_RATES: dict[str, LinkRate] = {
    "HDR": LinkRate(IB, "HDR", 200, source=_CX6),
    "NDR": LinkRate(IB, "NDR", 400, source=_CX7),
    "p4d.24xlarge": LinkRate(EFA, "p4d.24xlarge", 400, per_instance=True, gpus=8,
                             source=f"400 Gb/s EFA per instance, 4 EFA devices of 100 Gb/s, 8 A100 ({_AWS})"),
    "p5.48xlarge": LinkRate(EFA, "p5.48xlarge", 3200, per_instance=True, gpus=8,
                            source=f"3200 Gb/s EFA per instance, 32 EFA devices of 100 Gb/s, 8 H100 ({_AWS})"),
    "p5en.48xlarge": LinkRate(EFA, "p5en.48xlarge", 3200, per_instance=True, gpus=8,
                              source=f"3200 Gb/s EFAv3 per instance, 16 EFA devices of 200 Gb/s, 8 H200 ({_AWS})"),
}
# The rate of a family when the job declares none (--fabric-rate): the slowest documented one (or the slowest port
# rate NCCL reported, where lower), so the floor can only be too low, never fail a healthy fabric; per NIC, with the
# NICs NCCL lists.
DEFAULT_RATES: dict[str, LinkRate] = {
    IB: LINK_RATES["HDR"],
    EFA: LinkRate(EFA, "100 Gb/s per EFA device", 100,
                  source="the slowest EFA device of LINK_RATES (p4d.24xlarge, p5.48xlarge: 100 Gb/s each)"),
}
# family -> why it has no floor (a tested reason, not a silence)
NO_FABRIC_FLOOR: dict[str, str] = {
    SOCKET: "TCP sockets are NCCL's fallback over whatever Ethernet the nodes have (10 to 400 Gb/s, no one "
            "figure to state); a job that asked for InfiniBand or EFA fails on sockets by the transport check instead",
    UNKNOWN: "NCCL named a network this check does not know, so no documented rate applies",
}


def link_rate(name: str) -> LinkRate:
    """The documented rate --fabric-rate NAME names; ValueError naming the known ones."""
    try:
        return LINK_RATES[name]
    except KeyError:
        raise ValueError(f"--fabric-rate {name!r} is not a documented rate; one of {', '.join(LINK_RATES)} "
                         "(buildtool/contracts/busbw.py)") from None


@dataclass(frozen=True)
class FabricFloor:
    """The cross-node floor of one family, or why none (`floor_GBps` None, `how` says why)."""

    family: str
    floor_GBps: float | None
    expected_GBps: float | None
    how: str
    source: str = ""


def cross_node_floor(family: str, rate_name: str, nics: int | None, nics_from: str, gpus: int,
                     ports_gbits: float | None = None) -> FabricFloor:
    """The cross-node all-reduce floor of FAMILY on nodes of GPUS GPUs: FABRIC_FLOOR_FRACTION of the documented
    rate (RATE_NAME when declared and of this family, else DEFAULT_RATES', else PORTS_GBITS, the slowest port rate
    NCCL reported, where lower) times the NICs (NICS, said to come from NICS_FROM; at most GPUS), or per instance
    its share of the instance's rate."""
    if family in NO_FABRIC_FLOOR:
        return FabricFloor(family, None, None, NO_FABRIC_FLOOR[family])
    if family not in DEFAULT_RATES:
        raise ValueError(f"fabric {family!r} is neither in DEFAULT_RATES nor in NO_FABRIC_FLOOR "
                         "(buildtool/contracts/busbw.py)")
    declared = link_rate(rate_name) if rate_name else None
    rate = declared if declared is not None and declared.family == family else DEFAULT_RATES[family]
    said = "" if rate is declared else " (no rate declared: the slowest documented; declare --fabric-rate)"
    if rate is not declared and not rate.per_instance and ports_gbits and ports_gbits < rate.gbits:
        # IB is every verbs NIC: RoCE at 100 GbE, EDR and HDR100 run below HDR, the slowest documented rate
        rate = LinkRate(family, "the slowest port NCCL reported", ports_gbits, source="NCCL's port rate (speed=)")
        said = " (no rate declared: the slowest port rate NCCL reported; declare --fabric-rate)"
    if rate.per_instance:
        share = min(gpus, rate.gpus)
        gbits = rate.gbits * share / rate.gpus
        how = (f"{rate.name} {rate.gbits:g} Gb/s per instance"
               + (f" x {share}/{rate.gpus} of its GPUs" if share < rate.gpus else ""))
    else:
        if not nics:
            return FabricFloor(family, None, None, f"no floor: the number of {family} NICs is unknown (NCCL listed "
                                                   "none and the job named none)", rate.source)
        counted = min(nics, gpus) if gpus else nics
        gbits = rate.gbits * counted
        capped = f", at most one per GPU of {gpus}" if counted < nics else ""
        how = f"{counted} NIC(s) x {rate.name} {rate.gbits:g} Gb/s ({nics} NIC(s): {nics_from}{capped}){said}"
    expected = gbits / 8
    return FabricFloor(family, round(FABRIC_FLOOR_FRACTION * expected, 2), expected,
                       f"{FABRIC_FLOOR_FRACTION:g} x {how}", rate.source)


def model_of(gpu_name: str) -> str | None:
    return GPU_MODELS.get(gpu_name.strip())


def read_topology(topo: str) -> tuple[str, str]:
    """(NVLINK or PCIE, what was seen: the pairs joined only through PCIe, with their link) from
    `nvidia-smi topo -m`; ValueError naming what could not be read."""
    lines = [_ANSI_RE.sub("", line) for line in topo.splitlines()]
    header = next((line.split("\t") for line in lines if "\tGPU0" in line and not line.startswith("GPU")), None)
    if header is None:
        raise ValueError("no GPU0 column header in the `nvidia-smi topo -m` output")
    columns = [i for i, name in enumerate(header) if _GPU_RE.match(name.strip())]
    pcie: dict[tuple[str, ...], str] = {}
    names = []
    for line in lines:
        cells = line.split("\t")
        if not _GPU_RE.match(cells[0].strip()):
            continue
        names.append(cells[0].strip())
        for i in columns:
            link = cells[i].strip() if i < len(cells) else ""
            if names[-1] == header[i].strip() and link != "X":   # a GPU's cell for itself is always X
                raise ValueError(f"{names[-1]}'s link to itself is {link!r}, not X, in `nvidia-smi topo -m`")
            if link in _PCIE_LINKS:   # the first link seen between the pair (both rows list it)
                pcie.setdefault(tuple(sorted((cells[0].strip(), header[i].strip()))), link)
            elif (link != "X" or names[-1] != header[i].strip()) and not _NVLINK_RE.match(link):   # X: itself
                raise ValueError(f"unknown link {link!r} between {cells[0].strip()} and {header[i].strip()} in "
                                 "`nvidia-smi topo -m`")
    rows = len(names)
    if rows != len(columns) or rows < 2:
        raise ValueError(f"`nvidia-smi topo -m` lists {rows} GPU rows for {len(columns)} GPU columns; "
                         "an interconnect needs two or more GPUs")
    if sorted(names) != sorted(header[i].strip() for i in columns):
        raise ValueError(f"`nvidia-smi topo -m` lists the GPU rows {', '.join(names)} for the GPU columns "
                         f"{', '.join(header[i].strip() for i in columns)}")
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


def runner_floor(names: list[str], link: str, link_problem: str = "", seen: str = "") -> Floor:
    """floor_for the runner's GPUs (nvidia-smi's name of each); GPUs of several models have none: the floors are
    per model, and the first GPU's would judge (or fault) a ring of others."""
    models = sorted({name.strip() for name in names})
    if len(models) > 1:
        return Floor(", ".join(models), None, link, None, note=f"no floor for these GPUs: they are of {len(models)} "
                     f"models ({', '.join(m[:60] for m in models[:4])}); floors are per model "
                     "(buildtool/contracts/busbw.py)")
    return floor_for(names[0] if names else "", link, link_problem, seen, gpus=len(names))


# -- the window of earlier nights ----------------------------------------------------------------

def window_baseline(history: list[tuple[dt.datetime, float, str]], window: int = DEFAULT_WINDOW) -> dict[str, Any]:
    """The median peak of the last `window` nights of `history` ((started, peak, source) of earlier
    verdicts; one per night, the newest of that day). {} when there is none. With fewer nights than
    the window it uses what exists and says how many (`nights`). `started` is the verdict's time as its reader
    parsed it (contracts.verdict.when, as release and the report parse it: never the text, where 00:30+02:00
    sorts after 23:00+00:00 of the day before though it is earlier); a night is a UTC day."""
    if window < 1:
        raise ValueError(f"the bus-bandwidth window must be 1 night or more, not {window}")
    nightly: dict[dt.date, tuple[dt.datetime, float, str]] = {}   # night -> its newest verdict, the newest first
    for entry in sorted(history, key=lambda entry: entry[0], reverse=True):
        nightly.setdefault(entry[0].astimezone(dt.UTC).date(), entry)
    chosen = list(nightly.values())[:window]
    if not chosen:
        return {}
    return {"median_GBps": float(statistics.median(peak for _, peak, _ in chosen)), "nights": len(chosen),
            "window": window, "peaks": [peak for _, peak, _ in chosen], "sources": [src for _, _, src in chosen]}


def problems(peak: float, floor: float | None, floor_model: str, baseline: Mapping[str, Any],
             fault: str = "") -> list[str]:
    """Why a measured peak fails: a fault of the runner's links (Floor.fault), under the floor, or fallen more
    than MAX_FALL below the window's median."""
    found = [fault] if fault else []
    if not math.isfinite(peak):   # JSON reads NaN (below no floor) and Infinity (above every one): no measurement
        return [*found, f"peak {peak} GB/s is no measurement (not a finite number of GB/s)"]
    if floor is not None and peak < floor:
        found.append(f"peak {peak:.1f} GB/s is below the floor {floor:g} GB/s for {floor_model}")
    median = baseline.get("median_GBps")
    if isinstance(median, int | float) and median > 0 and peak < (1 - MAX_FALL) * median:
        nights = int(baseline.get("nights") or 0)
        window = int(baseline.get("window") or nights)
        short = f" (fewer than the window of {window})" if nights < window else ""
        left_out = list(baseline.get("left_out") or [])
        unplaced = (f"; {len(left_out)} earlier verdict{'s' if len(left_out) != 1 else ''} left out: {left_out[0]}"
                    + (f" and {len(left_out) - 1} more" if len(left_out) > 1 else "")) if left_out else ""
        found.append(f"peak {peak:.1f} GB/s fell {1 - peak / median:.0%} below {median:.1f} GB/s, the median of the "
                     f"last {nights} night{'s' if nights != 1 else ''}{short}{unplaced}")
    return found
