"""The OCI 1.1 referrers API in front of a registry that has none (the local distribution 2.8), for tests.

A loopback HTTP proxy: every request goes to the upstream registry unchanged (the Host header kept, so
upload locations come back naming the proxy), except that a manifest pushed through it with a `subject`
is indexed, as an OCI 1.1 registry indexes it on push, and says so (`OCI-Subject: <subject digest>` on the
PUT's answer, as the distribution spec asks), and `GET /v2/<repo>/referrers/<digest>` answers an OCI image
index of those descriptors (`?artifactType=` filters, and the answer then carries `OCI-Filters-Applied`). A
client told so writes no `sha256-<hex>` fallback tag, so a test sees which of the two ways it wrote and read.
`subject_header=False`: a registry that indexes the subject but does not say so (the client must then write
the fallback tag). Test fixture only: it keeps its index in memory and forgets it on stop.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}
_REFERRERS = re.compile(r"^/v2/(?P<repo>.+)/referrers/(?P<digest>sha256:[0-9a-f]{64})$")
_MANIFEST = re.compile(r"^/v2/(?P<repo>.+)/manifests/(?P<ref>[^/]+)$")


class ReferrersApi:
    def __init__(self, upstream: str = "127.0.0.1:5000", subject_header: bool = True) -> None:
        self.upstream = upstream
        self.subject_header = subject_header
        self.index: dict[tuple[str, str], list[dict[str, object]]] = {}
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> ReferrersApi:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def record(self, repo: str, body: bytes, media_type: str) -> str:
        """Index a pushed manifest under its subject; returns the subject's digest ("" when it names none)."""
        try:
            manifest = json.loads(body)
        except ValueError:
            return ""
        subject = (manifest.get("subject") or {}).get("digest") if isinstance(manifest, dict) else None
        if not subject:
            return ""
        descriptor: dict[str, object] = {
            "mediaType": media_type, "digest": "sha256:" + hashlib.sha256(body).hexdigest(), "size": len(body),
            "artifactType": manifest.get("artifactType") or (manifest.get("config") or {}).get("mediaType")}
        if manifest.get("annotations"):
            descriptor["annotations"] = manifest["annotations"]
        with self.lock:
            listed = self.index.setdefault((repo, subject), [])
            if descriptor["digest"] not in {d["digest"] for d in listed}:
                listed.append(descriptor)
        return str(subject)

    def referrers(self, repo: str, digest: str, artifact_type: str | None) -> list[dict[str, object]]:
        with self.lock:
            return [d for d in self.index.get((repo, digest), [])
                    if artifact_type is None or d["artifactType"] == artifact_type]


def _handler(api: ReferrersApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:   # noqa: A002
            return None

        def _handle(self) -> None:
            url = urlsplit(self.path)
            found = _REFERRERS.match(url.path)
            if self.command == "GET" and found:
                wanted = parse_qs(url.query).get("artifactType", [None])[0]
                body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                                   "manifests": api.referrers(found["repo"], found["digest"], wanted)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", OCI_INDEX)
                if wanted:
                    self.send_header("OCI-Filters-Applied", "artifactType")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length) if length else b""
            upstream = http.client.HTTPConnection(api.upstream, timeout=60)
            try:
                upstream.request(self.command, self.path, body=data if length else None,
                                 headers={k: v for k, v in self.headers.items() if k.lower() not in _HOP})
                answer = upstream.getresponse()
                payload = answer.read()
            finally:
                upstream.close()
            pushed = _MANIFEST.match(url.path)
            subject = ""
            if self.command == "PUT" and pushed and 200 <= answer.status < 300:
                subject = api.record(pushed["repo"], data, self.headers.get("Content-Type", ""))
            self.send_response(answer.status)
            if subject and api.subject_header:
                self.send_header("OCI-Subject", subject)
            for key, value in answer.getheaders():
                if key.lower() not in _HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            length_out = answer.getheader("Content-Length") if self.command == "HEAD" else str(len(payload))
            self.send_header("Content-Length", length_out or "0")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _handle

    return Handler
