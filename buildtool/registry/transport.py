"""HTTP for plain-http (loopback) registries on the standard library, without `requests`.

Importing requests and urllib3 costs more than a whole release of one image to a loopback
registry should take, so RegistryClient talks to `http://` registries (the ones on this machine:
it uses https for every other host) over `http.client`, one kept-alive connection per thread and
host. https registries keep going through requests (proxies, CA bundles). Redirects are followed by the
client (buildtool.registry.client), not here.

`Response` has the attributes callers of RegistryClient.request use: status_code, headers
(case-insensitive), content, text, json().
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
from typing import Any
from urllib.parse import urlencode, urlsplit


class TransportTimeout(TimeoutError):
    pass


class TransportConnectionError(ConnectionError):
    pass


class Response:
    def __init__(self, status: int, headers: http.client.HTTPMessage, content: bytes) -> None:
        self.status_code = status
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, http.client.BadStatusLine)


class _NoDelayConnection(http.client.HTTPConnection):
    """No Nagle: a small request must not wait for the delayed ACK of the one before (as urllib3 does)."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class LoopbackTransport:
    """Kept-alive http.client connections, one per thread and host:port."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _connection(self, netloc: str, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        pool: dict[str, http.client.HTTPConnection] = self._local.__dict__.setdefault("pool", {})
        conn = pool.get(netloc)
        if conn is not None:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            return conn, True
        host, _, port = netloc.rpartition(":") if ":" in netloc else (netloc, "", "80")
        conn = _NoDelayConnection(host.strip("[]"), int(port or 80), timeout=timeout)
        pool[netloc] = conn
        return conn, False

    def _drop(self, netloc: str) -> None:
        pool: dict[str, http.client.HTTPConnection] = self._local.__dict__.setdefault("pool", {})
        conn = pool.pop(netloc, None)
        if conn is not None:
            conn.close()

    def send(self, method: str, url: str, *, headers: dict[str, str], data: bytes | None, timeout: float,
             auth: tuple[str, str] | None = None, params: dict[str, str] | None = None) -> Response:
        """One request, redirects not followed: RegistryClient follows them, and it alone decides which
        headers (never the Authorization one across origins) go along."""
        return self._send_once(method, url, headers, data, timeout, auth, params)

    def _send_once(self, method: str, url: str, headers: dict[str, str], data: bytes | None, timeout: float,
                   auth: tuple[str, str] | None, params: dict[str, str] | None) -> Response:
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if params:
            target += ("&" if "?" in target else "?") + urlencode(params)
        headers = dict(headers)
        if auth is not None and "Authorization" not in headers:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        if data is not None or method in ("PUT", "POST", "PATCH"):
            headers["Content-Length"] = str(len(data or b""))
        for attempt in (1, 2):
            conn, reused = self._connection(parts.netloc, timeout)
            try:
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                content = resp.read()
            except _STALE as exc:
                self._drop(parts.netloc)
                if reused and attempt == 1:
                    continue   # the registry closed a kept-alive connection: once more on a new one
                raise TransportConnectionError(f"{type(exc).__name__}: {exc}") from None
            except TimeoutError as exc:
                self._drop(parts.netloc)
                raise TransportTimeout(str(exc) or "timed out") from None
            except (OSError, http.client.HTTPException) as exc:
                self._drop(parts.netloc)
                raise TransportConnectionError(f"{type(exc).__name__}: {exc}") from None
            if resp.will_close:
                self._drop(parts.netloc)
            return Response(resp.status, resp.headers, content)
        raise AssertionError("unreachable")
