"""Everything that talks to a registry, over the OCI distribution API.

Small on purpose: manifests and blobs by digest, tags, cross-repository blob mounts.
Every call has a timeout; connection errors, timeouts and 5xx are retried with exponential
backoff, 429 and 503 after the `Retry-After` the server names (bounded: RetryPolicy), other 4xx
and TLS failures never are. Authentication (Basic, and the distribution token flow with scopes
and expiry) is buildtool.registry.auth's; credentials come from docker's config, its credential
helpers, auth.json or REGISTRY_USER/REGISTRY_PASSWORD with REGISTRY_AUTH_HOST
(buildtool.registry.credentials), for this client's host only, and never appear in an exception,
a log line or a report. Redirects are followed here (GET and HEAD), and the Authorization header
never crosses to another host, port or scheme (a redirect's, or an upload Location's).
Plain-http registries (loopback, or named in
DL_IMAGES_INSECURE_REGISTRIES: buildtool.registry.tools) are spoken to over the standard library
(buildtool.registry.transport), https ones through `requests`, imported only then, trusting the
CA in /etc/docker/certs.d/HOST[:PORT]/ as docker does.

As large registries behave (docs/registries.md, "As hosted registries behave"): tag lists are read page by page
(`pages`), a blob read cut off part way is resumed with a Range request (`_download`), a declined cross-repository
mount is completed by copying the blob through this machine (`mount_blob`), and a manifest PUT answered with
`OCI-Subject` is remembered (`subject_indexed`) for buildtool.attest.referrers.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from buildtool.common import refs
from buildtool.common.errors import FailedError
from buildtool.common.urls import no_netrc
from buildtool.registry import answers, tools
from buildtool.registry.auth import HostAuth, Triple, needed_scopes, rate_limited, without_query
from buildtool.registry.call_errors import (
    NotFound,
    RegistryAuthError,
    RegistryError,
    RegistryTLSError,
    RegistryUnreachable,
    TooLarge,
)
from buildtool.registry.transport import (
    AnswerTooLarge,
    BodyInterrupted,
    LoopbackTransport,
    Response,
    Sink,
    SinkWriteError,
    TransportConnectionError,
    TransportTimeout,
)

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
_ACCEPT_MANIFESTS = {"Accept": ", ".join(MANIFEST_TYPES)}   # request() copies the headers it is given
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
EMPTY_JSON = b"{}"
EMPTY_JSON_TYPE = "application/vnd.oci.empty.v1+json"
_CONCURRENT_COMMIT_RETRIES = 3
_REDIRECTS = (301, 302, 303, 307, 308)
_AUTH_ROUNDS = 2          # 401s one request answers by (re)authenticating before it gives up
LIST_PAGES = 1000         # pages of one list (tags, referrers) read at most: 100,000 tags at Docker Hub's 100
MAX_TAGS = 1_000_000      # tags of one repository held at most (a dev tag per commit and version for decades)
BLOB_RESUMES = 100        # cut-offs one blob read survives in all, even each bringing bytes (a bound on the requests)
# The most a manifest (an index, the referrers fallback index) may be: the OCI distribution spec (spec.md, "Pushing
# Manifests") has registries SHOULD support manifests of at least 4 megabytes and SHOULD refuse larger ones (413).
MAX_MANIFEST_BYTES = 4 << 20


_CUT_OFF = "the connection broke part way through the answer"
# How a retried transport failure is named in messages, by its class's name (never its arguments: they may hold a
# URL); a class not named here is named as it is (requests' ConnectionError, ReadTimeout).
_FAILURE_NAMES = {"TransportConnectionError": "ConnectionError", "TransportTimeout": "Timeout",
                  **dict.fromkeys(("BodyInterrupted", "ChunkedEncodingError", "ContentDecodingError"), _CUT_OFF)}


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _hashed(body: bytes, digest: str) -> str:
    """`body`'s digest by the algorithm `digest` names (sha256 or sha512); "" for any other."""
    algorithm = digest.partition(":")[0]
    return f"{algorithm}:{hashlib.new(algorithm, body).hexdigest()}" if algorithm in ("sha256", "sha512") else ""


@dataclass
class RetryPolicy:
    attempts: int = 5
    first_delay: float = 0.5
    max_delay: float = 8.0
    timeout: float = 30.0
    max_retry_after: float = 60.0      # a longer Retry-After fails at once (RateLimited), naming it
    rate_limit_budget: float = 300.0   # seconds one client may spend waiting out 429/503, all calls together


class RegistryClient:
    """One registry host. `scheme` is http for loopback registries and those named in
    DL_IMAGES_INSECURE_REGISTRIES, https otherwise."""

    def __init__(self, host: str, *, retry: RetryPolicy | None = None, scheme: str | None = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
        self.host = host
        self.api_host = refs.api_host(host)   # docker.io names the registry; its API is registry-1.docker.io
        # Plain HTTP only for this machine by address, or a host the user named as insecure.
        self.scheme = scheme or ("http" if tools.plain_http(host) else "https")
        self.retry = retry or RetryPolicy()
        self._session: requests.Session | None = None
        # The errors a retry may cure (connection failures, timeouts, answers cut off part way) and the TLS failures
        # never retried, of either transport: requests' join them when `session` imports it.
        self._transient: tuple[type[BaseException], ...] = (TransportConnectionError, TransportTimeout)
        self._tls_errors: tuple[type[BaseException], ...] = ()
        self._loopback = LoopbackTransport()
        self._sleep = sleep
        self.auth = HostAuth(host, self._exchange, clock=clock)
        self._tls_ready: set[str] = set()
        self._lock = threading.Lock()
        self._rate_waited = 0.0
        # Repositories whose referrers API answered anything but an image index (buildtool.attest.referrers).
        self.no_referrers_api: set[str] = set()
        # `repo@digest` of manifests whose PUT the registry answered with OCI-Subject: it indexed their subject.
        self.subject_indexed: set[str] = set()

    # -- transport -------------------------------------------------------------------------

    @property
    def session(self) -> requests.Session:
        """requests, for https registries and token servers (imported on first use)."""
        if self._session is None:
            import requests

            self._session = requests.Session()
            # No ~/.netrc login (no_netrc) in place of the header this client chose, nor to the storage a blob
            # redirects to, nor to token servers. Proxies and REQUESTS_CA_BUNDLE are still read.
            self._session.auth = no_netrc
            self._transient += (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                                requests.exceptions.ContentDecodingError)
            self._tls_errors = (requests.exceptions.SSLError,)
        return self._session

    def _prepare_tls(self, url: str) -> None:
        """Trust the CA docker would trust for this URL's host (/etc/docker/certs.d/HOST[:PORT]/*.crt, the host as
        written: tools.host_ca_files, the lookup skopeo_access makes too)."""
        netloc = urlsplit(url).netloc
        with self._lock:
            if netloc in self._tls_ready:
                return
            self._tls_ready.add(netloc)
            context = tools.ssl_context(netloc)
            if context is not None:
                self.session.mount(f"https://{netloc}/", answers.ContextAdapter(context))

    def _send_once(self, method: str, url: str, headers: dict[str, str], data: bytes | Path | None,
                   sink: Sink | None = None) -> Any:
        if url.startswith("http://"):
            return self._loopback.send(method, url, headers=headers, data=data, timeout=self.retry.timeout, sink=sink)
        self._prepare_tls(url)
        with data.open("rb") if isinstance(data, Path) else contextlib.nullcontext(data) as body:
            # Streamed, and read by answers.streamed: a body cut off after the answer began (a reset, a TLS connection
            # closed without its close_notify) is then told apart from a handshake that failed.
            response = self.session.request(method, url, headers=headers, data=body, timeout=self.retry.timeout,
                                            allow_redirects=False, stream=True)
        return answers.streamed(response, sink if method != "HEAD" else None)

    def _send(self, method: str, url: str, headers: dict[str, str], data: bytes | Path | None,
              sink: Sink | None = None, follow: bool = True) -> Any:
        """One exchange; GET/HEAD redirects followed (unless not `follow`), the Authorization header dropped on
        leaving the origin. The answer names the origin that gave it (`answered_by`)."""
        response = self._send_once(method, url, headers, data, sink)
        for _ in range(5):
            location = response.headers.get("Location", "")
            if not (follow and location and response.status_code in _REDIRECTS and method in ("GET", "HEAD")):
                break
            target = urljoin(url, location)
            if answers.origin(target) != answers.origin(url):
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            url = target
            response = self._send_once(method, url, headers, data, sink)
        response.answered_by = urlsplit(url).netloc
        return response

    def _url(self, path: str) -> str:
        return path if path.startswith("http") else f"{self.scheme}://{self.api_host}/v2/{path}"

    def _exchange(self, method: str, url: str, *, headers: dict[str, str], data: bytes | Path | None = None,
                  sink: Sink | None = None, follow: bool = True) -> Any:
        """One call with retries: connection errors, timeouts, answers cut off part way and 5xx with backoff, 429
        and 503 after their Retry-After (bounded); the last answer otherwise (any status). TLS failures are not
        retried; a streamed body cut off part way (`sink`) is raised (BodyInterrupted) for the reader to resume, unless
        the sink reads each answer whole anew (answers.WholeBody)."""
        delay = self.retry.first_delay
        last: str = ""
        response = None
        for attempt in range(1, self.retry.attempts + 1):
            wait = delay
            try:
                response = self._send(method, url, headers, data, sink, follow)
            except self._tls_errors as exc:
                netloc = urlsplit(url).netloc
                raise RegistryTLSError(f"TLS to {netloc} failed: {answers.tls_reason(exc)}; put the registry's CA "
                                       f"certificate in /etc/docker/certs.d/{netloc}/ca.crt (docker, skopeo and "
                                       "buildtool read it) or name a CA bundle in REQUESTS_CA_BUNDLE") from None
            except AnswerTooLarge as exc:
                raise TooLarge(f"{method} {self._safe(url)}: the answer is {exc}; not read further") from None
            except self._transient as exc:     # BodyInterrupted too: a TransportConnectionError
                if sink is not None and isinstance(exc, BodyInterrupted) and not getattr(sink, "restarts", False):
                    raise
                last, response = _FAILURE_NAMES.get(type(exc).__name__, type(exc).__name__), None
            else:
                status = response.status_code
                if status != 429 and status < 500:
                    return response
                last = f"HTTP {status}"
                if status in (429, 503):
                    asked = answers.retry_after(response.headers.get("Retry-After"))
                    if asked is not None and asked > self.retry.max_retry_after:
                        raise rate_limited(method, url, response, f"Retry-After {asked:.0f} s, longer than "
                                                 f"the {self.retry.max_retry_after:.0f} s this command waits")
                    wait = delay if asked is None else asked
                    with self._lock:
                        self._rate_waited += wait
                        spent = self._rate_waited
                    if spent > self.retry.rate_limit_budget:
                        raise rate_limited(method, url, response, f"rate-limited for over "
                                                 f"{self.retry.rate_limit_budget:.0f} s in all")
            if attempt < self.retry.attempts:
                log.warning("registry %s: %s %s failed (%s); retry %d/%d in %.1fs", self.host, method,
                            self._safe(url), last, attempt, self.retry.attempts - 1, wait)
                self._sleep(wait)
                delay = min(delay * 2, self.retry.max_delay)
        if response is not None:
            if response.status_code == 429:
                raise rate_limited(method, url, response, f"{self.retry.attempts} attempts")
            return response
        if last == "ConnectionError" and urlsplit(url).netloc.lower() == self.api_host.lower():
            raise RegistryUnreachable(f"registry {self.host} is unreachable; start it (bash scripts/setup.sh starts "
                                      "the local one) or set REGISTRY to a reachable registry")
        said, hint = (f"no answer within {self.retry.timeout:g} s,", f"; is {urlsplit(url).netloc} answering? (restart "
                      "it, or set REGISTRY to another)") if last == "Timeout" else (f"{last} after", "")
        raise RegistryError(f"{method} {self._safe(url)}: {said} {self.retry.attempts} attempts{hint}")

    def request(self, method: str, path: str, *, ok: tuple[int, ...] = (200,), repo: str = "", mount_from: str = "",
                sink: Sink | None = None, headers: dict[str, str] | None = None,
                data: bytes | Path | None = None) -> Response:
        """One API call: authenticated as the registry asks (scopes for `repo`, and `mount_from` for a
        cross-repository mount), retried on connection errors, timeouts, 5xx and 429 (never other 4xx).
        `sink`: where a 2xx body goes instead of memory (see buildtool.registry.transport.Sink)."""
        url = self._url(path)
        response = self._call(method, url, needed_scopes(method, repo, mount_from), headers, data, sink,
                              ok_401=401 in ok)
        if response.status_code in ok:
            return response
        if response.status_code == 404:
            raise NotFound(f"{method} {self._safe(url)}: not found")
        said = answers.error_text(response, self.auth.secrets())   # never what the server echoes of our credentials
        raise RegistryError(f"{method} {self._safe(url)}: HTTP {response.status_code} {said}"
                            + (f" after {self.retry.attempts} attempts" if response.status_code >= 500 else ""))

    def answer(self, method: str, path: str, *, repo: str = "", headers: dict[str, str] | None = None) -> Any:
        """The registry's answer to one call, whatever it is: authenticated and retried as `request` does, but
        redirects are not followed and a 401 that authenticating cannot cure (one without a challenge, or one
        whose token is refused) is returned, not raised. For endpoints whose every answer but one means
        "not supported here" (the referrers API). Transport, TLS and rate-limit failures still raise."""
        return self._call(method, self._url(path), needed_scopes(method, repo, ""), headers, None, raw=True)

    def _call(self, method: str, url: str, needed: frozenset[Triple], base: dict[str, str] | None,
              data: bytes | Path | None, sink: Sink | None = None, *, ok_401: bool = False, raw: bool = False) -> Any:
        """One call authenticated for the scopes `needed` (more where the registry's challenge asks for them); a 2xx
        body goes to `sink`, else memory. `ok_401`: a 401 is itself an answer the caller takes; `raw` (`answer`):
        redirects are not followed, and a 401 that authenticating cannot cure is returned."""
        # Credentials and tokens are this registry's: never sent to a URL of another origin that an answer named (an
        # upload session's Location on another host, or on plain HTTP), as docker sends them only where it was
        # challenged. A 401 from there is the answer.
        own = answers.origin(url) == answers.origin(self._url(""))
        for rounds in range(_AUTH_ROUNDS + 1):
            headers = dict(base or {})
            sent = self.auth.header(needed) if own else None
            if sent:
                headers["Authorization"] = sent
            response = self._exchange(method, url, headers=headers, data=data, sink=sink, follow=not raw)
            if response.status_code != 401 or ok_401 or not own:
                break
            try:
                if rounds == _AUTH_ROUNDS:
                    raise self.auth.failure(response, needed, sent)
                needed = self.auth.on_unauthorized(response, needed, sent)
            except RegistryAuthError:
                if raw:
                    return response
                raise
        return response

    _safe = staticmethod(without_query)    # URLs never carry credentials here; query strings (upload state) go anyway

    # -- API -------------------------------------------------------------------------------

    def ping(self) -> None:
        """Raise RegistryUnreachable when nothing answers, RegistryError when it refuses."""
        self.request("GET", "", ok=(200, 401))

    def get_manifest(self, repo: str, ref: str) -> tuple[bytes, str, str]:
        """(raw bytes, media type, sha256 digest) of a manifest or index, by tag or digest; asked for by digest, the
        bytes must have that digest (the spec's client check: a registry or proxy serving others is refused), and
        whatever it is asked by, a JSON object of the shape OCI gives a manifest (answers.manifest_problem), of at most
        MAX_MANIFEST_BYTES (not read further)."""
        whole = answers.WholeBody(MAX_MANIFEST_BYTES, lambda size: TooLarge(
            f"{self.host}/{repo}{'@' if ':' in ref else ':'}{ref}: the manifest is {size}, over the "
            f"{MAX_MANIFEST_BYTES}-byte limit on a manifest; not read further"))
        response = self.request("GET", f"{repo}/manifests/{ref}", repo=repo, headers=_ACCEPT_MANIFESTS, sink=whole)
        body = whole.data
        if ":" in ref:
            got = _hashed(body, ref)
            if not got:
                raise RegistryError(f"{repo}@{ref}: the digest algorithm {ref.partition(':')[0]!r} is not one this "
                                    "client can check (sha256, sha512)")
            if got != ref:
                raise RegistryError(f"{self.host} answered {repo}@{ref} with a manifest whose digest is {got}, not "
                                    "the one asked for")
        # Checked here, once, so that every reader indexes config, layers and manifests of the shape OCI gives them.
        problem = answers.manifest_problem(body)
        if problem:
            named = f"{repo}@{ref}" if ":" in ref else f"{repo}:{ref} (digest {sha256_digest(body)})"
            raise RegistryError(f"{self.host}/{named} is no manifest OCI's image spec allows: {problem}")
        return body, response.headers.get("Content-Type", "").split(";")[0], sha256_digest(body)

    def manifest_digest(self, repo: str, ref: str) -> str | None:
        """The sha256 digest a tag points at, or None when the tag does not exist. A `Docker-Content-Digest` that is
        not a sha256 digest (another algorithm, a proxy's garbage) is not taken: the manifest is read and hashed."""
        try:
            response = self.request("HEAD", f"{repo}/manifests/{ref}", repo=repo, headers=_ACCEPT_MANIFESTS)
        except NotFound:
            return None
        digest = (response.headers.get("Docker-Content-Digest") or "").strip()
        return digest if _SHA256.fullmatch(digest) else self.get_manifest(repo, ref)[2]

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
        expected = sha256_digest(body)
        # The registry's digest of what it stored, by the algorithm it chose (sha512 is the spec's too).
        digest = response.headers.get("Docker-Content-Digest") or expected
        if _hashed(body, digest) != digest:
            raise RegistryError(f"registry stored {repo}:{ref} as {digest}, not {expected}")
        if response.headers.get("OCI-Subject"):
            with self._lock:
                self.subject_indexed.add(f"{repo}@{expected}")
        return expected

    def has_blob(self, repo: str, digest: str) -> bool:
        try:
            self.request("HEAD", f"{repo}/blobs/{digest}", repo=repo)
            return True
        except NotFound:
            return False

    def get_blob(self, repo: str, digest: str, limit: int | None = None) -> bytes:
        """A blob, checked against its digest; a read cut off part way is resumed (see _download); over `limit`
        bytes, a RegistryError with no more read (whatever size the registry said)."""
        buffer = io.BytesIO()
        self._download(repo, digest, buffer, limit)
        return buffer.getvalue()

    def _download(self, repo: str, digest: str, out: io.BytesIO | io.BufferedRandom, limit: int | None = None) -> None:
        """GET a blob into `out` and check it against its digest. A body cut off part way (a connection reset, on
        the registry or on the storage host it redirects to) is asked for again from the first missing byte
        (`Range`, as the distribution spec's resumable pull does), and taken whole again when the host answers 200
        instead of 206: at once when the cut-off read brought bytes, after the backoff when it brought none; at
        most retry.attempts cut-offs in a row that brought nothing, and BLOB_RESUMES in all. A write to `out` that
        fails (a full disk) is no cut-off: a FailedError naming the file, never retried."""
        algorithm = digest.partition(":")[0]
        if algorithm not in ("sha256", "sha512"):
            raise RegistryError(f"blob {digest} of {repo}: the digest algorithm {algorithm!r} is not one this client "
                                "can check (sha256, sha512)")
        path = f"{repo}/blobs/{digest}"
        got, idle, cuts, delay = 0, 0, 0, self.retry.first_delay

        def sink(status: int, headers: Any) -> Callable[[bytes], object] | None:
            if status == 206:
                start = answers.range_start(headers.get("Content-Range"))
                if start != got:
                    raise RegistryError(f"GET {self._safe(self._url(path))}: asked for bytes {got}- and got "
                                        f"{headers.get('Content-Range')!r}")
            elif status != 200:
                return None
            try:
                out.seek(got if status == 206 else 0)
                out.truncate()
            except OSError as exc:
                raise SinkWriteError(str(exc)) from None
            return out.write if limit is None else bounded

        def bounded(chunk: bytes) -> object:
            if out.tell() + len(chunk) > (limit or 0):
                raise TooLarge(f"blob {digest} of {repo} is over the {limit}-byte limit; not read further")
            return out.write(chunk)

        def unwritten(error: object) -> FailedError:
            return FailedError(f"blob {digest} of {repo} could not be written to {getattr(out, 'name', 'memory')}: "
                               f"{error}")

        while True:
            headers = {"Accept-Encoding": "identity"}   # byte offsets are offsets of the blob itself
            if got:
                headers["Range"] = f"bytes={got}-"
            try:
                self.request("GET", path, ok=(200, 206), repo=repo, headers=headers, sink=sink)
                break
            except SinkWriteError as exc:      # our disk, not the network: asking again would not cure it
                raise unwritten(exc) from None
            except BodyInterrupted as exc:
                now = out.tell()
                idle = 0 if now > got else idle + 1
                got, cuts = now, cuts + 1
                if idle >= self.retry.attempts:
                    raise RegistryError(f"GET {self._safe(self._url(path))}: {_CUT_OFF} {idle} times in a row "
                                        f"with nothing new ({got} bytes read)") from None
                if cuts >= BLOB_RESUMES:
                    raise RegistryError(f"GET {self._safe(self._url(path))}: {_CUT_OFF} {cuts} times ({got} bytes "
                                        "read); not asked again") from None
                # A cut that brought bytes is resumed at once; one that brought nothing waits the backoff.
                wait = delay if idle else 0.0
                log.warning("registry %s: blob %s cut off after %d bytes (%s); resuming from there in %.1fs",
                            self.host, digest, got, exc, wait)
                if idle:
                    self._sleep(delay)
                    delay = min(delay * 2, self.retry.max_delay)
        try:
            out.flush()        # what the file still buffered: a full disk may say so only now
        except OSError as exc:
            raise unwritten(exc) from None
        out.seek(0)
        if f"{algorithm}:{hashlib.file_digest(out, algorithm).hexdigest()}" != digest:
            raise RegistryError(f"blob {digest} of {repo} does not match its digest")

    def put_blob(self, repo: str, data: bytes) -> str:
        """Upload a small blob (monolithic POST+PUT); a no-op when it already exists."""
        digest = sha256_digest(data)
        return digest if self.has_blob(repo, digest) else self._upload(repo, data, digest)

    def check_push(self, repo: str) -> None:
        """Upload the empty JSON blob (the config of every attestation artifact) whether or not `repo` holds it:
        proves before anything big moves that this client may push there (credentials, token scope), and
        raises the one-line auth error when it may not."""
        self._upload(repo, EMPTY_JSON, sha256_digest(EMPTY_JSON))

    def _upload(self, repo: str, data: bytes | Path, digest: str, location: str = "") -> str:
        """A monolithic upload (PUT of the whole blob, from memory or a file) into the upload session at
        `location`, or a new one (POST)."""
        opened = ""
        if not location:
            start = self.request("POST", f"{repo}/blobs/uploads/", ok=(202,), repo=repo)
            location = opened = self._location(start, f"{repo}/blobs/uploads/")
        sep = "&" if "?" in location else "?"
        with contextlib.ExitStack() as unless_stored:
            # The session this call opened: none left open (a caller's is its own).
            unless_stored.callback(self._cancel, repo, opened)
            try:
                self.request("PUT", f"{location}{sep}digest={digest}", ok=(201,), repo=repo, data=data,
                             headers={"Content-Type": "application/octet-stream"})
            except RegistryError:
                # Two writers uploading the same blob at once: the registry may refuse the second
                # commit (DIGEST_INVALID) although the blob is there, whole, by then.
                if not self.has_blob(repo, digest):
                    raise
            unless_stored.pop_all()
        return digest

    def _location(self, response: Any, path: str) -> str:
        """The absolute URL of an answer's `Location` (an upload session), relative to the request's URL."""
        location = response.headers.get("Location", "")
        if not location:
            raise RegistryError(f"{self.host}: the answer to {self._safe(self._url(path))} names no upload Location")
        return urljoin(self._url(path), location)

    def mount_blob(self, repo: str, digest: str, from_repo: str) -> str:
        """Make `repo` hold blob `digest` of `from_repo`, by a cross-repository mount when the registry mounts
        (one request, no data moved: a mount of a blob the target already has answers 201 as well, so there is
        no HEAD first). A registry may decline and open an upload session instead (202: ECR for a blob no
        manifest of the source references, GHCR across owners, a registry without mounts): the blob is then
        copied through this machine (read from `from_repo`, resumably, to a temporary file; uploaded into that
        session), unless `repo` holds it already. Returns "mounted", "present" or "uploaded"; "" when neither
        repository holds the blob."""
        path = f"{repo}/blobs/uploads/?mount={digest}&from={from_repo}"
        response = self.request("POST", path, ok=(201, 202), repo=repo, mount_from=from_repo)
        if response.status_code == 201:
            return "mounted"
        session = self._location(response, path) if response.headers.get("Location") else ""
        with contextlib.ExitStack() as unless_uploaded:
            # Whatever ends the copy (blob there or gone, digest mismatch, refused PUT, ^C): no session left open.
            unless_uploaded.callback(self._cancel, repo, session)
            try:
                if self.has_blob(repo, digest):
                    return "present"
                with tempfile.TemporaryDirectory(prefix="dl-images-blob-") as folder:
                    copied = Path(folder) / "blob"
                    with copied.open("w+b") as out:     # a large blob is never held in memory
                        self._download(from_repo, digest, out)
                    self._upload(repo, copied, digest, session)
                    unless_uploaded.pop_all()
            except NotFound:
                return ""
        log.info("registry %s declined to mount %s from %s into %s: uploaded it", self.host, digest, from_repo, repo)
        return "uploaded"

    def _cancel(self, repo: str, session: str) -> None:
        if session:
            with contextlib.suppress(RegistryError):
                self.request("DELETE", session, ok=(204, 200, 404), repo=repo)

    def mount_blobs(self, repo: str, digests: list[str], from_repo: str) -> list[str]:
        """Mount every blob from `from_repo`, side by side (mount_blob: a declined mount is an upload). Returns
        the blobs that were uploaded; a blob neither repository holds is an error."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(8, max(1, len(digests)))) as pool:
            outcomes = list(pool.map(lambda blob: self.mount_blob(repo, blob, from_repo), digests))
        for blob, outcome in zip(digests, outcomes, strict=True):
            if not outcome:
                raise RegistryError(f"registry declined to mount {blob} from {from_repo} into {repo}, and "
                                    f"{from_repo} does not hold it to upload")
        return [blob for blob, outcome in zip(digests, outcomes, strict=True) if outcome == "uploaded"]

    def pages(self, path: str, repo: str, first: Any = None, headers: dict[str, str] | None = None) -> Iterator[Any]:
        """Every page of a list (`path`; `first`: its first page, already read), following each answer's
        `Link: <URL>; rel="next"` (RFC 8288; relative to the page it came with; only on this registry's origin)
        for at most LIST_PAGES pages."""
        url = self._url(path)
        seen = {url}
        for _ in range(LIST_PAGES):
            page = first if first is not None else self.request("GET", url, repo=repo, headers=headers or {})
            first = None
            yield page
            following = answers.next_link(page.headers, url)
            if following is None:
                return
            if answers.origin(following) != answers.origin(url):
                raise RegistryError(f"{self.host}: the next page of {self._safe(url)} is on another origin "
                                    f"({urlsplit(following).netloc}); not followed")
            if following in seen:
                raise RegistryError(f"{self.host}: the next page of {self._safe(url)} is one already read")
            seen.add(following)
            url = following
        raise RegistryError(f"{self.host}: {self._safe(self._url(path))} runs past {LIST_PAGES} pages; not read "
                            "further")

    def tags(self, repo: str) -> list[str]:
        """Every tag of `repo`, from every page the registry gives (none when the repository does not exist)."""
        found: list[str] = []
        try:
            first = self.request("GET", f"{repo}/tags/list", repo=repo)
        except NotFound:
            return []
        for page in self.pages(f"{repo}/tags/list", repo, first):
            try:
                listed = page.json().get("tags") or []
            except (ValueError, AttributeError):
                listed = None
            if not isinstance(listed, list) or not all(isinstance(t, str) for t in listed):
                raise RegistryError(f"{self.host}: the tag list of {repo} is not a JSON {{\"tags\": [...]}} document")
            found += listed
            if len(found) > MAX_TAGS:
                raise RegistryError(f"{self.host}: {repo} lists more than {MAX_TAGS} tags; refused, not read further "
                                    "(a list read in part could miss the tag asked for)")
        return list(dict.fromkeys(found))
