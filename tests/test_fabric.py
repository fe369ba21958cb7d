"""Issue 39 finding 1: the multi-node verifier reports the network NCCL chose in every process of its node
(NCCL_DEBUG=INFO's `Using network IB|Socket`), fails a job that asked for InfiniBand (--nccl-ib-hca,
--rdma-resource) when NCCL ran over TCP sockets, and compares the cross-node all-reduce bus bandwidth with
the floor of its fabric (contracts.busbw.FABRICS). No GPU and no cluster here: the check's output is a
fixture (tests/fixtures/nccl/, NCCL's line shapes) printed by a stand-in for torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from buildtool.common.errors import UserError
from buildtool.contracts import busbw
from buildtool.launch.multinode import VERIFY_SOURCE, MultiNodeJob, NcclSettings

REPO = Path(__file__).resolve().parent.parent
NCCL_LOGS = REPO / "tests" / "fixtures" / "nccl"
# A single-platform GPU cell (pytorch-ngc:25.10 is built for linux/amd64 and linux/arm64: --platform needed).
IMAGE = "127.0.0.1:5000/pytorch-ngc-dev:0123456789ab-25.01"
IB_FLOOR = busbw.fabric_floor(busbw.IB)[0]


def run_verifier(tmp_path: Path, log: str, peak: float | None, **env: str) -> subprocess.CompletedProcess[str]:
    """The generated verifier around a stand-in check that prints LOG's NCCL lines and rank 0's result."""
    result = {"backend": "nccl", "world_size": 4, "first_loss": 1.0, "last_loss": 0.1, "identical": True,
              "param_hashes": ["h"] * 4}
    if peak is not None:
        result["busbw"] = {"peak_GBps": peak, "ranks": 4, "sizes": []}
    check = tmp_path / "check.py"
    check.write_text("import sys\nsys.stdout.write(open(sys.argv[1]).read())\n"
                     f"print('DDP_RESULT ' + {json.dumps(json.dumps(result))})\n")
    verify = tmp_path / "verify_ddp.py"
    verify.write_text(VERIFY_SOURCE)
    job = MultiNodeJob(image=IMAGE, nodes=2, gpus_per_node=2, nccl=NcclSettings(ib_hca="mlx5_0:1,mlx5_1:1"))
    want = {"PATH": "/usr/bin:/bin", **job.expect_env, **env}
    log_path = NCCL_LOGS / log if log else tmp_path / "empty.log"
    if not log:
        log_path.write_text("")
    return subprocess.run([sys.executable, str(verify), sys.executable, str(check), str(log_path)],
                          capture_output=True, text=True, timeout=60, env=want)


def test_ib_asked_and_used_passes_with_the_transport_and_the_cross_node_figure(tmp_path: Path) -> None:
    proc = run_verifier(tmp_path, "ib.log", 22.4)
    assert proc.returncode == 0, proc.stderr
    assert "DDP transport on this node: NET/IB in 2 process(es) (gpu-a01:4127 [0], gpu-a01:4128 [1])" in proc.stdout
    assert f"cross-node bus bandwidth 22.4 GB/s over NET/IB (floor {IB_FLOOR:g} GB/s)" in proc.stdout


def test_ib_asked_but_sockets_used_fails_naming_each_process_and_the_cause(tmp_path: Path) -> None:
    """Before issue 39 this job passed: the verifier checked backend, world size, parameters and loss only."""
    proc = run_verifier(tmp_path, "socket.log", 22.4)
    assert proc.returncode == 1, proc.stdout
    assert ("the job asked for NET/IB (InfiniBand/RoCE), but 2 of 2 NCCL process(es) on this node used another "
            "network: gpu-a01:4127 [0] NET/Socket, gpu-a01:4128 [1] NET/Socket; NCCL said `Failed to open "
            "libibverbs.so[.1]`: without libibverbs1") in proc.stderr


def test_ib_asked_and_no_nccl_transport_line_fails(tmp_path: Path) -> None:
    proc = run_verifier(tmp_path, "", 22.4)
    assert proc.returncode == 1
    assert "NCCL reported no transport on this node (no `NCCL INFO Using network` line" in proc.stderr


def test_cross_node_busbw_below_the_fabric_floor_fails(tmp_path: Path) -> None:
    proc = run_verifier(tmp_path, "ib.log", 1.9)     # socket speed on an IB fabric
    assert proc.returncode == 1
    assert f"cross-node all-reduce bus bandwidth 1.9 GB/s over NET/IB is below the floor {IB_FLOOR:g} GB/s" in (
        proc.stderr)


def test_a_check_that_measures_no_busbw_says_so(tmp_path: Path) -> None:
    """JAX's check measures no bus bandwidth: the pass line says it was not measured, never a figure."""
    proc = run_verifier(tmp_path, "ib.log", None)
    assert proc.returncode == 0 and "cross-node bus bandwidth not measured (no busbw table" in proc.stdout


def test_sockets_not_asked_for_are_reported_and_have_no_floor_by_a_stated_reason(tmp_path: Path) -> None:
    proc = run_verifier(tmp_path, "socket.log", 1.9, DDP_EXPECT_TRANSPORT="")
    assert proc.returncode == 0, proc.stderr
    assert "NET/Socket in 2 process(es)" in proc.stdout and "(no floor for NET/Socket)" in proc.stdout
    floor, why = busbw.fabric_floor(busbw.SOCKET)
    assert floor is None and "fails on sockets by the transport check" in why


def test_fabric_floors_are_a_quarter_of_one_port_with_their_source() -> None:
    assert busbw.fabric_floor(busbw.IB) == (6.25, busbw.FABRICS[busbw.IB][1])
    assert "ConnectX-6" in busbw.FABRICS[busbw.IB][1]
    with pytest.raises(ValueError, match="fabric 'EFA' is neither in FABRICS nor in NO_FABRIC_FLOOR"):
        busbw.fabric_floor("EFA")


def test_asking_for_ib_sets_the_expectation_and_nccl_info() -> None:
    job = MultiNodeJob(image=IMAGE, nodes=2, gpus_per_node=8, nccl=NcclSettings(ib_hca="mlx5_0:1"))
    assert {k: job.env[k] for k in ("DDP_EXPECT_TRANSPORT", "DDP_BUSBW_FLOORS", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS")} == {
        "DDP_EXPECT_TRANSPORT": "IB", "DDP_BUSBW_FLOORS": f"IB={IB_FLOOR:g}", "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    plain = MultiNodeJob(image=IMAGE, nodes=2, gpus_per_node=8)
    assert "DDP_EXPECT_TRANSPORT" not in plain.env and plain.env["NCCL_DEBUG"] == "INFO"
    assert "DDP_EXPECT_TRANSPORT" in MultiNodeJob(image=IMAGE, nodes=2, gpus_per_node=8, rdma=True).env
    with pytest.raises(UserError, match="--nccl-debug WARN: the job asks for InfiniBand \\(--nccl-ib-hca\\)"):
        MultiNodeJob(image=IMAGE, nodes=2, gpus_per_node=8, nccl=NcclSettings(debug="WARN", ib_hca="mlx5_0:1"))


@pytest.mark.parametrize("flags", [["--nccl-ib-hca", "mlx5_0:1"], ["--rdma-resource", "rdma/ib"]])
def test_k8s_output_with_ib_carries_the_transport_check(run_cli, flags: list[str]) -> None:
    code, out, err = run_cli("k8s", IMAGE, "--gpus-per-node", "8", *flags, "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert "def transport_problems(" in docs[0]["data"]["verify_ddp.py"]
    env = {e["name"]: e["value"] for e in docs[-1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["DDP_EXPECT_TRANSPORT"] == "IB" and env["DDP_BUSBW_FLOORS"] == f"IB={IB_FLOOR:g}"


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis"])
def test_slurm_output_with_ib_carries_the_transport_check(run_cli, tmp_path: Path, runtime: str) -> None:
    script = tmp_path / "ddp.sbatch"
    code, _, err = run_cli("slurm", IMAGE, "--gpus-per-node", "8", "--nccl-ib-hca", "mlx5_0:1", "--runtime", runtime,
                           "--out", str(script), "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    text = script.read_text()
    assert "def transport_problems(" in text and "\nexport DDP_EXPECT_TRANSPORT=IB\n" in text
    assert f"\nexport DDP_BUSBW_FLOORS=IB={IB_FLOOR:g}\n" in text
