"""Registry authentication: Basic, and the distribution token flow (Bearer), for one registry host.

docs/registries.md ("Tokens", "Where credentials go") gives the rules: `WWW-Authenticate` parsed as RFC 7235
challenges (several per header, quoted values holding commas), the scopes each request needs and the union asked
for after a 401, when a token is asked for again (`expires_in`, Token.fresh, by the local clock), the token server's
GET with Basic or OAuth2 POST with an identity token (a `refresh_token` it answers serves the next tokens), and
credentials (buildtool.registry.credentials, resolved for this host only, and only when a challenge asks) sent to a
token realm only over HTTPS. A token server's own error message ends up in the error.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

from buildtool.registry import credentials as creds_mod
from buildtool.registry.answers import masked, one_line
from buildtool.registry.call_errors import (
    CredentialsRefused,
    InsufficientScope,
    NoCredentials,
    RateLimited,
    RegistryError,
)
from buildtool.registry.transport import Response

log = logging.getLogger(__name__)

DEFAULT_TOKEN_LIFE_S = 60.0
CLIENT_ID = "dl-images-buildtool"
_MAX_TOKENS = 64

Triple = tuple[str, str, str]        # (resource type, name, action)


# -- challenges --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Challenge:
    scheme: str                                   # lower-cased: "bearer", "basic"
    params: dict[str, str] = field(default_factory=dict)


_NAME = re.compile(r"[ \t,]*([!#$%&'*+\-.^_`|~0-9A-Za-z]+)[ \t]*")     # a scheme or a parameter's name
# `=` and a quoted string (backslash escapes; unterminated: to the end), or leniently anything up to a comma or space
_VALUE = re.compile(r'=[ \t]*(?:"((?:[^"\\]|\\[\s\S]|\\\Z)*)"?|([^,\s"]*))')
_TOKEN68 = re.compile(r"([A-Za-z0-9\-._~+/]+=*)[ \t]*(?:,|\Z)")
_ESCAPED = re.compile(r"\\([\s\S])")


def parse_challenges(header: str) -> list[Challenge]:
    """RFC 7235 `WWW-Authenticate`: every challenge with its parameters (names lower-cased). Never raises:
    what does not parse ends the list."""
    out: list[Challenge] = []
    pos = 0
    while name := _NAME.match(header, pos):
        pos = name.end()
        # `name=value` is a parameter of the challenge before it; `name==` (and a first name) begins a challenge.
        value = _VALUE.match(header, pos) if out and not header.startswith("==", pos) else None
        if value:
            quoted, bare = value.groups()
            out[-1].params[name.group(1).lower()] = bare if quoted is None else _ESCAPED.sub(r"\1", quoted)
            pos = value.end()
            continue
        out.append(Challenge(name.group(1).lower(), {}))
        token68 = _TOKEN68.match(header, pos)     # `Basic dXNlcg==`: a token68, not a parameter; skipped
        pos = token68.end(1) if token68 else pos
    return out


def challenge_header(headers: Any) -> str:
    """Every `WWW-Authenticate` header of an answer as one list (RFC 7230 lets a registry send its challenges as
    several headers): http.client's `get` gives the first alone; requests joins them already."""
    values = headers.get_all("WWW-Authenticate") if hasattr(headers, "get_all") else [headers.get("WWW-Authenticate")]
    return ", ".join(v for v in values or [] if v)


# -- scopes ------------------------------------------------------------------------------------

def parse_scopes(text: str) -> frozenset[Triple]:
    """`repository:a/b:pull,push registry:catalog:*` -> {(repository, a/b, pull), (repository, a/b, push), ...}."""
    out: set[Triple] = set()
    for item in text.split():
        head, sep, actions = item.rpartition(":")
        kind, sep2, name = head.partition(":")
        if not (sep and sep2 and kind and name):
            continue
        out.update((kind, name, a) for a in actions.split(",") if a)
    return frozenset(out)


def format_scopes(triples: Iterable[Triple]) -> list[str]:
    """The scope parameters for a token request, one per resource, actions in a stable order."""
    grouped: dict[tuple[str, str], set[str]] = {}
    for kind, name, action in triples:
        grouped.setdefault((kind, name), set()).add(action)
    return [f"{kind}:{name}:{','.join(sorted(actions))}" for (kind, name), actions in sorted(grouped.items())]


_ACTIONS = {"GET": ("pull",), "HEAD": ("pull",), "DELETE": ("delete",)}    # any other method: ("pull", "push")


def needed_scopes(method: str, repo: str, mount_from: str = "") -> frozenset[Triple]:
    """What the distribution registry checks for `method` on `repo` (and a mount's source)."""
    if not repo:
        return frozenset()
    out = {("repository", repo, a) for a in _ACTIONS.get(method.upper(), ("pull", "push"))}
    if mount_from:
        out.add(("repository", mount_from, "pull"))
    return frozenset(out)


def describe(needed: Iterable[Triple]) -> str:
    """`push to a/b and pull from c/d`, for messages."""
    grouped: dict[str, set[str]] = {}
    for _kind, name, action in needed:
        grouped.setdefault(name, set()).add(action)
    return " and ".join(f"{'/'.join(sorted(a))} on {name}" for name, a in sorted(grouped.items())) or "access"


@dataclass
class Token:
    value: str = field(repr=False)
    scopes: frozenset[Triple]
    expires_at: float           # monotonic

    def fresh(self, now: float, life: float) -> bool:
        return now < self.expires_at - min(10.0, life / 5)     # a margin: a fifth of the life, at most 10 s


def token_life(expires_in: Any) -> float | None:
    """A token answer's `expires_in` in seconds: absent (or null) the spec's 60, and so 0 or less (docker reads it
    so: Go cannot tell 0 from absent); None for anything but a finite number ("nan", NaN, Infinity, "300"), which
    no Go client decodes and would otherwise mean a token asked for every request, or never again."""
    if expires_in is None:
        return DEFAULT_TOKEN_LIFE_S
    if isinstance(expires_in, bool) or not isinstance(expires_in, int | float):
        return None
    try:
        life = float(expires_in)
    except OverflowError:       # an integer past float's range
        return None
    if not math.isfinite(life):
        return None
    return max(life, 1.0) if life > 0 else DEFAULT_TOKEN_LIFE_S


# -- messages ----------------------------------------------------------------------------------

def server_message(response: Response, secrets: Iterable[str] = ()) -> str:
    """The server's own words: registry `errors[].message`, a token server's `details`/`error_description`/
    `error`/`message`, else the first line of a short text body; each of `secrets` in them masked (a server may
    echo what it was sent), before they are cut."""
    try:
        body = response.json()
    except ValueError:
        body = None
    parts: list[str] = []
    if isinstance(body, dict):
        errors = body.get("errors")
        for e in errors if isinstance(errors, list) else []:     # `{"errors": 5}` is no list of errors
            if isinstance(e, dict):
                parts.append(": ".join(str(x) for x in (e.get("code"), e.get("message")) if x))
        for key in ("details", "error_description", "error", "message"):
            value = body.get(key)
            if isinstance(value, str) and value and not parts:
                parts.append(value)
    if not parts:
        text = response.text.strip().splitlines()
        if text and len(text[0]) < 300 and not text[0].lstrip().startswith("<"):
            parts.append(text[0])
    return one_line(masked("; ".join(parts), secrets))[:300]     # one line: a message may hold newlines


def without_query(url: str) -> str:
    """`url` as messages show it: URLs never carry credentials here, but the query string (upload state) is stripped
    anyway (RegistryClient._safe is this)."""
    return url.split("?", 1)[0]


def rate_limited(method: str, url: str, response: Any, detail: str) -> RateLimited:
    """429 (or 503) that waiting within this command's bounds did not cure: the host that answered and
    its own words (Docker Hub's explain its pull limit). `url` without its query string (without_query)."""
    status, url = response.status_code, without_query(url)
    said = server_message(response)
    if status == 429:
        who = getattr(response, "answered_by", "") or urlsplit(url).netloc
        return RateLimited(f"rate limited by {who}: {said or 'HTTP 429 Too Many Requests'} (HTTP 429 to {method} "
                           f"{url}; {detail}); try later")
    return RateLimited(f"{method} {url}: HTTP {status}{f' ({said})' if said else ''}, {detail}; try later")


def _token_realm(host: str, realm: str) -> str:
    """A Bearer challenge's realm as a URL to ask (scheme lower-cased: `HTTPS://` is HTTPS); a relative or
    non-http(s) realm is refused by name, where requests would end in a MissingSchema traceback."""
    scheme, sep, rest = realm.strip().partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not urlsplit(f"{scheme.lower()}://{rest}").netloc:
        raise RegistryError(f"{host}: its token realm {realm[:120]!r} is not an http(s) URL, so no token can be "
                            "asked for (a registry or proxy misconfiguration)")
    return f"{scheme.lower()}://{rest}"


def _hidden_repositories(response: Response, needed: Iterable[Triple]) -> str:
    """The repositories of a 401 whose Bearer challenge says `error="insufficient_scope"`: what Docker Hub (and
    others) answer for a repository that does not exist or is not the caller's, whoever asks. "" otherwise."""
    challenges = parse_challenges(challenge_header(response.headers))
    if not any(c.scheme == "bearer" and c.params.get("error") == "insufficient_scope" for c in challenges):
        return ""
    return " and ".join(sorted({name for kind, name, _ in needed if kind == "repository"}))


# -- one host ----------------------------------------------------------------------------------

Fetch = Callable[..., Any]     # (method, url, *, headers, data) -> response, retried and TLS-checked by the client


class HostAuth:
    """Authentication state for one registry host, shared by the threads of one RegistryClient."""

    def __init__(self, host: str, fetch: Fetch, *, clock: Callable[[], float] = time.monotonic,
                 resolve: Callable[[str], creds_mod.Credential | None] = creds_mod.resolve) -> None:
        self.host = host
        self._fetch = fetch
        self._clock = clock
        self._resolve = resolve
        self.scheme: str | None = None          # "basic" or "bearer" once the registry challenged
        self.realm = ""
        self.service = ""
        self._tokens: list[tuple[Token, float]] = []     # (token, its life in seconds)
        self._refresh_token = ""
        self._lock = threading.RLock()
        self._creds: creds_mod.Credential | None = None
        self._creds_loaded = False
        self.token_requests = 0                 # how many tokens were asked for (tests, logs)

    # credentials are resolved on the first challenge, never for a registry that asks for none
    def credentials(self) -> creds_mod.Credential | None:
        with self._lock:
            if not self._creds_loaded:
                self._creds = self._resolve(self.host)
                self._creds_loaded = True
            return self._creds

    def header(self, needed: frozenset[Triple]) -> str | None:
        """The Authorization header a request that needs `needed` goes with (None: none known to be needed)."""
        with self._lock:
            if self.scheme == "basic":
                return self._basic_header()
            if self.scheme == "bearer" and needed:
                token = self._cached(needed) or self._new_token(needed)
                return f"Bearer {token.value}"
            return None

    def _basic_header(self) -> str:
        found = self.credentials()
        if found is None or not found.password:
            raise self._no_credentials("it asks for a user name and password;")
        return "Basic " + found.basic()

    def _no_credentials(self, why: str) -> NoCredentials:
        """No credentials for this host, `why` they are needed, and the ways to give them."""
        return NoCredentials(f"no credentials for {self.host}: {why} run `docker login {self.host}`, add a credential "
                             f"helper, or set REGISTRY_USER, REGISTRY_PASSWORD and REGISTRY_AUTH_HOST={self.host}")

    def _cached(self, needed: frozenset[Triple]) -> Token | None:
        now = self._clock()
        self._tokens = [(t, life) for t, life in self._tokens if t.fresh(now, life)]
        return next((token for token, _life in reversed(self._tokens) if needed <= token.scopes), None)

    def on_unauthorized(self, response: Response, needed: frozenset[Triple], sent: str | None) -> frozenset[Triple]:
        """A 401: learn the scheme and get what the next try needs (returned: the scopes it asks a token
        for), or raise the error that says why another try would not do."""
        with self._lock:
            challenges = parse_challenges(challenge_header(response.headers))
            bearer = next((c for c in challenges if c.scheme == "bearer" and c.params.get("realm")), None)
            basic = next((c for c in challenges if c.scheme == "basic"), None)
            if bearer is not None:
                self.scheme = "bearer"
                self.realm = _token_realm(self.host, bearer.params["realm"])
                self.service = bearer.params.get("service", "")
                want = needed | parse_scopes(bearer.params.get("scope", ""))
                if sent and sent.startswith("Bearer "):
                    used = next((t for t, _ in self._tokens if f"Bearer {t.value}" == sent), None)
                    if used is not None and want <= used.scopes and bearer.params.get("error") == "insufficient_scope":
                        raise self.failure(response, needed, sent)    # asked for all of it; the server gave less
                    self._tokens = [(t, life) for t, life in self._tokens if f"Bearer {t.value}" != sent]
                self._new_token(want)
                return want
            if basic is not None:
                if sent and sent.startswith("Basic "):
                    raise self.failure(response, needed, sent)
                self.scheme = "basic"
                self._basic_header()     # raises NoCredentials now, with the host, when there are none
                return needed
            raise self.failure(response, needed, sent)

    def failure(self, response: Response, needed: frozenset[Triple], sent: str | None) -> RegistryError:
        """The one-line error for a 401 that another try will not cure."""
        message = self._said(response)
        said = f" ({message})" if message else ""
        found = self.credentials() if self.scheme else self._creds
        hidden = _hidden_repositories(response, needed)
        if sent and sent.startswith("Basic "):
            return CredentialsRefused(f"credentials for {self.host} were refused by {self.host}{said}; "
                                      f"check the user and password ({found.source if found else 'unknown source'})")
        if found is None:
            # Docker Hub answers insufficient_scope alike for a private repository and for one that does not exist.
            unknown = (f", or {hidden} is not found or not yours ({self.host} answered insufficient_scope, as "
                       "registries such as Docker Hub do for a repository that does not exist): check the name, and "
                       "if it is yours" if hidden else ";")
            return self._no_credentials(f"{describe(needed)} needs them{said}{unknown}")
        if self.realm.startswith("http://"):
            return NoCredentials(f"{self.host}: {describe(needed)} needs credentials, and they are not sent to "
                                 f"its plain-HTTP token realm {self._realm_host()}{said}")
        who = f" {found.username}" if found.username else ""
        return InsufficientScope(f"insufficient scope at {self.host}: the credentials of{who or ' this user'} "
                                 f"({found.source}) do not grant {describe(needed)}{said}"
                                 + (f"; {hidden} not found or not yours: check the name, and that{who or ' this user'}"
                                    " may use it" if hidden else ""))

    def secrets(self) -> list[str]:
        """What this host's messages never show: the credentials' secrets and every token's value."""
        found = self._creds
        held = [self._refresh_token, *(token.value for token, _ in self._tokens)]
        if found is not None:
            held += [found.identity_token, *((found.password, found.basic()) if found.password else ())]
        return held

    def _said(self, response: Response) -> str:
        return server_message(response, self.secrets())

    def _realm_host(self) -> str:
        return urlsplit(self.realm).netloc or self.realm

    def _new_token(self, want: frozenset[Triple]) -> Token:
        realm = self.realm
        found = self.credentials()
        secure = realm.startswith("https://")
        if found is not None and not secure:
            log.warning("%s: its token realm %s is plain HTTP; credentials are not sent there (asking anonymously)",
                        self.host, self._realm_host())
        usable = found if secure else None
        scopes = format_scopes(want)
        started = self._clock()
        self.token_requests += 1
        response = None
        refresh = self._refresh_token or (usable.identity_token if usable else "")
        if usable is not None and refresh:
            form = [("grant_type", "refresh_token"), ("refresh_token", refresh), ("client_id", CLIENT_ID),
                    ("service", self.service), ("scope", " ".join(scopes))]
            response = self._fetch("POST", realm, headers={"Content-Type": "application/x-www-form-urlencoded"},
                                   data=urlencode([(key, value) for key, value in form if value]).encode())
            if response.status_code in (404, 405) and usable.password:
                response = None
        if response is None:
            query = ([("service", self.service)] if self.service else []) + [("scope", s) for s in scopes]
            url = realm + (("&" if "?" in realm else "?") + urlencode(query) if query else "")
            headers = {}
            if usable is not None and usable.password:
                headers["Authorization"] = "Basic " + usable.basic()
            response = self._fetch("GET", url, headers=headers, data=None)
        return self._accept(response, want, started, usable)

    def _accept(self, response: Response, want: frozenset[Triple], started: float,
                sent: creds_mod.Credential | None) -> Token:
        server = self._realm_host()
        message = self._said(response)
        said = f": {message}" if message else ""
        if response.status_code in (401, 403):
            if sent is not None:
                raise CredentialsRefused(f"credentials for {self.host} were refused by its token server {server}"
                                         f"{said} ({sent.source})")
            if self._creds is not None:
                raise NoCredentials(f"{self.host}: its token server {server} is plain HTTP, so the credentials for "
                                    f"{self.host} are not sent there, and it refused an anonymous token{said}")
            raise self._no_credentials(f"its token server {server} refused an anonymous token for "
                                       f"{describe(want)}{said};")
        if response.status_code != 200:
            raise RegistryError(f"token server {server} for {self.host}: HTTP {response.status_code}{said}")
        try:
            body = response.json()
        except ValueError:
            body = None
        value = (body.get("token") or body.get("access_token")) if isinstance(body, dict) else None
        if not isinstance(value, str) or not value:
            raise RegistryError(f"token server {server} for {self.host} answered without a token "
                                "(no JSON `token` or `access_token`)")
        if not re.fullmatch(r"[\x21-\x7e]+", value):   # never quoted: the HTTP client's own refusal quoted it whole
            raise RegistryError(f"token server {server} for {self.host} answered a token that is no HTTP header value "
                                "(a space, a control or a non-ASCII character: RFC 6750's b64token is printable "
                                "ASCII); not sent")
        life = token_life(body.get("expires_in"))
        if life is None:
            raise RegistryError(f"token server {server} for {self.host} answered an expires_in of "
                                f"{str(body.get('expires_in'))[:40]!r}, not a number of seconds")
        if isinstance(body.get("refresh_token"), str) and body["refresh_token"]:
            self._refresh_token = body["refresh_token"]
        token = Token(value, want, started + life)
        self._tokens = [*self._tokens[-(_MAX_TOKENS - 1):], (token, life)]
        log.debug("%s: token for %s (%.0f s)", self.host, " ".join(format_scopes(want)), life)
        return token
