"""Reading what a registry answers: a `Link` header's next page, a `Content-Range`, a `Retry-After`, the errors a
body names, a streamed body read to its sink (or whole, bounded: WholeBody), why TLS failed, and whether a manifest
has the shape OCI gives it; the requests adapter that carries this toolkit's SSL context. Pure helpers of
buildtool.registry.client."""

from __future__ import annotations

import contextlib
import email.utils
import io
import json
import re
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urljoin, urlsplit

from buildtool.common.refs import shown
from buildtool.common.strict_json import bounded_loads
from buildtool.registry.transport import CHUNK, BodyInterrupted, Response, Sink, in_memory, write_to_sink


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a `Retry-After` header asks for (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():     # a header's `²` (latin-1) is a digit to str.isdigit, not to float
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


_DEFAULT_PORTS = {"http": ":80", "https": ":443"}


def origin(url: str) -> tuple[str, str]:
    """(scheme, host[:port]) of a URL, lower-cased, without the scheme's default port."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, parts.netloc.lower().removesuffix(_DEFAULT_PORTS.get(scheme, ""))


_TLS_REASON = re.compile(r"\[SSL: [A-Z_]+\] ([^(\'\"]+)|(certificate verify failed[^(\'\"]*)|(hostname [^(\'\"]+)")


def tls_reason(exc: BaseException) -> str:
    found = _TLS_REASON.search(str(exc))
    if found:
        return next(g for g in found.groups() if g).strip().rstrip(".")
    return type(exc).__name__


# A link, then its parameters: `; name=value`, a value quoted (RFC 8288: `title="a, b; c"`) or not.
_LINK = re.compile(r'<([^>]*)>((?:\s*;\s*(?:[^,;<"]|"(?:[^"\\]|\\.)*")+)*)')
_PARAM = re.compile(r';\s*([^\s=;,"]+)\s*(?:=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;,"]*)))?')


def next_link(headers: Any, url: str) -> str | None:
    """The absolute URL of a `Link: <...>; rel="next"` header (several links per header, several headers), or
    None. Relative targets are resolved against `url`, as registries (Docker Hub, distribution) write them."""
    values = headers.get_all("Link") if hasattr(headers, "get_all") else [headers.get("Link")]
    for value in values or []:
        for target, params in _LINK.findall(value or ""):
            rel = next((quoted or bare for name, quoted, bare in _PARAM.findall(params) if name.lower() == "rel"), "")
            if "next" in rel.lower().split():
                return urljoin(url, target.strip())
    return None


def range_start(value: str | None) -> int | None:
    """The first byte a `Content-Range: bytes START-END/TOTAL` answer holds."""
    found = re.match(r"\s*bytes\s+(\d+)-", value or "")
    return int(found.group(1)) if found else None


def streamed(response: Any, sink: Sink | None) -> Response:
    """A requests answer (made with stream=True) read to where `sink` says (or whole), as a transport.Response;
    a body cut off part way raises BodyInterrupted, a failed write to the sink SinkWriteError."""
    import urllib3

    chunks: list[bytes] = []
    got = 0
    # Closed whatever ends the read, the sink refusing the answer too: a half-read answer closes its connection.
    with contextlib.closing(response):
        write = (sink(response.status_code, response.headers) if sink is not None else None) or in_memory(chunks)
        try:
            # read1: what has arrived, so a reset keeps every byte before it (requests' iter_content waits for whole
            # chunks and loses a partial one); urllib3 still checks the Content-Length and decodes Content-Encoding.
            while chunk := response.raw.read1(CHUNK, decode_content=True):
                write_to_sink(write, chunk)
                got += len(chunk)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise BodyInterrupted(f"{type(exc).__name__} after {got} bytes") from None
    return Response(response.status_code, response.headers, b"".join(chunks))


class WholeBody:
    """A Sink that reads a 200's body into memory (`data`), at most `limit` bytes: an answer whose Content-Length says
    more is refused before its body is read, one that sends more (chunked, or ended by closing) stops at the limit;
    `refuse(size)` makes the error, `size` in words. Each answer starts it anew, so an answer cut off part way is
    asked for again whole (`restarts`), as one read without a sink is."""

    restarts = True

    def __init__(self, limit: int, refuse: Callable[[str], Exception]) -> None:
        self.limit, self.refuse, self._out = limit, refuse, io.BytesIO()

    def __call__(self, status: int, headers: Any) -> Callable[[bytes], object] | None:
        if status != 200:
            return None
        said = str(headers.get("Content-Length") or "").strip()
        if said.isascii() and said.isdigit() and int(said) > self.limit:
            raise self.refuse(f"{int(said)} bytes")
        self._out = io.BytesIO()
        return self._write

    def _write(self, chunk: bytes) -> object:
        if self._out.tell() + len(chunk) > self.limit:
            raise self.refuse(f"at least {self._out.tell() + len(chunk)} bytes")
        return self._out.write(chunk)

    @property
    def data(self) -> bytes:
        return self._out.getvalue()


def error_text(response: Response, secrets: Iterable[str] = ()) -> str:
    """The registry's `errors[]` as `CODE: message`; the start of the body when it is not that shape (a proxy's
    `"Forbidden"`, `{"errors": null}`): a hostile or odd answer is named, never a traceback. Each of `secrets` in
    it masked before it is cut (masked)."""
    try:
        body = response.json()
    except ValueError:
        return page_text(masked(response.text, secrets))
    errors = (body.get("errors") or []) if isinstance(body, dict) else None
    if not isinstance(errors, list):
        return page_text(masked(response.text, secrets))
    return one_line(masked("; ".join(f"{e.get('code')}: {e.get('message')}" if isinstance(e, dict) else
                                     masked(str(e), secrets)[:80] for e in errors), secrets))[:300]


def masked(text: str, secrets: Iterable[str]) -> str:
    """`text` with each of `secrets` (of 4 characters or more, longest first) as ****: what a server echoes of what
    it was sent (a password, a token, the Authorization header) never reaches a message."""
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "****")
    return text


# OCI's digest grammar (image-spec descriptor.md): algorithm:encoded.
_DIGEST = re.compile(r"[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+")
_JSON_KINDS = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number",
               type(None): "null"}


def _kind(value: Any) -> str:
    return f"a JSON {_JSON_KINDS.get(type(value), type(value).__name__)}"


def manifest_problem(body: bytes) -> str:
    """What makes `body` no manifest or index of the shape OCI's image spec gives it, "" when nothing does: a JSON
    object whose config and subject are descriptors, whose layers and manifests are lists of descriptors. Checked
    where every manifest is fetched, so that no reader indexes a field of the wrong type (a registry that breaks
    the spec, or anyone who may push, can serve one)."""
    try:
        doc = bounded_loads(body)
    except ValueError as exc:      # UnicodeDecodeError too
        return f"it is not JSON ({exc})"
    if not isinstance(doc, dict):
        return f"it is {_kind(doc)}, not an object"
    for key in ("mediaType", "artifactType"):
        if key in doc and not isinstance(doc[key], str):
            return f"its {key} is {_kind(doc[key])}, not a string"
    if "annotations" in doc and _annotations_problem(doc["annotations"]):
        return f"its annotations {_annotations_problem(doc['annotations'])}"
    for key in ("config", "subject"):
        if key in doc and _descriptor_problem(doc[key]):
            return f"its {key} {_descriptor_problem(doc[key])}"
    for key in ("layers", "manifests"):
        if key not in doc:
            continue
        if not isinstance(doc[key], list):
            return f"its {key} is {_kind(doc[key])}, not a list of descriptors"
        for number, entry in enumerate(doc[key]):
            if _descriptor_problem(entry):
                return f"{key}[{number}] {_descriptor_problem(entry)}"
    return ""


def _descriptor_problem(d: Any) -> str:
    """What makes `d` no OCI descriptor (a mediaType, a digest, a size; annotations and a platform that are
    objects where given), "" when nothing does."""
    if not isinstance(d, dict):
        return f"is {_kind(d)}, not a descriptor object"
    if not isinstance(d.get("mediaType"), str):
        return f"has the mediaType {json.dumps(d.get('mediaType'))[:80]}, not a string"
    digest = d.get("digest")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        return f"has the digest {json.dumps(digest)[:80]}, not algorithm:hex"
    size = d.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"{digest} has the size {json.dumps(size)[:80]}, not a non-negative integer"
    if "annotations" in d and _annotations_problem(d["annotations"]):
        return f"{digest} has annotations that {_annotations_problem(d['annotations'])}"
    if "platform" in d and not isinstance(d["platform"], dict):
        return f"{digest} has a platform that is {_kind(d['platform'])}, not an object"
    return ""


def _annotations_problem(notes: Any) -> str:
    if not isinstance(notes, dict):
        return f"are {_kind(notes)}, not an object"
    wrong = next((key for key, value in notes.items() if not isinstance(value, str)), None)
    return "" if wrong is None else f"give {shown(wrong)} {_kind(notes[wrong])}, not a string"


_TITLE = re.compile(r"<title[^>]*>([^<]*)</title>", re.IGNORECASE)


def one_line(text: str) -> str:
    """`text` with every run of white space (newlines too) as one space: a message stays one line."""
    return " ".join(text.split())


def page_text(text: str) -> str:
    """A body that is no registry error, for a one-line message: an HTML page (a proxy's 413, a load balancer's
    502) by its title, anything else by its start, newlines folded."""
    if text.lstrip().startswith("<"):
        title = _TITLE.search(text)
        return f"(an HTML page: {one_line(title.group(1))[:120]})" if title else "(an HTML page)"
    return one_line(text[:400])[:200]


def ContextAdapter(context: Any) -> Any:  # noqa: N802 - a factory standing for the class requests imports lazily
    """requests' adapter with our SSL context: the default CAs plus the host's certs.d CAs."""
    from requests.adapters import HTTPAdapter

    class Adapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            kwargs["ssl_context"] = context
            super().init_poolmanager(*args, **kwargs)

    return Adapter()
