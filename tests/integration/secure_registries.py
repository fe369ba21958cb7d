"""Two registries that refuse strangers, on loopback addresses under names that are not loopback (so the
toolkit speaks HTTPS to them), for the integration tests of issue 36:

- `tls-registry.test` (127.0.0.21): distribution 2.8 (Debian's docker-registry) with TLS from an in-house CA
  made for the session (tests/pki.py) and htpasswd Basic auth (bcrypt, cost 4: distribution checks the
  hash on every request).
- `token-registry.test` (127.0.0.22): the same with token auth; the token server (tests/tokenserver.py,
  RS256 JWTs, per-user scopes, settable token life and a 429-every-Nth mode, every request's headers
  recorded) answers at `auth.token-registry.test` (127.0.0.23), another name and port.

The session fixture writes the names into /etc/hosts and each CA into /etc/docker/certs.d/HOST:PORT/ca.crt
(where docker, skopeo and buildtool read it) and removes both, and stops the registries, in every path. It
needs root (CI runs as root); without root it fails saying so.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests import pki
from tests.tokenserver import TokenServer

PASSWORD = f"Pw-{uuid.uuid4().hex[:16]}"       # a fresh secret per session: searched for in every output
USERS = {"alice": PASSWORD, "reader": f"Rd-{uuid.uuid4().hex[:12]}"}
GRANTS = {"alice": {"*": "pull,push,delete"}, "reader": {"*": "pull"}}
ADDRESSES = {"tls-registry.test": "127.0.0.21", "token-registry.test": "127.0.0.22",
             "auth.token-registry.test": "127.0.0.23"}
HOSTS_FILE = Path("/etc/hosts")
CERTS_D = Path("/etc/docker/certs.d")


def secrets_of(password: str = PASSWORD, user: str = "alice") -> list[str]:
    """The forms a leaked password could take."""
    return [password, base64.b64encode(f"{user}:{password}".encode()).decode(),
            base64.b64encode(password.encode()).decode()]


@dataclass
class Registry:
    name: str
    host: str                   # name:port
    kind: str                   # "basic" or "token"
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class SecureRegistries:
    ca: pki.CA
    basic: Registry
    token: Registry
    tokens: TokenServer
    folder: Path
    added_dirs: list[Path] = field(default_factory=list)

    def by_kind(self, kind: str) -> Registry:
        return self.basic if kind == "basic" else self.token

    def logs(self) -> str:
        return "".join(r.log.read_text(errors="replace") for r in (self.basic, self.token) if r.log.exists())


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _bcrypt(password: str) -> str:
    try:
        import bcrypt

        return str(bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode())
    except ImportError:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt  # Python 3.11's, through libxcrypt: bcrypt ($2b$), which distribution accepts

            return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))


def _config(folder: Path, address: str, port: int, cert: pki.Issued, auth: str) -> Path:
    storage = folder / "storage"
    storage.mkdir(parents=True, exist_ok=True)
    text = f"""version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: {address}:{port}
  secret: {uuid.uuid4().hex}
  tls:
    certificate: {cert.cert}
    key: {cert.key}
{auth}"""
    path = folder / "config.yml"
    path.write_text(text)
    return path


def _wait(host: str, address: str, port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"docker-registry for {host} exited {process.returncode}: "
                               f"{log.read_text(errors='replace')[-800:]}")
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"docker-registry for {host} did not listen in 20 s: {log.read_text(errors='replace')[-800:]}")


@contextlib.contextmanager
def _hosts_entries(marker: str) -> Iterator[None]:
    lines = "".join(f"{address} {name}  # {marker}\n" for name, address in ADDRESSES.items())
    with HOSTS_FILE.open("a") as out:
        out.write(lines)
    try:
        yield
    finally:
        kept = [ln for ln in HOSTS_FILE.read_text().splitlines(keepends=True) if marker not in ln]
        HOSTS_FILE.write_text("".join(kept))


def _trust(ca: pki.CA, netloc: str, added: list[Path]) -> None:
    """CA into certs.d/NETLOC/ca.crt; `added` gets every folder made, to remove in reverse order."""
    for folder in (CERTS_D.parent, CERTS_D, CERTS_D / netloc):
        if not folder.exists():
            folder.mkdir()
            added.append(folder)
    shutil.copy(ca.cert, CERTS_D / netloc / "ca.crt")


def _untrust(added: list[Path]) -> None:
    for folder in reversed(added):
        if folder.parent == CERTS_D:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                folder.rmdir()          # /etc/docker, certs.d: only when nothing else is in them


@contextlib.contextmanager
def secure_registries(folder: Path) -> Iterator[SecureRegistries]:
    if os.geteuid() != 0:
        raise RuntimeError("the secure-registry tests write /etc/hosts and /etc/docker/certs.d: run them as root "
                           "(CI does)")
    if shutil.which("docker-registry") is None:
        raise RuntimeError("docker-registry is not installed (apt-get install docker-registry; scripts/setup.sh)")
    marker = f"dl-images-secure-registries-{uuid.uuid4().hex[:8]}"
    ca = pki.make_ca(folder / "ca")
    cert = ca.issue("servers", list(ADDRESSES))
    signer = pki.self_signed(folder / "signer", "token-signer")
    processes: list[subprocess.Popen[bytes]] = []
    added: list[Path] = []
    tokens: TokenServer | None = None
    try:
        with _hosts_entries(marker):
            ports = {name: _free_port(address) for name, address in ADDRESSES.items()}
            tokens = TokenServer(signing_cert=signer.cert, signing_key=signer.key, users=USERS, grants=GRANTS,
                                 service="token-registry.test", address=ADDRESSES["auth.token-registry.test"],
                                 port=ports["auth.token-registry.test"], tls=(cert.cert, cert.key))
            htpasswd = folder / "htpasswd"
            htpasswd.write_text("".join(f"{u}:{_bcrypt(p)}\n" for u, p in USERS.items()))
            auths = {
                "tls-registry.test": f"auth:\n  htpasswd:\n    realm: tls-registry.test\n    path: {htpasswd}\n",
                "token-registry.test": (f"auth:\n  token:\n    realm: {tokens.url('auth.token-registry.test')}\n"
                                        f"    service: token-registry.test\n    issuer: {tokens.issuer}\n"
                                        f"    rootcertbundle: {signer.cert}\n"),
            }
            made: dict[str, Registry] = {}
            for name, auth in auths.items():
                address, port = ADDRESSES[name], ports[name]
                config = _config(folder / name, address, port, cert, auth)
                log = folder / f"{name}.log"
                with log.open("wb") as out:
                    process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=out,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                processes.append(process)
                _wait(name, address, port, process, log)
                made[name] = Registry(name, f"{name}:{port}", "basic" if "htpasswd" in auth else "token", process, log)
            realm = f"auth.token-registry.test:{ports['auth.token-registry.test']}"
            for netloc in [r.host for r in made.values()] + [realm]:
                _trust(ca, netloc, added)
            yield SecureRegistries(ca, made["tls-registry.test"], made["token-registry.test"], tokens, folder, added)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if tokens is not None:
            tokens.close()
        _untrust(added)


def write_auths(config_dir: Path, host: str, user: str = "alice", password: str = PASSWORD) -> None:
    """A scratch DOCKER_CONFIG with the credentials inline in `auths`."""
    config_dir.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (config_dir / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))


def write_helper(config_dir: Path, bin_dir: Path, hosts: list[str], user: str = "alice",
                 password: str = PASSWORD) -> None:
    """A scratch DOCKER_CONFIG whose `credsStore` is docker-credential-dltest, a script in `bin_dir` (put it on
    PATH) that knows `hosts` and nothing else."""
    config_dir.mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "config.json").write_text(json.dumps({"credsStore": "dltest"}))
    table = json.dumps({h: {"ServerURL": h, "Username": user, "Secret": password} for h in hosts})
    script = bin_dir / "docker-credential-dltest"
    script.write_text(f"""#!/usr/bin/env python3
import json, sys
if sys.argv[1:] != ["get"]:
    sys.exit(1)
found = json.loads({table!r}).get(sys.stdin.read().strip())
if not found:
    print("credentials not found in native keychain")
    sys.exit(1)
print(json.dumps(found))
""")
    script.chmod(0o700)
