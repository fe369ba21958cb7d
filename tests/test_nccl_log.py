"""Issue 49: NCCL's debug log read as NCCL writes it (buildtool/contracts/nccl_log.py), by the multi-node verifier
and by the image test of two-node rendezvous; and NCCL's log never lost on the way there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from buildtool.contracts import busbw, nccl_log

REPO = Path(__file__).resolve().parent.parent
NCCL_LOGS = REPO / "tests" / "fixtures" / "nccl"
sys.path.insert(0, str(REPO / "image-tests"))
sys.path.insert(0, str(REPO / "image-tests" / "pytorch"))
from harness import Probe  # noqa: E402
from test_rendezvous import nccl_between_nodes  # noqa: E402


def fixture(name: str) -> nccl_log.Log:
    return nccl_log.read((NCCL_LOGS / name).read_text())


@pytest.mark.parametrize(("name", "family"), [
    ("IB", "IB"), ("IBext", "IB"), ("IBext_v8", "IB"), ("IBext_v11", "IB"), ("NCCL RDMA Plugin v8", "IB"),
    ("Libfabric", "EFA"), ("AWS Libfabric", "EFA"), ("OFI", "EFA"), ("Socket", "Socket"),
    ("UCX", "unknown"), ("", "unknown"), ("Sockets", "unknown"), ("IBX", "unknown"),
])
def test_network_names_map_to_families(name: str, family: str) -> None:
    """The names NCCL and its plugins give (NCCL src/transport, nccl-rdma-sharp-plugins, aws-ofi-nccl)."""
    assert nccl_log.family_of(name) == family


def test_busbw_keys_the_families_nccl_log_names() -> None:
    assert (busbw.IB, busbw.EFA, busbw.SOCKET, busbw.UNKNOWN) == nccl_log.FAMILIES
    assert set(busbw.DEFAULT_RATES) | set(busbw.NO_FABRIC_FLOOR) == set(nccl_log.FAMILIES)


def test_a_process_is_its_host_and_pid_with_its_rank_gpu_devices_and_channels() -> None:
    log = fixture("ibext_v8.log")
    assert len(log.processes) == 8 and log.cut == 0
    proc = log.processes[("dgx-h100-07", "2213")]
    assert (proc.ranks, proc.cuda_dev, proc.network, proc.families) == ({2}, "2", "IBext_v8", ["IB"])
    assert proc.plugin == "NCCL RDMA Plugin v8" and proc.listed_nics() == 8
    assert proc.devices["IB"][2] == "mlx5_4:1" and proc.used_devices() == ["mlx5_4:1"]
    assert [c.text() for c in proc.channels] == ["rank 2 channel 02 [send] via NET/IBext_v8/2/GDRDMA",
                                                 "rank 2 channel 10 [receive] via NET/IBext_v8/2/GDRDMA"]


def test_names_with_spaces_busids_and_nccl_229_lines_are_read() -> None:
    old = fixture("aws-libfabric.log")            # NCCL 2.18: `0[101c0]`, plugin name with a space
    proc = old.processes[("ip-10-0-3-88", "3102")]
    assert proc.network == "AWS Libfabric" and proc.ofi_nics == 4 and proc.channels[0].network == "AWS Libfabric"
    new = fixture("ib-quarter-rate.log")          # NCCL 2.29: `[Rank 0] ... Init START`, port speeds
    proc = new.processes[("gpu-a01", "4127")]
    assert proc.ranks == {0} and proc.speeds_gbits == {"mlx5_0:1": 100.0, "mlx5_1:1": 100.0}
    assert fixture("libfabric.log").processes[("ip-10-1-17-42", "3101")].ofi_nics == 16


def test_libfabric_on_a_provider_other_than_efa_is_not_read_as_efa() -> None:
    """aws-ofi-nccl names its network `Libfabric` whatever libfabric provider it selected (nccl_ofi_net.cpp:
    `Selected provider is %s, fabric is %s (found %d nics)`); on `tcp` (no EFA device, FI_PROVIDER=tcp) NCCL's
    traffic is TCP, and a job that asked for EFA must not pass as EFA."""
    lines = ("n1:10:11 [0] NCCL INFO NET/OFI Selected provider is {}, fabric is {} (found 1 nics)\n"
             "n1:10:11 [0] NCCL INFO Using network Libfabric\n"
             "n1:10:11 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Libfabric/0\n")
    tcp = nccl_log.read(lines.format("tcp", "10.0.0.0/24")).processes[("n1", "10")]
    assert tcp.families == [nccl_log.SOCKET] and tcp.listed_nics() is None
    assert tcp.why == ["NET/OFI Selected provider is tcp, fabric is 10.0.0.0/24 (found 1 nics)"]
    assert nccl_log.summary(nccl_log.read(lines.format("tcp;ofi_rxm", "x"))).startswith("Socket (NET/Libfabric)")
    assert nccl_log.read(lines.format("verbs;ofi_rxm", "mlx5_0")).families() == [nccl_log.UNKNOWN]
    efa = nccl_log.read(lines.format("efa", "efa-direct")).processes[("n1", "10")]
    assert efa.families == [nccl_log.EFA] and efa.listed_nics() == 1 and efa.why == []


def test_intra_node_channels_are_kept_apart_from_net_ones() -> None:
    proc = fixture("ib.log").processes[("gpu-a01", "4127")]
    assert proc.local == ["P2P/CUMEM", "P2P/CUMEM"] and {c.network for c in proc.channels} == {"IB"}
    shm = nccl_log.read("h:1:2 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct\n")
    assert shm.processes[("h", "1")].local == ["SHM/direct"]


def test_glued_lines_are_cut_never_misread() -> None:
    """What the old verifier's regex (`... NCCL INFO (?P<text>.*)$`) made of a glued line: rank 0's network was
    `IBgpu-a01:4128:4191 [1] NCCL INFO Using network IB`. Now the cut piece is dropped and rank 1's record keeps
    its own host."""
    glued = "gpu-a01:4127:4190 [0] NCCL INFO Using network IBgpu-a01:4128:4191 [1] NCCL INFO Using network IB"
    old = re.compile(r"(?P<host>[^\s:]+):(?P<pid>[0-9]+):[0-9]+ \[(?P<dev>[^\]]*)\] NCCL INFO (?P<text>.*)$")
    assert old.search(glued)["text"] == "Using network IBgpu-a01:4128:4191 [1] NCCL INFO Using network IB"
    log = fixture("glued.log")
    assert log.cut == 2
    assert set(log.processes) == {("gpu-a01", "4127"), ("gpu-a01", "4128")}
    assert log.processes[("gpu-a01", "4128")].networks == ["IB"]
    rank0 = log.processes[("gpu-a01", "4127")]
    assert rank0.networks == [] and rank0.network == "IB"    # from its channels: its own line was cut
    assert [c.text() for c in log.channels()] == [          # rank 1's cut channel 00 is dropped, not misread
        "rank 0 channel 00 [receive] via NET/IB/0/GDRDMA", "rank 0 channel 01 [receive] via NET/IB/0/GDRDMA",
        "rank 1 channel 01 [send] via NET/IB/1/GDRDMA"]


def test_launcher_prefixes_timestamps_and_warnings() -> None:
    text = textwrap.dedent("""\
        [1,7]<stdout>:ip-172-32-38-1:21471:22316 [7] NCCL INFO Using network AWS Libfabric
        0: gpu-b02:77:90 [3] NCCL INFO Using network IB
        [2026-01-02 03:04:05] gpu-b02:78:91 [4] NCCL INFO Using network IB

        gpu-b02:79:92 [5] transport/net_ib.cc:123 (ncclIbInit) NCCL WARN NET/IB : Got completion with error 12
        gpu-b02:79:92 [5] NCCL INFO this is not a line NCCL prints
        """)
    log = nccl_log.read(text)
    assert {k: p.network for k, p in log.processes.items()} == {
        ("ip-172-32-38-1", "21471"): "AWS Libfabric", ("gpu-b02", "77"): "IB", ("gpu-b02", "78"): "IB",
        ("gpu-b02", "79"): ""}
    assert log.processes[("gpu-b02", "79")].warnings == ["NET/IB : Got completion with error 12"]


def test_no_log_names_what_was_found(tmp_path: Path) -> None:
    assert nccl_log.no_log([], "DIR") == "NCCL wrote no log: no file in DIR"
    empty = tmp_path / "nccl.h.1.log"
    empty.write_text("")
    assert nccl_log.no_log([empty], "DIR") == "NCCL wrote no log: 1 file(s) in DIR, all empty"
    junk = tmp_path / "nccl.h.2.log"
    junk.write_text("Traceback (most recent call last):\n")
    assert nccl_log.no_log([empty, junk], "DIR").startswith("NCCL wrote no log: 2 file(s) in DIR (35 bytes) hold no "
                                                          "NCCL INFO or WARN line")
    assert nccl_log.no_log([NCCL_LOGS / "ib.log"], "DIR") == ""


def test_hca_lists_count_what_they_name() -> None:
    assert nccl_log.asked_hcas("=mlx5_0:1,mlx5_1") == ["mlx5_0:1", "mlx5_1"]
    # NCCL reads `=` only at the start of the list: a later one is part of a device name (utils.cc parseStringList).
    assert nccl_log.asked_hcas("mlx5_0:1,=mlx5_1") == ["mlx5_0:1", "=mlx5_1"]
    assert nccl_log.hca_count("mlx5_0:1,=mlx5_1", ["mlx5_0:1", "mlx5_1:1"]) == 2   # asked two; the NIC check names
    assert not nccl_log.matches_hca("mlx5_1:1", "=mlx5_1")                           # the one no node has
    assert nccl_log.asked_hcas("^mlx5_2") is None and nccl_log.asked_hcas("") is None
    assert nccl_log.matches_hca("mlx5_0:1", "mlx5_0") and nccl_log.matches_hca("mlx5_0:1", "mlx5_0:1")
    assert not nccl_log.matches_hca("mlx5_0:2", "mlx5_0:1") and not nccl_log.matches_hca("mlx5_3:1", "mlx5_0")


# -- the image test of two-node rendezvous -----------------------------------------------------------

def probes(tmp_path: Path, **files: str) -> dict[str, Probe]:
    """Two nodes' probes whose folders hold FILES (name -> text) as ddp_train.py leaves NCCL's logs there."""
    found = {}
    for node in ("node0", "node1"):
        folder = tmp_path / node
        folder.mkdir(parents=True)
        for name, text in files.items():
            if name.startswith(node):
                (folder / name.split("/", 1)[1]).write_text(text)
        found[node] = Probe(step=node, argv=[], dir=folder)
    return found


def ib_of(pid: str) -> str:
    """One process's lines of ib.log, as a node of one GPU has them (no P2P channel to a GPU of its own node)."""
    return "".join(line + "\n" for line in (NCCL_LOGS / "ib.log").read_text().splitlines()
                   if f":{pid}:" in line and "via P2P" not in line)


def test_the_image_test_fails_an_empty_nccl_log(tmp_path: Path) -> None:
    """Before issue 49 test_rendezvous.py passed when NCCL's log files were there but empty."""
    found = probes(tmp_path, **{"node0/nccl-0.11.log": "", "node1/nccl-1.12.log": ""})
    with pytest.raises(AssertionError, match="NCCL wrote no log: 2 file.s. in .*, all empty"):
        nccl_between_nodes(found)
    with pytest.raises(AssertionError, match="NCCL wrote no log: no file in"):
        nccl_between_nodes(probes(tmp_path / "none"))


def test_the_image_test_reports_the_family_and_fails_a_shortcut(tmp_path: Path) -> None:
    healthy = nccl_between_nodes(probes(tmp_path, **{"node0/nccl-0.4127.log": ib_of("4127"),
                                                     "node1/nccl-1.4128.log": ""}))
    assert healthy.startswith("IB (NET/IB) in 1 process(es) (ranks 0)") and "GPUDirect RDMA on" in healthy
    p2p = "gpu-a01:9:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\n"
    with pytest.raises(AssertionError, match="NCCL took the two nodes for one host .*via P2P/CUMEM"):
        nccl_between_nodes(probes(tmp_path / "p2p", **{"node0/nccl-0.9.log": p2p}))
    no_net = "gpu-a01:9:9 [0] NCCL INFO Using network IB\n"
    with pytest.raises(AssertionError, match="names no NET channel between the two nodes"):
        nccl_between_nodes(probes(tmp_path / "nonet", **{"node0/nccl-0.9.log": no_net}))


# -- the log is never lost ------------------------------------------------------------------------------

C_PRINT = """\
import ctypes, os, sys
libc = ctypes.CDLL(None)
libc.printf(b"gpu-a01:1:1 [0] NCCL INFO Using network IB\\n")   # as NCCL's vfprintf to stdout: never flushed
if sys.argv[1] == "leave":
    from {module} import leave
    leave(0)
os._exit(0)
"""


@pytest.mark.parametrize(("module", "folder"), [
    ("jax_train", "image-tests/jax/scripts"),
    pytest.param("ddp_train", "image-tests/pytorch/scripts", marks=pytest.mark.host_torch),   # it imports torch
])
def test_c_stdio_lines_survive_the_scripts_exit(tmp_path: Path, module: str, folder: str) -> None:
    """Reproduced on CPU: NCCL's line, written through C stdio to a pipe, is lost when the process leaves by
    os._exit. The launchers' PYTHONUNBUFFERED keeps it (CPython then makes C's stdout unbuffered too), and so does
    the scripts' leave() (it flushes C stdio before os._exit)."""
    from buildtool.launch.multinode import MultiNodeJob

    script = tmp_path / "c_print.py"
    script.write_text(C_PRINT.format(module=module))
    line = "gpu-a01:1:1 [0] NCCL INFO Using network IB\n"
    base = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"PYTHONPATH": str(REPO / folder)}
    unbuffered = MultiNodeJob(image="x:1", nodes=2, gpus_per_node=8).env["PYTHONUNBUFFERED"]
    runs = {how: subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=120,
                                env=base | extra)
            for how, extra in (("exit", {}), ("leave", {}), ("unbuffered", {"PYTHONUNBUFFERED": unbuffered}))}
    assert [r.returncode for r in runs.values()] == [0, 0, 0], {k: r.stderr for k, r in runs.items()}
    assert runs["exit"].stdout == ""
    assert runs["leave"].stdout == runs["unbuffered"].stdout == line


def test_nccl_ib_hca_counts_a_prefix_as_the_nics_it_matches_and_honours_exact_matching():
    """NCCL's net_ib.cc: entries match device names by prefix, exactly after a leading `=` (after `^`)."""
    listed = [f"mlx5_{n}:1" for n in range(12)]
    assert nccl_log.hca_count("mlx5", listed) == 12
    assert nccl_log.hca_count("mlx5_0:1,mlx5_1:1", ["mlx5_0:1"]) == 2   # a named NIC that NCCL left out still counts
    assert nccl_log.hca_count("=mlx5_1", listed) == 1 and nccl_log.hca_count("mlx5_1", listed) == 3   # 1, 10, 11
    assert nccl_log.hca_count("^mlx5_1", listed) == 0 and nccl_log.hca_count("", listed) == 0
    assert nccl_log.hca_exact("=mlx5_0") and nccl_log.hca_exact("^=mlx5_0") and not nccl_log.hca_exact("mlx5_0")
    assert nccl_log.matches_hca("mlx5_10:1", "mlx5_1") and not nccl_log.matches_hca("mlx5_10:1", "mlx5_1", exact=True)


def test_nccl_230_rail_and_plane_fields_are_read_apart_from_the_device() -> None:
    """From NCCL 2.30 (NVIDIA/nccl 7ec092af, net_ib/init.cc) a device NCCL_IB_HCA gives a rail or plane
    (`HCA:PORT:RAIL:PLANE`) is listed as `[i]HCA:PORT[:RAIL][:PLANE]/LINK` (`::PLANE` without a rail); the device
    is still HCA:PORT, the name its port speed and NCCL_IB_HCA's entries (matched by name and port) use."""
    prefix = "gpu-a01:4127:4190 [0] NCCL INFO "
    text = "".join(prefix + line + "\n" for line in (
        "NET/IB: [0] mlx5_0:uverbs0:1/IB provider=Mlx5 speed=400000 context=0x1 pciPath=/sys/x ar=1 oooRqSize=0",
        "NET/IB : Using [0]mlx5_0:1:0:1/IB [1]mlx5_1:1:1/IB [2]mlx5_2:1::0/RoCE [3]mlx5_3:1/IB [RO]; "
        "OOB eth0:10.0.0.1<0>",
        "Using network IB",
        "Channel 00/0 : 3[1] -> 0[0] [receive] via NET/IB/0/GDRDMA"))
    proc = nccl_log.read(text).processes[("gpu-a01", "4127")]
    assert proc.devices["IB"] == {0: "mlx5_0:1", 1: "mlx5_1:1", 2: "mlx5_2:1", 3: "mlx5_3:1"}
    assert proc.ib_rails == {"mlx5_0:1": (0, 1), "mlx5_1:1": (1, None), "mlx5_2:1": (None, 0)}
    assert proc.used_devices() == ["mlx5_0:1"] and set(proc.speeds_gbits) <= set(proc.devices["IB"].values())
    assert nccl_log.matches_hca("mlx5_0:1", "mlx5_0:1") and nccl_log.matches_hca("mlx5_0:1", "mlx5_0:1:0:1")
    assert nccl_log.matches_hca("mlx5_0:1", "mlx5_0:1:0:1", exact=True)
    assert not nccl_log.matches_hca("mlx5_0:2", "mlx5_0:1:0:1")
    assert nccl_log.hca_count("mlx5_0:1:0:1,mlx5_1:1:1", list(proc.devices["IB"].values())) == 2


def test_aws_ofi_nccl_before_1_6_names_its_provider_without_a_nic_count() -> None:
    """aws-ofi-nccl v1.0 to v1.5 print `NET/OFI Selected Provider is %s` with no `(found N nics)` (src/nccl_ofi_net.c
    at v1.5.0-aws; determined-ai/environments#169 shows `NCCL INFO NET/OFI Selected Provider is cxi` on Slingshot);
    the line was not read, so `Using network AWS Libfabric` on the cxi or tcp provider passed as EFA."""
    lines = ("nid000019:51404:52019 [0] NCCL INFO NET/OFI Selected Provider is {}\n"
             "nid000019:51404:52019 [0] NCCL INFO Using network AWS Libfabric\n")
    cxi = nccl_log.read(lines.format("cxi")).processes[("nid000019", "51404")]
    assert cxi.ofi_provider == "cxi" and cxi.families == [nccl_log.UNKNOWN] and cxi.ofi_nics is None
    assert nccl_log.read(lines.format("tcp")).families() == [nccl_log.SOCKET]
    efa = nccl_log.read(lines.format("efa")).processes[("nid000019", "51404")]
    assert efa.families == [nccl_log.EFA] and efa.listed_nics() is None and efa.why == []


def test_the_socket_threads_line_keeps_the_socket_devices_listed() -> None:
    """NCCL prints `NET/Socket: Using %d threads and %d sockets per thread` when it connects (src/transport/
    net_socket.cc, ncclNetSocketGetNsockNthread; on AWS and GCP NICs by default), after `NET/Socket : Using
    [0]eth0:...`: it was read as a device list of none, so the interfaces listed were lost and the summary named
    NET/Socket/0 instead of eth0."""
    text = "".join(f"gpu-a01:4128:4191 [1] NCCL INFO {line}\n" for line in (
        "NET/Socket : Using [0]ens5:172.31.0.112<0>", "Using network Socket",
        "NET/Socket: Using 2 threads and 8 sockets per thread",
        "Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0"))
    proc = nccl_log.read(text).processes[("gpu-a01", "4128")]
    assert proc.devices["Socket"] == {0: "ens5"} and proc.used_devices() == ["ens5"]


def test_a_port_speed_change_during_the_run_is_its_rate() -> None:
    """From NCCL 2.30.7 (NVIDIA/nccl fdf50c5e, net_ib/common.cc) the IB async thread prints `NET/IB : %s:%d speed
    change detected: %d -> %s Mbps` when a port retrains; it was not read, so an NDR port that fell to 100 Gb/s
    after init kept its 400 Gb/s and the rate check (--fabric-rate NDR) passed it."""
    from buildtool.launch import verify_ddp

    text = "".join(f"gpu-a01:4127:4190 [0] NCCL INFO {line}\n" for line in (
        "NET/IB: [0] mlx5_0:uverbs0:1/IB provider=Mlx5 speed=400000 context=0x1 pciPath=/sys/x ar=1 oooRqSize=0",
        "NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB eth0:10.0.0.1<0>", "Using network IB",
        "Channel 00/0 : 3[1] -> 0[0] [receive] via NET/IB/0/GDRDMA",
        "NET/IB : mlx5_0:1 speed change detected: 400000 -> 100000 Mbps",
        "NET/IB : mlx5_0:1 speed change detected: 100000 -> N/A Mbps"))
    log = nccl_log.read(text)
    assert log.processes[("gpu-a01", "4127")].retrained_gbits == {"mlx5_0:1": 100.0}
    assert verify_ddp.transport_problems(log, {"DDP_FABRIC_RATE": "NDR"}) == [
        "NCCL reports port(s) slower than NDR 400 Gb/s, the rate the job declared (--fabric-rate NDR): mlx5_0:1 at "
        "100 Gb/s (a link trained down: cable, transceiver or switch port)"]


def test_a_fused_nic_is_the_devices_nccl_fused_into_it() -> None:
    """From NCCL 2.24 (6aae3792) the ports of one card are fused by default (NCCL_NET_MERGE_LEVEL=PORT) into a
    virtual NIC numbered after the listed ones, `NET/IB : Made virtual device [%d] name=%s speed=%d ndevs=%d`
    (net_ib.cc; 2.29 adds ` rail=%d plane=%d`; names joined by +), and the channels name that index: `NET/IB/2` was
    read as one NIC of no name, so a node using both ports failed the NIC check ("NCCL used 1 NIC(s) ... not the 2
    asked for")."""
    from buildtool.launch import verify_ddp

    text = "".join(f"gpu-a01:4127:4190 [0] NCCL INFO {line}\n" for line in (
        "NET/IB : Made virtual device [0] name=mlx5_0 speed=200000 ndevs=1",
        "NET/IB : Made virtual device [1] name=mlx5_0 speed=200000 ndevs=1",
        "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_0:2/IB [RO]; OOB eth0:10.0.0.1<0>", "Using network IB",
        "NET/IB : Made virtual device [2] name=mlx5_0+mlx5_0 speed=400000 ndevs=2",
        "Channel 00/0 : 3[1] -> 0[0] [receive] via NET/IB/2/GDRDMA",
        "Channel 01/0 : 0[0] -> 1[1] [send] via NET/IB/2/GDRDMA"))
    log = nccl_log.read(text)
    assert log.processes[("gpu-a01", "4127")].used_devices() == ["mlx5_0:1", "mlx5_0:2"]
    env = {"NCCL_IB_HCA": "mlx5_0:1,mlx5_0:2", "DDP_GPUS_PER_NODE": "2", "DDP_EXPECT_TRANSPORT": "IB"}
    assert verify_ddp.transport_problems(log, env) == []


def test_hca_entries_with_an_empty_name_or_port_are_read_as_nccl_reads_them() -> None:
    """NCCL's parseStringList (src/misc/utils.cc) drops an entry whose name is empty (`:1`) and reads an empty port
    (`mlx5_0:`) as any port (-1, which matchPort takes for every port). `:1` counted as a NIC asked for, so a node
    whose one named NIC carried every channel failed the NIC check, and `mlx5_0:` matched no port, so the check
    named the NIC NCCL used as unused."""
    assert nccl_log.asked_hcas(":1,mlx5_0") == ["mlx5_0"]
    assert nccl_log.hca_count(":1,mlx5_0", ["mlx5_0:1", "mlx5_1:1"]) == 1
    assert nccl_log.matches_hca("mlx5_0:1", "mlx5_0:") and nccl_log.matches_hca("mlx5_0:2", "mlx5_0::0")
    assert not nccl_log.matches_hca("mlx5_1:1", "mlx5_0:")


def test_a_rail_that_is_no_number_is_no_traceback() -> None:
    """NCCL prints a rail as `:%d` (net_ib/init.cc); a garbled `NET/IB : Using [0]mlx5_0:1:-/IB` (a lone minus sign,
    which the rail's pattern `-?\\d*` took) ended the verifier in a ValueError traceback from int('-'); the entry is
    now kept as the name it lists, with no rail."""
    proc = nccl_log.read("h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1:-/IB ; OOB eth0:10.0.0.1<0>\n").processes[
        ("h", "1")]
    assert proc.devices["IB"] == {0: "mlx5_0:1:-"} and proc.ib_rails == {}
