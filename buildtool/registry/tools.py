"""What a registry tool this toolkit runs (skopeo) needs to reach a host as RegistryClient does.

`skopeo_access(host, "src"|"dest")` yields skopeo's options for one side of a copy: plain HTTP as
buildtool.registry.hosts decides it (`--src-tls-verify=false`), the host's certs.d folder
(`--src-cert-dir`), and its credentials (buildtool.registry.credentials, resolved for that host only)
in a private auth file (`--src-authfile`, mode 0600, removed when the block ends): never on a command
line, never in the environment of the tool.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from buildtool.registry import hosts
from buildtool.registry.credentials import authfile


@contextlib.contextmanager
def skopeo_access(host: str, side: str) -> Iterator[list[str]]:
    if side not in ("src", "dest"):
        raise ValueError(f"side {side!r} is src or dest")
    args: list[str] = []
    if hosts.plain_http(host):
        args.append(f"--{side}-tls-verify=false")
    else:
        folder = hosts.cert_dir(host)
        if folder is not None:
            args.append(f"--{side}-cert-dir={folder}")
    with authfile([host]) as path:
        if path is not None:
            args.append(f"--{side}-authfile={path}")
        yield args
