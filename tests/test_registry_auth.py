"""Registry authentication without an engine or a registry binary: the challenge parser, the token flow
(scopes, upgrade, mounts, expiry), Basic, Retry-After, redirects, TLS with a CA in certs.d, and the
one-line errors, against tests.tokenserver's TokenServer and FakeRegistry on loopback."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from buildtool.registry.answers import retry_after
from buildtool.registry.auth import HostAuth, format_scopes, needed_scopes, parse_challenges, parse_scopes
from buildtool.registry.call_errors import (
    CredentialsRefused,
    InsufficientScope,
    NoCredentials,
    RateLimited,
    RegistryTLSError,
)
from buildtool.registry.client import RegistryClient, RegistryError, RetryPolicy
from tests import pki
from tests.tokenserver import FakeRegistry, Recorder, TokenServer

PASSWORD = "s3cret-Pa55word"
USERS = {"alice": PASSWORD, "reader": "read-only-pw"}
GRANTS = {"alice": {"team": "pull,push", "other": "pull"}, "reader": {"team": "pull"}}


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("REGISTRY_USER", "REGISTRY_PASSWORD", "REGISTRY_AUTH_HOST", "REGISTRY_AUTH_FILE",
                 "DL_IMAGES_INSECURE_REGISTRIES", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "docker-config"
    config.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    certs = tmp_path / "certs.d"
    certs.mkdir()
    monkeypatch.setenv("DL_IMAGES_CERTS_D", str(certs))
    return config


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> pki.CA:
    return pki.make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def server_cert(ca: pki.CA) -> pki.Issued:
    return ca.issue("loopback", ["127.0.0.1", "localhost"])


@pytest.fixture(scope="module")
def signing(tmp_path_factory: pytest.TempPathFactory) -> pki.Issued:
    return pki.self_signed(tmp_path_factory.mktemp("signing"), "token-signer")


def trust(ca: pki.CA, netloc: str) -> None:
    import os

    folder = Path(os.environ["DL_IMAGES_CERTS_D"]) / netloc
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca.crt").write_bytes(ca.cert.read_bytes())


@pytest.fixture
def token_registry(ca: pki.CA, server_cert: pki.Issued,
                   signing: pki.Issued) -> Iterator[tuple[TokenServer, FakeRegistry]]:
    """A plain-http loopback registry whose token realm is an https server on another port."""
    tokens = TokenServer(signing_cert=signing.cert, signing_key=signing.key, users=USERS, grants=GRANTS,
                         tls=(server_cert.cert, server_cert.key))
    trust(ca, f"127.0.0.1:{tokens.server.port}")
    registry = FakeRegistry(auth="bearer", realm=tokens.url())
    try:
        yield tokens, registry
    finally:
        registry.close()
        tokens.close()


def client(host: str, sleeps: list[float] | None = None, **kw: object) -> RegistryClient:
    record = sleeps if sleeps is not None else []
    return RegistryClient(host, retry=RetryPolicy(attempts=3, timeout=10), sleep=record.append, **kw)  # type: ignore[arg-type]


def login(host: str, user: str = "alice", password: str = PASSWORD, monkeypatch: pytest.MonkeyPatch | None = None,
          config: Path | None = None) -> None:
    assert config is not None
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (config / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))


def blob(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# -- the challenge parser ---------------------------------------------------------------------------

def test_a_bearer_challenge_whose_scope_holds_commas_parses() -> None:
    header = ('Bearer realm="https://auth.example/token",service="registry.example",'
              'scope="repository:team/img:pull,push",error="insufficient_scope"')
    (challenge,) = parse_challenges(header)
    assert challenge.scheme == "bearer"
    assert challenge.params == {"realm": "https://auth.example/token", "service": "registry.example",
                                "scope": "repository:team/img:pull,push", "error": "insufficient_scope"}


def test_several_challenges_escapes_token68_and_garbage() -> None:
    found = parse_challenges('Basic realm="a \\"quoted\\" realm", Bearer realm="https://x/t", scope=repository:a:pull')
    assert [c.scheme for c in found] == ["basic", "bearer"]
    assert found[0].params["realm"] == 'a "quoted" realm'
    assert found[1].params["scope"] == "repository:a:pull"
    assert [c.scheme for c in parse_challenges("Negotiate dG9rZW4=, Basic realm=r")] == ["negotiate", "basic"]
    for junk in ("", "=", '"', "Bearer realm=", 'Bearer realm="unterminated', ",,,"):
        parse_challenges(junk)      # never raises


def test_scopes_parse_merge_and_format() -> None:
    triples = parse_scopes("repository:a/b:pull,push repository:c:pull registry:catalog:*")
    assert ("repository", "a/b", "push") in triples and ("registry", "catalog", "*") in triples
    assert format_scopes(triples) == ["registry:catalog:*", "repository:a/b:pull,push", "repository:c:pull"]
    assert format_scopes(needed_scopes("POST", "r", mount_from="s")) == ["repository:r:pull,push", "repository:s:pull"]
    assert format_scopes(needed_scopes("HEAD", "r")) == ["repository:r:pull"]


# -- the token flow ----------------------------------------------------------------------------------

def test_pull_token_is_upgraded_to_push_and_a_mount_gets_both_repositories(
        token_registry: tuple[TokenServer, FakeRegistry], clean_env: Path) -> None:
    tokens, registry = token_registry
    login(registry.host, config=clean_env)
    c = client(registry.host)
    assert c.manifest_digest("team/a", "latest") is None           # pull token
    digest = c.put_blob("team/a", b"layer")                         # push: asked again, pull+push
    assert c.get_blob("team/a", digest) == b"layer"                 # the push token covers pull
    assert c.mount_blob("team/b", digest, "team/a")                 # two repositories in one token
    scopes = [sorted(f"{a['name']}:{','.join(a['actions'])}" for a in claims["access"]) for claims in tokens.issued]
    assert scopes == [["team/a:pull"], ["team/a:pull,push"], ["team/a:pull", "team/b:pull,push"]]
    assert c.auth.token_requests == 3
    # The password went to the token server over TLS and nowhere else; the registry saw tokens only.
    assert all(not s.headers.get("Authorization", "").startswith("Basic") for s in registry.seen)
    assert all(s.headers.get("Authorization", "").startswith("Basic ") for s in tokens.seen)


def test_tokens_are_asked_again_before_expires_in_runs_out(
        token_registry: tuple[TokenServer, FakeRegistry], clean_env: Path) -> None:
    tokens, registry = token_registry
    tokens.omit_expires_in = True                     # the spec's default then: 60 s
    login(registry.host, config=clean_env)
    now = [1000.0]
    c = client(registry.host, clock=lambda: now[0])
    c.manifest_digest("team/a", "x")
    now[0] += 45
    c.manifest_digest("team/a", "x")
    assert c.auth.token_requests == 1
    now[0] += 10                                      # 55 s: within the margin (10 s) of the 60
    c.manifest_digest("team/a", "x")
    assert c.auth.token_requests == 2


def test_an_expired_token_the_registry_refuses_is_replaced(
        token_registry: tuple[TokenServer, FakeRegistry], clean_env: Path) -> None:
    tokens, registry = token_registry
    login(registry.host, config=clean_env)
    now = [0.0]
    c = client(registry.host, clock=lambda: now[0])   # the client's clock says fresh; the server's says no
    c.manifest_digest("team/a", "x")
    import time

    expired = tokens.sign({"iss": tokens.issuer, "sub": "alice", "aud": tokens.service, "exp": int(time.time()) - 5,
                           "access": [{"type": "repository", "name": "team/a", "actions": ["pull"]}]})
    for token, _ in c.auth._tokens:
        token.value = expired                          # the server's clock says it ran out: invalid_token
    c.manifest_digest("team/a", "x")
    assert c.auth.token_requests == 2


def test_access_token_key_and_a_real_short_life(
        token_registry: tuple[TokenServer, FakeRegistry], clean_env: Path) -> None:
    import time

    tokens, registry = token_registry
    tokens.token_key, tokens.life = "access_token", 1
    login(registry.host, config=clean_env)
    c = client(registry.host)
    c.put_blob("team/a", b"x")
    time.sleep(1.1)
    assert c.has_blob("team/a", blob(b"x"))
    assert c.auth.token_requests >= 2


def test_insufficient_scope_is_one_line_naming_repository_and_action(
        token_registry: tuple[TokenServer, FakeRegistry], clean_env: Path) -> None:
    _tokens, registry = token_registry
    login(registry.host, "reader", "read-only-pw", config=clean_env)
    c = client(registry.host)
    assert c.manifest_digest("team/a", "x") is None
    with pytest.raises(InsufficientScope) as caught:
        c.put_blob("team/a", b"layer")
    message = str(caught.value)
    assert "\n" not in message and registry.host in message and "team/a" in message and "push" in message
    assert caught.value.exit_code == 2
    # The registry's challenge said insufficient_scope: a repository that does not exist or is not this user's
    # is answered the same way (Docker Hub), so the message says so (issue 53).
    assert message.endswith("; team/a not found or not yours: check the name, and that reader may use it"), message


def test_a_wrong_password_is_refused_by_the_token_server_in_its_own_words(
        token_registry: tuple[TokenServer, FakeRegistry], clean_env: Path) -> None:
    _tokens, registry = token_registry
    login(registry.host, "alice", "wrong-password", config=clean_env)
    with pytest.raises(CredentialsRefused) as caught:
        client(registry.host).manifest_digest("team/a", "x")
    message = str(caught.value)
    assert "\n" not in message and registry.host in message and "refused" in message
    assert "incorrect username or password" in message and "wrong-password" not in message


def test_no_credentials_names_the_host(token_registry: tuple[TokenServer, FakeRegistry]) -> None:
    _tokens, registry = token_registry
    c = client(registry.host)
    for call in (lambda: c.manifest_digest("team/a", "x"), lambda: c.put_blob("team/a", b"layer")):
        with pytest.raises(NoCredentials, match=f"no credentials for {registry.host}: .* on team/a needs them"):
            call()


def test_identity_token_uses_the_oauth2_refresh_grant(
        token_registry: tuple[TokenServer, FakeRegistry], clean_env: Path) -> None:
    tokens, registry = token_registry
    tokens.refresh_tokens["refresh-123"] = "alice"
    (clean_env / "config.json").write_text(json.dumps({"auths": {registry.host: {"identitytoken": "refresh-123"}}}))
    c = client(registry.host)
    c.put_blob("team/a", b"x")
    assert {s.method for s in tokens.seen} == {"POST"}
    assert all("Authorization" not in s.headers for s in tokens.seen)


def test_the_token_server_rate_limit_is_waited_out(
        token_registry: tuple[TokenServer, FakeRegistry], clean_env: Path) -> None:
    tokens, registry = token_registry
    tokens.rate_limit_every = 2
    login(registry.host, config=clean_env)
    sleeps: list[float] = []
    c = client(registry.host, sleeps)
    c.manifest_digest("team/a", "x")
    c.put_blob("team/a", b"x")
    assert sleeps == [1.0]


def test_a_token_server_that_answers_garbage_or_fails_is_one_line(
        token_registry: tuple[TokenServer, FakeRegistry], clean_env: Path) -> None:
    tokens, registry = token_registry
    login(registry.host, config=clean_env)
    tokens.token_key = "nothing"
    with pytest.raises(RegistryError, match="answered without a token") as caught:
        client(registry.host).manifest_digest("team/a", "x")
    assert "\n" not in str(caught.value)


def test_credentials_never_go_to_a_plain_http_realm(signing: pki.Issued, clean_env: Path) -> None:
    tokens = TokenServer(signing_cert=signing.cert, signing_key=signing.key, users=USERS, grants=GRANTS)
    registry = FakeRegistry(auth="bearer", realm=tokens.url())
    try:
        login(registry.host, config=clean_env)
        with pytest.raises(NoCredentials, match="plain-HTTP"):
            client(registry.host).put_blob("team/a", b"x")
        assert tokens.seen and all("Authorization" not in s.headers for s in tokens.seen)
    finally:
        registry.close()
        tokens.close()


# -- Basic, and credentials for one host only --------------------------------------------------------

def test_basic_auth_answers_the_challenge_and_refusal_is_one_line(clean_env: Path) -> None:
    registry = FakeRegistry(auth="basic", users=USERS)
    try:
        login(registry.host, config=clean_env)
        c = client(registry.host)
        c.put_blob("team/a", b"x")
        assert "Authorization" not in registry.seen[0].headers     # nothing before the registry asks
        login(registry.host, "alice", "nope", config=clean_env)
        with pytest.raises(CredentialsRefused) as caught:
            client(registry.host).put_blob("team/a", b"y")
        assert "refused" in str(caught.value) and registry.host in str(caught.value)
        assert "nope" not in str(caught.value)
    finally:
        registry.close()


def test_environment_credentials_go_only_to_the_host_they_name(monkeypatch: pytest.MonkeyPatch) -> None:
    mine, other = FakeRegistry(auth="basic", users=USERS), FakeRegistry(auth="basic", users=USERS)
    try:
        monkeypatch.setenv("REGISTRY_USER", "alice")
        monkeypatch.setenv("REGISTRY_PASSWORD", PASSWORD)
        monkeypatch.setenv("REGISTRY_AUTH_HOST", mine.host)
        client(mine.host).put_blob("team/a", b"x")
        with pytest.raises(NoCredentials, match=f"no credentials for {other.host}"):
            client(other.host).put_blob("team/a", b"x")
        assert all("Authorization" not in s.headers for s in other.seen)
        # Without REGISTRY_AUTH_HOST they go nowhere.
        monkeypatch.delenv("REGISTRY_AUTH_HOST")
        with pytest.raises(NoCredentials):
            client(mine.host).put_blob("team/a", b"y")
    finally:
        mine.close()
        other.close()


def test_a_redirect_to_another_host_loses_the_authorization_header(
        token_registry: tuple[TokenServer, FakeRegistry], clean_env: Path) -> None:
    _tokens, registry = token_registry
    storage = Recorder(payload=b"layer")
    try:
        login(registry.host, config=clean_env)
        c = client(registry.host)
        digest = c.put_blob("team/a", b"layer")
        registry.redirect_blobs_to = storage.base
        assert c.get_blob("team/a", digest) == b"layer"
        assert storage.seen and all("Authorization" not in s.headers for s in storage.seen)
        assert registry.seen[-1].headers.get("Authorization", "").startswith("Bearer ")
    finally:
        storage.close()


# -- Retry-After --------------------------------------------------------------------------------------

def test_429_with_retry_after_is_waited_out_and_a_long_one_fails_at_once() -> None:
    registry = FakeRegistry(rate_limit_every=3)
    try:
        sleeps: list[float] = []
        c = client(registry.host, sleeps)
        for i in range(6):
            c.put_blob("team/a", f"blob {i}".encode())
        assert sleeps and set(sleeps) == {1.0}
        short = RegistryClient(registry.host, retry=RetryPolicy(max_retry_after=0.5), sleep=sleeps.append)
        with pytest.raises(RateLimited, match="Retry-After 1 s"):
            for _ in range(3):
                short.has_blob("team/a", blob(b"x"))
    finally:
        registry.close()


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after("7") == 7.0
    assert retry_after(None) is None and retry_after("soon") is None
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0


# -- TLS -----------------------------------------------------------------------------------------------

def test_tls_failure_says_why_and_where_the_ca_goes_and_is_not_retried(
        ca: pki.CA, server_cert: pki.Issued) -> None:
    registry = FakeRegistry(tls=(server_cert.cert, server_cert.key))
    try:
        sleeps: list[float] = []
        c = client(registry.host, sleeps, scheme="https")
        with pytest.raises(RegistryTLSError) as caught:
            c.manifest_digest("team/a", "x")
        message = str(caught.value)
        assert "certificate verify failed" in message and f"/etc/docker/certs.d/{registry.host}/ca.crt" in message
        assert "REQUESTS_CA_BUNDLE" in message and "\n" not in message
        assert sleeps == [] and registry.seen == []
        trust(ca, registry.host)                      # where docker reads it (DL_IMAGES_CERTS_D here)
        assert client(registry.host, scheme="https").manifest_digest("team/a", "x") is None
    finally:
        registry.close()


def test_the_ca_of_a_mixed_case_host_is_read_from_its_folder_as_written(ca: pki.CA, server_cert: pki.Issued) -> None:
    """certs.d/HOST[:PORT] is looked up with the host as written, as docker and skopeo (skopeo_access) look it up:
    the client looked up the lower-cased name, so a CA in certs.d/LocalHost:PORT was not trusted."""
    registry = FakeRegistry(tls=(server_cert.cert, server_cert.key))
    try:
        host = f"LocalHost:{registry.server.port}"
        trust(ca, host)
        assert client(host, scheme="https").manifest_digest("team/a", "x") is None
    finally:
        registry.close()


def test_a_non_loopback_host_is_https_unless_named_insecure(monkeypatch: pytest.MonkeyPatch) -> None:
    assert RegistryClient("registry.example:5000").scheme == "https"
    monkeypatch.setenv("DL_IMAGES_INSECURE_REGISTRIES", "registry.example:5000, other.example")
    assert RegistryClient("registry.example:5000").scheme == "http"
    assert RegistryClient("registry.example").scheme == "https"
    assert RegistryClient("127.0.0.1:5000").scheme == "http"
    assert RegistryClient("docker.io").api_host == "registry-1.docker.io"


def test_check_push_proves_push_access_before_anything_big_moves(
        token_registry: tuple[TokenServer, FakeRegistry], clean_env: Path) -> None:
    _tokens, registry = token_registry
    login(registry.host, config=clean_env)
    client(registry.host).check_push("team/a")                  # alice may push to team/
    with pytest.raises(InsufficientScope, match="push on other"):
        client(registry.host).check_push("other")               # ... and only pull from other


@pytest.mark.parametrize(("realm", "refused"), [
    ("/token", True), ("ftp://auth.example/token", True), ("https:///token", True),
    ("HTTPS://auth.example/token", False),
])
def test_a_token_realm_that_is_not_an_http_url_is_refused_by_name(realm: str, refused: bool) -> None:
    """A relative realm reached requests and ended in a MissingSchema traceback; `HTTPS://` was taken for HTTP."""
    from types import SimpleNamespace

    client = RegistryClient("registry.example", scheme="https")
    client.auth._fetch = lambda *a, **k: (_ for _ in ()).throw(RegistryError("asked"))  # type: ignore[method-assign]
    challenge = SimpleNamespace(status_code=401, headers={"WWW-Authenticate": f'Bearer realm="{realm}",service="r"'},
                                content=b"", text="", json=dict)
    with pytest.raises(RegistryError) as failed:
        client.auth.on_unauthorized(challenge, frozenset({("repository", "a/b", "pull")}), None)
    if refused:
        assert str(failed.value) == (f"registry.example: its token realm {realm!r} is not an http(s) URL, so no "
                                     "token can be asked for (a registry or proxy misconfiguration)")
    else:
        assert str(failed.value) == "asked" and client.auth.realm == "https://auth.example/token"


@pytest.mark.parametrize(("body", "said"), [
    (b'"Forbidden"', 'HTTP 403 "Forbidden"'), (b'{"errors": null}', "HTTP 403 "),
    (b'{"errors": ["x"]}', "HTTP 403 x"), (b"[1]", "HTTP 403 [1]"),
])
def test_an_error_body_of_another_shape_is_named_not_a_traceback(body: bytes, said: str) -> None:
    """A proxy's 403 with a JSON string for a body: AttributeError, and {"errors": null} TypeError, before."""
    from buildtool.registry.transport import Response

    client = RegistryClient("127.0.0.1:1")
    client._exchange = lambda *a, **k: Response(403, {}, body)  # type: ignore[method-assign]
    with pytest.raises(RegistryError) as failed:
        client.request("GET", "a/tags/list")
    assert str(failed.value) == f"GET http://127.0.0.1:1/v2/a/tags/list: {said}"


def _token_answering(body: dict[str, object], clock: list[float]) -> HostAuth:
    """A HostAuth whose token server answers `body` (200) to every request."""
    import email.message

    from buildtool.registry.transport import Response

    def fetch(method: str, url: str, **kw: object) -> Response:
        return Response(200, email.message.Message(), json.dumps(body).encode())

    auth = HostAuth("reg.example", fetch, clock=lambda: clock[0], resolve=lambda host: None)
    auth.scheme, auth.realm = "bearer", "https://auth.example/token"
    return auth


PULL_X = frozenset({("repository", "x", "pull")})


@pytest.mark.parametrize("expires_in", ["nan", float("nan"), "inf", float("inf"), "300", True, [60], 10 ** 400],
                         ids=["nan-text", "NaN", "inf-text", "Infinity", "text", "bool", "list", "past-float"])
def test_an_expires_in_that_is_no_number_is_refused_by_name(expires_in: object) -> None:
    """Before: "nan" (or JSON NaN) made the token never fresh, so one was asked for every request; "inf" made it
    never renewed. The spec says nothing of such a value: refused, naming it."""
    with pytest.raises(RegistryError) as failed:
        _token_answering({"token": "t", "expires_in": expires_in}, [0.0]).header(PULL_X)
    shown = repr(str(expires_in)[:40])
    assert str(failed.value) == (f"token server auth.example for reg.example answered an expires_in of {shown}, "
                                 "not a number of seconds")


@pytest.mark.parametrize("expires_in", ["omitted", None, 0, -5])
def test_an_expires_in_absent_or_not_positive_is_the_specs_60_seconds(expires_in: object) -> None:
    """The spec: absent means 60 s (docker takes 0 and less alike). Before, -5 gave a token of 1 s."""
    now = [1000.0]
    auth = _token_answering({"token": "t"} if expires_in == "omitted" else {"token": "t", "expires_in": expires_in},
                            now)
    for _ in range(3):
        auth.header(PULL_X)
    now[0] += 49
    auth.header(PULL_X)
    assert auth.token_requests == 1
    now[0] += 2                                       # 51 s: within the margin (10 s) of the 60
    auth.header(PULL_X)
    assert auth.token_requests == 2


def test_an_empty_password_is_named_alike_for_a_bearer_and_a_basic_registry(
        token_registry: tuple[TokenServer, FakeRegistry], clean_env: Path) -> None:
    """`auth` = base64 of `alice:`. Before: a Bearer registry asked for a token anonymously, then blamed credentials
    "refused by its token server" that were never sent; a Basic registry said there were no credentials at all."""
    from buildtool.registry.credentials import CredentialError

    tokens, bearer = token_registry
    basic = FakeRegistry(auth="basic", users=USERS)
    try:
        for registry in (bearer, basic):
            login(registry.host, password="", config=clean_env)
            with pytest.raises(CredentialError) as caught:
                client(registry.host).manifest_digest("team/a", "x")
            assert str(caught.value) == (f"{clean_env / 'config.json'}: auths['{registry.host}'] for {registry.host} "
                                         f"has an empty password; run `docker login {registry.host}` again")
            assert caught.value.exit_code == 2
        assert not tokens.seen                        # no token asked for on the strength of an unusable entry
    finally:
        basic.close()


def test_credentials_never_go_to_an_upload_location_on_another_origin() -> None:
    """A registry's 202 may name its upload session anywhere (`Location`, absolute). Before, the Basic password
    went along to that host, and to plain HTTP; docker sends credentials only where it was challenged."""
    import email.message

    from buildtool.registry.credentials import Credential
    from buildtool.registry.transport import Response

    seen: list[tuple[str, str, str]] = []

    def exchange(method: str, url: str, *, headers: dict[str, str], **kw: object) -> Response:
        sent = headers.get("Authorization", "")
        seen.append((method, url.split("?", 1)[0], sent))
        answer = email.message.Message()
        if url.startswith("https://reg.example/") and not sent:
            answer["WWW-Authenticate"] = 'Basic realm="reg"'
            return Response(401, answer, b"")
        if method == "POST":
            answer["Location"] = "http://storage.example/uploads/1?state=x"
            return Response(202, answer, b"")
        return Response(201 if method == "PUT" else 204, answer, b"")

    c = RegistryClient("reg.example", scheme="https")
    c._exchange = exchange  # type: ignore[method-assign]
    c.auth._resolve = lambda host: Credential("alice", PASSWORD, source="test")
    c.check_push("team/a")
    assert ("PUT", "http://storage.example/uploads/1", "") in seen
    assert [s for s in seen if s[2]] == [("POST", "https://reg.example/v2/team/a/blobs/uploads/", "Basic "
                                          + Credential("alice", PASSWORD).basic())]


def test_challenges_in_several_www_authenticate_headers_are_all_read() -> None:
    """A registry may send Basic and Bearer as two headers. Over the standard library's transport (plain-HTTP
    registries) only the first was read: a Basic challenge made an anonymous pull fail with "no credentials"
    where the Bearer one gives an anonymous token."""
    import email.message

    from buildtool.registry.transport import Response

    asked: list[str] = []

    def fetch(method: str, url: str, **kw: object) -> Response:
        asked.append(url)
        return Response(200, email.message.Message(), b'{"token": "t"}')

    answer = email.message.Message()
    answer["WWW-Authenticate"] = 'Basic realm="reg"'
    answer["WWW-Authenticate"] = 'Bearer realm="https://auth.example/token",service="reg"'
    auth = HostAuth("reg.example", fetch, resolve=lambda host: None)
    auth.on_unauthorized(Response(401, answer, b""), PULL_X, None)
    assert auth.scheme == "bearer" and asked == ["https://auth.example/token?service=reg&scope=repository%3Ax%3Apull"]


@pytest.mark.parametrize("body", [b'{"errors": 5}', b'{"errors": true}', b'{"errors": 1.5}'])
def test_a_401_whose_errors_is_no_list_is_one_line_not_a_traceback(body: bytes) -> None:
    """Before: TypeError ('int' object is not iterable) from the message of a 401, 429 or token server answer."""
    import email.message

    from buildtool.registry.transport import Response

    c = RegistryClient("127.0.0.1:1")
    c._exchange = lambda *a, **k: Response(401, email.message.Message(), body)  # type: ignore[method-assign]
    with pytest.raises(NoCredentials) as failed:
        c.request("GET", "a/tags/list", repo="a")
    assert str(failed.value).startswith(f"no credentials for 127.0.0.1:1: pull on a needs them ({body.decode()});")


@pytest.mark.parametrize(("body", "said"), [
    (b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center><h1>413 Request "
     b"Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n",
     "HTTP 413 (an HTML page: 413 Request Entity Too Large)"),
    (b"<!DOCTYPE html>\n<html><body>no</body></html>", "HTTP 413 (an HTML page)"),
    (b"request too large\nsee the proxy's limits\n", "HTTP 413 request too large see the proxy's limits"),
    (b'{"errors": [{"code": "SIZE_INVALID", "message": "too\\nlarge"}]}', "HTTP 413 SIZE_INVALID: too large"),
])
def test_an_error_body_with_newlines_is_named_on_one_line(body: bytes, said: str) -> None:
    """A proxy's HTML page (nginx's 413 to a large manifest PUT) went into the error as it came, tags and
    newlines and all: a message of many lines."""
    import email.message

    from buildtool.registry.transport import Response

    c = RegistryClient("127.0.0.1:1")
    c._exchange = lambda *a, **k: Response(413, email.message.Message(), body)  # type: ignore[method-assign]
    with pytest.raises(RegistryError) as failed:
        c.request("PUT", "a/manifests/t")
    assert str(failed.value) == f"PUT http://127.0.0.1:1/v2/a/manifests/t: {said}"


def test_a_token_servers_message_with_newlines_is_one_line() -> None:
    from buildtool.registry.auth import server_message
    from buildtool.registry.transport import Response

    body = b'{"errors": [{"code": "DENIED", "message": "requested access\\nto the resource is denied"}]}'
    assert server_message(Response(401, {}, body)) == "DENIED: requested access to the resource is denied"


def test_a_netrc_entry_never_replaces_the_registrys_authorization_nor_goes_to_other_hosts(
        token_registry: tuple[TokenServer, FakeRegistry], clean_env: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """requests reads ~/.netrc (NETRC) for every host it is given no auth for: its `default` entry replaced the
    Basic credentials this client sends the token server (which then refused them, naming docker's config) and
    went to every https host, the storage a blob redirects to too. The client sends only what it chose."""
    tokens, registry = token_registry
    netrc = tmp_path / "netrc"
    netrc.write_text("default login netuser password netrc-secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    login(registry.host, config=clean_env)
    c = client(registry.host)
    digest = c.put_blob("team/a", b"layer")
    assert c.get_blob("team/a", digest) == b"layer"
    netrc_basic = "Basic " + base64.b64encode(b"netuser:netrc-secret").decode()
    sent = [s.headers.get("Authorization", "") for s in tokens.seen]
    assert sent and netrc_basic not in sent
    assert all(h == "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode() for h in sent if h)


def test_a_retry_after_of_digits_that_are_not_ascii_is_unreadable_not_a_traceback() -> None:
    """A Retry-After of `²` or `١٢٠` (a header's bytes read as latin-1, or a proxy's) passed str.isdigit: `²` ended
    the command in a ValueError traceback, `١٢٠` was waited out as 120 s. RFC 9110's delay-seconds are ASCII digits:
    anything else is unreadable (the backoff applies), as a word is."""
    import email.message

    from buildtool.registry.transport import Response

    assert retry_after("²") is None and retry_after("١٢٠") is None and retry_after(" 7 ") == 7.0
    headers = email.message.Message()
    headers["Retry-After"] = "²"
    sleeps: list[float] = []
    c = client("127.0.0.1:1", sleeps)
    c._send = lambda *a, **k: Response(429, headers, b"")  # type: ignore[method-assign]
    with pytest.raises(RateLimited, match="HTTP 429 Too Many Requests"):
        c.has_blob("team/a", blob(b"x"))
    assert sleeps == [0.5, 1.0]


def test_rate_limit_messages_and_client_messages_strip_a_url_the_same_one_way() -> None:
    """Before, auth.rate_limited and RegistryClient._safe each stripped a URL's query string with their own copy of
    the code; now both are auth.without_query, so a change to what a message may show is made once."""
    from buildtool.registry import auth
    from buildtool.registry.transport import Response

    assert RegistryClient._safe is auth.without_query
    url = "https://registry.example/v2/r/blobs/uploads/abc?_state=secret&digest=sha256:0"
    answer = Response(503, {}, b"")
    message = str(auth.rate_limited("PUT", url, answer, "3 attempts"))
    assert "_state" not in message and auth.without_query(url) == "https://registry.example/v2/r/blobs/uploads/abc"


@pytest.mark.parametrize("echoed", ["password", "identity_token", "basic"])
def test_a_token_server_that_echoes_the_secret_it_was_sent_never_puts_it_in_the_error(echoed: str) -> None:
    """A token server's own words went into the refusal whole: one that echoes what it was sent (`invalid refresh
    token <token>`, the Basic header it could not decode) put the password or token into a message CI logs."""
    from buildtool.registry.credentials import Credential
    from buildtool.registry.transport import Response

    found = (Credential("alice", "pw-Sekr3t-4711", source="auths") if echoed != "identity_token"
             else Credential(identity_token="refresh-Sekr3t-4711", source="auths"))
    secret = {"password": found.password, "identity_token": found.identity_token, "basic": found.basic()}[echoed]
    filler = "x" * 270    # the secret across the 300th character shown: never half of it either
    answers = [Response(401, {}, json.dumps({"details": f"{filler} invalid credentials {secret}"}).encode()),
               Response(401, {}, json.dumps({"error_description": f"bad grant {secret}"}).encode())]
    auth = HostAuth("reg.example", lambda *a, **k: answers.pop(0) if answers else Response(404, {}, b""),
                    resolve=lambda host: found)
    challenge = Response(401, {"WWW-Authenticate": 'Bearer realm="https://auth.example/token",service="reg"'}, b"")
    for _ in range(2):
        with pytest.raises(CredentialsRefused) as refused:
            auth.on_unauthorized(challenge, needed_scopes("GET", "team/a"), None)
        message = str(refused.value)
        assert "refused by its token server auth.example" in message and "****" in message, message
        assert secret[:8] not in message, message


@pytest.mark.parametrize("echo", ["json", "text", "html"])
def test_a_registry_error_that_echoes_the_authorization_it_was_sent_never_puts_it_in_the_error(echo: str) -> None:
    """A registry's (or a proxy's) error body went into the error as it came: one that echoes the request's headers
    (`bad header: Basic <base64 of user:password>`) put the credentials into a message CI logs and the nightly
    report publishes."""
    import email.message

    from buildtool.registry.credentials import Credential
    from buildtool.registry.transport import Response

    found = Credential("alice", "pw-Sekr3t-4711", source="auths")
    c = RegistryClient("127.0.0.1:1")
    c.auth = HostAuth("127.0.0.1:1", c._exchange, resolve=lambda host: found)
    c.auth.scheme = "basic"

    def answer(method: str, url: str, *, headers: dict[str, str], **kw: object) -> Response:
        said = f"bad header: Authorization: {headers['Authorization']}"
        body = {"json": json.dumps({"errors": [{"code": "UNSUPPORTED", "message": said}]}), "text": said,
                "html": f"<html><title>{said}</title></html>"}[echo]
        return Response(400, email.message.Message(), body.encode())

    c._exchange = answer  # type: ignore[method-assign]
    with pytest.raises(RegistryError) as failed:
        c.request("PUT", "a/manifests/t")
    message = str(failed.value)
    assert "bad header: Authorization: Basic ****" in message, message
    assert found.basic()[:8] not in message and found.password not in message, message


@pytest.mark.parametrize("value", ["tok-Sekr3t-99\r\nX-Evil: 1", "tok-Sekr3t-99 more", "tok-Sekr3t-99\x00"])
def test_a_token_that_is_no_header_value_is_refused_without_showing_it(value: str) -> None:
    """A token server answering a token with a line break (or a space, a NUL) had it sent as `Bearer <token>`:
    http.client (or requests) refused the header with a ValueError traceback that quoted the header, the token
    itself, in the CI log."""
    auth = _token_answering({"token": value, "expires_in": 300}, [0.0])
    with pytest.raises(RegistryError) as refused:
        auth.header(PULL_X)
    message = str(refused.value)
    assert message == ("token server auth.example for reg.example answered a token that is no HTTP header value (a "
                       "space, a control or a non-ASCII character: RFC 6750's b64token is printable ASCII); not "
                       "sent"), message
    assert "Sekr3t" not in message
