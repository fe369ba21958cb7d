"""HTTP for plain-http (loopback) registries on the standard library, without `requests`.

Importing requests and urllib3 costs more than a whole release of one image to a loopback
registry should take, so RegistryClient talks to `http://` registries (the ones on this machine:
it uses https for every other host) over `http.client`, one kept-alive connection per thread and
host. https registries keep going through requests (proxies, CA bundles). Redirects are followed by the
client (buildtool.registry.client), not here.

`Response` has the attributes callers of RegistryClient.request use: status_code, headers
(case-insensitive), content, text, json(). A caller may stream a body instead (`sink`: blobs, read to a
file or resumed with a Range request after a reset); a body cut off part way raises BodyInterrupted,
after what arrived was written; a write to the sink's file that fails (a full disk) raises SinkWriteError.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from buildtool.common.strict_json import bounded_loads


class TransportTimeout(TimeoutError):
    pass


class TransportConnectionError(ConnectionError):
    pass


class BodyInterrupted(TransportConnectionError):
    """An answer's body stopped part way (a connection reset, or closed before its Content-Length): what
    arrived went to the sink, so a reader can resume from there."""


class SinkWriteError(Exception):
    """Putting a streamed body where the sink said failed on this machine (a full disk, an I/O error): not the
    network's doing, so never retried as a cut-off. Its text is the OSError's."""


class AnswerTooLarge(Exception):
    """An answer read into memory (no sink) ran past MAX_ANSWER_BYTES: not read further. Its text is how much."""


# The most an answer read into memory may be (a page of tags or referrers, an error page, a token): manifests and blobs
# go through a sink, to their own limits. A list page of 100,000 tags is some 5 MiB.
MAX_ANSWER_BYTES = 64 << 20


def in_memory(chunks: list[bytes]) -> Callable[[bytes], object]:
    """`chunks.append`, refusing (AnswerTooLarge) a chunk that would take them past MAX_ANSWER_BYTES."""
    held = 0

    def append(chunk: bytes) -> None:
        nonlocal held
        held += len(chunk)
        if held > MAX_ANSWER_BYTES:
            raise AnswerTooLarge(f"over {MAX_ANSWER_BYTES} bytes")
        chunks.append(chunk)
    return append


def write_to_sink(write: Callable[[bytes], object], chunk: bytes) -> None:
    try:
        write(chunk)
    except OSError as exc:
        raise SinkWriteError(str(exc)) from None


# Called with an answer's status and headers before its body is read: where the body goes (a write
# callable), or None to read it whole into Response.content (error pages, redirects).
Sink = Callable[[int, Any], "Callable[[bytes], object] | None"]
CHUNK = 1 << 16


@dataclass
class Response:
    status_code: int
    headers: Any          # case-insensitive: http.client's HTTPMessage, or requests' own (answers.streamed)
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return bounded_loads(self.content)


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
        conn = _NoDelayConnection(netloc, timeout=timeout)    # http.client reads `host[:port]`, `[v6]:port` too
        pool[netloc] = conn
        return conn, False

    def _drop(self, netloc: str) -> None:
        pool: dict[str, http.client.HTTPConnection] = self._local.__dict__.setdefault("pool", {})
        conn = pool.pop(netloc, None)
        if conn is not None:
            conn.close()

    def send(self, method: str, url: str, *, headers: dict[str, str], data: bytes | Path | None, timeout: float,
             sink: Sink | None = None) -> Response:
        """One request, redirects not followed: RegistryClient follows them, and it alone decides which
        headers (never the Authorization one across origins) go along. `data` may be a file (Path), sent
        from disk; `sink`: see Sink."""
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if isinstance(data, Path):     # http.client counts bytes itself, but would send a file chunked
            headers = {**headers, "Content-Length": str(data.stat().st_size)}
        for attempt in (1, 2):
            conn, reused = self._connection(parts.netloc, timeout)
            try:
                with data.open("rb") if isinstance(data, Path) else contextlib.nullcontext(data) as body:
                    conn.request(method, target, body=body, headers=headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                self._drop(parts.netloc)
                if isinstance(exc, _STALE) and reused and attempt == 1:
                    continue   # the registry closed a kept-alive connection: once more on a new one
                if isinstance(exc, TimeoutError):
                    raise TransportTimeout(str(exc) or "timed out") from None
                raise TransportConnectionError(f"{type(exc).__name__}: {exc}") from None
            try:
                content = self._body(method, resp, sink)
            except BaseException:
                # An answer not read to its end (cut off, or refused by the sink) would be read as the answer
                # to the next request on this kept-alive connection: closed, never reused.
                self._drop(parts.netloc)
                raise
            if resp.will_close:
                self._drop(parts.netloc)
            return Response(resp.status, resp.headers, content)
        raise AssertionError("unreachable")

    def _body(self, method: str, resp: http.client.HTTPResponse, sink: Sink | None) -> bytes:
        """The body, read whole, or streamed to where `sink` says; a body cut off part way (a reset, or fewer
        bytes than its Content-Length) raises BodyInterrupted."""
        chunks: list[bytes] = []
        streamed = sink(resp.status, resp.headers) if sink is not None and method != "HEAD" else None
        write = streamed or in_memory(chunks)
        declared = resp.getheader("Content-Length")
        got = 0
        try:
            # read1: what has arrived, so a reset keeps every byte before it; the final read() (of nothing
            # left) closes the answer, so the kept-alive connection takes the next request.
            while chunk := resp.read1(CHUNK) or resp.read():
                write_to_sink(write, chunk)      # a SinkWriteError is no OSError: it passes the handlers below
                got += len(chunk)
            known = declared is not None and declared.isascii() and declared.isdigit()   # else none, as http.client
            short = method != "HEAD" and known and got < int(declared or 0)
            why = f"closed after {got} of {declared} bytes" if short else ""
        except TimeoutError as exc:
            why = f"timed out after {got} bytes ({exc})"
        except (OSError, http.client.HTTPException) as exc:
            why = f"{type(exc).__name__} after {got} bytes: {exc}"
        if why:
            raise BodyInterrupted(why)
        return b"".join(chunks)
