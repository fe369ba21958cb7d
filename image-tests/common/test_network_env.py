"""The image's environment sends no connection somewhere that works on one host only: no socket
interface of gloo, NCCL or TensorPipe pinned to the loopback device (ranks on other hosts would be
told 127.0.0.1 and time out connecting to themselves), and no proxy variable without a no_proxy
that keeps loopback and the cluster's addresses off the proxy (urllib, requests and gRPC, so
TensorBoard's API and jax.distributed's coordinator, would send local connections to the proxy), as each of
them reads it: urllib and requests take the lower-case no_proxy over NO_PROXY, gRPC no_grpc_proxy over no_proxy
and reads no upper-case variable.
Read through testinfra's `host`: the variables as every process of the image gets them, and the container's
interfaces from /sys/class/net. Each problem names the variable and its value (a proxy's password masked)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from harness import NO_PROXY_VARS, PROXY_VARS, SOCKET_VARS, docker_lines, shown

pytestmark = pytest.mark.shared(why="reads the container's environment and interfaces")

LOOPBACK_HOSTS = ("localhost", "127.0.0.1")
USERS = {"GLOO_SOCKET_IFNAME": "gloo (torch.distributed's CPU backend, JAX's CPU collectives)",
         "NCCL_SOCKET_IFNAME": "NCCL", "TP_SOCKET_IFNAME": "TensorPipe (torch RPC)"}


IFF_LOOPBACK = 0x8


def interface_flags(host) -> dict[str, int]:
    """Each interface of /sys/class/net with its flags. An interface removed between the glob and its read (a
    bridge of another container going away on a host-network run) fails its read with EINVAL: it is left out,
    as long as some interface was read."""
    read = host.run("grep -sH . /sys/class/net/*/flags")
    if read.rc not in (0, 2) or not read.stdout.strip():
        pytest.fail(f"could not read the container's interfaces from /sys/class/net (rc {read.rc}): "
                    f"{read.stderr.strip() or 'no interface listed'}")
    lines = (line.split(":", 1) for line in read.stdout.splitlines())
    return {path.split("/")[-2]: int(value, 16) for path, value in lines}


@pytest.fixture(scope="module")
def found(host) -> dict[str, Any]:
    """The image's socket and proxy variables, and its interfaces with which of them are loopback."""
    names = interface_flags(host)
    return {"env": {k: v for k, v in host.environment().items() if k in (*SOCKET_VARS, *PROXY_VARS, *NO_PROXY_VARS)},
            "interfaces": sorted(names), "loopback": sorted(n for n, f in names.items() if f & IFF_LOOPBACK)}


def interfaces_selected(name: str, value: str, known: list[str]) -> list[str] | None:
    """The interfaces a socket-interface variable lets its library use, from `known` (None: it excludes
    some, `^lo`, and so leaves the rest). NCCL takes prefixes (`=name` exact, `^` excludes); gloo and
    TensorPipe take names (gloo a comma list)."""
    value = value.strip()
    if not value:
        return list(known)
    if value.startswith("^"):
        return None
    exact = name != "NCCL_SOCKET_IFNAME" or value.startswith("=")
    wanted = [w.strip() for w in value.lstrip("=").split(",") if w.strip()]
    return [i for i in known if any(i == w if exact else i.startswith(w) for w in wanted)] or wanted


def pinned_to_loopback(env: dict[str, str], interfaces: list[str], loopback: list[str]) -> list[str]:
    """`NAME=value` of every socket-interface variable that selects loopback interfaces only."""
    pinned = []
    for name in SOCKET_VARS:
        if name not in env:
            continue
        chosen = interfaces_selected(name, env[name], interfaces)
        if chosen and all(i in loopback or (i not in interfaces and i.startswith("lo")) for i in chosen):
            pinned.append(f"{name}={shown(env[name])}")
    return pinned


def covered(host: str, no_proxy: str) -> bool:
    """Whether a no_proxy value keeps `host` (a name, an address or a network) off the proxy, as the
    clients that read it do: `*`, the name or address itself, a domain suffix (`.example.com` or
    `example.com`), an address inside a CIDR entry (requests, curl and gRPC)."""
    try:
        net: ipaddress.IPv4Network | ipaddress.IPv6Network | None = ipaddress.ip_network(host, strict=False)
    except ValueError:
        net = None
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        if net is not None:
            try:
                if net.subnet_of(ipaddress.ip_network(entry, strict=False)):  # type: ignore[arg-type]
                    return True
            except (ValueError, TypeError):
                continue
        elif host.lower() == entry.lstrip(".") or host.lower().endswith("." + entry.lstrip(".")):
            return True
    return False


# Clients that read one no-proxy list, the first of theirs that is set, not all of them together: Python's urllib and
# requests take the lower-case no_proxy over NO_PROXY; gRPC's C core (jax.distributed's coordinator) takes
# no_grpc_proxy over no_proxy, and of grpc_proxy, https_proxy, http_proxy (lower case only) the first that is set
# (grpc/grpc doc/environment_variables.md). (who, the proxies it reads, only the first set counts, its no-proxy lists)
CLIENTS = (("urllib and requests (TensorBoard's API, downloads)",
            ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"), False,
            ("no_proxy", "NO_PROXY")),
           ("gRPC (jax.distributed's coordinator)", ("grpc_proxy", "https_proxy", "http_proxy"), True,
            ("no_grpc_proxy", "no_proxy")))


def client_problems(env: dict[str, str], cluster: list[str]) -> list[str]:
    """What each client's own no-proxy list (the first of its variables that is set) leaves of loopback and `cluster`
    to a proxy it reads, one line per list; [] when every such list covers them."""
    found: dict[str, tuple[list[str], list[str], list[str], str]] = {}   # said -> clients, proxies, missing, fix
    for who, proxy_names, first_only, no_proxy_names in CLIENTS:
        names = [name for name in proxy_names if name in env][:1] if first_only else list(proxy_names)
        proxies = [f"{name}={shown(env[name])}" for name in names if env.get(name, "").strip()]
        read = next((name for name in no_proxy_names if name in env), "")
        missing = [host for host in (*LOOPBACK_HOSTS, *cluster) if not covered(host, env.get(read, ""))]
        said = f"{read}={env[read]}" if read else f"neither {' nor '.join(no_proxy_names)} is set"
        if proxies and missing:
            clients, shown_proxies, _, _ = found.setdefault(said, ([], [], missing, read or no_proxy_names[-1]))
            clients.append(who)
            shown_proxies.extend(p for p in proxies if p not in shown_proxies)
    lines = []
    for said, (clients, proxies, missing, fix) in found.items():
        ignored = [name for name in NO_PROXY_VARS if not said.startswith(name + "=") and name in env]
        unread = f" (not {', '.join(ignored)})" if ignored else ""
        lines.append(f"{', '.join(proxies)} set in the image, and {said}: the no-proxy list {' and '.join(clients)} "
                     f"read{unread} does not cover {', '.join(missing)}, "
                     f"so their local connections go to the proxy; add localhost,127.0.0.1,<the cluster's domains and "
                     f"addresses> to {fix} too, or set proxies per job instead of in the image")
    return lines


def proxy_problem(env: dict[str, str], cluster: list[str]) -> str:
    """'' when no proxy variable is set or no_proxy covers loopback and `cluster` for every client; else what is
    wrong."""
    proxies = [f"{name}={shown(env[name])}" for name in PROXY_VARS if env.get(name, "").strip()]
    if not proxies:
        return ""
    no_proxy = ",".join(env[n] for n in ("no_proxy", "NO_PROXY") if n in env)
    missing = [host for host in (*LOOPBACK_HOSTS, *cluster) if not covered(host, no_proxy)]
    if not missing:
        return "; ".join(client_problems(env, cluster))
    said = ", ".join(f"{n}={env[n]}" for n in ("no_proxy", "NO_PROXY") if n in env) or "no_proxy is unset"
    return (f"{', '.join(proxies)} set in the image, and {said}, which does not cover {', '.join(missing)}: "
            "local connections through urllib, requests and gRPC (TensorBoard's API, jax.distributed's "
            "coordinator, a job's rendezvous) go to the proxy; add no_proxy=localhost,127.0.0.1,<the cluster's "
            "domains and addresses> beside them, or set proxies per job instead of in the image")


def run_network_subnets(network: str) -> list[str]:
    """The subnets of the run's bridge network: the cluster's addresses in this validation ([] when the target names
    no network). A network that cannot be inspected or has no subnet fails the test naming it: no_proxy would go
    unchecked against the cluster's addresses."""
    if not network:
        return []
    subnets = [line.strip() for line in docker_lines("network", "inspect", "--format",
                                                     "{{range .IPAM.Config}}{{println .Subnet}}{{end}}", network)
               if line.strip()]
    if not subnets:
        pytest.fail(f"`docker network inspect {network}` named no subnet of the run's bridge network (the network "
                    "is gone, or the engine failed): no_proxy cannot be checked against the cluster's addresses",
                    pytrace=False)
    return subnets


def test_socket_interfaces_are_not_pinned_to_loopback(found):
    pinned = pinned_to_loopback(found["env"], found["interfaces"], found["loopback"])
    users = "; ".join(f"{p.split('=')[0]} is read by {USERS[p.split('=')[0]]}" for p in pinned)
    assert not pinned, (
        f"{', '.join(pinned)} set in the image pins the sockets to the loopback device: each rank tells the others "
        f"to connect to 127.0.0.1, which works on one host only; ranks on other hosts time out connecting "
        f"(gloo: connectFullMesh failed ... timed out connecting ... remote=[127.0.0.1]) ({users}); remove it from "
        f"the image and set the cluster's interface per job")


def test_proxies_leave_local_traffic_local(found, target):
    env = found["env"]
    proxied = any(env.get(name, "").strip() for name in PROXY_VARS)   # the run's network matters only behind a proxy
    problem = proxy_problem(env, run_network_subnets(target.get("network", "")) if proxied else [])
    assert not problem, problem
