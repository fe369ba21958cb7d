"""Image checks that could not fail on an image with the fault they look for, each shown failing here against a
stand-in (rank files as torchrun's ranks write them, a host's environment, NCCL's log files) with no engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from buildtool.contracts import nccl_log

IMAGE_TESTS = Path(__file__).resolve().parent.parent / "image-tests"
for _folder in ("", "pytorch", "common"):
    sys.path.insert(0, str(IMAGE_TESTS / _folder))
import harness  # noqa: E402

with warnings.catch_warnings():   # their marks are image-tests' own (image-tests/conftest.py)
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    import test_collectives as collectives_tests
    import test_network_env as network_env
    import test_rendezvous as rendezvous_tests


class LoneRanks:
    """torchrun whose every rank ends well but formed a group of its own (world size 1): each all_reduce returns its
    own input, which is the right answer for a world of one."""

    def __init__(self, folder: Path, world: int) -> None:
        self.folder, self.world = folder, world

    def run(self, argv: list[str], step: str, quiet: float = 0, env: dict[str, str] | None = None) -> harness.Probe:
        nproc = int(argv[argv.index("--nproc-per-node") + 1])
        want = [self.world * (self.world + 1) / 2] * 8
        for rank in range(nproc):
            checks = {"all_reduce(SUM)": {"ok": True, "got": want, "want": want}}
            (self.folder / f"rank-{rank}.start.json").write_text("{}")
            (self.folder / f"rank-{rank}.json").write_text(json.dumps(
                {"ok": True, "rank": str(rank), "backend": "gloo", "world_size": self.world, "checks": checks}))
        return harness.Probe(step=step, argv=argv, rc=0, dir=self.folder)


def test_collectives_of_ranks_that_each_ran_alone_fail_naming_their_world_size(tmp_path):
    """Before: passed, the expected sums being computed from the world size each rank reported (1)."""
    with pytest.raises(AssertionError) as failed:
        collectives_tests.test_collectives_give_known_results_on_cpu(LoneRanks(tmp_path, world=1))
    assert str(failed.value).startswith("collectives on 2 ranks (gloo): not every rank joined one group of 2: "
                                        "rank 0 reports world size 1, rank 1 reports world size 1")


def test_collectives_of_ranks_in_one_group_still_pass(tmp_path):
    collectives_tests.test_collectives_give_known_results_on_cpu(LoneRanks(tmp_path, world=2))


PROXIED = {"http_proxy": "http://proxy.invalid:3128", "no_proxy": "localhost,127.0.0.1"}   # not the run's bridge


def _network_env(env: dict[str, str]) -> dict[str, object]:
    return {"env": env, "interfaces": ["eth0", "lo"], "loopback": ["lo"]}


def test_a_bridge_network_that_cannot_be_inspected_fails_the_proxy_check_naming_it(monkeypatch):
    """Before: `docker network inspect` failing gave no subnet, so a no_proxy that covers loopback only passed,
    unchecked against the run's bridge network."""
    asked: list[tuple[str, ...]] = []
    monkeypatch.setattr(network_env, "docker_lines", lambda *args, **kw: asked.append(args) or [])
    with pytest.raises(pytest.fail.Exception) as failed:
        network_env.test_proxies_leave_local_traffic_local(_network_env(PROXIED), {"network": "dl-imagetest-r1"})
    assert str(failed.value).startswith("`docker network inspect dl-imagetest-r1` named no subnet of the run's "
                                        "bridge network"), failed.value
    assert asked and asked[0][:2] == ("network", "inspect")


def test_the_proxy_check_names_the_bridge_subnet_no_proxy_leaves_out_and_needs_none_without_a_proxy(monkeypatch):
    monkeypatch.setattr(network_env, "docker_lines", lambda *args, **kw: ["172.18.0.0/16", ""])
    with pytest.raises(AssertionError) as failed:
        network_env.test_proxies_leave_local_traffic_local(_network_env(PROXIED), {"network": "dl-imagetest-r1"})
    assert "does not cover 172.18.0.0/16" in str(failed.value)
    network_env.test_proxies_leave_local_traffic_local(
        _network_env({**PROXIED, "no_proxy": "localhost,127.0.0.1,172.16.0.0/12"}), {"network": "dl-imagetest-r1"})
    monkeypatch.setattr(network_env, "docker_lines", lambda *args, **kw: [])   # no proxy: the network is not asked
    network_env.test_proxies_leave_local_traffic_local(_network_env({"no_proxy": "x"}), {"network": "dl-imagetest-r1"})


# Lines no NCCL prints (src/debug.cc, v2.18 to v2.29): a TRACE line has the milliseconds and FUNC:LINE before
# `NCCL TRACE`, a CALL line no `[DEV]`. Read as INFO, these two made a network, a NIC and GPUDirect RDMA.
NEVER_PRINTED = ("gpu-a01:11:12 [0] NCCL TRACE Using network IB\n"
                 "gpu-a01:11:12 [0] NCCL CALL Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA\n")


def _nodes(tmp_path: Path, text: str) -> dict[str, harness.Probe]:
    found = {}
    for index, node in enumerate(("node0", "node1")):
        folder = tmp_path / node
        folder.mkdir()
        (folder / f"nccl-{index}.11.log").write_text(text if index == 0 else "")
        found[node] = harness.Probe(step=node, argv=[], dir=folder)
    return found


def test_lines_nccl_never_prints_are_no_nccl_log_for_the_two_node_check(tmp_path):
    """Before: the two-node check passed on them, reporting IB with GPUDirect RDMA on."""
    assert nccl_log.read(NEVER_PRINTED).lines == 0
    with pytest.raises(AssertionError) as failed:
        rendezvous_tests.nccl_between_nodes(_nodes(tmp_path, NEVER_PRINTED))
    assert str(failed.value).startswith("NCCL wrote no log: 2 file(s) in "), failed.value
    assert "hold no NCCL INFO or WARN line" in str(failed.value)


def test_real_trace_and_call_lines_end_a_record_and_are_not_read():
    text = ("gpu-a01:11:12 [0] NCCL INFO Using network IB\n"
            "gpu-a01:11:12 [0] 12.345678 netSend:301 NCCL TRACE Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0\n"
            "gpu-a01:11:12 NCCL CALL ncclAllReduce(0x7f, 0x7f, 8, 7, 0, 0x5, 0x6)\n"
            "gpu-a01:11:12 [0] NCCL INFO Using network IBgpu-a01:11:13 [0] 1.500000 f:1 NCCL TRACE x\n")
    log = nccl_log.read(text)
    assert (log.lines, log.cut, log.channels()) == (1, 1, [])
    assert [p.networks for p in log.processes.values()] == [["IB"]]


def test_a_test_in_a_folder_named_gpu_is_recorded_as_marked_not_as_named(tmp_path):
    """Before: results.json called a test gpu when any of its names was `gpu` (pytest's keywords: a site-check group
    folder `gpu`), where defined.json and the release gate read the `gpu` marker."""
    from tests.test_imagetests_unit import SUITE_TIMEOUT_S, image_tests_argv

    argv = image_tests_argv(tmp_path, {})
    (tmp_path / "suite" / "gpu").mkdir()
    (tmp_path / "suite" / "gpu" / "test_site.py").write_text(
        "import pytest\n\n\ndef test_dcgm_config():\n    pass\n\n\n"
        "@pytest.mark.gpu(what='a GPU check')\ndef test_on_gpu():\n    pass\n")
    subprocess.run(argv, env={**os.environ, "PYTHONPATH": str(IMAGE_TESTS.parent)}, capture_output=True, text=True,
                   timeout=SUITE_TIMEOUT_S)
    found = {t["id"]: t for t in json.loads((tmp_path / "results.json").read_text())["tests"]}
    assert found["gpu/test_site.py::test_dcgm_config"]["result"] == "passed"
    assert found["gpu/test_site.py::test_dcgm_config"]["gpu"] is False
    assert found["gpu/test_site.py::test_on_gpu"]["gpu"] is True and found["gpu/test_site.py::test_on_gpu"][
        "skip_code"] == "gpu-not-in-cell"
