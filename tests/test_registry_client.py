"""RegistryClient against a scripted registry: what concurrent writers make a real one answer."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from buildtool.registry.client import RegistryClient, RegistryError, RetryPolicy


class Script:
    """Answers per (method, path prefix): a list of (status, body) consumed in order, then 201."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], list[tuple[int, dict]]] = {}
        self.blobs: set[str] = set()
        self.seen: list[tuple[str, str]] = []
        self.other_writer_commits = False   # a refused blob commit lands anyway (another writer's)


def _error(code: str) -> dict:
    return {"errors": [{"code": code, "message": code.lower().replace("_", " ")}]}


@pytest.fixture
def registry() -> Iterator[tuple[Script, str]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            path = self.path.split("?", 1)[0]
            script.seen.append((self.command, path))
            for (method, prefix), queue in script.answers.items():
                if method == self.command and path.startswith(prefix) and queue:
                    status, payload = queue.pop(0)
                    if script.other_writer_commits and "digest=" in self.path:
                        script.blobs.add(self.path.split("digest=", 1)[1].split("&", 1)[0])
                    data = json.dumps(payload).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
            if self.command == "DELETE":
                self.send_response(204)
                self.end_headers()
                return
            if self.command == "HEAD" and "/blobs/" in path:
                self.send_response(200 if path.rsplit("/", 1)[1] in script.blobs else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.command == "POST":
                self.send_response(202)
                self.send_header("Location", path + "session")
            else:
                self.send_response(201)
                if "/manifests/" in path:
                    self.send_header("Docker-Content-Digest", "sha256:" + hashlib.sha256(body).hexdigest())
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield script, f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def client(host: str) -> RegistryClient:
    return RegistryClient(host, retry=RetryPolicy(attempts=1, timeout=5), sleep=lambda s: None)


def _answered(status: int, headers: Any, body: bytes, sink: Any = None) -> Any:
    """An answer as the transports give it: a body the sink takes (a 2xx the caller streams) goes there, not into
    the answer's content."""
    from buildtool.registry.transport import Response

    write = sink(status, headers) if sink is not None else None
    if write is None:
        return Response(status, headers, body)
    write(body)
    return Response(status, headers, b"")


def test_a_manifest_whose_blob_another_writer_is_committing_is_put_again(registry) -> None:
    script, host = registry
    script.answers[("PUT", "/v2/r/manifests/")] = [(400, _error("MANIFEST_BLOB_UNKNOWN"))] * 2
    body = b'{"schemaVersion": 2}'
    assert client(host).put_manifest("r", "t", body, "application/vnd.oci.image.manifest.v1+json") == \
        "sha256:" + hashlib.sha256(body).hexdigest()
    assert script.seen.count(("PUT", "/v2/r/manifests/t")) == 3


def test_a_manifest_whose_blob_stays_unknown_fails_and_other_400s_are_not_retried(registry) -> None:
    script, host = registry
    script.answers[("PUT", "/v2/r/manifests/")] = [(400, _error("MANIFEST_BLOB_UNKNOWN"))] * 10
    with pytest.raises(RegistryError, match="MANIFEST_BLOB_UNKNOWN"):
        client(host).put_manifest("r", "t", b"{}", "application/json")
    assert script.seen.count(("PUT", "/v2/r/manifests/t")) == 4
    script.answers[("PUT", "/v2/r/manifests/")] = [(400, _error("MANIFEST_INVALID"))]
    with pytest.raises(RegistryError, match="MANIFEST_INVALID"):
        client(host).put_manifest("r", "u", b"{}", "application/json")
    assert script.seen.count(("PUT", "/v2/r/manifests/u")) == 1


def test_a_blob_commit_refused_while_another_writer_committed_it_counts_as_uploaded(registry) -> None:
    script, host = registry
    data = b"{}"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    script.answers[("PUT", "/v2/r/blobs/uploads/")] = [(400, _error("DIGEST_INVALID"))]
    script.other_writer_commits = True
    assert client(host).put_blob("r", data) == digest
    # Without the blob there afterwards, the refusal stands.
    script.blobs.clear()
    script.other_writer_commits = False
    script.answers[("PUT", "/v2/r/blobs/uploads/")] = [(400, _error("DIGEST_INVALID"))]
    with pytest.raises(RegistryError, match="DIGEST_INVALID"):
        client(host).put_blob("r", data)


def test_a_declined_mount_cancels_its_upload_session_whatever_ends_the_copy(registry) -> None:
    """A 202 to a mount opens an upload session: a failed copy cancels it (DELETE) on any error, not only when
    the source no longer holds the blob (a digest mismatch, a refused PUT left it open)."""
    script, host = registry
    body = {"layer": 1}
    digest = "sha256:" + hashlib.sha256(json.dumps(body).encode()).hexdigest()
    cancel = ("DELETE", "/v2/r/blobs/uploads/session")
    script.answers[("GET", f"/v2/s/blobs/{digest}")] = [(200, {"layer": 2})]         # not the blob named
    with pytest.raises(RegistryError, match="does not match its digest"):
        client(host).mount_blob("r", digest, "s")
    assert script.seen.count(cancel) == 1
    script.answers[("GET", f"/v2/s/blobs/{digest}")] = [(200, body)]
    script.answers[("PUT", "/v2/r/blobs/uploads/")] = [(400, _error("BLOB_UPLOAD_INVALID"))]
    with pytest.raises(RegistryError, match="BLOB_UPLOAD_INVALID"):
        client(host).mount_blob("r", digest, "s")
    assert script.seen.count(cancel) == 2
    script.answers[("GET", f"/v2/s/blobs/{digest}")] = [(200, body)]
    assert client(host).mount_blob("r", digest, "s") == "uploaded"
    script.blobs.add(digest)
    assert client(host).mount_blob("r", digest, "s") == "present"
    assert script.seen.count(cancel) == 3                              # the copy that worked closed its own


def test_an_upload_that_fails_cancels_the_session_it_opened(registry) -> None:
    """put_blob's own upload session (POST, then a refused PUT) was left open on the registry."""
    script, host = registry
    data = b'{"x": 1}'
    script.answers[("PUT", "/v2/r/blobs/uploads/")] = [(400, _error("BLOB_UPLOAD_INVALID"))]
    with pytest.raises(RegistryError, match="BLOB_UPLOAD_INVALID"):
        client(host).put_blob("r", data)
    assert script.seen.count(("DELETE", "/v2/r/blobs/uploads/session")) == 1
    assert client(host).put_blob("r", data) == "sha256:" + hashlib.sha256(data).hexdigest()
    assert script.seen.count(("DELETE", "/v2/r/blobs/uploads/session")) == 1   # a commit that worked: no DELETE


@pytest.mark.parametrize("algorithm", ["sha256", "sha512"])
def test_a_manifest_asked_for_by_digest_must_have_that_digest(algorithm: str) -> None:
    """Before, GET repo/manifests/<digest> took whatever bytes came back: a registry or proxy serving another
    manifest for a digest passed unseen to every reader that asks by digest (index children, chains)."""
    import email.message


    served, other = b'{"schemaVersion":2}', b'{"schemaVersion":2,"x":1}'
    c = RegistryClient("127.0.0.1:1")
    c._exchange = lambda *a, sink=None, **k: _answered(200, email.message.Message(), served, sink)  # type: ignore
    good = f"{algorithm}:{hashlib.new(algorithm, served).hexdigest()}"
    assert c.get_manifest("a", good)[0] == served
    wanted = f"{algorithm}:{hashlib.new(algorithm, other).hexdigest()}"
    with pytest.raises(RegistryError) as refused:
        c.get_manifest("a", wanted)
    assert str(refused.value) == (f"127.0.0.1:1 answered a@{wanted} with a manifest whose digest is {good}, not the "
                                  "one asked for")
    with pytest.raises(RegistryError, match="the digest algorithm 'md5' is not one this client can check"):
        c.get_manifest("a", "md5:" + hashlib.md5(served).hexdigest())


@pytest.mark.parametrize("header", ["sha512:" + "a" * 128, "garbage", "SHA256:" + "A" * 64, "sha256:abc"])
def test_a_docker_content_digest_that_is_no_sha256_digest_is_not_taken_for_the_tag(header: str) -> None:
    """Before, manifest_digest returned the HEAD's Docker-Content-Digest as it came (a registry's sha512, a proxy's
    garbage), and its callers compared that with sha256 digests: a tag read as moved, or a garbage digest pinned.
    Now the manifest is read and hashed."""
    import email.message

    from buildtool.registry.transport import Response

    body = b'{"schemaVersion":2}'

    def exchange(method: str, url: str, sink: object = None, **kw: object) -> Response:
        answer = email.message.Message()
        answer["Docker-Content-Digest"] = header
        return _answered(200, answer, body if method == "GET" else b"", sink)

    c = RegistryClient("127.0.0.1:1")
    c._exchange = exchange  # type: ignore[method-assign]
    assert c.manifest_digest("a", "t") == "sha256:" + hashlib.sha256(body).hexdigest()


def test_a_manifest_put_answered_with_its_sha512_digest_is_stored() -> None:
    """The spec lets a registry name what it stored by sha512. Before, a PUT answered with the sha512 digest of the
    very bytes sent was refused as "registry stored a:t as sha512:..., not sha256:..."; another digest still is."""
    import email.message

    from buildtool.registry.transport import Response

    body = b'{"schemaVersion":2}'
    header = ["sha512:" + hashlib.sha512(body).hexdigest()]

    def exchange(method: str, url: str, **kw: object) -> Response:
        answer = email.message.Message()
        answer["Docker-Content-Digest"] = header[0]
        return Response(201, answer, b"")

    c = RegistryClient("127.0.0.1:1")
    c._exchange = exchange  # type: ignore[method-assign]
    assert c.put_manifest("a", "t", body, "application/vnd.oci.image.manifest.v1+json") == (
        "sha256:" + hashlib.sha256(body).hexdigest())
    header[0] = "sha512:" + hashlib.sha512(b"other").hexdigest()
    with pytest.raises(RegistryError, match=f"registry stored a:t as {header[0]}, not sha256:"):
        c.put_manifest("a", "t", body, "application/vnd.oci.image.manifest.v1+json")


def test_a_blob_named_by_its_sha512_digest_is_checked_by_sha512() -> None:
    """OCI descriptors may name a blob by sha512. Before, every blob was hashed with sha256 and compared with its
    digest, so a sha512 blob always failed as "does not match its digest", however whole it came."""
    import email.message

    from buildtool.registry.transport import Response

    data = b"layer bytes"

    def exchange(method: str, url: str, *, sink: object = None, **kw: object) -> Response:
        write = sink(200, email.message.Message())  # type: ignore[operator]
        write(data)
        return Response(200, email.message.Message(), b"")

    c = RegistryClient("127.0.0.1:1")
    c._exchange = exchange  # type: ignore[method-assign]
    assert c.get_blob("a", "sha512:" + hashlib.sha512(data).hexdigest()) == data
    with pytest.raises(RegistryError, match="does not match its digest"):
        c.get_blob("a", "sha512:" + hashlib.sha512(b"other").hexdigest())
    with pytest.raises(RegistryError, match="the digest algorithm 'md5' is not one this client can check"):
        c.get_blob("a", "md5:" + hashlib.md5(data).hexdigest())


def test_a_blob_read_with_a_limit_stops_at_the_limit() -> None:
    """Before, get_blob read a blob whole into memory however many bytes the registry sent: a registry that lies
    about a referrer layer's size could make release read gigabytes."""
    import email.message

    from buildtool.registry.transport import Response

    written: list[int] = []

    def exchange(method: str, url: str, *, sink: object = None, **kw: object) -> Response:
        write = sink(200, email.message.Message())  # type: ignore[operator]
        for _ in range(100):
            write(b"x" * 1000)
            written.append(1000)
        return Response(200, email.message.Message(), b"")

    c = RegistryClient("127.0.0.1:1")
    c._exchange = exchange  # type: ignore[method-assign]
    digest = "sha256:" + hashlib.sha256(b"x" * 100_000).hexdigest()
    with pytest.raises(RegistryError, match=f"blob {digest} of a is over the 5000-byte limit; not read further"):
        c.get_blob("a", digest, limit=5000)
    assert sum(written) == 5000
    assert c.get_blob("a", digest) == b"x" * 100_000


_D = "sha256:" + "a" * 64
_CONFIG = {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _D, "size": 2}


@pytest.mark.parametrize(("doc", "said"), [
    (b"not json", "it is not JSON (Expecting value"),
    ([], "it is a JSON list, not an object"),
    ({"schemaVersion": 2, "config": "x", "layers": []}, "its config is a JSON string, not a descriptor object"),
    ({"schemaVersion": 2, "config": _CONFIG, "layers": "x"}, "its layers is a JSON string, not a list of descriptors"),
    ({"schemaVersion": 2, "config": _CONFIG, "layers": [{**_CONFIG, "digest": 5}]},
     "layers[0] has the digest 5, not algorithm:hex"),
    ({"schemaVersion": 2, "config": {**_CONFIG, "size": "2"}, "layers": []},
     f"its config {_D} has the size \"2\", not a non-negative integer"),
    ({"schemaVersion": 2, "config": {**_CONFIG, "mediaType": 7}, "layers": []},
     "its config has the mediaType 7, not a string"),
    ({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": ["x"]},
     "manifests[0] is a JSON string, not a descriptor object"),
    ({"schemaVersion": 2, "manifests": [{**_CONFIG, "platform": "linux/amd64"}]},
     f"manifests[0] {_D} has a platform that is a JSON string, not an object"),
    ({"schemaVersion": 2, "manifests": [{**_CONFIG, "annotations": ["a"]}]},
     f"manifests[0] {_D} has annotations that are a JSON list, not an object"),
])
def test_a_manifest_of_the_wrong_shape_is_one_registry_error_for_every_reader(doc: object, said: str) -> None:
    """A registry that breaks the spec (or anyone who may push) served a manifest whose config is no descriptor, whose
    layers are no list, whose descriptors' fields have the wrong types: each reader indexed it as it came and failed
    with a KeyError, TypeError or AttributeError's traceback. Now the client refuses it where it is fetched, naming
    the reference, its digest and what is wrong."""
    import email.message

    from buildtool.attest.referrers import Referrer, copy_artifact
    from buildtool.registry import image_index
    from buildtool.release import execute, read

    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    c = RegistryClient("127.0.0.1:1")
    c._exchange = lambda *a, sink=None, **k: _answered(200, email.message.Message(), body, sink)  # type: ignore
    by_tag = f"r:t (digest {digest})"
    readers = [(lambda: image_index.read_children(c, "r", "t"), by_tag),
               (lambda: image_index.platform_manifest(c, "r", "t", "linux/amd64"), by_tag),
               (lambda: read.read_platforms(c, "r", *c.get_manifest("r", "t")[:2]), by_tag),
               (lambda: execute.copy_manifest(c, "r", "s", *c.get_manifest("r", "t")), by_tag),
               (lambda: copy_artifact(c, "r", "s", Referrer(digest, "x", len(body))), f"r@{digest}")]
    for reader, named in readers:
        with pytest.raises(RegistryError) as refused:
            reader()
        assert str(refused.value).startswith(f"127.0.0.1:1/{named} is no manifest OCI's image spec allows: {said}")
        assert "\n" not in str(refused.value)


@pytest.mark.parametrize("config", [b"not json", b"\xff\xfe", b"[1]", b'{"os": "linux", "config": ["x"]}',
                                    b'{"os": "linux", "architecture": "amd64", "config": {"Labels": ["a=b"]}}'])
def test_an_image_whose_config_is_no_image_config_is_one_registry_error_for_the_index_readers(config: bytes) -> None:
    """read_children, read_index (a multi-platform dev tag, the report's fetch) and platform_manifest (a build's base)
    parsed the config blob as it came: one that is not JSON, not an object, or whose config.Labels is no object (anyone
    who may push can write one) ended the command in a JSONDecodeError or AttributeError traceback. Now one line
    naming the image and its config."""
    from buildtool.registry import image_index
    from buildtool.registry.client import DOCKER_MANIFEST
    from tests.memregistry import MemRegistry

    c: Any = MemRegistry()
    blob = c.put_blob("r", config)
    body = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "layers": [],
                       "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": blob,
                                  "size": len(config)}}).encode()
    child = c.put_manifest("r", "single", body, DOCKER_MANIFEST)
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": DOCKER_MANIFEST, "digest": child, "size": len(body),
         "platform": {"os": "linux", "architecture": "amd64"}}]}).encode()
    c.put_manifest("r", "index", index, "application/vnd.oci.image.index.v1+json")
    said = "is not an image config (a JSON object whose config.Labels, where present, is an object)"
    readers = [(lambda: image_index.read_children(c, "r", "single"), "r:single"),
               (lambda: image_index.read_index(c, "r", "index"), f"r:index linux/amd64 entry {child}"),
               (lambda: image_index.platform_manifest(c, "r", "single", "linux/amd64"), "r:single")]
    for reader, named in readers:
        with pytest.raises(RegistryError) as refused:
            reader()
        assert str(refused.value) == f"{named}: its config {blob} {said}"


@contextlib.contextmanager
def _manifest_server(body: bytes, length: str | None) -> Iterator[tuple[str, list[int]]]:
    """A registry that answers every manifest GET with `body`, its Content-Length `length` (None: no Content-Length,
    the body ends when the connection closes, as a chunked or lying registry's may), while the block runs: its host and
    `sent`, the bytes it wrote."""
    sent: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
            if length is not None:
                self.send_header("Content-Length", length)
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                for start in range(0, len(body), 1 << 16):
                    self.wfile.write(body[start:start + (1 << 16)])
                    sent.append(min(1 << 16, len(body) - start))
            except OSError:
                pass    # the client stopped reading

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", sent
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("length", ["declared", "none"])
def test_a_manifest_over_the_size_limit_is_refused_and_not_read_past_it(length: str, monkeypatch) -> None:
    """Before, get_manifest read a manifest (and the referrers fallback index, a manifest read by tag) whole into
    memory whatever its size: anyone who may push could make release and verify read gigabytes."""
    from buildtool.registry import client as client_mod

    monkeypatch.setattr(client_mod, "MAX_MANIFEST_BYTES", 100_000, raising=False)
    body = json.dumps({"schemaVersion": 2, "annotations": {"x": "y" * 8_000_000}}).encode()
    said = str(len(body)) if length == "declared" else None
    with _manifest_server(body, said) as (host, sent), pytest.raises(RegistryError) as refused:
        client(host).get_manifest("r", "t")
    size = f"{len(body)} bytes" if length == "declared" else r"at least 1\d{5} bytes"
    assert re.fullmatch(f"{re.escape(host)}/r:t: the manifest is {size}, over the 100000-byte limit on a manifest; "
                        "not read further", str(refused.value))
    assert sum(sent) < len(body)


def test_an_image_config_over_the_size_limit_is_not_read_past_it_by_the_index_readers(monkeypatch) -> None:
    """Before, read_children, read_index and platform_manifest read an image's config whole whatever its size (anyone
    who may push writes it); release and verify read it to MAX_CONFIG_BYTES only. Now the same limit here."""
    from buildtool.registry import image_index
    from buildtool.registry.client import DOCKER_MANIFEST
    from tests.memregistry import MemRegistry

    monkeypatch.setattr(image_index, "MAX_CONFIG_BYTES", 64, raising=False)
    c: Any = MemRegistry()
    config = json.dumps({"os": "linux", "architecture": "amd64", "config": {"Env": ["A=" + "x" * 100]}}).encode()
    blob = c.put_blob("r", config)
    body = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "layers": [],
                       "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": blob,
                                  "size": len(config)}}).encode()
    c.put_manifest("r", "single", body, DOCKER_MANIFEST)
    for reader in (lambda: image_index.read_children(c, "r", "single"),
                   lambda: image_index.platform_manifest(c, "r", "single", "linux/amd64")):
        with pytest.raises(RegistryError) as refused:
            reader()
        assert str(refused.value) == f"blob {blob} of r is over the 64-byte limit; not read further"


def test_every_blob_read_into_memory_names_its_limit() -> None:
    """Before, the build's reads of image configs (the base's platform, its BASE_SOURCE label, the provenance's labels,
    the config normalised after a push) called get_blob with no limit: whatever the registry sent was read into
    memory. Every get_blob call in buildtool/ now names one (MAX_CONFIG_BYTES for a config)."""
    import ast
    from pathlib import Path

    unbounded = []
    for path in sorted((Path(__file__).resolve().parent.parent / "buildtool").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get_blob" \
                    and not any(k.arg == "limit" for k in node.keywords):
                unbounded.append(f"{path.name}:{node.lineno}")
    assert unbounded == []


def test_a_manifest_annotation_key_of_the_wrong_value_type_is_named_bounded() -> None:
    """Before, manifest_problem named an annotation whose value is no string by its key whole (`{key!r}`): anyone who
    may push could make the refusal of a manifest (or of the release lock) a message of megabytes."""
    from buildtool.registry.answers import manifest_problem

    key = "k" * 1_000_000
    problem = manifest_problem(json.dumps({"schemaVersion": 2, "annotations": {key: 5}}).encode())
    assert problem == f"its annotations give {ascii(key[:80])}... (1000000 characters) a JSON number, not a string"
    assert manifest_problem(b'{"annotations": {"a": 5}}') == "its annotations give 'a' a JSON number, not a string"


def test_a_content_length_of_digits_that_are_not_ascii_is_read_as_none_never_a_traceback() -> None:
    """A Content-Length of '²' (latin-1 0xb2, as a broken proxy may send) passed str.isdigit, and int('²') raised
    ValueError out of the transport, a traceback for every registry command. http.client reads such a length as
    none (the body ends when the connection closes); so does the transport now."""
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + "a" * 64,
                           "size": 2}, "layers": []}
    body = json.dumps(manifest).encode()
    with _manifest_server(body, "\u00b2") as (host, _):
        raw, _media_type, _digest = client(host).get_manifest("r", "t")
    assert json.loads(raw) == manifest


def test_an_answer_of_json_nested_too_deeply_is_no_json_never_a_traceback() -> None:
    """JSON nested ~100,000 deep makes json.loads raise RecursionError, no ValueError: a registry (or anyone who may
    push a manifest) answering so ended get_manifest, tag listing, the referrers index and every error reading with
    a traceback. Both readers now take it as JSON that is not: the manifest is refused naming why."""
    from buildtool.registry.answers import manifest_problem
    from buildtool.registry.transport import Response

    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(ValueError, match="nested too deeply"):
        Response(200, {}, deep).json()
    assert manifest_problem(deep) == "it is not JSON (JSON nested too deeply to read)"
    with _manifest_server(b'{"schemaVersion": 2, "x": ' + deep + b"}", None) as (host, _), \
            pytest.raises(RegistryError) as refused:
        client(host).get_manifest("r", "t")
    assert str(refused.value).endswith("it is not JSON (JSON nested too deeply to read)"), str(refused.value)
