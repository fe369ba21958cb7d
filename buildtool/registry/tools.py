"""How this toolkit reaches a registry host: plain HTTP or HTTPS, which CA its certificate is checked against, and
what a registry tool this toolkit runs (skopeo) needs to reach it as RegistryClient does.

- Plain HTTP is spoken to this machine by address (buildtool.common.refs.is_loopback_host) and to the
  hosts named in DL_IMAGES_INSECURE_REGISTRIES (comma-separated `host[:port]`, off by default), as
  docker's `insecure-registries` setting does. Naming a host there changes only the scheme: it does not
  make a key "local" (--trust-local-key still goes by address) and credentials still never go to a
  plain-HTTP token realm (buildtool.registry.auth).
- A host's CA is read where docker and skopeo read it: every `*.crt` in /etc/docker/certs.d/HOST[:PORT]/
  (also /etc/containers/certs.d/, podman's place; DL_IMAGES_CERTS_D names other roots, colon-separated,
  for tests and for users without root). Those CAs are added to the default trust (certifi, or
  REQUESTS_CA_BUNDLE), for that host only.
- `skopeo_access(host, "src"|"dest")` yields skopeo's options for one side of a copy: plain HTTP as
  `plain_http` decides it (`--src-tls-verify=false`), the host's certs.d folder (`--src-cert-dir`), and its
  credentials (buildtool.registry.credentials, resolved for that host only) in a private auth file
  (`--src-authfile`, mode 0600, removed when the block ends): never on a command line, never in the
  environment of the tool.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from buildtool.common.errors import UserError
from buildtool.common.refs import is_loopback_host
from buildtool.registry.credentials import authfile

if TYPE_CHECKING:
    import ssl

INSECURE_ENV = "DL_IMAGES_INSECURE_REGISTRIES"
CERTS_D_ENV = "DL_IMAGES_CERTS_D"
CERTS_D_ROOTS = ("/etc/docker/certs.d", "/etc/containers/certs.d")


def plain_http(host: str) -> bool:
    """Whether `host` (`host[:port]`) is spoken to over plain HTTP."""
    named = {part.strip().lower() for part in os.environ.get(INSECURE_ENV, "").split(",") if part.strip()}
    return is_loopback_host(host) or host.lower() in named


def host_ca_files(netloc: str) -> list[Path]:
    """The `*.crt` CA files docker would read for registry `netloc` (`host[:port]`), in a stable order
    (DL_IMAGES_CERTS_D's roots first), the one lookup RegistryClient and skopeo_access share: certs.d/HOST[:PORT]
    with the host as written, not lower-cased (docker joins certs.d with the reference's host as it is,
    containers/image too; a folder for `Registry.Example` is not one for `registry.example`), and for a host
    without a port also HOST:443 (a folder named for the https port)."""
    roots = [root for root in (*os.environ.get(CERTS_D_ENV, "").split(":"), *CERTS_D_ROOTS) if root]
    for folder in (netloc, f"{netloc}:443") if ":" not in netloc else (netloc,):
        found = [path for root in roots for path in sorted((Path(root) / folder).glob("*.crt"))]
        if found:
            return found
    return []


def ssl_context(netloc: str) -> ssl.SSLContext | None:
    """A verifying context that trusts the default CAs plus `netloc`'s certs.d CAs (host_ca_files); None when it
    has none."""
    files = host_ca_files(netloc)
    if not files:
        return None
    import ssl

    import certifi  # requests' own CA bundle (it depends on certifi)

    setting = next((name for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE") if os.environ.get(name)), "")
    bundle = os.environ[setting] if setting else certifi.where()
    try:
        # A folder is openssl's capath (c_rehash names), as requests itself takes REQUESTS_CA_BUNDLE: not a cafile.
        folder = os.path.isdir(bundle)
        context = ssl.create_default_context(cafile=None if folder else bundle, capath=bundle if folder else None)
    except (OSError, ssl.SSLError) as exc:
        raise UserError(f"{setting or 'certifi'}: {bundle} is no CA bundle ({exc.strerror or exc}); point it at a PEM "
                        "file or a folder of hashed certificates (c_rehash), or unset it") from None
    for path in files:
        context.load_verify_locations(cafile=str(path))
    return context


@contextlib.contextmanager
def skopeo_access(host: str, side: str) -> Iterator[list[str]]:
    if side not in ("src", "dest"):
        raise ValueError(f"side {side!r} is src or dest")
    args: list[str] = []
    if plain_http(host):
        args.append(f"--{side}-tls-verify=false")
    elif files := host_ca_files(host):    # the certs.d folder (DL_IMAGES_CERTS_D's first) that holds its CA
        args.append(f"--{side}-cert-dir={files[0].parent}")
    with authfile([host]) as path:
        if path is not None:
            args.append(f"--{side}-authfile={path}")
        yield args
