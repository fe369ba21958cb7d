"""RegistryClient's lists (`Link` pages) and blob reads (resumed after a reset) against scripted plain-HTTP
servers, without a registry: the edge cases the hosted-registry tests (tests/integration/test_hosted_registries.py)
do not reach. Issue 53."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from buildtool.common.errors import FailedError
from buildtool.registry import client as client_mod
from buildtool.registry.answers import next_link, streamed
from buildtool.registry.client import RegistryClient, RegistryError, RetryPolicy

QUICK = RetryPolicy(attempts=3, first_delay=0.0, max_delay=0.0, timeout=5.0)


@pytest.mark.parametrize(("header", "expected"), [
    ('</v2/a/tags/list?last=x&n=20>; rel="next"', "http://r:5000/v2/a/tags/list?last=x&n=20"),   # Docker Hub
    ("<https://r:5000/v2/a/tags/list?n=2&last=b>; rel=next", "https://r:5000/v2/a/tags/list?n=2&last=b"),
    ('<https://r:5000/v2/a/tags/list?n=2>; rel="prev", <page2>; type="x"; rel="next"', "http://r:5000/v2/a/tags/page2"),
    ('</v2/a/tags/list?last=y>; REL="last next"', "http://r:5000/v2/a/tags/list?last=y"),
    ('</v2/a/tags/list?last=y>; rel="prev"', None),
    ("", None),
])
def test_next_link_as_registries_write_it(header: str, expected: str | None) -> None:
    assert next_link({"Link": header}, "http://r:5000/v2/a/tags/list") == expected


@pytest.mark.parametrize(("header", "expected"), [
    ('</v2/a/tags/list?last=b>; title="tags, page 2"; rel="next"', "http://r:5000/v2/a/tags/list?last=b"),
    ('</v2/a/tags/list?last=b>; title="a;b"; rel=next', "http://r:5000/v2/a/tags/list?last=b"),
    ('</v2/a/tags/list?last=b>; title="not rel=next"', None),
])
def test_a_quoted_link_parameter_holding_a_comma_or_semicolon(header: str, expected: str | None) -> None:
    """RFC 8288 lets a parameter's quoted value hold `,` and `;`. Before, such a parameter before `rel="next"` hid
    the next page: the tag list ended silently after its first page; and a `rel=next` inside a quoted title was
    read as the link's relation."""
    assert next_link({"Link": header}, "http://r:5000/v2/a/tags/list") == expected


Route = Callable[[BaseHTTPRequestHandler], tuple[int, dict[str, str], bytes]]


@pytest.fixture
def serve() -> Iterator[Callable[[Route], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(route: Route) -> str:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:   # noqa: N802
                status, headers, body = route(self)
                if status in (0, -206):       # a reset part way: the headers, what is given, then RST
                    self.send_response(206 if status else 200)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(body)
                    self.wfile.flush()
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _tags(tags: list[str], link: str = "") -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json", **({"Link": link} if link else {})}, json.dumps(
        {"name": "a", "tags": tags}).encode()


def test_every_page_of_a_tag_list_absolute_or_relative(serve) -> None:  # noqa: ANN001
    pages = {"": _tags(["a", "b"], '</v2/team/a/tags/list?last=b&n=2>; rel="next"'),
             "last=b&n=2": _tags(["c", "d"], ""), }
    host = serve(lambda h: pages[h.path.partition("?")[2]])
    pages["last=b&n=2"] = _tags(["c", "d"], f'<http://{host}/v2/team/a/tags/list?last=d&n=2>; rel="next"')
    pages["last=d&n=2"] = _tags(["e"])
    assert RegistryClient(host, retry=QUICK).tags("team/a") == ["a", "b", "c", "d", "e"]


def test_a_next_page_on_another_origin_or_already_read_is_refused(serve) -> None:  # noqa: ANN001
    elsewhere = serve(lambda h: _tags(["stolen"]))
    host = serve(lambda h: _tags(["a"], f'<http://{elsewhere}/v2/team/a/tags/list?last=a>; rel="next"'))
    with pytest.raises(RegistryError, match=f"is on another origin \\({elsewhere}\\); not followed"):
        RegistryClient(host, retry=QUICK).tags("team/a")
    looping = serve(lambda h: _tags(["a"], '</v2/team/a/tags/list?last=a>; rel="next"'))
    with pytest.raises(RegistryError, match="is one already read"):
        RegistryClient(looping, retry=QUICK).tags("team/a")


def test_a_list_is_read_to_its_bound_and_no_further(serve, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(client_mod, "LIST_PAGES", 3)
    served = iter(range(1000))
    host = serve(lambda h: _tags([h.path], f'</v2/team/a/tags/list?page={next(served)}>; rel="next"'))
    with pytest.raises(RegistryError, match="runs past 3 pages; not read further"):
        RegistryClient(host, retry=QUICK).tags("team/a")


def test_more_tags_than_the_bound_are_refused_never_cut_short(serve, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Before, the tags of a repository were gathered however many its pages held (LIST_PAGES pages, each up to
    MAX_ANSWER_BYTES: gigabytes in memory from a registry listing millions per page). Now more than MAX_TAGS is one
    error naming the repository and the limit, read no further; never a list cut short (a dev tag missed)."""
    monkeypatch.setattr(client_mod, "MAX_TAGS", 5, raising=False)
    monkeypatch.setattr(client_mod, "LIST_PAGES", 10)
    pages = iter(range(1, 1000))
    host = serve(lambda h: _tags([f"{h.path}-{n}" for n in range(3)],
                                 f'</v2/team/a/tags/list?page={next(pages)}>; rel="next"'))
    with pytest.raises(RegistryError) as refused:
        RegistryClient(host, retry=QUICK).tags("team/a")
    assert str(refused.value) == (f"{host}: team/a lists more than 5 tags; refused, not read further (a list read "
                                  "in part could miss the tag asked for)")
    assert next(pages) == 3    # two pages read, the one that passed the bound the last


def test_a_tag_list_that_is_not_one_is_a_registry_error(serve) -> None:  # noqa: ANN001
    host = serve(lambda h: (200, {"Content-Type": "text/html"}, b"<html>maintenance</html>"))
    with pytest.raises(RegistryError, match=r"the tag list of team/a is not a JSON \{\"tags\": \[...\]\} document"):
        RegistryClient(host, retry=QUICK).tags("team/a")


BLOB = bytes(range(256)) * 1024          # 256 KiB
DIGEST = "sha256:" + hashlib.sha256(BLOB).hexdigest()


@pytest.mark.parametrize("honours_range", [True, False])
def test_a_blob_cut_off_by_resets_is_resumed_from_its_last_byte(serve, honours_range: bool) -> None:  # noqa: ANN001
    """Plain HTTP (the loopback transport): two answers stop part way with a reset; the read goes on from the
    byte it stopped at (`Range`), or from the start where the server ignores Range (200), and the digest holds."""
    asked: list[str] = []

    def route(handler: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        wanted = handler.headers.get("Range", "")
        asked.append(wanted)
        start = int(wanted[6:-1]) if wanted and honours_range else 0
        rest = BLOB[start:]
        ranged = {"Content-Range": f"bytes {start}-{len(BLOB) - 1}/{len(BLOB)}"} if start else {}
        if len(asked) <= 2:
            return -206 if start else 0, {"Content-Length": str(len(rest)), **ranged}, rest[:len(rest) // 3]
        return 206 if start else 200, ranged, rest

    host = serve(route)
    assert RegistryClient(host, retry=QUICK).get_blob("team/a", DIGEST) == BLOB
    first_cut = len(BLOB) // 3
    assert asked[:2] == ["", f"bytes={first_cut}-"]
    if honours_range:
        assert asked[2] == f"bytes={first_cut + (len(BLOB) - first_cut) // 3}-"


def test_a_blob_host_that_resets_before_any_byte_is_a_bounded_one_line_error(serve) -> None:  # noqa: ANN001
    host = serve(lambda h: (0, {"Content-Length": str(len(BLOB))}, b""))
    with pytest.raises(RegistryError) as caught:
        RegistryClient(host, retry=QUICK).get_blob("team/a", DIGEST)
    message = str(caught.value)
    assert "the connection broke part way through the answer 3 times in a row with nothing new (0 bytes read)" in \
        message and "\n" not in message


class FullDisk(io.BytesIO):
    """A file on a disk that is full after `room` bytes, or whose last flush fails (EIO)."""

    name = "/data/blobs/layer"

    def __init__(self, room: int, flush_fails: bool = False) -> None:
        super().__init__()
        self.room, self.flush_fails = room, flush_fails

    def write(self, chunk: bytes) -> int:  # type: ignore[override]
        if self.tell() + len(chunk) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(chunk)

    def flush(self) -> None:
        if self.flush_fails:
            raise OSError(errno.EIO, os.strerror(errno.EIO))


def test_a_blob_our_disk_cannot_hold_is_named_as_that_and_not_asked_again(serve) -> None:  # noqa: ANN001
    """Before: ENOSPC on the file a blob streams to was taken for a network cut-off, resumed and retried, and ended
    in 'the connection broke part way through the answer 3 times in a row', hiding the full disk."""
    asked: list[str] = []

    def route(handler: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        asked.append(handler.headers.get("Range", ""))
        return 200, {}, BLOB

    registry = RegistryClient(serve(route), retry=QUICK)
    where = f"blob {DIGEST} of team/a could not be written to /data/blobs/layer"
    with pytest.raises(FailedError) as caught:
        registry._download("team/a", DIGEST, FullDisk(room=len(BLOB) // 2))
    assert str(caught.value) == f"{where}: [Errno 28] {os.strerror(errno.ENOSPC)}"
    assert asked == [""]                              # one GET: nothing retried
    with pytest.raises(FailedError) as caught:        # what the file buffered fails to reach the disk at the end
        registry._download("team/a", DIGEST, FullDisk(room=len(BLOB), flush_fails=True))
    assert str(caught.value) == f"{where}: [Errno 5] {os.strerror(errno.EIO)}"


def test_a_failed_write_of_a_requests_answer_is_no_cut_off() -> None:
    """The https path (answers.streamed) took a local write error for a cut-off too."""
    from buildtool.registry.transport import SinkWriteError

    class Raw:
        def read1(self, amount: int, decode_content: bool) -> bytes:
            return b"x" * 10

    class Answer:
        status_code, headers, raw = 200, {}, Raw()

        def close(self) -> None:
            pass

    def full(chunk: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(SinkWriteError, match=r"^\[Errno 28\] "):
        streamed(Answer(), lambda status, headers: full)


def test_an_answer_the_sink_refuses_leaves_no_dirty_connection(serve) -> None:  # noqa: ANN001
    """Before: a 206 whose Content-Range is not the one asked for was refused before its body was read, and the
    body stayed on the kept-alive connection: the next request on it failed (ResponseNotReady), here with one
    attempt as 'registry ... is unreachable'."""
    seen: list[str] = []

    def route(handler: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        seen.append(handler.path)
        if "/blobs/" in handler.path:
            return 206, {"Content-Range": f"bytes 100-{len(BLOB) - 1}/{len(BLOB)}"}, BLOB[100:]
        return _tags(["a"])

    registry = RegistryClient(serve(route), retry=RetryPolicy(attempts=1, timeout=5.0))
    with pytest.raises(RegistryError, match="asked for bytes 0- and got 'bytes 100-"):
        registry.get_blob("team/a", DIGEST)
    assert registry.tags("team/a") == ["a"]
    assert seen == [f"/v2/team/a/blobs/{DIGEST}", "/v2/team/a/tags/list"]


def test_a_requests_answer_the_sink_refuses_is_closed() -> None:
    """The https path (answers.streamed) left such an answer open: its connection out of the pool, unclosed."""
    class Answer:
        status_code, headers, closed = 206, {"Content-Range": "bytes 100-"}, False

        def close(self) -> None:
            self.closed = True

    def refuse(status: int, headers: object) -> None:
        raise RegistryError("asked for bytes 0- and got 'bytes 100-'")

    answer = Answer()
    with pytest.raises(RegistryError):
        streamed(answer, refuse)
    assert answer.closed


SUBJECT = "sha256:" + "5" * 64
INDEX = "application/vnd.oci.image.index.v1+json"


def _descriptor(n: int) -> dict[str, object]:
    return {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + f"{n:x}" * 64,
            "size": 10, "artifactType": "application/x.test"}


def test_a_paged_referrers_api_is_read_to_its_last_page(serve) -> None:  # noqa: ANN001
    from buildtool.attest.referrers import listed_referrers

    def route(handler: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        last = handler.path.endswith("?page=2")
        link = {} if last else {"Link": f'</v2/team/a/referrers/{SUBJECT}?page=2>; rel="next"'}
        body = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [_descriptor(2 if last else 1)]}
        return 200, {"Content-Type": INDEX, **link}, json.dumps(body).encode()

    client = RegistryClient(serve(route), retry=QUICK)
    assert [r.digest for r in listed_referrers(client, "team/a", SUBJECT)] == [
        "sha256:" + "1" * 64, "sha256:" + "2" * 64]


@pytest.mark.parametrize("answer", [
    (200, {"Content-Type": "application/json"}, b'{"detail": "not here"}'),       # JSON, but no image index
    (200, {"Content-Type": INDEX}, b"<html>oops</html>"),                          # says index, is not JSON
    (401, {"Content-Type": "application/json"}, b'{"errors": [{"code": "UNAUTHORIZED"}]}'),   # no challenge
    (302, {"Location": "http://127.0.0.1:1/login"}, b""),                          # a redirect: not followed
])
def test_any_referrers_answer_but_an_index_reads_the_fallback_tag_once(serve, answer) -> None:  # noqa: ANN001
    from buildtool.attest.referrers import listed_referrers

    asked: list[str] = []
    fallback = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [_descriptor(3)]}

    def route(handler: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        asked.append(handler.path)
        if "/referrers/" in handler.path:
            return answer
        return 200, {"Content-Type": INDEX}, json.dumps(fallback).encode()

    client = RegistryClient(serve(route), retry=QUICK)
    for _ in range(2):
        assert [r.digest for r in listed_referrers(client, "team/a", SUBJECT)] == ["sha256:" + "3" * 64]
    assert [p for p in asked if "/referrers/" in p] == [f"/v2/team/a/referrers/{SUBJECT}"]    # remembered
    assert f"/v2/team/a/manifests/sha256-{'5' * 64}" in asked


def test_a_404_naming_the_subject_unknown_is_not_remembered_as_no_api(serve) -> None:  # noqa: ANN001
    from buildtool.attest.referrers import listed_referrers

    asked: list[str] = []

    def route(handler: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        asked.append(handler.path)
        return 404, {"Content-Type": "application/json"}, b'{"errors": [{"code": "MANIFEST_UNKNOWN"}]}'

    client = RegistryClient(serve(route), retry=QUICK)
    assert listed_referrers(client, "team/a", SUBJECT) == listed_referrers(client, "team/a", SUBJECT) == []
    assert len([p for p in asked if "/referrers/" in p]) == 2 and "team/a" not in client.no_referrers_api


@pytest.mark.parametrize("body", [b'{"errors": 5}', b'{"errors": true}', b'{"errors": {"code": "NAME_UNKNOWN"}}'])
def test_a_404_whose_errors_are_no_list_reads_the_fallback_tag(serve, body: bytes) -> None:  # noqa: ANN001
    """A referrers 404 whose `errors` was a number or true (a registry answering garbage) ended the read in a
    TypeError traceback ('int' object is not iterable) instead of being taken as no referrers API."""
    from buildtool.attest.referrers import listed_referrers

    fallback = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [_descriptor(3)]}

    def route(handler: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        if "/referrers/" in handler.path:
            return 404, {"Content-Type": "application/json"}, body
        return 200, {"Content-Type": INDEX}, json.dumps(fallback).encode()

    client = RegistryClient(serve(route), retry=QUICK)
    assert [r.digest for r in listed_referrers(client, "team/a", SUBJECT)] == ["sha256:" + "3" * 64]
    assert "team/a" in client.no_referrers_api


@pytest.mark.parametrize("where", ["api", "fallback"])
def test_more_referrers_than_the_bound_are_refused_never_cut_short(serve, monkeypatch, where: str) -> None:  # noqa: ANN001
    """Before, the referrers of a digest were read however many there were (a pusher attaching 100,000 of them, a
    registry answering with endless pages of them, a fallback index listing them): read whole into memory, and each
    fetched by its reader. Now more than MAX_REFERRERS is one error naming the subject and the limit; the list is never
    cut short, which could hide a signature or pick another."""
    from buildtool.attest import referrers

    monkeypatch.setattr(referrers, "MAX_REFERRERS", 3, raising=False)
    pages = iter(range(1, 1000))

    def route(handler: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        if "/referrers/" in handler.path and where == "fallback":
            return 404, {"Content-Type": "text/plain"}, b"404 page not found"
        page = next(pages)
        link = {"Link": f'</v2/team/a/referrers/{SUBJECT}?page={page}>; rel="next"'} if "/referrers/" in handler.path \
            else {}
        listed = [_descriptor(n) for n in range(page, page + (2 if link else 4))]
        body = {"schemaVersion": 2, "mediaType": INDEX, "manifests": listed}
        return 200, {"Content-Type": INDEX, **link}, json.dumps(body).encode()

    client = RegistryClient(serve(route), retry=QUICK)
    with pytest.raises(RegistryError) as refused:
        referrers.listed_referrers(client, "team/a", SUBJECT)
    assert str(refused.value) == (f"team/a@{SUBJECT} has more than 3 referrers; refused, not read further (a list "
                                  "read in part could hide a signature or choose another)")
    assert next(pages) == (3 if where == "api" else 2)      # read up to the page that passed the bound, no further


def test_an_endless_chain_of_referrers_pages_stops_at_the_page_bound(serve, monkeypatch) -> None:  # noqa: ANN001
    """A registry that answers each referrers page with a next one (none of them listing anything) is read to
    LIST_PAGES pages, then refused naming the subject's referrers path."""
    from buildtool.attest.referrers import listed_referrers

    monkeypatch.setattr(client_mod, "LIST_PAGES", 3)
    pages = iter(range(1, 1000))

    def route(handler: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        link = {"Link": f'</v2/team/a/referrers/{SUBJECT}?page={next(pages)}>; rel="next"'}
        return 200, {"Content-Type": INDEX, **link}, json.dumps({"schemaVersion": 2, "manifests": []}).encode()

    client = RegistryClient(serve(route), retry=QUICK)
    with pytest.raises(RegistryError, match=f"/v2/team/a/referrers/{SUBJECT} runs past 3 pages; not read further"):
        listed_referrers(client, "team/a", SUBJECT)


def test_an_answer_read_into_memory_stops_at_its_bound(serve, monkeypatch) -> None:  # noqa: ANN001
    """Before, every answer read without a sink (a page of tags or referrers, an error page, a token) was read whole
    into memory whatever its size: a registry answering garbage, or one page listing millions of tags, could take the
    machine's memory. Now more than MAX_ANSWER_BYTES is one error naming the call, on both transports."""
    from buildtool.registry import transport

    monkeypatch.setattr(transport, "MAX_ANSWER_BYTES", 1000, raising=False)
    host = serve(lambda h: _tags([f"t{n}" for n in range(1000)]) if "tags" in h.path else (
        404, {"Content-Type": "text/html"}, b"<html>" + b"x" * 5000 + b"</html>"))
    client = RegistryClient(host, retry=QUICK)
    with pytest.raises(RegistryError) as refused:
        client.tags("team/a")
    assert str(refused.value) == (f"GET http://{host}/v2/team/a/tags/list: the answer is over 1000 bytes; not read "
                                  "further")
    with pytest.raises(RegistryError, match=r"^GET http://.*/v2/team/a/referrers/sha256:5+: the answer is over 1000 "):
        client.request("GET", f"team/a/referrers/{SUBJECT}", repo="team/a")

    class Raw:
        def read1(self, amount: int, decode_content: bool) -> bytes:
            return b"x" * 600

    class Answer:
        status_code, headers, raw, closed = 500, {}, Raw(), False

        def close(self) -> None:
            self.closed = True

    answer = Answer()
    with pytest.raises(transport.AnswerTooLarge):
        streamed(answer, None)
    assert answer.closed
