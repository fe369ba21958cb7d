"""NCCL's debug log, read as NCCL writes it: per process, the network NCCL chose and its family, the
devices it lists and uses, and whether GPUDirect RDMA is on in each of its NET channels.

Standard library only: the multi-node verifier (buildtool/launch/verify_ddp.py) runs it in the job's
containers, shipped beside itself, and the image tests import it from here.

The formats, from NCCL's own source (NVIDIA/nccl, v2.18 to v2.30; tests/fixtures/nccl/README.md cites each):
- src/debug.cc: an INFO line is `HOST:PID:TID [CUDADEV] NCCL INFO TEXT` (HOST cut at its first dot; a
  `[date time] ` before it only when NCCL_DEBUG_TIMESTAMP_LEVELS names INFO), a WARN line
  `HOST:PID:TID [CUDADEV] FILE:LINE (FUNC) NCCL WARN TEXT`. NCCL writes them with vfprintf to stdout, never
  flushed, or to NCCL_DEBUG_FILE (`%h` host, `%p` pid), line-buffered: one process per file.
- src/init.cc: `Using network NAME`, NAME being the net plugin's: `IB` and `Socket` (NCCL's own), `IBext`,
  `IBext_v8` ... (NVIDIA's HPC-X plugin, nccl-rdma-sharp-plugins), names starting `NCCL RDMA Plugin`,
  `Libfabric`, `AWS Libfabric` or `OFI` (aws-ofi-nccl, src/nccl_ofi_interface_nvidia.cpp).
  `... comm 0x... rank R nranks N cudaDev D ... - Init COMPLETE` names the process's rank.
- src/transport/net.cc: `Channel CC/C : R[X] -> R[X] [send|receive] via NET/NAME/DEV[(PROXY)][/GDRDMA][(PCI)][/Shared]`:
  DEV indexes the plugin's device list; /GDRDMA is GPUDirect RDMA on that connection.
- src/transport/net_ib: `NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ... [RO]; OOB IF:ADDR<0>` (the HPC-X
  plugin prints the same line, `.../IB/SHARP`); from v2.30 (commit 7ec092af) a device NCCL_IB_HCA gives a rail
  or plane (`mlx5_0:1:0:1`, HCA:PORT:RAIL:PLANE) is listed with them, `[0]mlx5_0:1:0/IB` (rail),
  `[0]mlx5_0:1:0:1/IB` (both), `[0]mlx5_0:1::1/IB` (plane): the device is still `mlx5_0:1`;
  `NET/IB : No device found.`, and from v2.27 (TRACE before)
  `NET/IB: [0] mlx5_0:uverbs0:1/IB provider=Mlx5 speed=400000 ...` (the port's rate, Mb/s); from v2.30.7
  `NET/IB : mlx5_0:1 speed change detected: 400000 -> 100000 Mbps` when a port retrains during the run.
- aws-ofi-nccl: `NET/OFI Selected provider is efa, fabric is efa-direct (found 16 nics)` (older:
  `Selected Provider is efa (found 4 nics)`; v1.0 to v1.5 `Selected Provider is efa`). The plugin runs on any
  libfabric provider (`tcp`, `tcp;ofi_rxm` where EFA is missing or FI_PROVIDER names it, `cxi` on Slingshot:
  src/nccl_ofi_ofiutils.cpp), under the same network name: a process whose provider is not EFA's is of the
  provider's family (tcp: Socket), never EFA.

Several processes writing to one pipe glue lines together: `...Using netgpu-a01:4128:4191 [1] NCCL INFO ...`.
A physical line is split at every NCCL prefix; every piece but the last is a cut record and is dropped
(counted in `Log.cut`), never parsed as a whole one, and a host name glued to a cut piece is restored from
the hosts seen at the start of lines.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

IB = "IB"
EFA = "EFA"
SOCKET = "Socket"
UNKNOWN = "unknown"
FAMILIES = (IB, EFA, SOCKET, UNKNOWN)
FAMILY_WORDS = {IB: "InfiniBand/RoCE through verbs", EFA: "AWS EFA through libfabric (aws-ofi-nccl)",
                SOCKET: "TCP sockets", UNKNOWN: "a network this check does not know"}

# `HOST:PID:TID [DEV] ` followed by NCCL's level (a WARN has FILE:LINE (FUNC) between), as src/debug.cc prints them.
# A TRACE line (`[DEV] MS FUNC:LINE NCCL TRACE `) and a CALL line (`NCCL CALL `, no device) end the record before them
# but are not read; `[DEV] NCCL TRACE ` or `[DEV] NCCL CALL ` is no line NCCL prints, and no record.
_PREFIX = re.compile(r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) (?:\[(?P<dev>-?\d+)\] "
                     r"(?=NCCL INFO |\S+:\d+ (?:\([^)]*\) )?NCCL WARN |\d+\.\d+ \S+:\d+ NCCL TRACE )|(?=NCCL CALL ))")
_LEVEL = re.compile(r"NCCL (?P<level>INFO) |\S+:\d+ (?:\([^)]*\) )?NCCL (?P<warn>WARN) ")
_USING = re.compile(r"Using network (?P<name>\S.*?)\s*$")
# NET lines name their direction; P2P (`Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM`) and SHM (`Channel 00 : ...
# via SHM/direct`, no connection index) do not.
_CHANNEL = re.compile(r"Channel (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<a>\d+)\[[0-9a-fA-F]+\] -> "
                      r"(?P<b>\d+)\[[0-9a-fA-F]+\](?: \[(?P<dir>send|receive)\])? via (?P<via>\S.*?)\s*$")
_NET_VIA = re.compile(r"NET/(?P<net>.+?)/(?P<dev>\d+)(?:\((?P<proxy>\d+)\))?(?P<gdr>/GDRDMA)?(?:\(PCI\))?"
                      r"(?P<shared>/Shared)?$")
_IB_USING = re.compile(r"NET/IB ?: Using (?P<devs>.*?);\s*OOB ")
_IB_DEV = re.compile(r"\[(?P<i>\d+)\](?P<name>[^/\s\[]+)/(?P<link>[A-Za-z]+)")
# Its name: HCA:PORT, then (NCCL >= 2.30) `:RAIL`, `:RAIL:PLANE` or `::PLANE` where NCCL_IB_HCA gave them.
_IB_NAME = re.compile(r"(?P<dev>[^:]+:[^:]+)(?::(?P<rail>(?:-?\d+)?)(?::(?P<plane>-?\d+))?)?")
_IB_SPEED = re.compile(r"NET/IB ?: \[(?P<i>\d+)\] (?P<dev>[^:\s]+):[^:\s]+:(?P<port>\d+)/\S+ .*\bspeed=(?P<mbps>\d+)")
# NCCL >= 2.30.7 (net_ib/common.cc): a port that retrains during the run; its lowest rate is kept apart (N/A: unread).
_IB_SPEED_CHANGE = re.compile(r"NET/IB ?: (?P<dev>[^:\s]+):(?P<port>\d+) speed change detected: \S+ -> "
                              r"(?P<mbps>\d+) Mbps")
# NCCL >= 2.24: ports of one card fused into a virtual NIC, numbered after the listed devices (names joined by +).
_IB_VNIC = re.compile(r"NET/IB ?: Made virtual device \[(?P<i>\d+)\] name=(?P<names>\S+) speed=\S+ ndevs=(?P<n>\d+)")
# `NET/Socket: Using 2 threads and 8 sockets per thread` (net_socket.cc, at connect) lists no device.
_SOCKET_USING = re.compile(r"NET/Socket ?: Using (?P<devs>\[.*)$")
_SOCKET_DEV = re.compile(r"\[(?P<i>\d+)\](?P<name>[^:\s]+):")
# v1.0 to v1.5 print `Selected Provider is efa` alone (no NIC count).
_OFI = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<provider>[^,\s]+)(?:, fabric is (?P<fabric>\S+))?"
                  r"(?: \(found (?P<nics>\d+) nics?\))?")
_RANK = re.compile(r"\bcomm 0x[0-9a-fA-F]+ rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cuda>-?\d+)")
_PLUGIN = re.compile(r"NET/Plugin ?: Loaded net plugin (?P<name>.+?) \(v\d+\)\s*$")
# NCCL's own words for why a network was not used: quoted in a refusal.
_WHY = re.compile(r"NET/IB ?: No device found|Failed to open libibverbs|NET/Plugin ?: (?:Could not find|Failed)|"
                  r"NET/OFI .*(?:failed|Could not|No )|libnccl-net")


def family_of(network: str) -> str:
    """The family of a network NCCL names in `Using network NAME` (IB, EFA, Socket, or unknown), or that NCCL_NET
    selects: NCCL takes the network whose name matches NCCL_NET in any case (src/init.cc, strcasecmp), so the
    launcher refuses an NCCL_NET of another family than the job asks for with the rule the verifier applies."""
    name = network.strip().casefold()
    if name == "ib" or name.startswith(("ibext", "nccl rdma plugin")):
        return IB
    if "libfabric" in name or name == "ofi":
        return EFA
    if name == "socket":
        return SOCKET
    return UNKNOWN


@dataclass(frozen=True)
class Channel:
    """One NET connection of a process (`Channel ... via NET/...`)."""

    channel: int
    direction: str          # send | receive
    rank: int               # the rank of the process that printed it
    network: str
    device: int             # index into the plugin's device list
    gdr: bool

    def text(self) -> str:
        return (f"rank {self.rank} channel {self.channel:02d} [{self.direction}] via NET/{self.network}/{self.device}"
                + ("/GDRDMA" if self.gdr else ""))


@dataclass
class Process:
    """What NCCL said in one process (one HOST:PID)."""

    host: str
    pid: str
    cuda_dev: str = ""
    ranks: set[int] = field(default_factory=set)
    networks: list[str] = field(default_factory=list)       # `Using network`, one per communicator
    # family whose plugin listed them (IB: `NET/IB : Using`, Socket: `NET/Socket : Using`) -> index -> name
    devices: dict[str, dict[int, str]] = field(default_factory=dict)
    speeds_gbits: dict[str, float] = field(default_factory=dict)   # IB device -> port rate (NCCL >= 2.27)
    retrained_gbits: dict[str, float] = field(default_factory=dict)   # -> its lowest rate after init (>= 2.30.7)
    # IB device -> the (rail, plane) NCCL_IB_HCA gave it, None where it gave none (NCCL >= 2.30); absent: neither
    ib_rails: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    fused: dict[int, list[str]] = field(default_factory=dict)   # IB virtual NIC index -> its HCAs (NCCL >= 2.24)
    ofi_nics: int | None = None
    ofi_provider: str = ""                                  # aws-ofi-nccl's libfabric provider (efa, tcp, ...)
    plugin: str = ""
    channels: list[Channel] = field(default_factory=list)
    local: list[str] = field(default_factory=list)         # intra-node channel transports (P2P/..., SHM/...)
    why: list[str] = field(default_factory=list)           # NCCL's lines saying why a network was not used
    warnings: list[str] = field(default_factory=list)

    @property
    def who(self) -> str:
        rank = f"rank {','.join(str(r) for r in sorted(self.ranks))} " if self.ranks else ""
        gpu = f", GPU {self.cuda_dev}" if self.cuda_dev else ""
        return f"{rank}({self.host}:{self.pid}{gpu})"

    @property
    def network(self) -> str:
        """The network of its communicators, several joined by +: their `Using network` lines, else the network
        its NET channels name (a `Using network` line lost to glued output); '' when it said neither."""
        return "+".join(dict.fromkeys(self.networks or [c.network for c in self.channels]))

    @property
    def families(self) -> list[str]:
        return list(dict.fromkeys(self.family(n) for n in self.network.split("+") if n))

    def family(self, network: str) -> str:
        """The family of one of its networks: aws-ofi-nccl's `Libfabric` is EFA only on libfabric's EFA provider
        (an unnamed provider is taken as EFA); on `tcp` it is TCP sockets, on another provider unknown."""
        family = family_of(network)
        if family != EFA or not self.ofi_provider or self.ofi_provider.startswith("efa"):
            return family
        return SOCKET if self.ofi_provider.startswith(("tcp", "sockets")) else UNKNOWN

    def used_devices(self) -> list[str]:
        """The devices its NET channels used, by name where NCCL listed them (a fused NIC: the listed devices of its
        HCAs), else NET/NAME/INDEX."""
        used: set[str] = set()
        for net, i in {(c.network, c.device) for c in self.channels}:
            listed = self.devices.get(family_of(net), {})
            hcas = self.fused.get(i, []) if family_of(net) == IB and i not in listed else []
            used |= {d for d in listed.values() if d.partition(":")[0] in hcas} or {listed.get(i, f"NET/{net}/{i}")}
        return sorted(used)

    def listed_nics(self) -> int | None:
        """How many devices NCCL listed for its network: `NET/IB : Using [0]... [n]...`, or aws-ofi-nccl's
        `found N nics`; None when it listed none."""
        families = self.families
        if IB in families and self.devices.get(IB):
            return len(self.devices[IB])
        return self.ofi_nics if EFA in families else None


@dataclass
class Log:
    """NCCL's log of one or more processes."""

    processes: dict[tuple[str, str], Process] = field(default_factory=dict)
    lines: int = 0            # NCCL lines read (whole ones)
    cut: int = 0              # pieces of lines cut by another process's output (dropped)

    def process(self, host: str, pid: str) -> Process:
        return self.processes.setdefault((host, pid), Process(host, pid))

    def with_network(self) -> list[Process]:
        return [p for p in self.processes.values() if p.network]

    def channels(self) -> list[Channel]:
        return [c for p in self.processes.values() for c in p.channels]

    def families(self) -> list[str]:
        return sorted({f for p in self.processes.values() for f in p.families})


def read(text: str, log: Log | None = None) -> Log:
    """NCCL's records in TEXT (one or several processes' output), added to LOG."""
    log = log or Log()
    records: list[tuple[str, str, str, str, bool]] = []   # host, pid, dev, text, glued host?
    hosts: set[str] = set()
    for line in text.splitlines():
        found = list(_PREFIX.finditer(line))
        for index, match in enumerate(found):
            if index == 0:      # the line's first record (a launcher's or a timestamp's prefix may come before)
                hosts.add(match["host"])
            if index + 1 < len(found):   # cut by the next record's start (glued output of two processes)
                log.cut += 1
                continue
            records.append((match["host"], match["pid"], match["dev"] or "", line[match.end():], index > 0))
    for host, pid, dev, rest, glued in records:
        if glued:   # `...Using netgpu-a01:4128:...`: the host is the known one its name ends with
            host = max((h for h in hosts if host.endswith(h)), key=len, default=host)
        level = _LEVEL.match(rest)
        if level is None:
            continue
        log.lines += 1
        proc = log.process(host, pid)
        proc.cuda_dev = proc.cuda_dev or dev
        body = rest[level.end():].rstrip()
        if level["warn"]:
            proc.warnings.append(body)
            continue
        _record(proc, body)
    return log


def _record(proc: Process, body: str) -> None:
    if found := _USING.match(body):
        proc.networks.append(found["name"])
    elif found := _CHANNEL.match(body):
        via, receive = found["via"], found["dir"] == "receive"
        net = _NET_VIA.match(via)
        rank = int(found["b"] if receive else found["a"])    # the printing process is the sender, or the receiver
        proc.ranks.add(rank)
        if net:
            proc.channels.append(Channel(int(found["ch"]), found["dir"] or "send", rank, net["net"], int(net["dev"]),
                                         bool(net["gdr"])))
        elif not via.startswith("NET/"):
            proc.local.append(via)
    elif found := _IB_USING.match(body):
        proc.devices[IB] = {int(d["i"]): _ib_device(proc, d["name"]) for d in _IB_DEV.finditer(found["devs"])}
    elif found := _IB_SPEED.match(body):
        proc.speeds_gbits[f"{found['dev']}:{found['port']}"] = int(found["mbps"]) / 1000
    elif found := _IB_VNIC.match(body):
        if int(found["n"]) > 1:
            proc.fused[int(found["i"])] = found["names"].split("+")
    elif found := _IB_SPEED_CHANGE.match(body):
        key = f"{found['dev']}:{found['port']}"
        proc.retrained_gbits[key] = min(int(found["mbps"]) / 1000, proc.retrained_gbits.get(key, float("inf")))
    elif found := _SOCKET_USING.match(body):
        proc.devices[SOCKET] = {int(d["i"]): d["name"] for d in _SOCKET_DEV.finditer(found["devs"])}
    elif found := _OFI.search(body):
        proc.ofi_nics = int(found["nics"]) if found["nics"] else proc.ofi_nics
        proc.ofi_provider = found["provider"].lower()
        if not proc.ofi_provider.startswith("efa") and body not in proc.why:   # why it was not EFA
            proc.why.append(body)
    elif found := _RANK.search(body):
        proc.ranks.add(int(found["rank"]))
        proc.cuda_dev = found["cuda"]
    elif found := _PLUGIN.match(body):
        proc.plugin = found["name"]
    if _WHY.search(body) and body not in proc.why:
        proc.why.append(body)


def _ib_device(proc: Process, name: str) -> str:
    """The device (`mlx5_0:1`) of a `NET/IB : Using` entry's name, its rail and plane kept apart (NCCL >= 2.30)."""
    found = _IB_NAME.fullmatch(name)
    if found is None:
        return name
    if found["rail"] is not None:
        proc.ib_rails[found["dev"]] = (int(found["rail"]) if found["rail"] else None,
                                       int(found["plane"]) if found["plane"] else None)
    return found["dev"]


def read_files(paths: Iterable[Path]) -> Log:
    """The NCCL log of every file in PATHS (NCCL_DEBUG_FILE's, one process each)."""
    log = Log()
    for path in paths:
        read(path.read_text(encoding="utf-8", errors="replace"), log)
    return log


def no_log(paths: list[Path], where: str, log: Log | None = None) -> str:
    """'' when NCCL wrote something readable, else the one-line failure naming what was found."""
    if not paths:
        return f"NCCL wrote no log: no file in {where}"
    sizes = [p.stat().st_size if p.exists() else 0 for p in paths]
    if not any(sizes):
        return f"NCCL wrote no log: {len(paths)} file(s) in {where}, all empty"
    log = log if log is not None else read_files(paths)
    if not log.lines:
        return (f"NCCL wrote no log: {len(paths)} file(s) in {where} ({sum(sizes)} bytes) hold no NCCL INFO or WARN "
                "line (`HOST:PID:TID [DEV] NCCL INFO ...`)")
    return ""


def ranges(numbers: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    # Consecutive numbers keep the same distance from their position in the sorted list: one run per distance.
    runs = [[n for _, n in run] for _, run in groupby(enumerate(sorted(set(numbers))), lambda pair: pair[1] - pair[0])]
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def summary(log: Log) -> str:
    """One line: the family per network, the processes and their ranks, the devices used, GPUDirect RDMA."""
    groups: dict[str, list[Process]] = {}
    for proc in log.with_network():
        groups.setdefault(proc.network, []).append(proc)
    if not groups:
        return "no network named (no `NCCL INFO Using network` line)"
    parts = []
    for network, procs in sorted(groups.items()):
        families = "+".join(dict.fromkeys(f for p in procs for f in p.families))
        ranks = [r for p in procs for r in p.ranks]
        who = f"ranks {ranges(ranks)}" if ranks else ", ".join(f"{p.host}:{p.pid}" for p in procs)
        channels = [c for p in procs for c in p.channels]
        used = sorted({d for p in procs for d in p.used_devices()})
        listed = max((p.listed_nics() or 0 for p in procs), default=0)
        text = f"{families} (NET/{network}) in {len(procs)} process(es) ({who})"
        if channels:
            gdr = sum(c.gdr for c in channels)
            text += (f"; NICs used: {', '.join(used)} ({len(used)}" + (f" of {listed} listed)" if listed else ")")
                     + f"; GPUDirect RDMA {'on' if gdr == len(channels) else 'off' if not gdr else 'partly on'} "
                       f"({gdr} of {len(channels)} NET channels)")
        else:
            text += "; no NET channel line"
        parts.append(text)
    return "; ".join(parts)


def asked_hcas(value: str) -> list[str] | None:
    """The HCAs an NCCL_IB_HCA value names, for counting: None when it excludes (`^...`) or is empty. As NCCL reads
    it (net_ib.cc, then utils.cc parseStringList): `=` only at the start of the whole list; a later `=mlx5_1` is
    a device of that name, which no node has (the NIC check then names it, the real cause)."""
    value = value.strip()
    if not value or value.startswith("^"):
        return None
    return [entry for entry in value.removeprefix("=").split(",") if entry.partition(":")[0]]   # `:1`: no entry


def hca_exact(value: str) -> bool:
    """NCCL_IB_HCA starts (after its `^`) with `=`: every entry names a device exactly, not by prefix (NCCL's
    net_ib.cc reads `^`, then `=`, at the start of the whole list)."""
    return value.strip().removeprefix("^").startswith("=")


def matches_hca(device: str, entry: str, exact: bool = False) -> bool:
    """Whether an NCCL_IB_HCA entry (`mlx5_0`, `mlx5_0:1`; from NCCL 2.30 also `mlx5_0:1:RAIL:PLANE`) names DEVICE
    (`mlx5_0:1`), as NCCL matches: by prefix of the device name (`mlx5` is every mlx5_N), exactly under `=`, and the
    port when the entry names one (`mlx5_0:` names none; a rail or plane after it does not take part, utils.cc
    parseStringList, matchIfList)."""
    name, _, port = device.partition(":")
    want_name, _, rest = entry.partition(":")
    want_port = rest.partition(":")[0]
    return (name == want_name if exact else name.startswith(want_name)) and want_port in ("", port)


def hca_count(value: str, listed: list[str]) -> int:
    """How many NICs an NCCL_IB_HCA value asks for on a node whose NCCL listed `listed` (0: it names none). An
    entry counts once, a prefix entry (`mlx5`) as every listed device it matches: counting it once set the NIC
    check and the bus-bandwidth floor for one NIC on an eight-NIC node."""
    asked = asked_hcas(value) or []
    exact = hca_exact(value)
    return max(len(asked), sum(any(matches_hca(d, a, exact) for a in asked) for d in listed))
