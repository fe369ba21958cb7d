"""The image tests' new judgements, without an engine (issue 43): settings that work on one host only
(socket interfaces pinned to `lo`, proxies without a no_proxy for loopback and the cluster), the variables
named when a local connection fails, what the profiler's views hold (steps, operators, trace events), and a
TensorBoard plugin that does not load named by the file it lacks. The fault-injection tests show each on a
real image (tests/integration/test_image_faults.py)."""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS_DIR = REPO / "image-tests"
for folder in ("", "common", "pytorch", "scripts"):
    sys.path.insert(0, str(TESTS_DIR / folder))
import harness  # noqa: E402
import ranks  # noqa: E402
import tb_query  # noqa: E402
import test_network_env as network_env  # noqa: E402

IFACES, LOOPBACK = ["docker0", "eth0", "lo"], ["lo"]


@pytest.mark.parametrize(("env", "pinned"), [
    ({"GLOO_SOCKET_IFNAME": "lo"}, ["GLOO_SOCKET_IFNAME=lo"]),
    ({"NCCL_SOCKET_IFNAME": "lo"}, ["NCCL_SOCKET_IFNAME=lo"]),          # a prefix: lo only here
    ({"NCCL_SOCKET_IFNAME": "=lo"}, ["NCCL_SOCKET_IFNAME==lo"]),
    ({"TP_SOCKET_IFNAME": "lo"}, ["TP_SOCKET_IFNAME=lo"]),
    ({"NCCL_SOCKET_IFNAME": "^lo,docker"}, []),                          # excludes loopback
    ({"NCCL_SOCKET_IFNAME": "e"}, []),                                   # prefix of eth0
    ({"GLOO_SOCKET_IFNAME": "eth0,lo"}, []),
    ({"GLOO_SOCKET_IFNAME": "nonexistent0"}, []),                        # missing, not loopback: DDP names it
    ({}, []),
])
def test_socket_interfaces_pinned_to_loopback_are_named(env, pinned):
    assert network_env.pinned_to_loopback(env, IFACES, LOOPBACK) == pinned


@pytest.mark.parametrize(("no_proxy", "missing"), [
    (None, "localhost, 127.0.0.1, 172.18.0.0/16"),
    ("localhost,127.0.0.1", "172.18.0.0/16"),
    ("localhost,127.0.0.0/8,172.16.0.0/12", ""),
    (".localhost,127.0.0.1,172.18.0.0/16", ""),
    ("*", ""),
])
def test_proxies_need_no_proxy_for_loopback_and_the_cluster(no_proxy, missing):
    env = {"http_proxy": "http://bob:secret@proxy.invalid:3128", **({"no_proxy": no_proxy} if no_proxy else {})}
    problem = network_env.proxy_problem(env, ["172.18.0.0/16"])
    if not missing:
        assert problem == ""
        return
    assert problem.startswith("http_proxy=http://bob:***@proxy.invalid:3128 set in the image"), problem
    assert f"which does not cover {missing}:" in problem and "secret" not in problem
    assert ("no_proxy is unset" if no_proxy is None else f"no_proxy={no_proxy}") in problem


class _Host:
    """testinfra's `host`, answering the one command the interface read runs."""

    def __init__(self, rc: int, stdout: str, stderr: str = "") -> None:
        self.result = SimpleNamespace(rc=rc, stdout=stdout, stderr=stderr)

    def run(self, command: str) -> SimpleNamespace:
        assert command == "grep -sH . /sys/class/net/*/flags", command
        return self.result


def test_an_interface_that_goes_away_during_the_read_is_left_out():
    """A bridge removed between the glob and its read (EINVAL, grep's rc 2; seen in CI on a host-network run)."""
    read = "/sys/class/net/docker0/flags:0x1003\n/sys/class/net/eth0/flags:0x1003\n/sys/class/net/lo/flags:0x9\n"
    assert network_env.interface_flags(_Host(2, read)) == {"docker0": 0x1003, "eth0": 0x1003, "lo": 0x9}


@pytest.mark.parametrize(("rc", "stdout", "said"), [(2, "", "(rc 2): grep: no such file"), (127, "x:0x1", "(rc 127)")])
def test_interfaces_that_cannot_be_read_fail_the_test(rc, stdout, said):
    with pytest.raises(pytest.fail.Exception, match=r"could not read the container's interfaces .*" + re.escape(said)):
        network_env.interface_flags(_Host(rc, stdout, "grep: no such file" if not stdout else ""))


@pytest.mark.parametrize(("proxy", "masked"), [
    ("http://s3cr3t-token@proxy.invalid:3128", "http://***@proxy.invalid:3128"),
    ("http://bob:pa@s3cr3t@proxy.invalid:3128", "http://bob:***@proxy.invalid:3128"),
    ("http://bob:pa/s3cr3t@proxy.invalid:3128", "http://bob:***@proxy.invalid:3128"),
    ("bob:s3cr3t@proxy.invalid:3128", "bob:***@proxy.invalid:3128"),
])
def test_a_proxys_token_never_reaches_the_verdict(proxy, masked):
    """harness.shown masked `scheme://user:password@` alone: a token given as the user name, a password holding
    `@` or `/`, or a proxy without a scheme was written whole (or its tail) into the test's message, the verdict
    and the nightly report."""
    problem = network_env.proxy_problem({"https_proxy": proxy}, ["172.18.0.0/16"])
    assert "s3cr3t" not in problem, problem
    assert problem.startswith(f"https_proxy={masked} set in the image"), problem
    assert "s3cr3t" not in harness.redirects("proxy", env={"HTTPS_PROXY": proxy})


@pytest.mark.parametrize("proxy", ["http://s3cr3t-token:@proxy.invalid:3128", "s3cr3t-token:@proxy.invalid:3128"])
def test_a_proxy_token_given_as_the_user_name_before_an_empty_password_never_reaches_the_verdict(proxy):
    """`http://TOKEN:@proxy` (a token as the user name, the password empty, as curl's `-U TOKEN:` writes it) was shown
    as `http://TOKEN:***@proxy`: the colon alone made harness.shown keep the user name, the token itself, in the
    test's message, the verdict and the nightly report."""
    masked = proxy.replace("s3cr3t-token:", "***")
    problem = network_env.proxy_problem({"https_proxy": proxy}, ["172.18.0.0/16"])
    assert "s3cr3t" not in problem and problem.startswith(f"https_proxy={masked} set in the image"), problem
    assert "s3cr3t" not in harness.redirects("proxy", env={"HTTPS_PROXY": proxy})
    assert harness.shown("http://bob:pw@proxy.invalid:3128") == "http://bob:***@proxy.invalid:3128"   # as before


def test_no_proxy_variable_means_no_problem():
    assert network_env.proxy_problem({"no_proxy": "x"}, []) == ""


def test_a_failed_local_connection_names_what_could_redirect_it(tmp_path):
    harness.set_image_env({"GLOO_SOCKET_IFNAME": "lo", "PATH": "/bin"}, ["-e", "https_proxy=http://u:pw@p:1"])
    try:
        said = harness.redirects("socket", "proxy")
        assert said == "the image's environment could redirect it: GLOO_SOCKET_IFNAME=lo, https_proxy=http://u:***@p:1"
        probe = harness.Probe(step="two-node DDP", argv=[], rc=1)
        probe.dir = tmp_path
        (tmp_path / "rank-0.json").write_text(json.dumps(
            {"ok": False, "error": "RuntimeError: Gloo connectFullMesh failed with ... timed out connecting"}))
        cause = ranks.cause(probe, "node0 of two", "node0:29500")
        assert cause.endswith("; the image's environment could redirect it: GLOO_SOCKET_IFNAME=lo, "
                              "https_proxy=http://u:***@p:1"), cause
    finally:
        harness.set_image_env({}, [])
    assert harness.redirects("socket").startswith("no variable that could redirect it is set (GLOO_SOCKET_IFNAME")


def _event(name, ts, dur=1, cat="cpu_op", ph="X"):
    return {"name": name, "ts": ts, "dur": dur, "cat": cat, "ph": ph}


def test_the_trace_view_counts_the_operators_of_each_step():
    healthy = {"traceEvents": [
        {"name": "process_name", "ph": "M"}, _event("ProfilerStep#2", 0, 100, "user_annotation"),
        _event("aten::addmm", 10), _event("aten::relu", 20), _event("ProfilerStep#3", 200, 100, "user_annotation"),
        _event("aten::addmm", 210), _event("void gemm", 220, cat="kernel")]}
    found = tb_query.trace_summary(200, json.dumps(healthy).encode())
    assert found["steps"] == {"ProfilerStep#2": 2, "ProfilerStep#3": 1} and found["kernels"] == 1
    assert found["operator_names"] == ["aten::addmm", "aten::relu"]
    metadata = tb_query.trace_summary(200, json.dumps({"traceEvents": [{"name": "thread_name", "ph": "M"}]}).encode())
    assert metadata["steps"] == {} and metadata["operator_names"] == [] and metadata["categories"] == {"(ph M)": 1}
    assert "not trace JSON" in tb_query.trace_summary(200, b"<html>").get("error", "")


def test_the_overview_rows_sum_their_times():
    overview = {"steps": {"columns": [{"type": "string"}, {"type": "number"}, {"type": "string"}, {"type": "number"}],
                          "rows": [["2", 0, "<tip>", 140.5], ["0", 0, "<tip>", 0]]}}
    assert tb_query.step_rows(overview) == [["2", 140.5], ["0", 0.0]]


def test_a_plugin_with_a_missing_native_module_is_named_by_its_file(tmp_path, monkeypatch):
    """A distribution whose RECORD lists a native module that is gone: the file and the import error are
    named, not "TensorBoard did not list the plugin"."""
    site = tmp_path / "site"
    (site / "imgtestplug").mkdir(parents=True)
    (site / "imgtestplug" / "__init__.py").write_text("")
    (site / "imgtestplug" / "loader.py").write_text("class Loader:\n    pass\n")
    (site / "imgtestplug" / "plugin.py").write_text("from imgtestplug import _native\n")
    info = site / "imgtestplug-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: imgtestplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[tensorboard_plugins]\nimgtest = imgtestplug.loader:Loader\n")
    (info / "RECORD").write_text("imgtestplug/__init__.py,,\nimgtestplug/loader.py,,\nimgtestplug/plugin.py,,\n"
                                 "imgtestplug/_native.cpython-311-x86_64-linux-gnu.so,,\n")
    monkeypatch.syspath_prepend(str(site))
    md_cache = getattr(md, "_cache", None)
    if md_cache is not None:
        md_cache.clear()
    log = "W1203 tensorboard: Unable to load imgtest plugin. Import error: cannot import name '_native'\n"
    said = tb_query.diagnose_plugin(["imgtestplug"], log)
    assert said.startswith("imgtestplug 1.0 is installed and its entry point imgtest = imgtestplug.loader:Loader "
                           "loads, but the plugin does not: files of it are missing: "
                           "imgtestplug/_native.cpython-311-x86_64-linux-gnu.so (in the RECORD of imgtestplug)"), said
    assert "importing imgtestplug.plugin fails: ImportError: cannot import name '_native'" in said
    assert "TensorBoard's log: W1203 tensorboard: Unable to load imgtest plugin" in said
    assert "did not list the plugin" not in said
