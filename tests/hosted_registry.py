"""A front proxy that makes the local distribution registry behave like a hosted one, one respect at a time,
for tests of the commands users run against Docker Hub, GHCR, ECR, Quay or Harbor (issue 53).

Every request goes to the upstream registry unchanged (the Host header kept, so upload Locations name the
proxy), except where a behaviour is switched on:

- `tag_page`: `tags/list` is answered in pages of that many tags, in lexical order, each but the last with
  `Link: </v2/<name>/tags/list?last=<tag>&n=<page>>; rel="next"`, relative as Docker Hub and distribution
  write it (the client's `n` is honoured when smaller).
- `decline_mounts`: a cross-repository mount (`POST .../blobs/uploads/?mount=&from=`) is declined as ECR and
  GHCR (across owners) decline it: the POST reaches the registry without `mount` and `from`, which answers
  202 with an upload session.
- `referrers`: what `GET /v2/<name>/referrers/<digest>` answers: "passthrough" (distribution 2.8's 404 page),
  "harbor-401" (Harbor 2.7: 401 with a JSON error and no WWW-Authenticate challenge), "ghcr-303" (a 303 to a
  web host, `web`, that answers 429 with an HTML page), "html-500" (an HTML error page).
- `rate_limit`: requests whose "METHOD /path" matches it are answered 429 with Docker Hub's body
  (TOOMANYREQUESTS and its message), with `Retry-After: <rate_limit_retry_after>` when that is set.
- `hidden`: repositories answered as Docker Hub answers one that does not exist or is not yours: a Bearer
  challenge naming this proxy's `/token` (plain HTTP: the client asks anonymously, as for Docker Hub
  without a login), whose anonymous token the registry then refuses with `error="insufficient_scope"`.
- `blob_host`: blob GETs are redirected (307) to that HTTPS host (`BlobHost`), as registries redirect to
  their storage; the Authorization header must not follow.

Test fixture only: loopback, threads are daemons, `with` stops everything.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from tests import pki

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}
_TAGS = re.compile(r"^/v2/(?P<repo>.+)/tags/list$")
_REFERRERS = re.compile(r"^/v2/(?P<repo>.+)/referrers/(?P<digest>sha256:[0-9a-f]{64})$")
_BLOB = re.compile(r"^/v2/(?P<repo>.+)/blobs/(?P<digest>sha256:[0-9a-f]{64})$")
_REPO = re.compile(r"^/v2/(?P<repo>.+)/(?:tags|manifests|blobs|referrers)/")
# Docker Hub's answer to a pull over its limit (docs.docker.com/docker-hub/usage/pulls).
DOCKER_HUB_429 = {"errors": [{"code": "TOOMANYREQUESTS", "message": "You have reached your unauthenticated pull "
                              "rate limit. https://www.docker.com/increase-rate-limit"}]}
HARBOR_401 = {"errors": [{"code": "UNAUTHORIZED", "message": "unauthorized to access repository"}]}


def _server(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    return server


def _forward(upstream: str, method: str, path: str, headers: list[tuple[str, str]],
             body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    conn = http.client.HTTPConnection(upstream, timeout=60)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        if not any(name.lower() == "host" for name, _ in headers):
            conn.putheader("Host", upstream)
        for name, value in headers:
            if name.lower() not in _HOP and name.lower() != "content-length":
                conn.putheader(name, value)
        if body or method in ("PUT", "POST", "PATCH"):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        answer = conn.getresponse()
        return answer.status, answer.getheaders(), answer.read()
    finally:
        conn.close()


@dataclass
class BlobHost:
    """An HTTPS host serving the registry's blobs (a storage bucket or CDN behind a redirect): its certificate
    is for 127.0.0.1, from an in-house CA put where buildtool reads it (`certs_d`, named by DL_IMAGES_CERTS_D).
    It honours `Range` (206, `Content-Range`). `cut`: how many answers per blob send `cut_at` (a fraction) of
    what they owe (then pause briefly, so the client reads it), then reset the connection (RST), as a CDN edge
    dropping a connection does. Every request is recorded: (digest, Range header or "", whether it was cut)."""

    folder: Path
    upstream: str = "127.0.0.1:5000"
    cut: int = 0
    cut_at: float = 0.5
    seen: list[tuple[str, str, bool]] = field(default_factory=list)
    authorization_seen: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        ca = pki.make_ca(self.folder / "ca", "dl-images blob host test CA")
        issued = ca.issue("blob-host", ["127.0.0.1"])
        self.lock = threading.Lock()
        self.server = _server(_blob_handler(self))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(issued.cert), str(issued.key))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.certs_d = self.folder / "certs.d"
        (self.certs_d / self.netloc).mkdir(parents=True)
        (self.certs_d / self.netloc / "ca.crt").write_bytes(ca.cert.read_bytes())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def netloc(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def cuts(self) -> list[tuple[str, str]]:
        with self.lock:
            return [(digest, asked) for digest, asked, cut in self.seen if cut]

    def __enter__(self) -> BlobHost:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _blob_handler(host: BlobHost) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:   # noqa: A002
            return None

        def do_GET(self) -> None:   # noqa: N802 - http.server's name
            url = urlsplit(self.path)
            repo, digest = parse_qs(url.query)["repo"][0], url.path.rsplit("/", 1)[-1]
            status, _, data = _forward(host.upstream, "GET", f"/v2/{repo}/blobs/{digest}", [], b"")
            asked = self.headers.get("Range", "")
            with host.lock:
                cut = sum(1 for d, _, c in host.seen if d == digest and c) < host.cut
                host.seen.append((digest, asked, cut))
                if self.headers.get("Authorization"):
                    host.authorization_seen.append(self.path)
            if status != 200:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = 0
            found = re.fullmatch(r"bytes=(\d+)-", asked)
            if found and int(found.group(1)) < len(data):
                start = int(found.group(1))
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            body = data[start:]
            if not cut:
                self.wfile.write(body)
                return
            self.wfile.write(body[:int(len(body) * host.cut_at)])
            self.wfile.flush()
            time.sleep(0.3)
            # SO_LINGER 0: closing sends RST, the client sees "connection reset by peer" part way through.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.close()

    return Handler


@dataclass
class HostedRegistry:
    upstream: str = "127.0.0.1:5000"
    tag_page: int = 0
    decline_mounts: bool = False
    referrers: str = "passthrough"
    rate_limit: str = ""
    rate_limit_retry_after: str = ""
    hidden: set[str] = field(default_factory=set)
    blob_host: BlobHost | None = None
    seen: list[tuple[str, str, int]] = field(default_factory=list)     # (method, path, status answered)

    def __post_init__(self) -> None:
        if self.referrers not in ("passthrough", "harbor-401", "ghcr-303", "html-500"):
            raise ValueError(f"unknown referrers behaviour {self.referrers!r}")
        self.lock = threading.Lock()
        self.server = _server(_handler(self))
        self.web = _server(_web_handler())        # GHCR's web host, answering 429 to everyone
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (self.server, self.web)]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def requests(self, pattern: str) -> list[tuple[str, str, int]]:
        with self.lock:
            return [s for s in self.seen if re.search(pattern, f"{s[0]} {s[1]}")]

    def __enter__(self) -> HostedRegistry:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server in (self.server, self.web):
            server.shutdown()
            server.server_close()

    def tag_list_page(self, repo: str, query: str) -> tuple[int, dict[str, str], bytes]:
        status, headers, body = _forward(self.upstream, "GET", f"/v2/{repo}/tags/list", [], b"")
        if status != 200:
            return status, dict(headers), body
        tags = sorted(json.loads(body).get("tags") or [])
        asked = parse_qs(query)
        last = asked.get("last", [""])[0]
        size = min(self.tag_page, int(asked["n"][0])) if "n" in asked else self.tag_page
        after = [t for t in tags if t > last] if last else tags
        page = after[:size]
        extra = {"Content-Type": "application/json"}
        if len(after) > size:
            extra["Link"] = f'</v2/{repo}/tags/list?{urlencode({"last": page[-1], "n": self.tag_page})}>; rel="next"'
        return 200, extra, json.dumps({"name": repo, "tags": page}).encode()


def _web_handler() -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:   # noqa: A002
            return None

        def do_GET(self) -> None:   # noqa: N802
            body = b"<!DOCTYPE html><html><body><h1>Too many requests</h1></body></html>"
            self.send_response(429)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

    return Handler


def _handler(proxy: HostedRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:   # noqa: A002
            return None

        def _reply(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
            with proxy.lock:
                proxy.seen.append((self.command, self.path, status))
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, document: object, headers: dict[str, str] | None = None) -> None:
            self._reply(status, {"Content-Type": "application/json; charset=utf-8", **(headers or {})},
                        json.dumps(document).encode())

        def _quirk(self, url: str, query: str) -> bool:
            """Answer the request as the hosted registry would; False when it goes upstream unchanged."""
            repo = _REPO.match(url)
            if url == "/token":
                self._json(200, {"token": "anonymous", "expires_in": 300})
                return True
            if repo and repo["repo"] in proxy.hidden:
                scope = f"repository:{repo['repo']}:pull"
                challenge = f'Bearer realm="http://{proxy.address}/token",service="registry.test",scope="{scope}"'
                if self.headers.get("Authorization"):
                    challenge += ',error="insufficient_scope"'
                self._json(401, {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required",
                                             "detail": [{"Type": "repository", "Class": "", "Name": repo["repo"],
                                                         "Action": "pull"}]}]}, {"WWW-Authenticate": challenge})
                return True
            if proxy.rate_limit and re.search(proxy.rate_limit, f"{self.command} {url}"):
                extra = {"Retry-After": proxy.rate_limit_retry_after} if proxy.rate_limit_retry_after else {}
                self._json(429, DOCKER_HUB_429, extra)
                return True
            if _REFERRERS.match(url) and self.command == "GET" and proxy.referrers != "passthrough":
                if proxy.referrers == "harbor-401":
                    self._json(401, HARBOR_401)
                elif proxy.referrers == "ghcr-303":
                    web = f"http://127.0.0.1:{proxy.web.server_address[1]}"
                    self._reply(303, {"Location": f"{web}/orgs/x/packages/container/package/{quote(url)}"})
                else:
                    self._reply(500, {"Content-Type": "text/html"},
                                b"<html><body><h1>500 Internal Server Error</h1></body></html>")
                return True
            tags = _TAGS.match(url)
            if tags and self.command == "GET" and proxy.tag_page:
                status, headers, body = proxy.tag_list_page(tags["repo"], query)
                self._reply(status, {k: v for k, v in headers.items() if k.lower() in ("content-type", "link")}, body)
                return True
            blob = _BLOB.match(url)
            if blob and self.command == "GET" and proxy.blob_host is not None:
                target = f"https://{proxy.blob_host.netloc}/blobs/{blob['digest']}?" + urlencode(
                    {"repo": blob["repo"], "X-Amz-Signature": "0" * 16})
                self._reply(307, {"Location": target})
                return True
            return False

        def _handle(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length) if length else b""
            if self._quirk(url.path, url.query):
                return
            path = self.path
            query = parse_qs(url.query)
            if proxy.decline_mounts and self.command == "POST" and "mount" in query:
                rest = {k: v for k, v in query.items() if k not in ("mount", "from")}
                path = url.path + (f"?{urlencode(rest, doseq=True)}" if rest else "")
            status, headers, body = _forward(proxy.upstream, self.command, path, list(self.headers.items()), data)
            with proxy.lock:
                proxy.seen.append((self.command, self.path, status))
            self.send_response(status)
            for key, value in headers:
                if key.lower() not in _HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            length_out = dict((k.lower(), v) for k, v in headers).get("content-length", "0") \
                if self.command == "HEAD" else str(len(body))
            self.send_header("Content-Length", length_out)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _handle

    return Handler
