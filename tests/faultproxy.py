"""A fault-injecting proxy between a client and a local registry, for tests and benchmarks.

Two modes, both listening on 127.0.0.1 only and forwarding to a loopback upstream only:

- `http`: reads each request (bodies by Content-Length), and either answers it with a fault
  (a connection reset, a 503, a stall: no answer for `stall_s` seconds, then close, or a late
  delivery: no answer, the client gives up, and the request reaches the registry afterwards,
  when `hold` is set or `stall_s` has passed) or forwards it on a fresh upstream connection.
  Faults are chosen by rules matched against "METHOD /path", each firing a bounded number of
  times, or by `down` (every request reset).
- `tcp`: a byte pipe per connection that only counts bytes in each direction; any client
  (docker, skopeo) can go through it, so benchmarks measure bytes moved the same way.

Everything is bounded: stalls have a ceiling, sockets have timeouts, threads are daemons and
`stop()` closes the listener and every open connection.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

MAX_STALL_S = 30.0
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


@dataclass
class Rule:
    pattern: str             # regex searched in "METHOD /v2/path?query"
    fault: str               # reset | 503 | stall | late | lost (delivered, then the answer is reset)
    times: int = 1           # how many matching requests get the fault
    stall_s: float = 5.0
    fired: int = 0
    hold: threading.Event = field(default_factory=threading.Event)        # late: deliver once set
    delivered: threading.Event = field(default_factory=threading.Event)   # late: the registry has it


@dataclass
class Seen:
    method: str
    path: str
    fault: str = ""


@dataclass
class FaultProxy:
    upstream: tuple[str, int] = ("127.0.0.1", 5000)
    mode: str = "http"
    rules: list[Rule] = field(default_factory=list)
    down: bool = False                      # every request is reset (a registry that stays down)
    bytes_to_upstream: int = 0
    bytes_to_client: int = 0
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.upstream[0] not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("the fault proxy only forwards to a loopback upstream")
        if self.mode not in ("http", "tcp"):
            raise ValueError(f"unknown mode {self.mode!r}")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _close(sock)
        self._thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add(self, pattern: str, fault: str, times: int = 1, stall_s: float = 5.0) -> Rule:
        if fault not in ("reset", "503", "stall", "late", "lost"):
            raise ValueError(f"unknown fault {fault!r}")
        rule = Rule(pattern, fault, times, min(stall_s, MAX_STALL_S))
        with self._lock:
            self.rules.append(rule)
        return rule

    def faults(self) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.fault]

    # -- plumbing ------------------------------------------------------------------------------

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._track(client)
            # No Nagle on either leg: small requests must not wait for delayed ACKs in the proxy.
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            target = self._serve_http if self.mode == "http" else self._serve_tcp
            threading.Thread(target=target, args=(client,), daemon=True).start()

    def _count(self, up: int = 0, down: int = 0) -> None:
        with self._lock:
            self.bytes_to_upstream += up
            self.bytes_to_client += down

    def _serve_tcp(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            _close(client)
            return
        self._track(server)
        server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def pipe(src: socket.socket, dst: socket.socket, upward: bool) -> None:
            try:
                while True:
                    data = src.recv(1 << 20)
                    if not data:
                        break
                    dst.sendall(data)
                    self._count(up=len(data)) if upward else self._count(down=len(data))
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)

        other = threading.Thread(target=pipe, args=(server, client, False), daemon=True)
        other.start()
        pipe(client, server, True)
        other.join(timeout=600)
        _close(client)
        _close(server)

    def go_down_at(self, pattern: str) -> None:
        """From the first request matching `pattern` on, every request is reset (the registry died)."""
        with self._lock:
            self._trip = pattern

    def _pick(self, method: str, path: str) -> Rule | None:
        with self._lock:
            trip = getattr(self, "_trip", None)
            if trip and re.search(trip, f"{method} {path}"):
                self.down = True
            if self.down:
                return Rule(".*", "reset", 1)
            for rule in self.rules:
                if rule.fired < rule.times and re.search(rule.pattern, f"{method} {path}"):
                    rule.fired += 1
                    return rule
        return None

    def _serve_http(self, client: socket.socket) -> None:
        client.settimeout(60)
        reader = client.makefile("rb")
        try:
            while not self._stop.is_set():
                request = _read_request(reader)
                if request is None:
                    return
                method, path, headers, body = request
                self._count(up=len(body))
                rule = self._pick(method, path)
                with self._lock:
                    self.seen.append(Seen(method, path, rule.fault if rule else ""))
                if rule is not None:
                    if rule.fault == "lost":
                        # The registry did it; its answer never reaches the client (a connection reset
                        # after the write, as when the registry goes down right after writing).
                        with contextlib.suppress(OSError, http.client.HTTPException):
                            self._forward(method, path, headers, body)
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        return
                    if rule.fault == "reset":
                        # SO_LINGER 0: close sends RST, the client sees "connection reset by peer".
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        return
                    if rule.fault == "503":
                        client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                       b"Connection: close\r\n\r\n")
                        return
                    if rule.fault == "late":
                        # Never answered: the client times out and moves on; the request still reaches
                        # the registry later, as a request held up in the network would.
                        rule.hold.wait(rule.stall_s)
                        with contextlib.suppress(OSError, http.client.HTTPException):
                            self._forward(method, path, headers, body)
                        rule.delivered.set()
                        return
                    self._stop.wait(rule.stall_s)   # stall: no answer, then close
                    return
                response = self._forward(method, path, headers, body)
                client.sendall(response)
                self._count(down=len(response))
        except OSError:
            return
        finally:
            reader.close()
            _close(client)

    def _forward(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                if name.lower() not in _HOP and name.lower() != "content-length":
                    conn.putheader(name, value)
            if body or method in ("PUT", "POST", "PATCH"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            resp = conn.getresponse()
            data = resp.read()
            lines = [f"HTTP/1.1 {resp.status} {resp.reason}"]
            for name, value in resp.getheaders():
                if name.lower() in _HOP or (name.lower() == "content-length" and method != "HEAD"):
                    continue
                lines.append(f"{name}: {value}")
            if method != "HEAD":
                lines.append(f"Content-Length: {len(data)}")
            return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data
        finally:
            conn.close()


def _read_request(reader) -> tuple[str, str, list[tuple[str, str]], bytes] | None:  # noqa: ANN001
    line = reader.readline(65537)
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: list[tuple[str, str]] = []
    length = 0
    while True:
        raw = reader.readline(65537)
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
        if name.strip().lower() == "content-length":
            length = int(value.strip())
        if name.strip().lower() == "transfer-encoding":
            raise OSError("chunked request bodies are not supported in http mode; use tcp mode")
    body = reader.read(length) if length else b""
    return method, path, headers, body


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


def wait_port(port: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")
