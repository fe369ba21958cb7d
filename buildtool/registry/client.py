"""Everything that talks to a registry, over the OCI distribution API.

Small on purpose: manifests and blobs by digest, tags, cross-repository blob mounts.
Every call has a timeout; connection errors, timeouts and 5xx are retried with
exponential backoff, 4xx never are. Credentials come from the Docker config or the
environment and never appear in an exception, a log line or a report. Plain-http
(loopback) registries are spoken to over the standard library (buildtool.registry.transport),
https ones through `requests`, imported only then.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildtool.common.errors import FailedError, UserError
from buildtool.common.refs import is_loopback_host
from buildtool.registry.transport import LoopbackTransport, Response, TransportConnectionError, TransportTimeout

if TYPE_CHECKING:
    import requests

log = logging.getLogger(__name__)

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
EMPTY_JSON = b"{}"
EMPTY_JSON_TYPE = "application/vnd.oci.empty.v1+json"
_CONCURRENT_COMMIT_RETRIES = 3


_OUR_ERRORS: dict[type[BaseException], str] = {TransportConnectionError: "ConnectionError",
                                                TransportTimeout: "Timeout"}


class RegistryError(FailedError):
    """A registry refused a request or stayed unreachable after retries (exit 1)."""


class RegistryUnreachable(UserError):
    """No registry answers at this address at all (exit 2: the setting is wrong or it is down)."""


class NotFound(RegistryError):
    pass


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _docker_config_auth(host: str) -> tuple[str, str] | None:
    """user/password for `host` from REGISTRY_USER/REGISTRY_PASSWORD or ~/.docker/config.json."""
    if os.environ.get("REGISTRY_USER") and os.environ.get("REGISTRY_PASSWORD"):
        return os.environ["REGISTRY_USER"], os.environ["REGISTRY_PASSWORD"]
    config = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker")) / "config.json"
    try:
        auths = json.loads(config.read_text()).get("auths", {})
    except (OSError, ValueError):
        return None
    for key in (host, f"https://{host}", f"http://{host}", f"https://{host}/v1/"):
        encoded = auths.get(key, {}).get("auth")
        if encoded:
            user, _, password = base64.b64decode(encoded).decode().partition(":")
            return user, password
    return None


@dataclass
class RetryPolicy:
    attempts: int = 5
    first_delay: float = 0.5
    max_delay: float = 8.0
    timeout: float = 30.0


class RegistryClient:
    """One registry host. `scheme` is http for loopback/local registries, https otherwise."""

    def __init__(self, host: str, *, retry: RetryPolicy | None = None, scheme: str | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.host = host
        # Plain HTTP only for this machine by address (the same predicate --trust-local-key uses).
        self.scheme = scheme or ("http" if is_loopback_host(host) else "https")
        self.retry = retry or RetryPolicy()
        self._session: requests.Session | None = None
        self._loopback = LoopbackTransport() if self.scheme == "http" else None
        self._sleep = sleep
        self._auth = _docker_config_auth(host)
        self._tokens: dict[str, str] = {}
        # Repositories that answered the referrers API with 404 (buildtool.registry.referrers).
        self.no_referrers_api: set[str] = set()

    # -- transport -------------------------------------------------------------------------

    @property
    def session(self) -> requests.Session:
        """requests, for https registries and token servers (imported on first use)."""
        if self._session is None:
            import requests

            self._session = requests.Session()
        return self._session

    def _send(self, method: str, url: str, auth: tuple[str, str] | None,
              **kwargs: Any) -> Response | requests.Response:
        if self._loopback is not None and url.startswith("http://"):
            return self._loopback.send(method, url, headers=kwargs.get("headers") or {}, data=kwargs.get("data"),
                                       timeout=self.retry.timeout, auth=auth, params=kwargs.get("params"))
        return self.session.request(method, url, timeout=self.retry.timeout, auth=auth, **kwargs)

    def _transient(self) -> tuple[type[BaseException], ...]:
        """The errors a retry may cure: connection failures and timeouts, of either transport."""
        errors: tuple[type[BaseException], ...] = (TransportConnectionError, TransportTimeout)
        if self._loopback is None or self._session is not None:
            import requests

            errors += (requests.ConnectionError, requests.Timeout)
        return errors

    def _url(self, path: str) -> str:
        return path if path.startswith("http") else f"{self.scheme}://{self.host}/v2/{path}"

    def _token(self, challenge: str, scope_key: str) -> str | None:
        """Answer a Bearer challenge (token servers such as Docker Hub's or Harbor's)."""
        params = dict(part.split("=", 1) for part in challenge[len("Bearer "):].replace('"', "").split(","))
        realm = params.pop("realm", None)
        if not realm:
            return None
        response = self._send("GET", realm, self._auth, params=params)
        if response.status_code != 200:
            return None
        body = response.json()
        token = body.get("token") or body.get("access_token")
        self._tokens[scope_key] = token
        return token

    def request(self, method: str, path: str, *, ok: tuple[int, ...] = (200,), repo: str = "",
                **kwargs: Any) -> Response | requests.Response:
        """One API call with retries on connection errors, timeouts and 5xx (never 4xx)."""
        url = self._url(path)
        delay = self.retry.first_delay
        last: str = ""
        for attempt in range(1, self.retry.attempts + 1):
            headers = dict(kwargs.pop("headers", {}) or {})
            kwargs["headers"] = headers
            token = self._tokens.get(repo)
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                response = self._send(method, url, None if token else self._auth, **kwargs)
            except self._transient() as exc:
                last = _OUR_ERRORS.get(type(exc), type(exc).__name__)
            else:
                if response.status_code == 401 and "Bearer" in response.headers.get("WWW-Authenticate", "") \
                        and repo not in self._tokens and self._token(response.headers["WWW-Authenticate"], repo):
                    continue
                if response.status_code in ok:
                    return response
                if response.status_code == 404:
                    raise NotFound(f"{method} {self._safe(url)}: not found")
                if response.status_code < 500:
                    raise RegistryError(f"{method} {self._safe(url)}: HTTP {response.status_code} "
                                        f"{_error_text(response)}")
                last = f"HTTP {response.status_code}"
            if attempt < self.retry.attempts:
                log.warning("registry %s: %s %s failed (%s); retry %d/%d in %.1fs", self.host, method,
                            self._safe(url), last, attempt, self.retry.attempts - 1, delay)
                self._sleep(delay)
                delay = min(delay * 2, self.retry.max_delay)
        if last == "ConnectionError":
            raise RegistryUnreachable(self._down_message())
        raise RegistryError(f"{method} {self._safe(url)}: {last} after {self.retry.attempts} attempts")

    def _down_message(self) -> str:
        return (f"registry {self.host} is unreachable; start it (bash scripts/setup.sh starts the local one) "
                "or set REGISTRY to a reachable registry")

    @staticmethod
    def _safe(url: str) -> str:
        """URLs never carry credentials here, but strip query strings (upload state) anyway."""
        return url.split("?", 1)[0]

    # -- API -------------------------------------------------------------------------------

    def ping(self) -> None:
        """Raise RegistryUnreachable when nothing answers, RegistryError when it refuses."""
        self.request("GET", "", ok=(200, 401))

    def get_manifest(self, repo: str, ref: str) -> tuple[bytes, str, str]:
        """(raw bytes, media type, digest) of a manifest or index, by tag or digest."""
        response = self.request("GET", f"{repo}/manifests/{ref}", repo=repo,
                                headers={"Accept": ", ".join(MANIFEST_TYPES)})
        body = response.content
        return body, response.headers.get("Content-Type", "").split(";")[0], sha256_digest(body)

    def manifest_digest(self, repo: str, ref: str) -> str | None:
        """Digest a tag points at, or None when the tag does not exist."""
        try:
            response = self.request("HEAD", f"{repo}/manifests/{ref}", repo=repo,
                                    headers={"Accept": ", ".join(MANIFEST_TYPES)})
        except NotFound:
            return None
        digest = response.headers.get("Docker-Content-Digest")
        return digest or self.get_manifest(repo, ref)[2]

    def put_manifest(self, repo: str, ref: str, body: bytes, media_type: str) -> str:
        for attempt in range(_CONCURRENT_COMMIT_RETRIES + 1):
            try:
                response = self.request("PUT", f"{repo}/manifests/{ref}", ok=(201, 200), repo=repo, data=body,
                                        headers={"Content-Type": media_type})
                break
            except RegistryError as exc:
                # A blob another writer is committing at this moment (concurrent releases mount
                # and upload the same blobs) is briefly unknown to the registry: ask again.
                if "MANIFEST_BLOB_UNKNOWN" not in str(exc) or attempt == _CONCURRENT_COMMIT_RETRIES:
                    raise
                self._sleep(0.2 * (attempt + 1))
        digest = response.headers.get("Docker-Content-Digest") or sha256_digest(body)
        if digest != sha256_digest(body):
            raise RegistryError(f"registry stored {repo}:{ref} as {digest}, not {sha256_digest(body)}")
        return digest

    def has_blob(self, repo: str, digest: str) -> bool:
        try:
            self.request("HEAD", f"{repo}/blobs/{digest}", repo=repo)
            return True
        except NotFound:
            return False

    def get_blob(self, repo: str, digest: str) -> bytes:
        data = self.request("GET", f"{repo}/blobs/{digest}", repo=repo).content
        if sha256_digest(data) != digest:
            raise RegistryError(f"blob {digest} of {repo} does not match its digest")
        return data

    def put_blob(self, repo: str, data: bytes) -> str:
        """Upload a small blob (monolithic POST+PUT); a no-op when it already exists."""
        digest = sha256_digest(data)
        if self.has_blob(repo, digest):
            return digest
        start = self.request("POST", f"{repo}/blobs/uploads/", ok=(202,), repo=repo)
        location = start.headers["Location"]
        if location.startswith("/"):
            location = f"{self.scheme}://{self.host}{location}"
        sep = "&" if "?" in location else "?"
        try:
            self.request("PUT", f"{location}{sep}digest={digest}", ok=(201,), repo=repo, data=data,
                         headers={"Content-Type": "application/octet-stream"})
        except RegistryError:
            # Two writers uploading the same blob at once: the registry may refuse the second
            # commit (DIGEST_INVALID) although the blob is there, whole, by then.
            if not self.has_blob(repo, digest):
                raise
        return digest

    def mount_blob(self, repo: str, digest: str, from_repo: str) -> bool:
        """Cross-repository mount: the registry links the blob, no data moves. True if mounted
        (or already there). One request when the registry mounts: a mount of a blob the target
        already has answers 201 as well, so there is no HEAD first."""
        response = self.request("POST", f"{repo}/blobs/uploads/?mount={digest}&from={from_repo}",
                                ok=(201, 202), repo=repo)
        if response.status_code == 201:
            return True
        # 202: the registry declined to mount and opened an upload instead; cancel it.
        location = response.headers.get("Location", "")
        if location:
            url = location if location.startswith("http") else f"{self.scheme}://{self.host}{location}"
            with contextlib.suppress(RegistryError):
                self.request("DELETE", url, ok=(204, 200, 404), repo=repo)
        return self.has_blob(repo, digest)   # declined, but the target may hold it already

    def mount_blobs(self, repo: str, digests: list[str], from_repo: str) -> None:
        """Mount every blob from `from_repo`, side by side; a declined mount is an error, because
        moving the data through this client is exactly what a promotion must not do."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(8, max(1, len(digests)))) as pool:
            mounted = list(pool.map(lambda blob: self.mount_blob(repo, blob, from_repo), digests))
        for blob, ok in zip(digests, mounted, strict=True):
            if not ok:
                raise RegistryError(f"registry declined to mount {blob} from {from_repo} into {repo}")

    def tags(self, repo: str) -> list[str]:
        try:
            return self.request("GET", f"{repo}/tags/list", repo=repo).json().get("tags") or []
        except NotFound:
            return []


def _error_text(response: Response | requests.Response) -> str:
    try:
        errors = response.json().get("errors", [])
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)[:300]
    except ValueError:
        return response.text[:200]
