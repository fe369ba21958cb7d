"""A TCP proxy on loopback that makes a registry look `delay_s` away, and counts the HTTP requests through it.

    with DelayProxy(("127.0.0.1", 5000), delay_s=0.020) as proxy:
        ...   # talk to proxy.address ("127.0.0.1:<port>")
        proxy.requests    # Counter of "METHOD /v2/<path, digests and tags folded>"

Every chunk read from either side is written to the other `delay_s` after it arrived (order kept,
bandwidth not limited: latency only), and a new connection's first bytes wait one extra round trip
(2 * delay_s), the TCP handshake a real far registry costs. Requests are counted by reading the
HTTP/1.1 stream the client sends (request line, headers, a Content-Length or chunked body), as both
buildtool and skopeo speak it to a plain-http registry.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import threading
import time
from collections.abc import Callable
from types import TracebackType

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_INDEX_TAG = re.compile(r"sha256-[0-9a-f]{64}")
_UPLOAD = re.compile(r"/blobs/uploads/[^?]+")
_CHUNK = 1 << 16


def fold(method: str, path: str) -> str:
    """`METHOD /v2/<repo>/<kind>/<ref>` with the repository, digests and upload ids folded, so one kind
    of request across repositories and runs is one line of the log."""
    mount = "?mount=<digest>" if "mount=" in path else ""
    path = path.split("?", 1)[0]
    path = _UPLOAD.sub("/blobs/uploads/<id>", _INDEX_TAG.sub("<referrers-index-tag>", _DIGEST.sub("<digest>", path)))
    for kind in ("/manifests/", "/blobs/", "/referrers/", "/tags/"):
        if kind in path:
            tail = path.split(kind, 1)[1]
            known = ("<digest>", "<referrers-index-tag>", "list")
            ref = tail if tail in known or tail.startswith("uploads") else "<tag>"
            return f"{method} /v2/<repo>{kind}{ref}{mount}"
    return f"{method} {path}"


class DelayProxy:
    def __init__(self, upstream: tuple[str, int], delay_s: float = 0.020) -> None:
        self.upstream, self.delay_s = upstream, delay_s
        self.requests: collections.Counter[str] = collections.Counter()
        self.connections = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delay-proxy", daemon=True)
        self.address = ""

    def __enter__(self) -> DelayProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the delay proxy did not start")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._thread.join(10)
        self._loop.close()

    async def _shutdown(self) -> None:
        """Cancel every connection's tasks and stop the loop (a clean exit, no pending-task warnings)."""
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._server.close()
        self._loop.call_soon(self._loop.stop)

    def take(self) -> collections.Counter[str]:
        """The requests counted since the last take (and the count of new connections under "CONNECT")."""
        with self._lock:
            taken, self.requests = self.requests, collections.Counter()
            if self.connections:
                taken["CONNECT (new TCP connections)"] = self.connections
            self.connections = 0
        return taken

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        with self._lock:
            self.connections += 1
        opened = time.monotonic()
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        # The handshake's round trip: nothing the client sent reaches the registry before it.
        not_before = opened + 2 * self.delay_s
        # On shutdown the task ends normally: asyncio logs a connection task that ends cancelled.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(self._pump(client_r, up_w, not_before, count=True),
                                 self._pump(up_r, client_w, 0.0, count=False), return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, not_before: float,
                    count: bool) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()

        sender = asyncio.ensure_future(deliver())
        requests = _Requests(self._counted) if count else None
        try:
            while True:
                data = await reader.read(_CHUNK)
                queue.put_nowait((max(time.monotonic(), not_before) + self.delay_s, data))
                if not data:
                    break
                if requests is not None:
                    requests.feed(data)
            await sender
        except (ConnectionError, OSError, asyncio.CancelledError):
            sender.cancel()
        finally:
            writer.close()

    def _counted(self, method: str, path: str) -> None:
        with self._lock:
            self.requests[fold(method, path)] += 1


class _Requests:
    """The HTTP/1.1 requests in a client's byte stream: request line and headers, then a body of
    Content-Length bytes or chunked; `seen(method, path)` is called once per request."""

    def __init__(self, seen: Callable[[str, str], None]) -> None:
        self.seen, self.buffer, self.body_left, self.chunked = seen, b"", 0, False

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if self.body_left:
                taken = min(self.body_left, len(self.buffer))
                self.buffer, self.body_left = self.buffer[taken:], self.body_left - taken
                if self.body_left:
                    return
            if self.chunked:
                line_end = self.buffer.find(b"\r\n")
                if line_end < 0:
                    return
                size = int(self.buffer[:line_end].split(b";")[0] or b"0", 16)
                if size == 0:     # the last chunk, then (no trailers from these clients) an empty line
                    if len(self.buffer) < line_end + 4:
                        return
                    self.buffer, self.chunked = self.buffer[line_end + 4:], False
                    continue
                self.buffer, self.body_left = self.buffer[line_end + 2:], size + 2   # the chunk and its CRLF
                continue
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head, self.buffer = self.buffer[:head_end].decode("latin-1"), self.buffer[head_end + 4:]
            lines = head.split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            self.seen(method, path)
            fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            self.chunked = fields.get("transfer-encoding", "").lower() == "chunked"
            self.body_left = 0 if self.chunked else int(fields.get("content-length", "0"))
