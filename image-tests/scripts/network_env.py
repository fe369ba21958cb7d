"""What decides where the container's connections go: the socket-interface and proxy variables every
process of the image starts with, and the container's network interfaces (which are loopback). Run
with `python3 -I -S` (the environment as the image sets it, nothing the image's site adds). Writes
result.json: {"env": {name: value} of the variables set, "interfaces": [names], "loopback": [names],
"hostname"}. Decides nothing: the test says what breaks."""

import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's folder out
from probe_io import result  # noqa: E402

NAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "http_proxy", "https_proxy", "all_proxy",
         "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "GRPC_PROXY", "no_proxy", "NO_PROXY", "no_grpc_proxy")
IFF_LOOPBACK = 0x8


def loopback(name: str) -> bool:
    try:
        with open(f"/sys/class/net/{name}/flags") as fh:
            return bool(int(fh.read().strip(), 16) & IFF_LOOPBACK)
    except (OSError, ValueError):
        return name.startswith("lo")


names = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
result({"env": {name: os.environ[name] for name in NAMES if name in os.environ}, "interfaces": names,
        "loopback": [name for name in names if loopback(name)], "hostname": socket.gethostname()})
