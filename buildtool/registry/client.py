"""Everything that talks to a registry, over the OCI distribution API.

Small on purpose: manifests and blobs by digest, tags, cross-repository blob mounts.
Every call has a timeout; connection errors, timeouts and 5xx are retried with exponential
backoff, 429 and 503 after the `Retry-After` the server names (bounded: RetryPolicy), other 4xx
and TLS failures never are. Authentication (Basic, and the distribution token flow with scopes
and expiry) is buildtool.registry.auth's; credentials come from docker's config, its credential
helpers, auth.json or REGISTRY_USER/REGISTRY_PASSWORD with REGISTRY_AUTH_HOST
(buildtool.registry.credentials), for this client's host only, and never appear in an exception,
a log line or a report. Redirects are followed here (GET and HEAD), and the Authorization header
never crosses to another host, port or scheme. Plain-http registries (loopback, or named in
DL_IMAGES_INSECURE_REGISTRIES: buildtool.registry.hosts) are spoken to over the standard library
(buildtool.registry.transport), https ones through `requests`, imported only then, trusting the
CA in /etc/docker/certs.d/HOST[:PORT]/ as docker does.
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from buildtool.registry import hosts
from buildtool.registry.auth import HostAuth, Triple, needed_scopes
from buildtool.registry.errors import (
    NotFound,
    RateLimited,
    RegistryError,
    RegistryTLSError,
    RegistryUnreachable,
)
from buildtool.registry.transport import LoopbackTransport, Response, TransportConnectionError, TransportTimeout

if TYPE_CHECKING:
    import requests

__all__ = ["NotFound", "RegistryClient", "RegistryError", "RegistryUnreachable", "RetryPolicy", "sha256_digest"]

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
_REDIRECTS = (301, 302, 303, 307, 308)
_AUTH_ROUNDS = 2          # 401s one request answers by (re)authenticating before it gives up
# docker.io names the registry; its API answers at registry-1.docker.io (as the docker CLI does it).
_API_HOSTS = {"docker.io": "registry-1.docker.io", "index.docker.io": "registry-1.docker.io"}


_OUR_ERRORS: dict[type[BaseException], str] = {TransportConnectionError: "ConnectionError",
                                                TransportTimeout: "Timeout"}


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class RetryPolicy:
    attempts: int = 5
    first_delay: float = 0.5
    max_delay: float = 8.0
    timeout: float = 30.0
    max_retry_after: float = 60.0      # a longer Retry-After fails at once (RateLimited), naming it
    rate_limit_budget: float = 300.0   # seconds one client may spend waiting out 429/503, all calls together


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a `Retry-After` header asks for (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc.lower()


_TLS_REASON = re.compile(r"\[SSL: [A-Z_]+\] ([^(\'\"]+)|(certificate verify failed[^(\'\"]*)|(hostname [^(\'\"]+)")


def _tls_reason(exc: BaseException) -> str:
    found = _TLS_REASON.search(str(exc))
    if found:
        return next(g for g in found.groups() if g).strip().rstrip(".")
    return type(exc).__name__


class RegistryClient:
    """One registry host. `scheme` is http for loopback registries and those named in
    DL_IMAGES_INSECURE_REGISTRIES, https otherwise."""

    def __init__(self, host: str, *, retry: RetryPolicy | None = None, scheme: str | None = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
        self.host = host
        self.api_host = _API_HOSTS.get(host.lower(), host)
        # Plain HTTP only for this machine by address, or a host the user named as insecure.
        self.scheme = scheme or ("http" if hosts.plain_http(host) else "https")
        self.retry = retry or RetryPolicy()
        self._session: requests.Session | None = None
        self._loopback: LoopbackTransport | None = None
        self._sleep = sleep
        self._clock = clock
        self.auth = HostAuth(host, self._exchange, clock=clock)
        self._tls_ready: set[str] = set()
        self._lock = threading.Lock()
        self._rate_waited = 0.0
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

    def _prepare_tls(self, url: str) -> None:
        """Trust the CA docker would trust for this URL's host (/etc/docker/certs.d/HOST[:PORT]/*.crt)."""
        netloc = urlsplit(url).netloc.lower()
        with self._lock:
            if netloc in self._tls_ready:
                return
            self._tls_ready.add(netloc)
            context = hosts.ssl_context(netloc)
            if context is None and ":" not in netloc:
                context = hosts.ssl_context(f"{netloc}:443")
            if context is not None:
                self.session.mount(f"https://{netloc}/", _ContextAdapter(context))

    def _send_once(self, method: str, url: str, headers: dict[str, str], data: bytes | None) -> Any:
        if url.startswith("http://"):
            if self._loopback is None:
                self._loopback = LoopbackTransport()
            return self._loopback.send(method, url, headers=headers, data=data, timeout=self.retry.timeout, auth=None)
        self._prepare_tls(url)
        return self.session.request(method, url, headers=headers, data=data, timeout=self.retry.timeout,
                                    allow_redirects=False)

    def _send(self, method: str, url: str, headers: dict[str, str], data: bytes | None) -> Any:
        """One exchange; GET/HEAD redirects followed, the Authorization header dropped on leaving the origin."""
        response = self._send_once(method, url, headers, data)
        for _ in range(5):
            if response.status_code not in _REDIRECTS or method not in ("GET", "HEAD"):
                break
            location = response.headers.get("Location", "")
            if not location:
                break
            target = urljoin(url, location)
            if _origin(target) != _origin(url):
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            url = target
            response = self._send_once(method, url, headers, data)
        return response

    def _transient(self) -> tuple[type[BaseException], ...]:
        """The errors a retry may cure: connection failures and timeouts, of either transport."""
        errors: tuple[type[BaseException], ...] = (TransportConnectionError, TransportTimeout)
        if self._session is not None:
            import requests

            errors += (requests.ConnectionError, requests.Timeout)
        return errors

    def _tls_errors(self) -> tuple[type[BaseException], ...]:
        if self._session is None:
            return ()
        import requests

        return (requests.exceptions.SSLError,)

    def _url(self, path: str) -> str:
        return path if path.startswith("http") else f"{self.scheme}://{self.api_host}/v2/{path}"

    def _exchange(self, method: str, url: str, *, headers: dict[str, str], data: bytes | None = None) -> Any:
        """One call with retries: connection errors, timeouts and 5xx with backoff, 429 and 503 after their
        Retry-After (bounded); the last answer otherwise (any status). TLS failures are not retried."""
        delay = self.retry.first_delay
        last: str = ""
        response = None
        for attempt in range(1, self.retry.attempts + 1):
            wait = delay
            try:
                response = self._send(method, url, headers, data)
            except self._tls_errors() as exc:
                netloc = urlsplit(url).netloc
                raise RegistryTLSError(f"TLS to {netloc} failed: {_tls_reason(exc)}; {hosts.tls_hint(netloc)}") \
                    from None
            except self._transient() as exc:
                last = _OUR_ERRORS.get(type(exc), type(exc).__name__)
                response = None
            else:
                status = response.status_code
                if status not in (429,) and status < 500:
                    return response
                last = f"HTTP {status}"
                asked = retry_after(response.headers.get("Retry-After"))
                if status in (429, 503) and asked is not None:
                    if asked > self.retry.max_retry_after:
                        raise RateLimited(f"{method} {self._safe(url)}: {last}, Retry-After {asked:.0f} s, longer "
                                          f"than the {self.retry.max_retry_after:.0f} s this command waits; try later")
                    wait = asked
                if status in (429, 503):
                    with self._lock:
                        self._rate_waited += wait
                        spent = self._rate_waited
                    if spent > self.retry.rate_limit_budget:
                        raise RateLimited(f"{method} {self._safe(url)}: {last}; rate-limited for over "
                                          f"{self.retry.rate_limit_budget:.0f} s in all; try later")
            if attempt < self.retry.attempts:
                log.warning("registry %s: %s %s failed (%s); retry %d/%d in %.1fs", self.host, method,
                            self._safe(url), last, attempt, self.retry.attempts - 1, wait)
                self._sleep(wait)
                delay = min(delay * 2, self.retry.max_delay)
        if response is not None:
            if response.status_code == 429:
                raise RateLimited(f"{method} {self._safe(url)}: {last} after {self.retry.attempts} attempts")
            return response
        if last == "ConnectionError" and urlsplit(url).netloc.lower() == self.api_host.lower():
            raise RegistryUnreachable(self._down_message())
        raise RegistryError(f"{method} {self._safe(url)}: {last} after {self.retry.attempts} attempts")

    def request(self, method: str, path: str, *, ok: tuple[int, ...] = (200,), repo: str = "",
                mount_from: str = "", **kwargs: Any) -> Response | requests.Response:
        """One API call: authenticated as the registry asks (scopes for `repo`, and `mount_from` for a
        cross-repository mount), retried on connection errors, timeouts, 5xx and 429 (never other 4xx)."""
        url = self._url(path)
        base = dict(kwargs.pop("headers", None) or {})
        data = kwargs.pop("data", None)
        if kwargs:
            raise TypeError(f"unexpected arguments: {', '.join(kwargs)}")
        needed: frozenset[Triple] = needed_scopes(method, repo, mount_from)
        for rounds in range(_AUTH_ROUNDS + 1):
            headers = dict(base)
            sent = self.auth.header(needed)
            if sent:
                headers["Authorization"] = sent
            response = self._exchange(method, url, headers=headers, data=data)
            if response.status_code != 401 or 401 in ok:
                break
            if rounds == _AUTH_ROUNDS:
                raise self.auth.failure(response, needed, sent)
            needed = self.auth.on_unauthorized(response, needed, sent)
        if response.status_code in ok:
            return response
        if response.status_code == 404:
            raise NotFound(f"{method} {self._safe(url)}: not found")
        raise RegistryError(f"{method} {self._safe(url)}: HTTP {response.status_code} {_error_text(response)}"
                            + (f" after {self.retry.attempts} attempts" if response.status_code >= 500 else ""))

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
        return self._upload(repo, data, digest)

    def check_push(self, repo: str) -> None:
        """Upload the empty JSON blob (the config of every attestation artifact) whether or not `repo` holds it:
        proves before anything big moves that this client may push there (credentials, token scope), and
        raises the one-line auth error when it may not."""
        self._upload(repo, EMPTY_JSON, sha256_digest(EMPTY_JSON))

    def _upload(self, repo: str, data: bytes, digest: str) -> str:
        start = self.request("POST", f"{repo}/blobs/uploads/", ok=(202,), repo=repo)
        location = start.headers["Location"]
        if location.startswith("/"):
            location = f"{self.scheme}://{self.api_host}{location}"
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
                                ok=(201, 202), repo=repo, mount_from=from_repo)
        if response.status_code == 201:
            return True
        # 202: the registry declined to mount and opened an upload instead; cancel it.
        location = response.headers.get("Location", "")
        if location:
            url = location if location.startswith("http") else f"{self.scheme}://{self.api_host}{location}"
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


def _context_adapter() -> type:
    from requests.adapters import HTTPAdapter

    class ContextAdapter(HTTPAdapter):
        """requests' adapter with our SSL context: the default CAs plus the host's certs.d CAs."""

        def __init__(self, context: Any) -> None:
            self._context = context
            super().__init__()

        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            kwargs["ssl_context"] = self._context
            super().init_poolmanager(*args, **kwargs)

    return ContextAdapter


def _ContextAdapter(context: Any) -> Any:  # noqa: N802 - a factory standing for the class requests imports lazily
    return _context_adapter()(context)
