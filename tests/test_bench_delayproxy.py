"""bench/delayproxy.py, which bench/bench_release.py's request counts come from: every request through it
is counted once, by kind, and every byte arrives unchanged (no timing is asserted)."""

from __future__ import annotations

import http.client
import http.server
import threading
from collections.abc import Iterator

import pytest

from bench.delayproxy import DelayProxy, fold

DIGEST = "sha256:" + "ab" * 32


class _Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"    # kept-alive, as registry clients talk

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - the handler's API
        self._answer(self.path.encode())

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(b"")

    def do_PUT(self) -> None:  # noqa: N802
        self._answer(self.rfile.read(int(self.headers["Content-Length"])))

    def do_PATCH(self) -> None:  # noqa: N802 - a chunked upload, as Go clients send a blob of unknown size
        body = b""
        while (size := int(self.rfile.readline().strip(), 16)) > 0:
            body += self.rfile.read(size)
            self.rfile.readline()
        self.rfile.readline()
        self._answer(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_every_request_is_counted_once_by_kind_and_passed_through_unchanged(server) -> None:  # noqa: ANN001
    # 256 kB (several reads, delivered in order) that hold what looks like a request: a body is never counted.
    body = b"\r\n\r\nGET /v2/a/manifests/x HTTP/1.1\r\nHost: y\r\n\r\n" + bytes(range(256)) * 1024
    with DelayProxy(("127.0.0.1", server.server_address[1]), delay_s=0.001) as proxy:
        host, port = proxy.address.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        answers = []
        sent = (("GET", f"/v2/a/b/manifests/{DIGEST}", None), ("HEAD", "/v2/a/manifests/2.13", None),
                ("PUT", "/v2/a/manifests/latest", body), ("PATCH", "/v2/a/blobs/uploads/u1", iter([body, body])),
                ("GET", "/v2/a/tags/list?n=5", None))
        for method, path, data in sent:
            conn.request(method, path, body=data, encode_chunked=method == "PATCH")
            response = conn.getresponse()
            answers.append(response.read())
        conn.close()
        counted = proxy.take()
    assert answers == [f"/v2/a/b/manifests/{DIGEST}".encode(), b"", body, body * 2, b"/v2/a/tags/list?n=5"]
    assert counted == {"GET /v2/<repo>/manifests/<digest>": 1, "HEAD /v2/<repo>/manifests/<tag>": 1,
                       "PUT /v2/<repo>/manifests/<tag>": 1,
                       "PATCH /v2/<repo>/blobs/uploads/<id>": 1, "GET /v2/<repo>/tags/list": 1,
                       "CONNECT (new TCP connections)": 1}


def test_fold_keeps_the_kind_of_request_and_drops_names() -> None:
    assert fold("POST", f"/v2/x/y/blobs/uploads/?mount={DIGEST}&from=z") == \
        "POST /v2/<repo>/blobs/uploads/?mount=<digest>"
    assert fold("PATCH", "/v2/x/blobs/uploads/0f-1e?_state=abc") == "PATCH /v2/<repo>/blobs/uploads/<id>"
    assert fold("GET", f"/v2/x/referrers/{DIGEST}") == "GET /v2/<repo>/referrers/<digest>"
    assert fold("HEAD", f"/v2/x/manifests/{DIGEST.replace(':', '-')}") == \
        "HEAD /v2/<repo>/manifests/<referrers-index-tag>"
    assert fold("PUT", "/v2/x/manifests/2.13-0.1.0") == "PUT /v2/<repo>/manifests/<tag>"
    assert fold("GET", "/v2/") == "GET /v2/"
