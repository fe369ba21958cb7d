"""Run a multi-node check and fail unless it really trained in sync (shipped into every job by buildtool:
launch/multinode.py VERIFY_FILES, with contracts/nccl_log.py and contracts/busbw.py beside it).

Usage: DDP_EXPECT_WORLD_SIZE=N DDP_EXPECT_BACKEND=nccl|gloo verify_ddp.py COMMAND...
COMMAND is torchrun, or a framework's script with `{process_id}` among its arguments: this node's
process id, JOB_COMPLETION_INDEX (a Kubernetes indexed Job) or the place of this container's hostname
in DDP_NODES (SLURM: the allocation's node names in order, the first hosting process 0). Torch's
launcher may be given `is_host={is_host}` in its rendezvous configuration (true on process 0: it hosts
the c10d store) and `{local_addr}` (this node's entry of DDP_NODE_ADDRS); where no process id is known
both are left to torch. `--node-rank={node_rank}` (torchrun's static rendezvous in a Kubeflow PyTorchJob) is
RANK, the node rank the training operator gives the pod (the Master 0): node 0 runs global rank 0.
DDP_RDZV_HOST: a name to wait for (up to DDP_RESOLVE_TIMEOUT_S) before starting.
DDP_APPEND_LIBRARY_PATH: folders appended to the command's LD_LIBRARY_PATH (GKE's driver folder).

NCCL (a GPU job, NCCL_DEBUG set): every process writes its own log, NCCL_DEBUG_FILE=DIR/nccl.%h.%p.log
(DDP_NCCL_LOG_DIR, else a new folder under /tmp, removed once read: one writer per file, so nothing is lost or
glued), which the verifier prints into the job's log and reads after the check, against what the job asked for:
DDP_EXPECT_TRANSPORT=IB|EFA, DDP_EXPECT_GDR=1, NCCL_IB_HCA or DDP_FABRIC_NICS, DDP_FABRIC_RATE. The node
that prints rank 0's result compares the cross-node bus bandwidth with the family's floor
(contracts/busbw.py). docs/multinode.md ("The transport check") says what each check reads and why.

Rank 0's result: the node that ran it must see its `DDP_RESULT {json}` line, or the check fails there. With a
process id, process 0 is rank 0. Under torchrun, which node holds rank 0 is torch's choice, so every process of
the check prints `DDP_RANK {json}` (its global rank, local rank and the node's local world size): a node that
ran rank 0 needs the result, a node whose every local rank is another passes, and a node whose lines do not say
(none, or some local rank's missing) fails; with a node rank, node 0 ran rank 0 (the PyTorchJob's Master, whose
outcome alone the operator reports) and needs the result whatever its lines say. DDP_OWN_WORKLOAD=1: a workload
of the caller's own (the scaling benchmark), which prints what its caller reads; no DDP_RESULT is required then.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:
    from buildtool.contracts import busbw, nccl_log
else:   # in the job: shipped beside this file
    import busbw
    import nccl_log

NCCL_FILE_PATTERN = "nccl.%h.%p.log"   # NCCL_DEBUG_FILE's: host and pid, one file per process
RESULT_PREFIX = "DDP_RESULT "           # rank 0's result
RANK_PREFIX = "DDP_RANK "               # every process's global and local rank (torchrun's checks)
NODE_RANK_ARG = "--node-rank={node_rank}"   # torchrun's static rendezvous: this node's rank, from RANK
OWN_WORKLOAD_ENV = "DDP_OWN_WORKLOAD"   # 1: the caller reads what the workload prints (no DDP_RESULT owed)
READS_NCCL = ("INFO", "TRACE")          # the NCCL_DEBUG levels that print the network and the channels


# The whole-number settings (never negative) and what each says, for the one line that refuses a bad value.
COUNT_SETTINGS = {
    "JOB_COMPLETION_INDEX": "(this pod's index in its Kubernetes indexed Job: the node's process id)",
    "RANK": "(the node rank Kubeflow's training operator gives this pod: the Master 0, Worker i i+1)",
    "DDP_RESOLVE_TIMEOUT_S": "of seconds (how long to wait for the rendezvous host's name to resolve)",
    "DDP_EXPECT_WORLD_SIZE": "(the processes the launcher asked for)",
    "DDP_GPUS_PER_NODE": "(the GPUs per node the job asked for)",
    "DDP_FABRIC_NICS": "(the fabric's NICs per node the job named, --fabric-nics)"}


def count_setting(name: str, value: str) -> int:
    """Setting NAME's VALUE as a whole number (digits only: int() also reads ' -1', '1_0'); anything else stops
    the node naming it, never a traceback or a guess (a negative process id indexes the node list from its end)."""
    if not (value.isascii() and value.isdigit()):
        sys.exit(f"DDP check failed: {name}={value!r} is not a whole number {COUNT_SETTINGS[name]}")
    return int(value)


def node_index(strict: bool) -> str | None:
    """This node's process id: JOB_COMPLETION_INDEX, or the place of its hostname in DDP_NODES. None when
    neither says (only when not STRICT: a torchrun node then lets torch decide whether it hosts the store)."""
    if "JOB_COMPLETION_INDEX" in os.environ:
        return str(count_setting("JOB_COMPLETION_INDEX", os.environ["JOB_COMPLETION_INDEX"]))
    nodes = os.environ.get("DDP_NODES", "").split()
    if not nodes:
        if not strict:
            return None
        sys.exit("DDP check failed: no process id for this node: neither JOB_COMPLETION_INDEX (a Kubernetes "
                 "indexed Job) nor DDP_NODES (the SLURM job's node names) is set")
    host = socket.gethostname()
    for names, name in ((nodes, host), ([n.split(".")[0] for n in nodes], host.split(".")[0])):
        if name in names:
            return str(names.index(name))
    if not strict:
        print(f"verify_ddp.py: hostname {host!r} is none of the job's nodes ({', '.join(nodes)}): torch decides "
              "whether this node hosts the c10d store", file=sys.stderr, flush=True)
        return None
    sys.exit(f"DDP check failed: this container's hostname {host!r} is none of the job's nodes "
             f"({', '.join(nodes)}), so it has no process id; the container must have its node's hostname "
             "(SLURM's NodeName)")


def wait_for_name(host: str, timeout_s: int) -> None:
    """Kubernetes: the headless Service's record for pod 0 appears once that pod has an address (it may be
    pulling its image); wait for it, bounded, rather than let the c10d client retry silently."""
    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        try:
            socket.getaddrinfo(host, None)
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                sys.exit(f"DDP check failed: the rendezvous host {host} did not resolve within {timeout_s} s "
                         f"({exc}): is pod 0 running, and does the headless Service select it?")
            if not said:
                print(f"verify_ddp.py: waiting up to {timeout_s} s for {host} to resolve ({exc})", file=sys.stderr,
                      flush=True)
                said = True
            time.sleep(2)


def libcuda_hint(env: dict[str, str]) -> str:
    """Where CUDA's driver library is not: the usual reason a GPU run falls back to gloo."""
    folders = [f for f in env.get("LD_LIBRARY_PATH", "").split(":") if f]
    if any(os.path.exists(os.path.join(f, "libcuda.so.1")) for f in folders):
        return ""
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        cache = ""
    if "libcuda.so.1" in cache:
        return ""
    return (f"; libcuda.so.1 is in none of LD_LIBRARY_PATH's folders ({':'.join(folders) or 'unset'}) nor the "
            "linker cache: on GKE the driver installer mounts it at /usr/local/nvidia/lib64, which must be on "
            "LD_LIBRARY_PATH (the generated manifests append it)")


def node_addr(index: str, addrs: list[str]) -> str:
    """This node's entry of DDP_NODE_ADDRS, by its process id INDEX: one outside the list is an error (a negative
    index would pick another node's address from the end)."""
    if not 0 <= int(index) < len(addrs):
        where = "JOB_COMPLETION_INDEX" if "JOB_COMPLETION_INDEX" in os.environ else "this node's place in DDP_NODES"
        sys.exit(f"DDP check failed: this node's process id {index} ({where}) is outside DDP_NODE_ADDRS, which names "
                 f"{len(addrs)} node(s) (process ids 0 to {len(addrs) - 1})")
    return addrs[int(index)]


def resolve_command(argv: list[str]) -> tuple[list[str], str | None]:
    """The check's command with this node's placeholders resolved, and its process id or node rank (None: torch's
    choice)."""
    command, me = list(argv), None
    if NODE_RANK_ARG in command:
        # The operator's rank of this pod: never a default, as node rank 0 owes rank 0's result (a Worker taken for
        # node 0 would hold the store and rank 0 while the Master's outcome is the job's).
        if "RANK" not in os.environ:
            sys.exit("DDP check failed: no node rank for this node: RANK is not set (Kubeflow's training operator "
                     "sets it in a PyTorchJob's pods: the Master 0, Worker i i+1)")
        me = str(count_setting("RANK", os.environ["RANK"]))
        command = [f"--node-rank={me}" if arg == NODE_RANK_ARG else arg for arg in command]
    if "{process_id}" in command:
        me = node_index(strict=True)
        assert me is not None   # strict: it exits naming why rather than guess
        command = [me if arg == "{process_id}" else arg for arg in command]
    if any("{is_host}" in arg or arg == "--local-addr={local_addr}" for arg in command):
        # Whether this node hosts the c10d store, from its index: torch would match its hostname through DNS. And
        # the address its agent gives the workers (torch's default, the node's name, may not resolve elsewhere).
        index = node_index(strict=False)
        flag = "" if index is None else ",is_host=" + ("true" if index == "0" else "false")
        addrs = os.environ.get("DDP_NODE_ADDRS", "").split()
        local = "" if index is None or not addrs else node_addr(index, addrs)
        command = [arg.replace(",is_host={is_host}", flag).replace("{local_addr}", local) for arg in command
                   if arg != "--local-addr={local_addr}" or local]
    return command, me


def nccl_log_dir(env: dict[str, str]) -> Path | None:
    """Where NCCL writes one file per process (NCCL_DEBUG_FILE set in ENV), or None when NCCL logs nothing."""
    if not env.get("NCCL_DEBUG"):
        return None
    folder = Path(env["DDP_NCCL_LOG_DIR"]) if env.get("DDP_NCCL_LOG_DIR") else Path(tempfile.mkdtemp(prefix="nccl-"))
    folder.mkdir(parents=True, exist_ok=True)
    env["NCCL_DEBUG_FILE"] = str(folder / NCCL_FILE_PATTERN)
    return folder


def show_logs(files: list[Path]) -> None:
    """NCCL's per-process files into this node's output, one after the other: the job's log keeps them."""
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        print(f"verify_ddp.py: NCCL log {path.name} ({len(text.splitlines())} lines)", flush=True)
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    sys.stdout.flush()


def asked_words(family: str) -> str:
    return f"{family} ({nccl_log.FAMILY_WORDS.get(family, family)})"


def why_other(want: str, wrong: list[nccl_log.Process]) -> str:
    """Why NCCL used another network, where that is known; never says sockets for a network that is not."""
    used = {f for p in wrong for f in p.families}
    # NCCL's line about the fabric asked for (`Could not find: libnccl-net.so` is no cause where IB is NCCL's own).
    about = ("NET/OFI", "NET/Plugin", "libnccl-net") if want == nccl_log.EFA else ("NET/IB", "libibverbs")
    said = next((w for p in wrong for w in p.why if any(word in w for word in about)), "")
    quote = f"; NCCL said `{said}`" if said else ""
    if used == {nccl_log.SOCKET}:
        if want == nccl_log.EFA:
            return (quote + ": without the aws-ofi-nccl plugin (libnccl-net.so) and libfabric's EFA provider in the "
                    "image, or without the EFA devices (/dev/infiniband/uverbs*) in the container, NCCL falls back "
                    "to TCP sockets")
        return (quote + ": without libibverbs1 and its provider (ibverbs-providers) in the image, or without the "
                "RDMA device in the container, NCCL falls back to TCP sockets")
    if nccl_log.UNKNOWN in used:
        return quote + ": NCCL named a network of no family this check knows, so it cannot say what fabric it ran on"
    return quote + ": NCCL loaded another network plugin than the fabric asked for (NCCL_NET selects one)"


def transport_problems(log: nccl_log.Log, env: dict[str, str]) -> list[str]:
    """What the job asked of the fabric (DDP_EXPECT_TRANSPORT, DDP_EXPECT_GDR, the NICs, the rate) that NCCL's
    log on this node shows it did not get."""
    problems: list[str] = []
    want = env.get("DDP_EXPECT_TRANSPORT", "")
    named = log.with_network()
    if want:
        if not named:
            problems.append(f"the job asked for {asked_words(want)}, but NCCL named no network on this node (no "
                            "`NCCL INFO Using network` line in its log: NCCL_DEBUG must be INFO or TRACE and "
                            "NCCL_DEBUG_SUBSYS include INIT)")
        else:
            wrong = [p for p in named if p.families != [want]]
            if wrong:
                them = ", ".join(f"{p.who} {'+'.join(p.families)} (NET/{p.network})" for p in wrong)
                problems.append(f"the job asked for {asked_words(want)}, but {len(wrong)} of {len(named)} NCCL "
                                f"process(es) on this node used another network: {them}{why_other(want, wrong)}")
    channels = log.channels()
    if env.get("DDP_EXPECT_GDR") == "1":
        off = [c for c in channels if not c.gdr]
        if not channels:
            problems.append("GPUDirect RDMA was asked for (--require-gdr), but NCCL printed no NET channel line on "
                            "this node (`Channel NN/N : ... via NET/...`; NCCL_DEBUG_SUBSYS must include INIT or NET)")
        elif off:
            shown = ", ".join(c.text() for c in off[:4]) + (f" and {len(off) - 4} more" if len(off) > 4 else "")
            problems.append(f"GPUDirect RDMA was asked for (--require-gdr), but {len(off)} of {len(channels)} NET "
                            f"channel(s) on this node ran without it (no /GDRDMA): {shown}: NCCL uses it only with "
                            "the host's peer-memory module (nvidia-peermem) or DMA-BUF, and a NIC close enough to "
                            "the GPU (NCCL_NET_GDR_LEVEL)")
    gpus = count_setting("DDP_GPUS_PER_NODE", env.get("DDP_GPUS_PER_NODE") or "0")
    asked = nccl_log.asked_hcas(env.get("NCCL_IB_HCA", ""))
    count, said = asked_nics(env, listed_ib(named))
    # The NICs of the family asked for (a process on another network is the transport problem above).
    on_fabric = [p for p in named if p.families == [want or nccl_log.IB]]
    used = sorted({d for p in on_fabric for d in p.used_devices()})
    if count and on_fabric and any(p.channels for p in on_fabric):
        need = min(count, gpus) if gpus else count
        if len(used) < need:
            exact = nccl_log.hca_exact(env.get("NCCL_IB_HCA", ""))
            unused = [a for a in asked or [] if not any(nccl_log.matches_hca(u, a, exact) for u in used)]
            problems.append(f"NCCL used {len(used)} NIC(s) on this node ({', '.join(used)}), not the {need} asked "
                            f"for ({said}, one per GPU of {gpus})" + (f"; unused: {', '.join(unused)}" if unused
                                                                          else "")
                            + ": NCCL leaves out a port that is down, and one NIC carries every channel then")
    rate_name = env.get("DDP_FABRIC_RATE", "")
    if rate_name:
        rate = busbw.link_rate(rate_name)
        slow = sorted({f"{dev} at {gbits:g} Gb/s" for p in named for dev, gbits in p.speeds_gbits.items()
                       if gbits < rate.gbits})
        if slow and rate.family == nccl_log.IB:
            problems.append(f"NCCL reports port(s) slower than {rate.name} {rate.gbits:g} Gb/s, the rate the job "
                            f"declared (--fabric-rate {rate_name}): {', '.join(slow)} (a link trained down: cable, "
                            "transceiver or switch port)")
    return problems


def listed_ib(processes: list[nccl_log.Process]) -> list[str]:
    """The InfiniBand/RoCE devices NCCL listed on this node (`NET/IB : Using [0]mlx5_0:1/IB ...`)."""
    return sorted({name for p in processes for name in p.devices.get(nccl_log.IB, {}).values()})


def asked_nics(env: dict[str, str], listed: list[str]) -> tuple[int, str]:
    """The NICs per node the job named (DDP_FABRIC_NICS, else NCCL_IB_HCA's list, a prefix entry counted as the
    devices NCCL `listed` that it matches) and how it named them."""
    if env.get("DDP_FABRIC_NICS"):
        said = env.get("DDP_FABRIC_NICS_FROM") or f"--fabric-nics {env['DDP_FABRIC_NICS']}"
        return count_setting("DDP_FABRIC_NICS", env["DDP_FABRIC_NICS"]), said
    value = env.get("NCCL_IB_HCA", "")
    count = nccl_log.hca_count(value, listed)
    if count and count != len(nccl_log.asked_hcas(value) or []):
        return count, f"NCCL_IB_HCA {value.strip()[:60]!r} matches {count} that NCCL listed"
    return count, f"NCCL_IB_HCA names {count}" if count else ""


def busbw_check(result: dict[str, Any], log: nccl_log.Log | None, env: dict[str, str], problems: list[str]) -> str:
    """The cross-node all-reduce bus bandwidth against the floor of the family this node's processes used
    (contracts/busbw.py cross_node_floor); the text the pass line adds."""
    if log is None or not env.get("DDP_GPUS_PER_NODE"):   # set for GPU jobs across nodes only
        return ""
    table = result.get("busbw")
    if table is None:
        # PyTorch's ddp_train.py measures it on GPUs; a check that does not (JAX's) is said to, not failed.
        return ", cross-node bus bandwidth not measured (no busbw table in rank 0's DDP_RESULT)"
    peak: Any = table.get("peak_GBps") if isinstance(table, dict) else None
    if not finite(peak) or peak < 0:
        # NaN is below no floor: a table that says nothing measurable fails rather than passes the floor.
        problems.append("rank 0's busbw table has no valid peak_GBps (a finite number of GB/s): "
                        + json.dumps(table)[:120])
        return ""
    peak = float(peak)
    families = log.families()
    if len(families) != 1:
        return (f", cross-node bus bandwidth {peak:.1f} GB/s (no floor: NCCL used "
                f"{'networks of ' + ' and '.join(families) if families else 'no network it named'} on this node)")
    family = families[0]
    named = log.with_network()
    count, said = asked_nics(env, listed_ib(named))
    if not count:
        count = max((p.listed_nics() or 0 for p in named), default=0)
        said = f"NCCL listed {count} on this node"
    gpus = count_setting("DDP_GPUS_PER_NODE", env.get("DDP_GPUS_PER_NODE") or "0")
    floor = busbw.cross_node_floor(family, env.get("DDP_FABRIC_RATE", ""), count or None, said, gpus)
    if floor.floor_GBps is None:
        return f", cross-node bus bandwidth {peak:.1f} GB/s over {family} (no floor for {family}: {floor.how})"
    if peak < floor.floor_GBps:
        used = sorted({d for p in named for d in p.used_devices()})
        problems.append(f"cross-node all-reduce bus bandwidth {peak:.1f} GB/s over {family} is below the floor "
                        f"{floor.floor_GBps:g} GB/s ({floor.how}); NCCL used {len(used)} NIC(s) on this node"
                        + (f" ({', '.join(used)})" if used else ""))
    return f", cross-node bus bandwidth {peak:.1f} GB/s over {family} (floor {floor.floor_GBps:g} GB/s: {floor.how})"


def read_nccl(folder: Path | None, output: str, env: dict[str, str]) -> tuple[nccl_log.Log | None, list[str], str]:
    """NCCL's log on this node: (the log, its problems, the family line). The per-process files first; the
    check's own output where NCCL could not open them (it then writes to stdout)."""
    if folder is None:
        if env.get("DDP_EXPECT_BACKEND") == "gloo":
            return None, [], "Socket (gloo: torch's and JAX's CPU collectives run over TCP; NCCL not used)"
        return None, [], "not read (NCCL_DEBUG unset)"
    files = sorted(folder.glob("nccl.*.log"))
    show_logs(files)
    log = nccl_log.read_files(files)
    if env.get("NCCL_DEBUG") not in READS_NCCL:
        return log, [], f"not read (NCCL_DEBUG={env.get('NCCL_DEBUG')}: the network is in NCCL's INFO lines)"
    empty = nccl_log.no_log(files, f"{folder} (NCCL_DEBUG_FILE={env['NCCL_DEBUG_FILE']})", log)
    if empty:
        printed = nccl_log.read(output)
        if printed.lines:
            return printed, [], (nccl_log.summary(printed) + f" (read from the check's output: {empty}; "
                                 f"{printed.cut} cut line(s) of glued output dropped)")
        return log, [empty + ": did the check reach NCCL (a GPU in the container, NCCL_DEBUG=INFO)?"], "no NCCL log"
    return log, [], nccl_log.summary(log)


def finite(value: Any) -> bool:
    """A JSON number that is neither NaN nor infinite (json reads NaN, Infinity and -Infinity), never a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# What the checks below read from rank 0's result: the JSON type each needs, and its name in a message. The losses
# must be finite (NaN and Infinity, which json reads, are no JSON numbers): `last < first` holds for -Infinity
# after 1.0 and for 1.0 after Infinity.
RESULT_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "backend": (lambda v: isinstance(v, str), "a string"),
    "world_size": (lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number"),
    "identical": (lambda v: isinstance(v, bool), "true or false"),
    "first_loss": (finite, "a number"), "last_loss": (finite, "a number")}


def _json_line(text: str, name: str, fields: Callable[[Any], str]) -> tuple[dict[str, Any] | None, str]:
    """A `NAME` line's JSON object, or None and what is wrong with it (the check broke its contract): FIELDS
    says what is wrong with the parsed value, '' when nothing is."""
    shown = text.strip()[:120]
    try:
        value = json.loads(text)
    except ValueError as exc:
        return None, f"the check printed a {name} line that is not JSON ({exc}): {shown}"
    wrong = fields(value)
    return (None, f"{wrong}: {shown}") if wrong else (value, "")


def result_fault(result: Any) -> str:
    if not isinstance(result, dict):
        return "the check printed a DDP_RESULT line that is not a JSON object"
    # bool is an int to Python: true is no world size, 1 no answer to `identical`
    wrong = [f"{name} ({words})" for name, (test, words) in RESULT_FIELDS.items() if not test(result.get(name))]
    return f"the check's DDP_RESULT line has no valid {', '.join(wrong)}" if wrong else ""


def whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def rank_fault(mark: Any) -> str:
    if (not isinstance(mark, dict) or not all(whole(mark.get(k)) for k in ("rank", "local_rank", "local_world_size"))
            or mark["local_rank"] >= mark["local_world_size"] or not whole(mark.get("restart", 0))):
        return ("the check's DDP_RANK line needs rank, local_rank and local_world_size (whole numbers, local_rank "
                "below local_world_size; restart, if there, a whole number)")
    return ""


def owed_result(me: str | None, marks: list[dict[str, Any]], env: dict[str, str],
                ranked: bool = False) -> tuple[str, str]:
    """Why this node fails without rank 0's DDP_RESULT line ('' when it need not have seen it), and what the log
    says instead: where rank 0 ran, by this node's process id, its node rank (RANKED) or its processes' DDP_RANK
    lines."""
    if env.get(OWN_WORKLOAD_ENV) == "1":
        return "", ""
    if ranked and me is not None:   # torchrun's static rendezvous: node 0 runs ranks 0 to G-1
        if me == "0":
            return ("node rank 0 (RANK=0: the PyTorchJob's Master, whose outcome is the job's) runs global rank 0, "
                    "which ended without its DDP_RESULT line"), ""
        return "", (f"verify_ddp.py: node rank {me} (RANK); global rank 0 runs on node rank 0 (the PyTorchJob's "
                    "Master), whose verifier checks its DDP_RESULT")
    if me is not None:   # a process id: process 0 reports
        return ("process 0 ended without its DDP_RESULT line" if me == "0" else ""), ""
    host = socket.gethostname()
    if not marks:
        return (f"the check printed no DDP_RANK line on this node ({host}), so nothing says whether global rank 0 "
                "ran here and owed its DDP_RESULT line (torchrun chooses the node of rank 0: every process of the "
                "check must print `DDP_RANK {\"rank\": R, \"local_rank\": L, \"local_world_size\": N}`)"), ""
    last = max(m.get("restart", 0) for m in marks)   # torchrun's latest attempt: a restart may rank anew
    marks = [m for m in marks if m.get("restart", 0) == last]
    ranks = sorted({m["rank"] for m in marks})
    if 0 in ranks:
        return f"global rank 0 ran on this node ({host}) and ended without its DDP_RESULT line", ""
    sizes = sorted({m["local_world_size"] for m in marks})
    missing = sorted(set(range(sizes[-1])) - {m["local_rank"] for m in marks})
    if missing or len(sizes) > 1:
        return (f"this node's DDP_RANK lines do not cover its local ranks (local world size "
                f"{' and '.join(map(str, sizes))}; no line from local rank(s) {', '.join(map(str, missing)) or '-'}), "
                f"so nothing says whether global rank 0 ran here ({host}) and owed its DDP_RESULT line"), ""
    return "", (f"verify_ddp.py: global rank(s) {', '.join(map(str, ranks))} ran on this node ({host}); rank 0 ran "
                "on another node, whose verifier checks its DDP_RESULT")


def check_fabric_settings() -> None:
    """The fabric settings read after the check has run, read now: a bad one stops the node before it runs (once a
    traceback after every GPU had run)."""
    for name in ("DDP_GPUS_PER_NODE", "DDP_FABRIC_NICS"):
        if os.environ.get(name):
            count_setting(name, os.environ[name])
    if os.environ.get("DDP_FABRIC_RATE"):
        try:
            busbw.link_rate(os.environ["DDP_FABRIC_RATE"])
        except ValueError as exc:
            sys.exit(f"DDP check failed: DDP_FABRIC_RATE: {exc}")


def main(argv: list[str]) -> int:
    if "DDP_EXPECT_WORLD_SIZE" not in os.environ or "DDP_EXPECT_BACKEND" not in os.environ:
        sys.exit("verify_ddp.py: set DDP_EXPECT_WORLD_SIZE and DDP_EXPECT_BACKEND (what the launcher asked for)")
    want_world = count_setting("DDP_EXPECT_WORLD_SIZE", os.environ["DDP_EXPECT_WORLD_SIZE"])
    want_backend = os.environ["DDP_EXPECT_BACKEND"]
    check_fabric_settings()
    command, me = resolve_command(argv)
    if os.environ.get("DDP_RDZV_HOST"):
        timeout = count_setting("DDP_RESOLVE_TIMEOUT_S", os.environ.get("DDP_RESOLVE_TIMEOUT_S", "900"))
        wait_for_name(os.environ["DDP_RDZV_HOST"], timeout)
    env = dict(os.environ)
    if os.environ.get("DDP_APPEND_LIBRARY_PATH"):
        # After the image's own folders (which may hold CUDA's forward-compatibility libraries).
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (env.get("LD_LIBRARY_PATH", ""),
                                                      os.environ["DDP_APPEND_LIBRARY_PATH"]) if p)
    folder = nccl_log_dir(env)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    result = None
    malformed = ""   # the first bad DDP_RESULT or DDP_RANK line's fault: the check is failed, after it ends
    output: list[str] = []
    marks: list[dict[str, Any]] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        if line.startswith(RESULT_PREFIX):
            result, fault = _json_line(line[len(RESULT_PREFIX):], "DDP_RESULT", result_fault)
            malformed = malformed or fault
        elif line.startswith(RANK_PREFIX):
            mark, fault = _json_line(line[len(RANK_PREFIX):], "DDP_RANK", rank_fault)
            marks += [mark] if mark is not None else []
            malformed = malformed or fault
        elif " NCCL " in line:
            output.append(line)
    code = proc.wait()
    log, problems, transport = read_nccl(folder, "".join(output), env)
    if folder is not None and not os.environ.get("DDP_NCCL_LOG_DIR"):   # ours, printed above: /tmp may be the node's
        shutil.rmtree(folder, ignore_errors=True)
    if folder is not None:   # NCCL's: per node, whichever rank it hosts (gloo's is said in the pass line)
        print(f"DDP transport on this node ({socket.gethostname()}): {transport}", flush=True)
    if log is not None and not problems and env.get("NCCL_DEBUG") in READS_NCCL:
        problems = transport_problems(log, env)
    if code != 0:   # the check's own failure is the cause (the transport line above says what NCCL used)
        return code
    if malformed:
        print(f"DDP check failed: {malformed}", file=sys.stderr)
        return 1
    owed, elsewhere = owed_result(me, marks, env, NODE_RANK_ARG in argv) if result is None else ("", "")
    if owed:   # rank 0 ran here (or nothing says it did not): its result must be seen, here
        print(f"DDP check failed: {owed}", file=sys.stderr)
        return 1
    if elsewhere:
        print(elsewhere, flush=True)
    passed = ""
    if result is not None:
        if result.get("backend") != want_backend:
            problems.insert(0, f"trained with {result.get('backend')}, not {want_backend}"
                            + (" (no GPU reached the container? check NVIDIA_VISIBLE_DEVICES and the runtime"
                               + libcuda_hint(env) + ")" if want_backend == "nccl" else ""))
        if result["world_size"] != want_world:
            problems.append(f"world size {result['world_size']}, not the {want_world} asked for")
        if not result["identical"]:
            problems.append("ranks ended with different parameters")
        if not result["last_loss"] < result["first_loss"]:
            problems.append(f"loss did not fall ({result['first_loss']:.4f} -> {result['last_loss']:.4f})")
        passed = busbw_check(result, log, env, problems)
    if problems:
        print("DDP check failed: " + "; ".join(problems), file=sys.stderr)
        return 1
    if result is not None:
        read = log is not None and env.get("NCCL_DEBUG") in READS_NCCL and log.families()
        family = "+".join(log.families()) if read and log is not None else (
            nccl_log.SOCKET if want_backend == "gloo" else "not read")
        print(f"DDP check passed: world size {result['world_size']}, {result['backend']}, transport {family}, loss "
              f"{result['first_loss']:.4f} -> {result['last_loss']:.4f}{passed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
