"""A token server for tests, as the distribution token-auth spec describes one (Docker Hub, GHCR, Harbor...).

- `GET /token?service=S&scope=...` with Basic credentials or none; `POST /token` (OAuth2: grant_type
  `password` or `refresh_token`). The answer: `{"token", "access_token", "expires_in", "issued_at"}` (and
  a `refresh_token` for a POST password grant with access_type=offline).
- The token is an RS256 JWT (iss, sub, aud = service, exp, nbf, iat, jti, access), signed by a key whose
  self-signed certificate is in the `x5c` header and is the registry's `rootcertbundle`.
- Scopes are granted per user: `grants` maps a user to {repository-name prefix: actions}; what a user may not
  do is left out of the token (as real servers do: the registry then answers 401 insufficient_scope).
  Anonymous requests get no access at all. A wrong password is 401 `incorrect username or password`.
- `life`: the tokens' expires_in (5 s to prove refreshing); `rate_limit_every=N`: every Nth request is
  answered 429 with Retry-After: 1 (`retry_after` seconds).
- Every request is recorded with its headers (`seen`), so tests can assert what was and was not sent.

`FakeRegistry` (unit tests, no registry binary): checks such tokens (or Basic credentials) the way
distribution does, for the calls RegistryClient makes, and records requests too.
"""

from __future__ import annotations

import base64
import hashlib
import json
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    status: int = 0


class _Server:
    """A threading HTTP(S) server on (address, port) with a handler function; records every request."""

    def __init__(self, handle: Callable[[BaseHTTPRequestHandler, bytes], tuple[int, dict[str, str], bytes]],
                 address: str = "127.0.0.1", port: int = 0, tls: tuple[Path, Path] | None = None) -> None:
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                record = Seen(self.command, self.path, {k: v for k, v in self.headers.items()})
                with outer._lock:
                    outer.seen.append(record)
                status, headers, payload = handle(self, body)
                record.status = status
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _any

        self.httpd = ThreadingHTTPServer((address, port), Handler)
        self.httpd.daemon_threads = True
        self.scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            self.scheme = "https"
        self.port = self.httpd.server_address[1]
        self.address = address
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class TokenServer:
    def __init__(self, *, signing_cert: Path, signing_key: Path, users: dict[str, str],
                 grants: dict[str, dict[str, str]], service: str = "token-registry.test",
                 issuer: str = "dl-images-test-issuer", life: int = 300, rate_limit_every: int = 0,
                 retry_after: int = 1, address: str = "127.0.0.1", port: int = 0,
                 tls: tuple[Path, Path] | None = None, omit_expires_in: bool = False,
                 token_key: str = "token") -> None:
        from cryptography import x509

        self.users, self.grants = users, grants
        self.service, self.issuer, self.life = service, issuer, life
        self.rate_limit_every, self.retry_after = rate_limit_every, retry_after
        self.omit_expires_in, self.token_key = omit_expires_in, token_key
        self._key = serialization.load_pem_private_key(signing_key.read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate(signing_cert.read_bytes())
        self._x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self._count = 0
        self._count_lock = threading.Lock()
        self.refresh_tokens: dict[str, str] = {}
        self.issued: list[dict[str, Any]] = []
        self.server = _Server(self._handle, address, port, tls)

    @property
    def seen(self) -> list[Seen]:
        return self.server.seen

    def url(self, host: str | None = None) -> str:
        return f"{self.server.scheme}://{host or self.server.address}:{self.server.port}/token"

    def close(self) -> None:
        self.server.close()

    # -- tokens ----------------------------------------------------------------------------

    def sign(self, claims: dict[str, Any]) -> str:
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self._x5c]}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = self._key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())  # type: ignore[union-attr,call-arg]
        return f"{signing_input}.{_b64url(signature)}"

    def _granted(self, user: str, scopes: list[str]) -> list[dict[str, Any]]:
        allowed = self.grants.get(user, {}) if user else {}
        access = []
        for scope in scopes:
            for item in scope.split():
                head, _, actions = item.rpartition(":")
                kind, _, name = head.partition(":")
                if kind != "repository":
                    continue
                may: set[str] = set()
                for prefix, granted in allowed.items():
                    if name == prefix or name.startswith(prefix.rstrip("/") + "/") or prefix == "*":
                        may |= set(granted.split(","))
                give = sorted(a for a in actions.split(",") if a in may or "*" in may)
                if give:
                    access.append({"type": kind, "name": name, "actions": give})
        return access

    def _answer(self, user: str, scopes: list[str], offline: bool = False) -> tuple[int, dict[str, str], bytes]:
        now = int(time.time())
        access = self._granted(user, scopes)
        claims = {"iss": self.issuer, "sub": user, "aud": self.service, "exp": now + self.life, "nbf": now - 1,
                  "iat": now, "jti": uuid.uuid4().hex, "access": access}
        self.issued.append(claims)
        token = self.sign(claims)
        body: dict[str, Any] = {self.token_key: token,
                                "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}
        if not self.omit_expires_in:
            body["expires_in"] = self.life
        if offline and user:
            refresh = uuid.uuid4().hex
            self.refresh_tokens[refresh] = user
            body["refresh_token"] = refresh
        return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()

    @staticmethod
    def _refuse(status: int, message: str, extra: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        return status, {"Content-Type": "application/json", **(extra or {})}, json.dumps({"details": message}).encode()

    def _handle(self, req: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, str], bytes]:
        with self._count_lock:
            self._count += 1
            count = self._count
        if self.rate_limit_every and count % self.rate_limit_every == 0:
            return self._refuse(429, "rate limited", {"Retry-After": str(self.retry_after)})
        parts = urlsplit(req.path)
        if parts.path != "/token":
            return self._refuse(404, "not found")
        if req.command == "POST":
            form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
            scopes = form.get("scope", "").split()
            if form.get("grant_type") == "refresh_token":
                user = self.refresh_tokens.get(form.get("refresh_token", ""))
                if not user:
                    return self._refuse(401, "invalid refresh token")
                return self._answer(user, scopes)
            if form.get("grant_type") == "password":
                user = form.get("username", "")
                if self.users.get(user) != form.get("password"):
                    return self._refuse(401, "incorrect username or password")
                return self._answer(user, scopes, offline=form.get("access_type") == "offline")
            return self._refuse(400, "unsupported grant_type")
        query = parse_qs(parts.query)
        if query.get("service", [""])[0] != self.service:
            return self._refuse(400, "unknown service")
        user = ""
        header = req.headers.get("Authorization", "")
        if header.startswith("Basic "):
            name, _, password = base64.b64decode(header[6:]).decode().partition(":")
            if self.users.get(name) != password:
                return self._refuse(401, "incorrect username or password")
            user = name
        return self._answer(user, query.get("scope", []))


# -- a fake registry for unit tests ----------------------------------------------------------------

def token_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT (not verified: FakeRegistry trusts the TokenServer it was given)."""
    return json.loads(_unb64url(token.split(".")[1]))


@dataclass
class FakeRegistry:
    """Blobs and manifests in memory; auth "bearer" (tokens from `realm`), "basic" (`users`) or None."""

    auth: str | None = None
    realm: str = ""
    service: str = "token-registry.test"
    users: dict[str, str] = field(default_factory=dict)
    address: str = "127.0.0.1"
    tls: tuple[Path, Path] | None = None
    redirect_blobs_to: str = ""      # answer blob GETs with 307 to this base URL
    server: _Server = field(init=False)
    blobs: dict[str, bytes] = field(default_factory=dict)
    manifests: dict[tuple[str, str], tuple[bytes, str]] = field(default_factory=dict)
    rate_limit_every: int = 0
    _count: int = 0

    def __post_init__(self) -> None:
        self.server = _Server(self._handle, self.address, 0, self.tls)

    @property
    def host(self) -> str:
        return f"{self.address}:{self.server.port}"

    @property
    def seen(self) -> list[Seen]:
        return self.server.seen

    def close(self) -> None:
        self.server.close()

    def _need(self, method: str, repo: str, query: dict[str, list[str]]) -> list[tuple[str, str]]:
        actions = ["pull"] if method in ("GET", "HEAD") else ["delete"] if method == "DELETE" else ["pull", "push"]
        need = [(repo, a) for a in actions]
        if "mount" in query and "from" in query:
            need.append((query["from"][0], "pull"))
        return need

    def _challenge(self, need: list[tuple[str, str]], error: str = "") -> dict[str, str]:
        if self.auth == "basic":
            return {"WWW-Authenticate": 'Basic realm="fake registry"'}
        grouped: dict[str, list[str]] = {}
        for repo, action in need:
            grouped.setdefault(repo, []).append(action)
        scope = " ".join(f"repository:{r}:{','.join(a)}" for r, a in grouped.items())
        value = f'Bearer realm="{self.realm}",service="{self.service}"' + (f',scope="{scope}"' if scope else "")
        return {"WWW-Authenticate": value + (f',error="{error}"' if error else "")}

    def _authorized(self, req: BaseHTTPRequestHandler, need: list[tuple[str, str]]) -> tuple[bool, str]:
        header = req.headers.get("Authorization", "")
        if self.auth is None:
            return True, ""
        if self.auth == "basic":
            if not header.startswith("Basic "):
                return False, ""
            name, _, password = base64.b64decode(header[6:]).decode().partition(":")
            return self.users.get(name) == password, ""
        if not header.startswith("Bearer "):
            return False, ""
        try:
            claims = token_claims(header[7:])
        except (ValueError, IndexError):
            return False, "invalid_token"
        if claims.get("exp", 0) < time.time():
            return False, "invalid_token"
        have = {(a["name"], action) for a in claims.get("access", []) for action in a["actions"]}
        if not all(n in have for n in need):
            return False, "insufficient_scope"
        return True, ""

    def _handle(self, req: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, str], bytes]:
        self._count += 1
        if self.rate_limit_every and self._count % self.rate_limit_every == 0:
            return 429, {"Retry-After": "1"}, b'{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}'
        parts = urlsplit(req.path)
        query = parse_qs(parts.query)
        path = parts.path
        if path == "/v2/":
            ok, _ = self._authorized(req, [])
            if not ok and self.auth:
                return 401, self._challenge([]), b""
            return 200, {}, b"{}"
        rest = path[len("/v2/"):]
        for marker in ("/manifests/", "/blobs/uploads/", "/blobs/", "/tags/list"):
            if marker in rest:
                repo, _, tail = rest.partition(marker)
                break
        else:
            return 404, {}, b""
        need = self._need(req.command, repo, query)
        ok, error = self._authorized(req, need)
        if not ok:
            body_out = json.dumps({"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]})
            return 401, {"Content-Type": "application/json", **self._challenge(need, error)}, body_out.encode()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if marker == "/manifests/":
            if req.command == "PUT":
                media = req.headers.get("Content-Type", "")
                self.manifests[(repo, tail)] = self.manifests[(repo, digest)] = (body, media)
                return 201, {"Docker-Content-Digest": digest}, b""
            found = self.manifests.get((repo, tail))
            if found is None:
                return 404, {}, b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}'
            raw, media = found
            stored = "sha256:" + hashlib.sha256(raw).hexdigest()
            return 200, {"Content-Type": media, "Docker-Content-Digest": stored}, raw
        if marker == "/blobs/uploads/":
            if req.command == "POST" and "mount" in query:
                if query["mount"][0] in self.blobs:
                    return 201, {}, b""
                return 202, {"Location": f"/v2/{repo}/blobs/uploads/x"}, b""
            if req.command == "POST":
                return 202, {"Location": f"/v2/{repo}/blobs/uploads/{uuid.uuid4().hex}"}, b""
            if req.command == "PUT":
                self.blobs[query["digest"][0]] = body
                return 201, {}, b""
            return 204, {}, b""
        if marker == "/blobs/":
            if tail not in self.blobs:
                return 404, {}, b""
            if self.redirect_blobs_to and req.command == "GET":
                return 307, {"Location": f"{self.redirect_blobs_to}/{tail}"}, b""
            return 200, {}, self.blobs[tail]
        tags = sorted(t for r, t in self.manifests if r == repo and not t.startswith("sha256:"))
        return 200, {"Content-Type": "application/json"}, json.dumps({"name": repo, "tags": tags}).encode()


class Recorder:
    """A listener that answers 200 with `payload` to anything and records the headers it was sent."""

    def __init__(self, payload: bytes = b"", address: str = "127.0.0.1") -> None:
        self.server = _Server(lambda req, body: (200, {}, payload), address)

    @property
    def seen(self) -> list[Seen]:
        return self.server.seen

    @property
    def base(self) -> str:
        return f"http://{self.server.address}:{self.server.port}"

    def close(self) -> None:
        self.server.close()
