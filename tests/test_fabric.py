"""Issue 49: the multi-node verifier on the fabrics GPU clusters have. NCCL writes one log file per process
(NCCL_DEBUG_FILE, set by the verifier); the verifier reads them into transport families (IB with NVIDIA's HPC-X
`IBext*` plugin, EFA's `Libfabric`, Socket, unknown), the NICs NCCL's NET channels used and GPUDirect RDMA per
channel, fails what the job asked for and did not get (naming the rank and what NCCL used), fails an empty or
missing log on its own, and compares the cross-node bus bandwidth with the floor of the fabric's NICs.

No GPU and no cluster here: a stand-in check writes a fixture's lines (tests/fixtures/nccl/, NCCL's formats,
README there) as NCCL does, one file per HOST:PID into NCCL_DEBUG_FILE, or to stdout where NCCL could not open
the file, then prints rank 0's result."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from buildtool.common.errors import UserError
from buildtool.contracts import busbw, nccl_log
from buildtool.launch import verify_ddp
from buildtool.launch.multinode import VERIFY_FILES, MultiNodeJob, NcclSettings, write_verifier

REPO = Path(__file__).resolve().parent.parent
NCCL_LOGS = REPO / "tests" / "fixtures" / "nccl"
# A single-platform GPU cell (pytorch-ngc:25.10 is built for linux/amd64 and linux/arm64: --platform needed).
IMAGE = "127.0.0.1:5000/pytorch-ngc-dev:0123456789ab-25.01"
HCAS8 = ",".join(f"mlx5_{i}:1" for i in (0, 3, 4, 5, 6, 9, 10, 11))

# Writes the fixture as NCCL would (mode files: one NCCL_DEBUG_FILE per HOST:PID; stdout: NCCL could not open it;
# empty: a file NCCL opened and never wrote; none: nothing at all), then prints rank 0's result.
STANDIN = """\
import os, re, sys
text, mode, result = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
target = os.environ.get("NCCL_DEBUG_FILE", "")
if mode == "files":
    groups = {}
    for line in text.splitlines():
        found = re.match(r"([^\\s:]+):(\\d+):\\d+ \\[", line)
        if found:
            groups.setdefault(found.groups(), []).append(line)
    for (host, pid), lines in groups.items():
        with open(target.replace("%h", host).replace("%p", pid), "w") as fh:
            fh.write("\\n".join(lines) + "\\n")
elif mode == "stdout":
    sys.stdout.write(text)
elif mode == "empty":
    open(target.replace("%h", "gpu-a01").replace("%p", "4127"), "w").close()
print("DDP_RESULT " + result)
"""


def run_verifier(tmp_path: Path, log: str, peak: float | None, job: MultiNodeJob | None = None, mode: str = "files",
                 **env: str) -> subprocess.CompletedProcess[str]:
    """The shipped verifier around the stand-in check printing LOG's NCCL lines and rank 0's result (PEAK: its
    cross-node bus bandwidth, None: not measured), with JOB's environment (default: 2 nodes of 2 GPUs)."""
    job = job or MultiNodeJob(image=IMAGE, nodes=2, gpus_per_node=2)
    result: dict = {"backend": job.backend, "world_size": job.world_size, "first_loss": 1.0, "last_loss": 0.1,
                    "identical": True, "param_hashes": ["h"] * job.world_size}
    if peak is not None:
        result["busbw"] = {"peak_GBps": peak, "ranks": job.world_size, "sizes": []}
    check = tmp_path / "check.py"
    check.write_text(STANDIN)
    verify = write_verifier(tmp_path)
    want = {"PATH": "/usr/bin:/bin", **job.expect_env, "DDP_NCCL_LOG_DIR": str(tmp_path / "nccl"), **env}
    return subprocess.run([sys.executable, str(verify), sys.executable, str(check), str(NCCL_LOGS / log), mode,
                           json.dumps(result)], capture_output=True, text=True, timeout=60, env=want)


def ib_job(hcas: str = "mlx5_0:1,mlx5_1:1", gpus: int = 2, **fabric) -> MultiNodeJob:
    return MultiNodeJob(image=IMAGE, nodes=2, gpus_per_node=gpus, nccl=NcclSettings(ib_hca=hcas), **fabric)


def efa_job(rate: str = "", devices: int = 0, gpus: int = 2) -> MultiNodeJob:
    return MultiNodeJob(image=IMAGE, nodes=2, gpus_per_node=gpus, fabric_rate=rate, efa_devices=devices)


# -- healthy fabrics pass, and say what NCCL used ------------------------------------------------------

def test_ib_with_gdr_passes_reporting_family_nics_and_gdr(tmp_path: Path) -> None:
    proc = run_verifier(tmp_path, "ib.log", 46.0, ib_job())
    assert proc.returncode == 0, proc.stderr
    assert ("): IB (NET/IB) in 2 process(es) (ranks 0-1); NICs used: mlx5_0:1, mlx5_1:1 (2 of 2 listed); GPUDirect "
            "RDMA on (4 of 4 NET channels)\n") in proc.stdout
    assert ("DDP check passed: world size 4, nccl, transport IB, loss 1.0000 -> 0.1000, cross-node bus bandwidth "
            "46.0 GB/s over IB (floor 25 GB/s: 0.5 x 2 NIC(s) x HDR 200 Gb/s (2 NIC(s): NCCL_IB_HCA names 2) (no rate "
            "declared: the slowest documented; declare --fabric-rate))") in proc.stdout


@pytest.mark.parametrize("peak", [46.0, 1.0])   # the check passes; it fails (below the floor)
def test_the_nccl_log_folder_the_verifier_made_is_removed_after_it_is_read(tmp_path: Path, peak: float) -> None:
    """Without DDP_NCCL_LOG_DIR the verifier made a folder under /tmp for NCCL's per-process logs and left it there
    after printing them into the job's log: under apptainer /tmp is the node's own, so every run left one behind on
    every node. It is removed once read, whatever the outcome; a folder the job names is the job's to keep."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = run_verifier(tmp_path, "ib.log", peak, ib_job(), DDP_NCCL_LOG_DIR="", TMPDIR=str(temp))
    assert proc.returncode == (0 if peak > 25 else 1), proc.stderr
    assert "NCCL log nccl.gpu-a01" in proc.stdout   # the logs were there, and were printed
    assert list(temp.iterdir()) == []
    proc = run_verifier(tmp_path, "ib.log", 46.0, ib_job(), TMPDIR=str(temp))
    assert proc.returncode == 0 and list((tmp_path / "nccl").glob("nccl.*.log")), proc.stderr


def test_hpcx_ibext_v8_is_infiniband_and_passes_an_ndr_fabric(tmp_path: Path) -> None:
    """NGC images load NVIDIA's HPC-X plugin: `Using network IBext_v8`, `via NET/IBext_v8/N/GDRDMA`. Before issue 49
    the verifier required the name IB and failed this healthy fabric, saying NCCL had fallen back to sockets."""
    job = ib_job(HCAS8, gpus=8, fabric_rate="NDR", require_gdr=True)
    proc = run_verifier(tmp_path, "ibext_v8.log", 380.0, job)
    assert proc.returncode == 0, proc.stderr
    assert "IB (NET/IBext_v8) in 8 process(es) (ranks 0-7); NICs used: mlx5_0:1, mlx5_10:1" in proc.stdout
    assert "(8 of 8 listed); GPUDirect RDMA on (16 of 16 NET channels)" in proc.stdout
    assert ("cross-node bus bandwidth 380.0 GB/s over IB (floor 200 GB/s: 0.5 x 8 NIC(s) x NDR 400 Gb/s (8 NIC(s): "
            "NCCL_IB_HCA names 8))") in proc.stdout
    assert "socket" not in (proc.stdout + proc.stderr).lower()


@pytest.mark.parametrize(("log", "network", "job"), [
    ("libfabric.log", "Libfabric", efa_job("p5en.48xlarge")),
    ("aws-libfabric.log", "AWS Libfabric", efa_job(devices=4)),
])
def test_efa_through_aws_ofi_nccl_passes(tmp_path: Path, log: str, network: str, job: MultiNodeJob) -> None:
    proc = run_verifier(tmp_path, log, 90.0, job)
    assert proc.returncode == 0, proc.stderr
    assert f"EFA (NET/{network}) in 2 process(es) (ranks 0-1)" in proc.stdout
    assert "GPUDirect RDMA on (4 of 4 NET channels)" in proc.stdout and "transport EFA" in proc.stdout
    assert "socket" not in (proc.stdout + proc.stderr).lower()


def test_the_efa_instance_rate_sets_the_floor(tmp_path: Path) -> None:
    """p5en.48xlarge: 3200 Gb/s per instance of 8 GPUs; 2 of them here get a quarter: 0.5 x 800 Gb/s = 50 GB/s."""
    proc = run_verifier(tmp_path, "libfabric.log", 40.0, efa_job("p5en.48xlarge"))
    assert proc.returncode == 1
    assert ("cross-node all-reduce bus bandwidth 40.0 GB/s over EFA is below the floor 50 GB/s (0.5 x p5en.48xlarge "
            "3200 Gb/s per instance x 2/8 of its GPUs)") in proc.stderr


def test_sockets_not_asked_for_are_reported_with_no_floor_by_a_stated_reason(tmp_path: Path) -> None:
    proc = run_verifier(tmp_path, "socket.log", 1.9)
    assert proc.returncode == 0, proc.stderr
    assert "Socket (NET/Socket) in 2 process(es) (ranks 0-1); NICs used: eth0 (1); GPUDirect RDMA off" in proc.stdout
    assert "(no floor for Socket: TCP sockets are NCCL's fallback" in proc.stdout
    assert "transport Socket" in proc.stdout


# -- faults fail, naming the rank, what NCCL used and why ---------------------------------------------

def test_ib_asked_but_sockets_used_fails_naming_each_rank_and_the_cause(tmp_path: Path) -> None:
    proc = run_verifier(tmp_path, "socket.log", 22.4, ib_job())
    assert proc.returncode == 1, proc.stdout
    assert ("the job asked for IB (InfiniBand/RoCE through verbs), but 2 of 2 NCCL process(es) on this node used "
            "another network: rank 0 (gpu-a01:4127, GPU 0) Socket (NET/Socket), rank 1 (gpu-a01:4128, GPU 1) Socket "
            "(NET/Socket); NCCL said `Failed to open libibverbs.so[.1]`: without libibverbs1") in proc.stderr


def test_efa_asked_but_sockets_used_names_the_efa_cause(tmp_path: Path) -> None:
    proc = run_verifier(tmp_path, "socket.log", 22.4, efa_job(devices=16))
    assert proc.returncode == 1
    assert "the job asked for EFA (AWS EFA through libfabric (aws-ofi-nccl)), but 2 of 2" in proc.stderr
    assert "without the aws-ofi-nccl plugin (libnccl-net.so) and libfabric's EFA provider" in proc.stderr


def test_mixed_ranks_fail_naming_only_the_rank_that_left_the_fabric(tmp_path: Path) -> None:
    proc = run_verifier(tmp_path, "mixed.log", 30.0, ib_job())
    assert proc.returncode == 1
    assert ("but 1 of 2 NCCL process(es) on this node used another network: rank 1 (gpu-a01:4128, GPU 1) Socket "
            "(NET/Socket); NCCL said `NET/IB : No device found.`") in proc.stderr
    assert "rank 0 (gpu-a01:4127" not in proc.stderr


@pytest.mark.parametrize(("log", "job", "used"), [
    ("ib.log", efa_job(devices=16), "IB (NET/IB)"),
    ("ibext_v8.log", efa_job("p5.48xlarge", gpus=8), "IB (NET/IBext_v8)"),
    ("libfabric.log", ib_job(), "EFA (NET/Libfabric)"),
    ("aws-libfabric.log", ib_job(), "EFA (NET/AWS Libfabric)"),
    ("ucx.log", ib_job(), "unknown (NET/UCX)"),
])
def test_another_fabric_is_named_as_itself_never_as_sockets(tmp_path: Path, log: str, job: MultiNodeJob,
                                                           used: str) -> None:
    """Before issue 49 every network but `IB` was reported as a fall-back to TCP sockets."""
    proc = run_verifier(tmp_path, log, 90.0, job)
    assert proc.returncode == 1
    assert "used another network: rank 0 (" in proc.stderr and f") {used}" in proc.stderr
    assert "socket" not in proc.stderr.lower()


def test_an_unknown_network_is_reported_as_unknown(tmp_path: Path) -> None:
    proc = run_verifier(tmp_path, "ucx.log", 90.0)
    assert proc.returncode == 0, proc.stderr
    assert "unknown (NET/UCX) in 2 process(es)" in proc.stdout and "(no floor for unknown: NCCL named" in proc.stdout
    assert "socket" not in proc.stdout.lower()


def test_gdr_asked_fails_each_channel_without_it(tmp_path: Path) -> None:
    proc = run_verifier(tmp_path, "ib-nogdr.log", 46.0, ib_job(require_gdr=True))
    assert proc.returncode == 1
    assert ("GPUDirect RDMA was asked for (--require-gdr), but 4 of 4 NET channel(s) on this node ran without it (no "
            "/GDRDMA): rank 0 channel 00 [receive] via NET/IB/0, rank 0 channel 01 [receive] via NET/IB/0, rank 1 "
            "channel 00 [send] via NET/IB/1, rank 1 channel 01 [send] via NET/IB/1: NCCL uses it only with the host's "
            "peer-memory module (nvidia-peermem)") in proc.stderr


@pytest.mark.parametrize(("log", "gdr"), [("ib.log", True), ("ib-nogdr.log", False)])
def test_gdr_on_passes_and_gdr_off_not_asked_for_is_reported_only(tmp_path: Path, log: str, gdr: bool) -> None:
    proc = run_verifier(tmp_path, log, 46.0, ib_job(require_gdr=gdr))
    assert proc.returncode == 0, proc.stderr
    assert f"GPUDirect RDMA {'on' if gdr else 'off'} (" in proc.stdout


def test_one_nic_of_eight_fails_by_the_nics_and_by_the_floor(tmp_path: Path) -> None:
    """NCCL listed one port (seven were down): every channel on mlx5_0; 47 GB/s is one NDR NIC's worth."""
    proc = run_verifier(tmp_path, "ib-one-nic.log", 47.0, ib_job(HCAS8, gpus=8, fabric_rate="NDR"))
    assert proc.returncode == 1
    assert ("NCCL used 1 NIC(s) on this node (mlx5_0:1), not the 8 asked for (NCCL_IB_HCA names 8, one per GPU of 8); "
            "unused: mlx5_3:1, mlx5_4:1, mlx5_5:1, mlx5_6:1, mlx5_9:1, mlx5_10:1, mlx5_11:1") in proc.stderr
    assert ("cross-node all-reduce bus bandwidth 47.0 GB/s over IB is below the floor 200 GB/s (0.5 x 8 NIC(s) x NDR "
            "400 Gb/s (8 NIC(s): NCCL_IB_HCA names 8)); NCCL used 1 NIC(s) on this node (mlx5_0:1)") in proc.stderr


def test_a_fabric_at_a_quarter_of_its_rate_fails_the_floor(tmp_path: Path) -> None:
    """Healthy NDR: about 48 GB/s per NIC (nccl-tests#267), 384 for 8; a quarter of that is 96."""
    job = ib_job(HCAS8, gpus=8, fabric_rate="NDR")
    assert run_verifier(tmp_path, "ibext_v8.log", 0.96 * 8 * 50, job).returncode == 0
    proc = run_verifier(tmp_path, "ibext_v8.log", 0.96 * 8 * 50 / 4, job)
    assert proc.returncode == 1
    assert "cross-node all-reduce bus bandwidth 96.0 GB/s over IB is below the floor 200 GB/s" in proc.stderr


def test_ports_nccl_reports_slower_than_the_declared_rate_fail(tmp_path: Path) -> None:
    """NCCL (INFO from 2.27) prints each port's rate (`speed=100000`, Mb/s): NDR ports trained down to a quarter."""
    proc = run_verifier(tmp_path, "ib-quarter-rate.log", 46.0, ib_job(fabric_rate="NDR"))
    assert proc.returncode == 1
    assert ("NCCL reports port(s) slower than NDR 400 Gb/s, the rate the job declared (--fabric-rate NDR): mlx5_0:1 at "
            "100 Gb/s, mlx5_1:1 at 100 Gb/s") in proc.stderr


@pytest.mark.parametrize(("mode", "said"), [
    ("none", "NCCL wrote no log: no file in "),
    ("empty", "NCCL wrote no log: 1 file(s) in "),
])
def test_an_empty_or_missing_nccl_log_is_its_own_failure(tmp_path: Path, mode: str, said: str) -> None:
    """Before issue 49 a lost log read as `no transport` only where IB was asked for, and passed otherwise."""
    proc = run_verifier(tmp_path, "ib.log", 46.0, mode=mode)
    assert proc.returncode == 1
    line = next(line for line in proc.stderr.splitlines() if line.startswith("DDP check failed"))
    assert said in line and f"(NCCL_DEBUG_FILE={tmp_path}/nccl/nccl.%h.%p.log)" in line
    assert mode != "empty" or ", all empty" in line


def test_glued_output_of_two_ranks_is_not_misparsed(tmp_path: Path) -> None:
    """NCCL could not open its file and wrote to the shared stdout pipe, where two ranks' lines are glued:
    `... Using network IBgpu-a01:4128:4191 [1] NCCL INFO Using network IB`. The old verifier took
    `IBgpu-a01:4128:4191 [1] NCCL INFO Using network IB` for rank 0's network and failed the job."""
    proc = run_verifier(tmp_path, "glued.log", 46.0, ib_job(), mode="stdout")
    assert proc.returncode == 0, proc.stderr
    assert ("IB (NET/IB) in 2 process(es) (ranks 0-1); NICs used: mlx5_0:1, mlx5_1:1 (2 of 2 listed); GPUDirect RDMA "
            "on (3 of 3 NET channels) (read from the check's output: NCCL wrote no log: no file in") in proc.stdout
    assert "2 cut line(s) of glued output dropped" in proc.stdout and "NET/IBgpu" not in proc.stdout


def test_the_logs_are_printed_into_the_jobs_output(tmp_path: Path) -> None:
    proc = run_verifier(tmp_path, "ib.log", 46.0)
    assert "verify_ddp.py: NCCL log nccl.gpu-a01.4127.log (10 lines)\n" in proc.stdout
    assert "gpu-a01:4128:4191 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/IB/1/GDRDMA\n" in proc.stdout


def test_a_check_that_measures_no_busbw_says_so(tmp_path: Path) -> None:
    """JAX's check measures no bus bandwidth: the pass line says it was not measured, never a figure."""
    proc = run_verifier(tmp_path, "ib.log", None, ib_job())
    assert proc.returncode == 0 and "cross-node bus bandwidth not measured (no busbw table" in proc.stdout


def test_gloo_jobs_say_socket(tmp_path: Path) -> None:
    job = MultiNodeJob(image=IMAGE, nodes=2, gpus_per_node=0)
    proc = run_verifier(tmp_path, "empty.log", None, job, mode="none")
    assert proc.returncode == 0, proc.stderr
    assert "DDP check passed: world size 2, gloo, transport Socket, loss" in proc.stdout


# -- floors ------------------------------------------------------------------------------------------

def test_the_floor_catches_one_nic_of_eight_and_a_quarter_rate_and_passes_healthy_fabrics() -> None:
    ndr = busbw.cross_node_floor(busbw.IB, "NDR", 8, "NCCL_IB_HCA names 8", 8)
    healthy = 8 * 48.5          # nccl-tests#267: 48-49 GB/s per NDR NIC
    assert ndr.expected_GBps == 400 and ndr.floor_GBps == 200
    assert healthy > ndr.floor_GBps > healthy / 4 > healthy / 8
    hdr = busbw.cross_node_floor(busbw.IB, "HDR", 4, "x", 8)
    assert hdr.floor_GBps == 50 and hdr.floor_GBps < 4 * 24   # nccl-tests#119: 24 GB/s per HDR NIC
    p5 = busbw.cross_node_floor(busbw.EFA, "p5.48xlarge", None, "", 8)
    assert (p5.expected_GBps, p5.floor_GBps) == (400, 200)
    one_gpu = busbw.cross_node_floor(busbw.IB, "NDR", 4, "x", 1)     # one GPU drives about one NIC (nccl-tests#232)
    assert one_gpu.floor_GBps == 25 and "at most one per GPU of 1" in one_gpu.how


def test_every_figure_has_its_source_and_unknown_fabrics_are_refused() -> None:
    for rate in busbw.LINK_RATES.values():
        assert rate.source and rate.family in (busbw.IB, busbw.EFA)
    assert "ConnectX-7" in busbw.LINK_RATES["NDR"].source and "ConnectX-6" in busbw.LINK_RATES["HDR"].source
    assert busbw.cross_node_floor(busbw.SOCKET, "", 4, "x", 8).floor_GBps is None
    with pytest.raises(ValueError, match="fabric 'RoCEv9' is neither in DEFAULT_RATES nor in NO_FABRIC_FLOOR"):
        busbw.cross_node_floor("RoCEv9", "", 1, "x", 1)
    with pytest.raises(ValueError, match="--fabric-rate 'EDR' is not a documented rate; one of HDR, NDR"):
        busbw.link_rate("EDR")
    no_count = busbw.cross_node_floor(busbw.IB, "NDR", None, "", 8)
    assert no_count.floor_GBps is None and "the number of IB NICs is unknown" in no_count.how


# -- what the job asks for -------------------------------------------------------------------------

def test_asking_for_a_fabric_sets_the_expectations() -> None:
    job = ib_job(HCAS8, gpus=8, fabric_rate="NDR", require_gdr=True)
    assert {k: v for k, v in job.env.items() if k.startswith(("DDP_", "NCCL_", "PYTHON"))} == {
        "DDP_EXPECT_WORLD_SIZE": "16", "DDP_EXPECT_BACKEND": "nccl", "PYTHONUNBUFFERED": "1", "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_IB_HCA": HCAS8, "DDP_GPUS_PER_NODE": "8", "DDP_EXPECT_TRANSPORT": "IB",
        "DDP_EXPECT_GDR": "1", "DDP_FABRIC_RATE": "NDR", "DDP_STEPS": "40", "DDP_TIMEOUT_S": "900"}
    efa = efa_job("p5.48xlarge", devices=32, gpus=8)
    assert (efa.env["DDP_EXPECT_TRANSPORT"], efa.env["DDP_FABRIC_NICS"], efa.env["DDP_FABRIC_NICS_FROM"]) == (
        "EFA", "32", "--efa-resource asks for 32 EFA device(s)")
    plain = MultiNodeJob(image=IMAGE, nodes=2, gpus_per_node=8)
    assert "DDP_EXPECT_TRANSPORT" not in plain.env and plain.env["NCCL_DEBUG"] == "INFO"
    assert MultiNodeJob(image=IMAGE, nodes=2, gpus_per_node=8, rdma=True).env["DDP_EXPECT_TRANSPORT"] == "IB"


@pytest.mark.parametrize(("kwargs", "cause"), [
    ({"nccl": NcclSettings(debug="WARN", ib_hca="mlx5_0:1")},
     "--nccl-debug WARN: the job asks for IB (--nccl-ib-hca), and the check reads NCCL's INFO lines"),
    ({"require_gdr": True, "nccl": NcclSettings(debug="VERSION")}, "the job asks for GPUDirect RDMA (--require-gdr)"),
    ({"fabric_rate": "p5.48xlarge", "nccl": NcclSettings(ib_hca="mlx5_0")},
     "the job asks for two fabrics: EFA (--fabric-rate p5.48xlarge) and IB (--nccl-ib-hca); name one"),
    ({"fabric_rate": "EDR"}, "--fabric-rate 'EDR' is not a documented rate; one of HDR, NDR, p4d.24xlarge"),
    ({"require_gdr": True, "nodes": 1}, "--require-gdr check NCCL's traffic between nodes: they need a GPU job"),
    ({"fabric_nics": 8, "gpus_per_node": 0}, "--fabric-nics check NCCL's traffic between nodes"),
    ({"fabric_rate": "NDR", "nccl": NcclSettings(extra=(("NCCL_DEBUG_SUBSYS", "COLL"),))},
     "--nccl-env NCCL_DEBUG_SUBSYS=COLL: the job asks for IB (--fabric-rate NDR), and NCCL prints the network"),
])
def test_a_fabric_the_check_cannot_see_is_refused_naming_why(kwargs: dict, cause: str) -> None:
    settings = {"image": IMAGE, "nodes": 2, "gpus_per_node": 8, **kwargs}
    with pytest.raises(UserError) as raised:
        MultiNodeJob(**settings)
    assert cause in str(raised.value)


def test_nccl_debug_file_is_the_verifiers() -> None:
    with pytest.raises(UserError, match="--nccl-env NCCL_DEBUG_FILE: the verifier sets it, one file per process"):
        NcclSettings(extra=(("NCCL_DEBUG_FILE", "/tmp/x"),))


# -- the generated jobs carry the check --------------------------------------------------------------

JOBS = {   # an IB, an EFA and a socket job, as users write them
    "ib": ["--nccl-ib-hca", HCAS8, "--fabric-rate", "NDR", "--require-gdr"],
    "efa": ["--fabric-rate", "p5.48xlarge", "--require-gdr"],
    "socket": [],
}
EXPECTED = {
    "ib": {"DDP_EXPECT_TRANSPORT": "IB", "DDP_FABRIC_RATE": "NDR", "DDP_EXPECT_GDR": "1", "NCCL_IB_HCA": HCAS8},
    "efa": {"DDP_EXPECT_TRANSPORT": "EFA", "DDP_FABRIC_RATE": "p5.48xlarge", "DDP_EXPECT_GDR": "1"},
    "socket": {},
}


@pytest.mark.parametrize("kind", JOBS)
def test_k8s_output_carries_the_transport_check(run_cli, kind: str) -> None:
    extra = ["--efa-resource", "vpc.amazonaws.com/efa=32"] if kind == "efa" else []
    code, out, err = run_cli("k8s", IMAGE, "--gpus-per-node", "8", *JOBS[kind], *extra,
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert {name: docs[0]["data"][name] for name in VERIFY_FILES} == VERIFY_FILES
    container = docs[-1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert {k: env[k] for k in EXPECTED[kind]} == EXPECTED[kind] and env["DDP_GPUS_PER_NODE"] == "8"
    if kind == "socket":
        assert not {"DDP_EXPECT_TRANSPORT", "DDP_EXPECT_GDR", "DDP_FABRIC_RATE"} & set(env)
    if kind == "efa":
        assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == 32
        assert (env["DDP_FABRIC_NICS"], env["DDP_FABRIC_NICS_FROM"]) == (
            "32", "--efa-resource asks for 32 EFA device(s)")


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis", "oci"])
@pytest.mark.parametrize("kind", JOBS)
def test_slurm_output_carries_the_transport_check(run_cli, tmp_path: Path, kind: str, runtime: str) -> None:
    script = tmp_path / "ddp.sbatch"
    image = IMAGE
    extra = ["--runtime", runtime]
    if runtime == "oci":
        image = "/shared/bundles/ngc"
        extra += ["--shm-size", "8g", "--framework", "pytorch"]
    code, _, err = run_cli("slurm", image, "--gpus-per-node", "8", *JOBS[kind], *extra, "--out", str(script),
                           "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    text = script.read_text()
    for name, source in VERIFY_FILES.items():   # the verifier and the contracts it imports, in the job folder
        marker = name.replace(".", "_").upper()
        assert f"cat > \"$workdir/{name}\" <<'{marker}'\n{source.rstrip()}\n{marker}\n" in text
    for name, value in EXPECTED[kind].items():
        assert f"\nexport {name}={value}\n" in text
    if runtime == "oci":
        exported = next(w for w in text.split() if w.startswith("--export=DDP_")).removeprefix("--export=").split(",")
        assert set(EXPECTED[kind]) | {"DDP_GPUS_PER_NODE", "PYTHONUNBUFFERED"} <= set(exported)


@pytest.mark.parametrize(("args", "cause"), [
    (["--fabric-rate", "EDR"], "--fabric-rate"),
    (["--require-gdr", "--nodes", "1"], "--require-gdr check NCCL's traffic between nodes"),
    (["--efa-resource", "vpc.amazonaws.com/efa=32", "--nccl-ib-hca", "mlx5_0"],
     "the job asks for two fabrics: EFA (--efa-resource) and IB (--nccl-ib-hca); name one"),
    (["--efa-resource", "vpc.amazonaws.com/efa=0"], "--efa-resource"),
])
def test_the_commands_refuse_a_fabric_they_cannot_check_exit_2(run_cli, args: list[str], cause: str) -> None:
    code, _, err = run_cli("k8s", IMAGE, "--gpus-per-node", "8", *args, "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and cause in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("command", ["k8s", "slurm"])
@pytest.mark.parametrize(("args", "net", "family"), [
    (["--fabric-rate", "HDR"], "Socket", "TCP sockets"),
    (["--fabric-rate", "HDR"], "AWS Libfabric", "AWS EFA through libfabric"),
    (["--fabric-rate", "p5en.48xlarge"], "IB", "InfiniBand/RoCE"),
    (["--fabric-rate", "NDR"], "UCX", "a network this check does not know"),
])
def test_an_nccl_net_of_another_fabric_is_refused_when_the_job_is_generated(
        run_cli, tmp_path: Path, command: str, args: list[str], net: str, family: str) -> None:
    """--nccl-env NCCL_NET=... selects NCCL's network; one of another family than the job asks for was generated,
    and every node failed after the pods were scheduled and ran. It is refused now, exit 2, naming both options,
    by the rule the verifier reads NCCL's `Using network` with (NCCL matches NCCL_NET in any case)."""
    out = ["--out", str(tmp_path / "ddp.sbatch")] if command == "slurm" else []
    code, _, err = run_cli(command, IMAGE, "--nodes", "2", "--gpus-per-node", "8", *args, "--nccl-env",
                           f"NCCL_NET={net}", *out, "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"--nccl-env NCCL_NET={net} selects {family}" in err and args[0] in err
    assert not (tmp_path / "ddp.sbatch").exists()
    for fine in (["--fabric-rate", "HDR", "--nccl-env", "NCCL_NET=ib"], ["--nccl-env", "NCCL_NET=Socket"],
                 ["--fabric-rate", "NDR", "--nccl-env", "NCCL_NET=IBext_v8"]):
        code, _, err = run_cli(command, IMAGE, "--nodes", "2", "--gpus-per-node", "8", *fine, *out,
                               "--matrix", str(REPO / "matrix.yaml"))
        assert code == 0, err


def test_nccl_net_families_are_the_verifiers() -> None:
    """The launcher's refusal and the verifier read a network's family with one rule (nccl_log.family_of): a job
    asking for IB that NCCL ran on the network NCCL_NET names fails there exactly where it is refused here."""
    for net in ("Socket", "IB", "IBext_v8", "AWS Libfabric", "UCX"):
        settings = {"image": IMAGE, "nodes": 2, "gpus_per_node": 2, "fabric_rate": "HDR",
                    "nccl": NcclSettings(extra=(("NCCL_NET", net),))}
        refused = nccl_log.read(f"gpu-a01:1:1 [0] NCCL INFO Using network {net}\n").families() != ["IB"]
        if refused:
            with pytest.raises(UserError, match=f"NCCL_NET={net} selects"):
                MultiNodeJob(**settings)
        else:
            assert MultiNodeJob(**settings).env["NCCL_NET"] == net


@pytest.mark.parametrize("value", ["vpc.amazonaws.com/efa", "vpc.amazonaws.com/efa="])
def test_k8s_refuses_an_efa_resource_without_its_count(run_cli, value: str) -> None:
    """--efa-resource is NAME=COUNT: the COUNT (a node's EFA devices) sets the floor; never a silent 1."""
    code, out, err = run_cli("k8s", IMAGE, "--gpus-per-node", "8", "--efa-resource", value,
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "--efa-resource" in err and "COUNT" in err


def test_nccl_at_warn_is_not_read_and_says_so(tmp_path: Path) -> None:
    """A GPU job that asked for no fabric may lower NCCL_DEBUG; the verifier then says it did not read the transport."""
    job = MultiNodeJob(image=IMAGE, nodes=2, gpus_per_node=2, nccl=NcclSettings(debug="WARN"))
    proc = run_verifier(tmp_path, "ib.log", 46.0, job)
    assert proc.returncode == 0, proc.stderr
    assert "): not read (NCCL_DEBUG=WARN: the network is in NCCL's INFO lines)" in proc.stdout
    assert "DDP check passed: world size 4, nccl, transport not read, loss" in proc.stdout


def test_a_prefix_nccl_ib_hca_counts_every_nic_it_matches_for_the_floor(tmp_path: Path) -> None:
    """NCCL_IB_HCA=mlx5 is every mlx5_N (NCCL matches by prefix): counted as one NIC, the floor was half of
    this two-NIC node's and 20 GB/s passed it."""
    proc = run_verifier(tmp_path, "ib.log", 20.0, ib_job("mlx5"))
    assert proc.returncode == 1
    assert ("cross-node all-reduce bus bandwidth 20.0 GB/s over IB is below the floor 25 GB/s (0.5 x 2 NIC(s) x HDR "
            "200 Gb/s (2 NIC(s): NCCL_IB_HCA 'mlx5' matches 2 that NCCL listed)") in proc.stderr
    proc = run_verifier(tmp_path, "ib.log", 46.0, ib_job("mlx5"))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("peak", [math.nan, math.inf])
def test_a_busbw_peak_that_is_no_finite_figure_fails_the_job(tmp_path: Path, peak: float) -> None:
    """NaN is below no floor, and Infinity above every one: a busbw table whose peak was NaN or Infinity (json reads
    both) passed the floor check, printing `cross-node bus bandwidth nan GB/s`. Now the job fails naming the table."""
    proc = run_verifier(tmp_path, "ib.log", peak, ib_job())
    assert proc.returncode == 1, proc.stdout
    assert "DDP check passed" not in proc.stdout
    assert proc.stderr.startswith("DDP check failed: rank 0's busbw table has no valid peak_GBps (a finite number of "
                                  "GB/s): {\"peak_GBps\": "), proc.stderr


@pytest.mark.parametrize(("name", "value", "what"), [
    ("DDP_GPUS_PER_NODE", "eight", "(the GPUs per node the job asked for)"),
    ("DDP_FABRIC_NICS", "-2", "(the fabric's NICs per node the job named, --fabric-nics)"),
    ("DDP_EXPECT_WORLD_SIZE", "4.0", "(the processes the launcher asked for)")])
def test_a_count_setting_that_is_no_whole_number_stops_the_check_before_it_runs(tmp_path: Path, name: str,
                                                                                 value: str, what: str) -> None:
    """DDP_GPUS_PER_NODE and DDP_FABRIC_NICS were read with a bare int() after the check had run: a traceback (and
    a negative count passed as one). Now every whole-number setting is refused in one line, before the check runs."""
    proc = run_verifier(tmp_path, "ib.log", 46.0, ib_job(), **{name: value})
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stdout
    assert proc.stderr == f"DDP check failed: {name}={value!r} is not a whole number {what}\n", proc.stderr


def test_an_unknown_fabric_rate_stops_the_check_before_it_runs_naming_the_known_ones(tmp_path: Path) -> None:
    """DDP_FABRIC_RATE (--fabric-rate) naming no documented rate was a ValueError traceback from busbw.link_rate
    after the check had run on every GPU; now one line before it runs."""
    proc = run_verifier(tmp_path, "ib.log", 46.0, ib_job(), DDP_FABRIC_RATE="HDR-9000")
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stdout
    assert proc.stderr.startswith("DDP check failed: DDP_FABRIC_RATE: --fabric-rate 'HDR-9000' is not a documented "
                                  "rate; one of ") and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize(("name", "value", "said"), [
    ("DDP_EXPECT_GDR", "true", "DDP_EXPECT_GDR='true' is neither 1 (--require-gdr) nor empty"),
    ("DDP_EXPECT_TRANSPORT", "ib", "DDP_EXPECT_TRANSPORT='ib' is no fabric the check knows (IB or EFA, or empty)"),
])
def test_a_fabric_expectation_of_another_value_stops_the_check_before_it_runs(tmp_path: Path, name: str, value: str,
                                                                             said: str) -> None:
    """The launcher writes DDP_EXPECT_GDR as 1 or empty and DDP_EXPECT_TRANSPORT as IB, EFA or empty; an edited job's
    DDP_EXPECT_GDR=true skipped the GPUDirect RDMA check without a word, and DDP_EXPECT_TRANSPORT=ib failed a healthy
    IB fabric after the run saying NCCL loaded another network plugin."""
    proc = run_verifier(tmp_path, "ib.log", 46.0, ib_job(require_gdr=True), **{name: value})
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stdout
    assert proc.stderr == f"DDP check failed: {said}\n", proc.stderr


@pytest.mark.parametrize(("subsys", "refused"), [
    ("^NET,INIT", True), ("^init", True), ("^ALL", True), ("INIT,^NET", False),
    ("^NET", False), ("^COLL,GRAPH", False), ("init", False), ("ALL", False), ("COLL,NET", True),
])
def test_nccl_debug_subsys_is_read_as_nccl_reads_a_leading_caret(subsys: str, refused: bool) -> None:
    """NCCL reads a leading ^ as "every subsystem but these" (src/debug.cc): `^NET,INIT` hides the INIT lines the
    fabric check reads (`Using network`) and passed because INIT was in the list; `^NET` shows them and was
    refused because INIT was not."""
    settings = {"image": IMAGE, "nodes": 2, "gpus_per_node": 8, "fabric_rate": "NDR",
                "nccl": NcclSettings(extra=(("NCCL_DEBUG_SUBSYS", subsys),))}
    if refused:
        with pytest.raises(UserError, match=f"NCCL_DEBUG_SUBSYS={re.escape(subsys)}: the job asks for IB"):
            MultiNodeJob(**settings)
    else:
        assert MultiNodeJob(**settings).env["NCCL_DEBUG_SUBSYS"] == subsys


def test_a_job_pinning_nccl_net_aws_libfabric_is_generated_and_its_efa_log_passes(run_cli, tmp_path: Path) -> None:
    """aws-ofi-nccl's net plugin is named `AWS Libfabric` (its src/compat_v6.c `.name`), which NCCL_NET pins: --nccl-env
    refused the value for its space (exit 2). The job is generated with it, and the verifier, run with the job's own
    env, reads NCCL's `Using network AWS Libfabric` and `via NET/AWS Libfabric/N/GDRDMA` as EFA and passes."""
    code, out, err = run_cli("k8s", IMAGE, "--nodes", "2", "--gpus-per-node", "2",
                             "--nccl-env", "NCCL_NET=AWS Libfabric", "--efa-resource", "vpc.amazonaws.com/efa=4",
                             "--require-gdr",
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    container = list(yaml.safe_load_all(out))[-1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (env["NCCL_NET"], env["DDP_EXPECT_TRANSPORT"], env["DDP_EXPECT_GDR"]) == ("AWS Libfabric", "EFA", "1")
    job = MultiNodeJob(image=IMAGE, nodes=2, gpus_per_node=2, efa_devices=4, require_gdr=True,
                       nccl=NcclSettings(extra=(("NCCL_NET", "AWS Libfabric"),)))
    checked = {k: v for k, v in env.items() if k.startswith(("NCCL_", "DDP_EXPECT_", "DDP_FABRIC_", "DDP_GPUS_"))}
    assert checked == {k: v for k, v in job.expect_env.items() if k in checked}
    proc = run_verifier(tmp_path, "aws-libfabric.log", 90.0, job, **checked)
    assert proc.returncode == 0, proc.stderr
    assert "EFA (NET/AWS Libfabric) in 2 process(es) (ranks 0-1)" in proc.stdout
    assert "GPUDirect RDMA on (4 of 4 NET channels)" in proc.stdout and "transport EFA" in proc.stdout


def test_ports_slower_than_hdr_set_the_floor_when_no_rate_is_declared() -> None:
    """With no --fabric-rate the IB floor took HDR's 200 Gb/s per NIC as the slowest rate, but the IB family is every
    verbs NIC (RoCE at 100 GbE, EDR, HDR100): a healthy 100 Gb/s port (about 12 GB/s, 0.96 of its rate) was below
    the floor of 12.5 GB/s. Where NCCL reported the ports' rate (`speed=100000`, NCCL 2.27+) a slower one is the
    rate now; a declared rate and faster ports are judged as before."""
    text = "".join(f"gpu-a01:4127:4190 [0] NCCL INFO {line}\n" for line in (
        "NET/IB: [0] mlx5_0:uverbs0:1/RoCE provider=Mlx5 speed=100000 context=0x1 pciPath=/sys/x ar=0 oooRqSize=0",
        "NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:10.0.0.1<0>", "Using network IB",
        "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA"))
    log = nccl_log.read(text)
    result = {"busbw": {"peak_GBps": 11.5}}
    problems: list[str] = []
    said = verify_ddp.busbw_check(result, log, {"DDP_GPUS_PER_NODE": "1"}, problems)
    assert problems == [] and said == (
        ", cross-node bus bandwidth 11.5 GB/s over IB (floor 6.25 GB/s: 0.5 x 1 NIC(s) x the slowest port NCCL "
        "reported 100 Gb/s (1 NIC(s): NCCL listed 1 on this node) (no rate declared: the slowest port rate NCCL "
        "reported; declare --fabric-rate))")
    verify_ddp.busbw_check(result, log, {"DDP_GPUS_PER_NODE": "1", "DDP_FABRIC_RATE": "HDR"}, problems)
    assert problems and "below the floor 12.5 GB/s" in problems[0]


def test_a_port_that_drops_during_the_run_does_not_lower_the_floor() -> None:
    """The floor takes a port rate below HDR from the rate NCCL listed the port at (`speed=`), as the fabric's own;
    a later `speed change detected: 400000 -> 100000 Mbps` (NCCL 2.30.7) is the port failing, and lowered the floor
    to the failed rate, so the run that suffered it passed."""
    text = "".join(f"gpu-a01:4127:4190 [0] NCCL INFO {line}\n" for line in (
        "NET/IB: [0] mlx5_0:uverbs0:1/IB provider=Mlx5 speed=400000 context=0x1 pciPath=/sys/x ar=1 oooRqSize=0",
        "NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB eth0:10.0.0.1<0>", "Using network IB",
        "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA",
        "NET/IB : mlx5_0:1 speed change detected: 400000 -> 100000 Mbps"))
    problems: list[str] = []
    verify_ddp.busbw_check({"busbw": {"peak_GBps": 11.5}}, nccl_log.read(text), {"DDP_GPUS_PER_NODE": "1"}, problems)
    assert len(problems) == 1 and "below the floor 12.5 GB/s (0.5 x 1 NIC(s) x HDR 200 Gb/s" in problems[0]
