"""Registry credentials, resolved the way docker resolves them, for one host and no other.

Where they come from, first match wins (docs/registries.md, "Where credentials come from", says more):

1. REGISTRY_USER / REGISTRY_PASSWORD, only when REGISTRY_AUTH_HOST names the host being contacted
   (`host[:port]`, exactly): credentials that name no host would go to every host a command contacts.
2. REGISTRY_AUTH_FILE (podman's and skopeo's auth.json), then docker's config.json (DOCKER_CONFIG, else
   ~/.docker), each read the way the docker CLI reads it (from_config): the server address is the host, or
   for Docker Hub's hosts `https://index.docker.io/v1/` (docker's ResolveAuthConfig); `credHelpers[ADDRESS]`,
   else `credsStore` (run_helper); then `auths` (docker's fileStore.Get).

Why not the Docker SDK's `docker.auth`: docs/registries.md says; tests/test_credentials.py checks that both pick
the same entry for the same configuration.

Secrets never appear in an exception, a log line or repr(): Credential's repr shows the user and source.
`authfile()` writes credentials for tools this toolkit runs (skopeo) into a private file, never argv.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildtool.common.errors import UserError
from buildtool.common.refs import is_docker_hub

log = logging.getLogger(__name__)

DOCKER_HUB_KEY = "https://index.docker.io/v1/"
TOKEN_USERNAME = "<token>"
HELPER_TIMEOUT_S = 30.0
NOT_FOUND = "credentials not found in native keychain"
_warned_unscoped = False


class CredentialError(UserError):
    """A credential source is broken (malformed entry, a helper that fails): names the file or helper and host."""


@dataclass(frozen=True)
class Credential:
    username: str = ""
    password: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)
    source: str = ""        # where it came from, for messages: "auths in /x/config.json", a helper's name

    def basic(self) -> str:
        """base64 of USER:PASSWORD: an `auths` entry's `auth`, and what a Basic Authorization header sends."""
        return base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


def server_address(host: str) -> str:
    """The key docker looks credentials up by for `host`: Docker Hub's index server, else the host itself."""
    return DOCKER_HUB_KEY if is_docker_hub(host) else host


def _hostname(key: str) -> str:
    """docker's ConvertToHostname: the host part of an `auths` key (a scheme and path stripped)."""
    return key.split("://", 1)[-1].split("/", 1)[0]


def config_files() -> list[Path]:
    """The files credentials are read from, in order (those that exist)."""
    docker_dir = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
    files = [os.environ.get("REGISTRY_AUTH_FILE"), docker_dir / "config.json"]
    return [Path(f) for f in files if f and Path(f).is_file()]


def resolve(host: str) -> Credential | None:
    """Credentials for `host` (`host[:port]` as contacted), or None. CredentialError when a source is broken."""
    env = _from_environment(host)
    if env is not None:
        return env
    for path in config_files():
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CredentialError(f"{path}: not readable JSON ({type(exc).__name__}); fix or remove it") from None
        if not isinstance(config, dict):
            raise CredentialError(f"{path}: not a JSON object; fix or remove it")
        found = from_config(config, host, str(path))
        if found is not None:
            return found
    return None


def _from_environment(host: str) -> Credential | None:
    global _warned_unscoped
    given = {name: os.environ.get(name) for name in ("REGISTRY_USER", "REGISTRY_PASSWORD")}
    if all(value is None for value in given.values()):
        return None
    named = os.environ.get("REGISTRY_AUTH_HOST", "").strip()
    if not named:
        if not _warned_unscoped:
            log.warning("REGISTRY_USER/REGISTRY_PASSWORD are ignored: set REGISTRY_AUTH_HOST to the registry "
                        "host they are for (host[:port]); they are never sent to any other host")
            _warned_unscoped = True
        return None
    hosts = {h.strip().lower() for h in named.split(",") if h.strip()}
    if not (host.lower() in hosts or (is_docker_hub(host) and any(is_docker_hub(h) for h in hosts))):
        return None
    # Half a credential (an empty secret from CI, say) is refused, never dropped for anonymous access or a
    # config file's entry, as an auths entry with an empty password is (from_config).
    missing = [f"{name} is {'unset' if value is None else 'set but empty'}" for name, value in given.items()
               if not value]
    if missing:
        raise CredentialError(f"{' and '.join(missing)}, and REGISTRY_AUTH_HOST names {host} for them: set both "
                              "REGISTRY_USER and REGISTRY_PASSWORD, or unset both")
    user, password = given["REGISTRY_USER"] or "", given["REGISTRY_PASSWORD"] or ""
    return Credential(user, password, source="REGISTRY_USER/REGISTRY_PASSWORD (REGISTRY_AUTH_HOST)")


def from_config(config: dict[str, Any], host: str, where: str) -> Credential | None:
    """Credentials for `host` from one parsed config.json / auth.json (`where` names it in errors)."""
    address = server_address(host)
    helpers = config.get("credHelpers") or {}
    if not isinstance(helpers, dict):      # was ignored: another helper, the auths or anonymous access went instead
        raise CredentialError(f"{where}: `credHelpers` is not an object; fix or remove it")
    helper, store = helpers.get(address), config.get("credsStore")
    if not isinstance(helper, str | None):
        raise CredentialError(f"{where}: credHelpers[{address!r}] for {host} is not a helper's name; fix or remove it")
    if not isinstance(store, str | None):
        raise CredentialError(f"{where}: `credsStore` is not a helper's name; fix or remove it")
    # The key exactly as written: `https://reg.example` does not serve reg.example. A credHelpers key present names
    # the host's store even when empty (or null): "" is docker's file store, the `auths` below, never credsStore
    # (docker's getConfiguredCredentialStore).
    name = helper if address in helpers else store
    if name:
        found = run_helper(name, address, host, where)
        if found is not None:
            return found
    auths = config.get("auths") or {}
    if not isinstance(auths, dict):
        raise CredentialError(f"{where}: `auths` is not an object; fix or remove it")
    # The key equal to ADDRESS, else one whose host part equals it exactly (docker's fileStore.Get: case not folded).
    keys = [k for k in auths if k == address] + [k for k in auths if k != address and _hostname(k) == address]
    for key in keys:
        entry = auths[key]
        if not isinstance(entry, dict):
            raise CredentialError(f"{where}: auths[{key!r}] for {host} is not an object; run `docker login {host}` "
                                  "again")
        found = _from_entry(entry, key, host, where)
        if found is not None:
            return found
    return None


def _from_entry(entry: dict[str, Any], key: str, host: str, where: str) -> Credential | None:
    source = f"auths[{key!r}] in {where}"
    user, password = _decode(entry["auth"], key, host, where) if entry.get("auth") else ("", "")
    if entry.get("identitytoken"):
        return Credential(user, identity_token=str(entry["identitytoken"]), source=source)
    if not user and entry.get("username"):      # written by some tools; docker reads it too
        user, password = str(entry["username"]), str(entry.get("password") or "")
    # A login whose secret was empty (an unset CI variable): docker takes the entry and sends nothing, so a
    # registry's refusal would blame credentials that were never sent.
    if user and not password:
        raise CredentialError(f"{where}: auths[{key!r}] for {host} has an empty password; run `docker login {host}` "
                              "again")
    return Credential(user, password, source=source) if user else None


def _decode(value: Any, key: str, host: str, where: str) -> tuple[str, str]:
    problem = f"{where}: auths[{key!r}].auth for {host} is not base64 of USER:PASSWORD; run `docker login {host}` again"
    if not isinstance(value, str):
        raise CredentialError(problem)
    try:
        text = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise CredentialError(problem) from None
    user, sep, password = text.partition(":")
    if not sep or not user:
        raise CredentialError(problem)
    return user, password


def run_helper(name: str, server: str, host: str, where: str, timeout: float = HELPER_TIMEOUT_S) -> Credential | None:
    """`docker-credential-NAME get` for `server`; None when it has nothing for it."""
    program = f"docker-credential-{name}"
    exe = shutil.which(program)
    if exe is None:
        raise CredentialError(f"{where} names the credential helper {program} for {host}, and it is not on PATH; "
                              "install it or remove the entry")
    try:
        proc = subprocess.run([exe, "get"], input=server.encode(), capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CredentialError(f"{program} get for {host} did not answer in {timeout:.0f} s") from None
    except OSError as exc:
        raise CredentialError(f"{program} get for {host} could not start: {exc.strerror}") from None
    out = proc.stdout.decode("utf-8", errors="replace").strip()
    if proc.returncode != 0:
        # Only the exact text of docker-credential-helpers' ErrCredentialsNotFound on stdout means "nothing for this
        # server", as docker reads it: any other failure (`exec: "pass": executable file not found`) is one.
        if out == NOT_FOUND:
            return None
        # Its stdout alone, as docker shows it: what a helper writes to stderr (a debug trace, a tool it runs) may
        # hold the secret, and is left for the user to see by running the helper.
        message = out.splitlines()
        first = message[0][:200] if message else (f"exit {proc.returncode} (its error output is not shown: it may "
                                                  f"hold a secret; run `echo {server} | {program} get` to see it)")
        if first.lstrip().startswith(("{", "[")):   # credentials JSON, then a failing exit: never shown
            first = f"exit {proc.returncode}, after printing JSON (not shown: it may hold the secret)"
        raise CredentialError(f"{program} get for {host} failed: {first}")
    try:
        data = json.loads(out)
        user, secret = str(data.get("Username") or ""), str(data.get("Secret") or "")
    except (ValueError, AttributeError):
        raise CredentialError(f"{program} get for {host} printed no credentials JSON") from None
    if not secret:
        return None
    if user == TOKEN_USERNAME:      # the Secret is an identity (refresh) token
        return Credential(identity_token=secret, source=program)
    return Credential(user, secret, source=program)


@contextlib.contextmanager
def authfile(hosts: Iterable[str]) -> Iterator[Path | None]:
    """A private auth.json (containers-auth.json / docker `auths` format) with the credentials of `hosts`
    as this module resolves them, for skopeo's --authfile: mode 0600 in a private (0700) temporary folder,
    removed afterwards, whatever happens. Yields None when no host has credentials."""
    auths: dict[str, dict[str, str]] = {}
    for host in dict.fromkeys(hosts):
        found = resolve(host)
        if found is None:
            continue
        entry: dict[str, str] = {}
        if found.password:
            entry["auth"] = found.basic()
        if found.identity_token:
            # containers/image (skopeo) skips an entry whose `auth` is not USER:PASSWORD, identitytoken and all: the
            # user (docker's `<token>` for a helper's token) with no password, as `docker login` writes it.
            entry["auth"] = Credential(found.username or TOKEN_USERNAME, found.password).basic()
            entry["identitytoken"] = found.identity_token
        auths[server_address(host)] = entry
    if not auths:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="buildtool-auth-"))   # mkdtemp: mode 0700
    try:
        path = folder / "auth.json"
        path.touch(mode=0o600, exist_ok=False)     # private before a secret is written into it
        path.write_text(json.dumps({"auths": auths}), encoding="utf-8")
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)
