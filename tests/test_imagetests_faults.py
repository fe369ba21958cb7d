"""Image checks run against stand-ins that really have the fault they look for, without an engine: each check through
the testinfra backend every image test's `host` has (image-tests/infra.py), on this machine under the real supervisor
(tests/test_imagetests_example.py's HostContainer), with the fault set up there and shown to be real before the check
is asked about it. Each of these checks passed on its fault before it was fixed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_imagetests_example import HostContainer

REPO = Path(__file__).resolve().parent.parent
TESTS_DIR = REPO / "image-tests"
for folder in ("", "common"):
    sys.path.insert(0, str(TESTS_DIR / folder))
import infra  # noqa: E402
import test_network_env as network_env  # noqa: E402

PROXY = "http://proxy.invalid:3128"
COVERING = "localhost,127.0.0.1,172.16.0.0/12"


def _host(tmp_path: Path, env: dict[str, str]) -> infra.ImageHost:
    return infra.host_of(HostContainer(tmp_path / "out", env))


def _urllib_bypasses(env: dict[str, str], host: str) -> bool:
    """Whether Python's urllib, in a process with exactly `env`, keeps `host` off the proxy."""
    code = f"import urllib.request as u; print(bool(u.proxy_bypass({host!r})))"
    done = subprocess.run([sys.executable, "-I", "-c", code], env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.strip() == "True"


@pytest.mark.parametrize(("env", "read", "clients"), [
    # urllib and requests read the lower-case no_proxy when it is set; NO_PROXY, which covers loopback, is ignored.
    ({"http_proxy": PROXY, "no_proxy": ".corp.example", "NO_PROXY": COVERING}, "no_proxy", "urllib and requests"),
    # gRPC's C core (jax.distributed's coordinator) reads no_grpc_proxy when it is set, never no_proxy then
    # (grpc/grpc doc/environment_variables.md); urllib is shown to be fine here, gRPC is not.
    ({"http_proxy": PROXY, "no_proxy": COVERING, "no_grpc_proxy": ".corp.example"}, "no_grpc_proxy", "gRPC"),
    # gRPC reads lower-case variables only: NO_PROXY alone leaves it without a no-proxy list.
    ({"http_proxy": PROXY, "NO_PROXY": COVERING}, "", "gRPC"),
])
def test_a_no_proxy_list_the_clients_do_not_read_does_not_pass_the_proxy_check(tmp_path, env, read, clients):
    """The check joined no_proxy and NO_PROXY and ignored no_grpc_proxy: an image whose clients read a no-proxy list
    that leaves 127.0.0.1 to the proxy passed it, because another no-proxy variable, which they ignore, covered it."""
    assert _urllib_bypasses(env, "127.0.0.1") is (read != "no_proxy"), "the stand-in does not have the fault"
    host = _host(tmp_path, env)
    found = network_env.found.__wrapped__(host)   # the module's fixture, on the stand-in's host
    with pytest.raises(AssertionError) as failed:
        network_env.test_proxies_leave_local_traffic_local(found, {"network": ""})
    first = str(failed.value).splitlines()[0]
    said = f"{read}=.corp.example" if read else "neither no_grpc_proxy nor no_proxy is set"
    assert first.startswith(f"http_proxy={PROXY} set in the image, and {said}: the no-proxy list {clients}"), first
    assert "does not cover localhost, 127.0.0.1, so their local connections go to the proxy" in first, first
    healthy = {**env, read or "no_proxy": COVERING}
    assert _urllib_bypasses(healthy, "127.0.0.1")
    network_env.test_proxies_leave_local_traffic_local(network_env.found.__wrapped__(_host(tmp_path / "ok", healthy)),
                                                       {"network": ""})
