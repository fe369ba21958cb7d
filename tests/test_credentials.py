"""Credential resolution as docker does it, for one host only: auths (auth, identitytoken), credsStore,
credHelpers (helper scripts on PATH), Docker Hub's legacy key, REGISTRY_AUTH_FILE, REGISTRY_AUTH_HOST,
malformed entries; and the private auth file skopeo gets."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from buildtool.registry import credentials
from buildtool.registry.credentials import Credential, CredentialError, authfile, resolve

HOST = "registry.example:5000"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture(autouse=True)
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("REGISTRY_USER", "REGISTRY_PASSWORD", "REGISTRY_AUTH_HOST", "REGISTRY_AUTH_FILE"):
        monkeypatch.delenv(name, raising=False)
    folder = tmp_path / "docker"
    folder.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))
    return folder / "config.json"


def helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, answers: dict[str, tuple[str, str]],
           sleep: float = 0) -> Path:
    """docker-credential-NAME on PATH: `get` answers per server URL, else 'credentials not found'; it logs
    what it was asked to calls.log."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    log = tmp_path / f"{name}.calls.log"
    script = bindir / f"docker-credential-{name}"
    table = {server: {"ServerURL": server, "Username": user, "Secret": secret}
             for server, (user, secret) in answers.items()}
    script.write_text(f"""#!/usr/bin/env python3
import json, sys, time
server = sys.stdin.read().strip()
with open({str(log)!r}, "a") as out:
    out.write(sys.argv[1] + " " + server + "\\n")
time.sleep({sleep})
table = {json.dumps(table)!r}
found = json.loads(table).get(server)
if found is None:
    print("credentials not found in native keychain")
    sys.exit(1)
print(json.dumps(found))
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_auths_by_exact_key_and_by_url_key(config: Path) -> None:
    config.write_text(json.dumps({"auths": {HOST: {"auth": b64("alice:pw:with:colons")},
                                            "https://other.example/v1/": {"auth": b64("bob:pw2")}}}))
    assert resolve(HOST) == Credential("alice", "pw:with:colons", source=f"auths['{HOST}'] in {config}")
    assert resolve("other.example") is not None and resolve("other.example").username == "bob"  # type: ignore[union-attr]
    assert resolve("third.example") is None
    assert resolve("registry.example") is None          # another port is another host


def test_identitytoken(config: Path) -> None:
    config.write_text(json.dumps({"auths": {HOST: {"auth": b64("alice:"), "identitytoken": "refresh-abc"}}}))
    found = resolve(HOST)
    assert found is not None and found.identity_token == "refresh-abc" and found.password == ""
    assert "refresh-abc" not in repr(found)


@pytest.mark.parametrize("entry", [{"auth": b64("alice:")}, {"username": "alice", "password": ""},
                                   {"username": "alice"}])
def test_a_user_with_an_empty_password_is_an_error_naming_the_entry(config: Path, entry: dict[str, str]) -> None:
    """Before: taken as credentials (and nothing sent), or skipped as none; either way the registry's answer was
    explained wrongly."""
    config.write_text(json.dumps({"auths": {HOST: entry}}))
    with pytest.raises(CredentialError) as caught:
        resolve(HOST)
    assert str(caught.value) == (f"{config}: auths['{HOST}'] for {HOST} has an empty password; run `docker login "
                                 f"{HOST}` again")
    config.write_text(json.dumps({"auths": {HOST: {}}}))    # what docker writes beside a credsStore: no credentials
    assert resolve(HOST) is None


def test_docker_hubs_legacy_key_serves_its_api_host(config: Path) -> None:
    config.write_text(json.dumps({"auths": {"https://index.docker.io/v1/": {"auth": b64("hubuser:hubpw")}}}))
    for host in ("docker.io", "registry-1.docker.io", "index.docker.io"):
        assert resolve(host) is not None and resolve(host).username == "hubuser"  # type: ignore[union-attr]
    assert resolve("ghcr.io") is None


def test_malformed_base64_is_one_line_naming_file_and_host_and_only_for_that_host(config: Path) -> None:
    config.write_text(json.dumps({"auths": {HOST: {"auth": "%%%not base64"},
                                            "good.example": {"auth": b64("u:p")}}}))
    with pytest.raises(CredentialError) as caught:
        resolve(HOST)
    message = str(caught.value)
    assert str(config) in message and HOST in message and "\n" not in message
    assert resolve("good.example") is not None          # a broken entry for one host breaks no other
    config.write_text(json.dumps({"auths": {HOST: {"auth": b64("no-colon")}}}))
    with pytest.raises(CredentialError, match="not base64 of USER:PASSWORD"):
        resolve(HOST)


def test_creds_store_helper_is_asked_with_the_host(config: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    log = helper(tmp_path, monkeypatch, "teststore", {HOST: ("carol", "from-store"),
                                                     "https://index.docker.io/v1/": ("<token>", "hub-refresh")})
    config.write_text(json.dumps({"credsStore": "teststore",
                                  "auths": {HOST: {}, "fallback.example": {"auth": b64("f:g")}}}))
    assert resolve(HOST) == Credential("carol", "from-store", source="docker-credential-teststore")
    hub = resolve("registry-1.docker.io")
    assert hub is not None and hub.identity_token == "hub-refresh" and hub.username == ""
    assert resolve("fallback.example") is not None      # the store has nothing: auths, as the SDK does
    assert log.read_text().splitlines() == [f"get {HOST}", "get https://index.docker.io/v1/", "get fallback.example"]


def test_cred_helpers_per_host_win_over_the_store(config: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    helper(tmp_path, monkeypatch, "ecr", {HOST: ("AWS", "ecr-token")})
    store_log = helper(tmp_path, monkeypatch, "desktop", {})
    config.write_text(json.dumps({"credsStore": "desktop", "credHelpers": {HOST: "ecr"}}))
    assert resolve(HOST) == Credential("AWS", "ecr-token", source="docker-credential-ecr")
    assert not store_log.exists()


@pytest.mark.parametrize("empty", ["", None])
def test_an_empty_cred_helper_for_a_host_reads_auths_not_the_store(config: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch, empty) -> None:
    """`credHelpers: {HOST: ""}` is how docker is told not to use credsStore for HOST (getConfiguredCredentialStore
    returns "", the file store): the toolkit ran the credsStore helper anyway and sent its credentials to HOST. It
    reads `auths` for that host now; every other host still asks the store."""
    store_log = helper(tmp_path, monkeypatch, "desktop", {HOST: ("store", "from-store"), "other.example": ("o", "p")})
    config.write_text(json.dumps({"credsStore": "desktop", "credHelpers": {HOST: empty},
                                  "auths": {HOST: {"auth": b64("alice:from-auths")}}}))
    assert resolve(HOST) == Credential("alice", "from-auths", source=f"auths[{HOST!r}] in {config}")
    assert not store_log.exists()
    assert resolve("other.example") == Credential("o", "p", source="docker-credential-desktop")


def test_a_helper_that_is_missing_fails_or_hangs_is_one_line(config: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    config.write_text(json.dumps({"credHelpers": {HOST: "absent"}}))
    with pytest.raises(CredentialError, match=f"docker-credential-absent for {HOST}, and it is not on PATH"):
        resolve(HOST)
    helper(tmp_path, monkeypatch, "slow", {HOST: ("u", "p")}, sleep=5)
    config.write_text(json.dumps({"credHelpers": {HOST: "slow"}}))
    with pytest.raises(CredentialError, match=f"docker-credential-slow get for {HOST} did not answer"):
        credentials.run_helper("slow", HOST, HOST, str(config), timeout=0.5)


def test_registry_auth_file_comes_first(config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config.write_text(json.dumps({"auths": {HOST: {"auth": b64("docker:pw")}}}))
    podman = tmp_path / "auth.json"
    podman.write_text(json.dumps({"auths": {HOST: {"auth": b64("podman:pw")}}}))
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(podman))
    assert resolve(HOST).username == "podman"  # type: ignore[union-attr]
    assert resolve(HOST).source.endswith(str(podman))  # type: ignore[union-attr]


def test_environment_credentials_need_the_host_they_are_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_USER", "env")
    monkeypatch.setenv("REGISTRY_PASSWORD", "env-pw")
    assert resolve(HOST) is None
    monkeypatch.setenv("REGISTRY_AUTH_HOST", HOST)
    assert resolve(HOST) == Credential("env", "env-pw", source="REGISTRY_USER/REGISTRY_PASSWORD (REGISTRY_AUTH_HOST)")
    assert resolve("other.example:5000") is None


@pytest.mark.parametrize(("user", "password", "named"), [
    ("env", "", "REGISTRY_PASSWORD is set but empty"),
    ("env", None, "REGISTRY_PASSWORD is unset"),
    ("", "env-pw", "REGISTRY_USER is set but empty"),
    ("", "", "REGISTRY_USER is set but empty and REGISTRY_PASSWORD is set but empty"),
])
def test_half_an_environment_credential_for_the_host_is_refused_naming_it(
        config: Path, monkeypatch: pytest.MonkeyPatch, user: str, password: str | None, named: str) -> None:
    """An empty REGISTRY_PASSWORD (a CI secret that is not there) was dropped silently: the host got a config
    file's entry, or nothing (anonymous), and its refusal blamed other credentials. Refused now, no secret shown."""
    config.write_text(json.dumps({"auths": {HOST: {"auth": b64("docker:pw")}}}))
    monkeypatch.setenv("REGISTRY_AUTH_HOST", HOST)
    monkeypatch.setenv("REGISTRY_USER", user)
    if password is not None:
        monkeypatch.setenv("REGISTRY_PASSWORD", password)
    message = (f"{named}, and REGISTRY_AUTH_HOST names {HOST} for them: set both REGISTRY_USER and "
               "REGISTRY_PASSWORD, or unset both")
    with pytest.raises(CredentialError) as refused:
        resolve(HOST)
    assert str(refused.value) == message and "env-pw" not in str(refused.value)
    with pytest.raises(CredentialError, match="REGISTRY_AUTH_HOST names"), authfile([HOST]):
        pass
    assert resolve("other.example:5000") is None   # not the host they are for: its config entry, or none, as before


def test_same_entry_as_the_docker_sdk(config: Path) -> None:
    """docker.auth picks the same auths entry for the same file (where both apply)."""
    import docker.auth

    entries = {HOST: {"auth": b64("a:1")}, "https://other.example/v2/": {"auth": b64("b:2")},
               "https://index.docker.io/v1/": {"auth": b64("c:3")}}
    config.write_text(json.dumps({"auths": entries}))
    sdk = docker.auth.load_config(str(config))
    for host in (HOST, "other.example", "docker.io", "index.docker.io", "nothing.example"):
        theirs = sdk.resolve_authconfig(host)
        ours = resolve(host)
        assert (theirs or {}).get("username") == (ours.username if ours else None), host


def test_authfile_is_private_and_removed(config: Path) -> None:
    config.write_text(json.dumps({"auths": {HOST: {"auth": b64("alice:pw")}}}))
    with authfile([HOST, "nothing.example"]) as path:
        assert path is not None
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert json.loads(path.read_text()) == {"auths": {HOST: {"auth": b64("alice:pw")}}}
        folder = path.parent
    assert not folder.exists()
    with authfile(["nothing.example"]) as none:
        assert none is None
    with pytest.raises(RuntimeError), authfile([HOST]) as path:
        folder = path.parent  # type: ignore[union-attr]
        raise RuntimeError("the tool failed")
    assert not folder.exists()


def test_authfile_writes_an_identity_token_as_skopeo_reads_it(config: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """containers/image (skopeo) skips an auths entry whose `auth` does not decode to USER:PASSWORD, identitytoken
    and all (decodeDockerAuth). Before, an identity token was written without `auth`, so skopeo went anonymous."""
    helper(tmp_path, monkeypatch, "acr", {HOST: ("<token>", "refresh-xyz")})
    config.write_text(json.dumps({"credHelpers": {HOST: "acr"},
                                  "auths": {"other.example": {"auth": b64("alice:"), "identitytoken": "refresh-abc"}}}))
    with authfile([HOST, "other.example"]) as path:
        assert path is not None
        assert json.loads(path.read_text()) == {"auths": {
            HOST: {"auth": b64("<token>:"), "identitytoken": "refresh-xyz"},
            "other.example": {"auth": b64("alice:"), "identitytoken": "refresh-abc"}}}


# -- keys matched as the docker CLI matches them (issue 51) -----------------------------------------------------
# docker/cli: configfile.getConfiguredCredentialStore looks up credHelpers[address] exactly; fileStore.Get takes
# auths[address], else a key whose ConvertToHostname equals the address exactly (no case folding); the address is
# the registry's hostname, or https://index.docker.io/v1/ for Docker Hub (command.ResolveAuthConfig).

def test_a_cred_helper_key_is_matched_exactly(config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a credHelpers key `https://reg.example` served reg.example; docker's CLI asks credHelpers[host]."""
    log = helper(tmp_path, monkeypatch, "loose", {"reg.example": ("u", "p")})
    config.write_text(json.dumps({"credHelpers": {"https://reg.example": "loose", "REG2.example": "loose"}}))
    assert resolve("reg.example") is None and resolve("reg2.example") is None
    assert not log.exists()
    config.write_text(json.dumps({"credHelpers": {"reg.example": "loose"}}))
    assert resolve("reg.example") == Credential("u", "p", source="docker-credential-loose")


def test_an_auths_key_by_its_hostname_is_matched_without_folding_case(config: Path) -> None:
    config.write_text(json.dumps({"auths": {"https://reg.example/v2/": {"auth": b64("a:b")},
                                            "OTHER.example": {"auth": b64("c:d")}}}))
    assert resolve("reg.example") is not None          # ConvertToHostname("https://reg.example/v2/") == reg.example
    assert resolve("other.example") is None            # docker compares the hostname exactly


def test_docker_hub_is_asked_by_its_index_server_key_only(config: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Docker Hub's credentials are under https://index.docker.io/v1/; a key `docker.io` serves it in no docker CLI.
    Before, any of Docker Hub's host names as a key served every one of them."""
    config.write_text(json.dumps({"auths": {"docker.io": {"auth": b64("a:b")}},
                                  "credHelpers": {"index.docker.io": "nope"}}))
    for host in ("docker.io", "index.docker.io", "registry-1.docker.io"):
        assert resolve(host) is None, host
    log = helper(tmp_path, monkeypatch, "hub", {"https://index.docker.io/v1/": ("hubuser", "pw")})
    config.write_text(json.dumps({"credHelpers": {"https://index.docker.io/v1/": "hub"}}))
    assert resolve("docker.io") == Credential("hubuser", "pw", source="docker-credential-hub")
    assert log.read_text().splitlines() == ["get https://index.docker.io/v1/"]


def failing_helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, script: str) -> None:
    """docker-credential-NAME on PATH: the shell `script` given."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    path = bindir / f"docker-credential-{name}"
    path.write_text(script)
    path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


def test_a_helper_that_prints_its_json_and_fails_is_named_without_the_secret(config: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Its stdout is the message of a failing helper (as docker reads it): a helper that printed the credentials
    JSON and then exited 1 put the secret in the error."""
    failing_helper(tmp_path, monkeypatch, "leaky",
                   "#!/bin/sh\necho '{\"Username\":\"u\",\"Secret\":\"s3cret-token\"}'\nexit 1\n")
    config.write_text(json.dumps({"credsStore": "leaky"}))
    with pytest.raises(CredentialError) as failed:
        resolve(HOST)
    assert "s3cret-token" not in str(failed.value)
    assert str(failed.value) == (f"docker-credential-leaky get for {HOST} failed: exit 1, after printing JSON (not "
                                 "shown: it may hold the secret)")


@pytest.mark.parametrize("said", ['exec: "pass": executable file not found in $PATH',
                                  "gpg: decryption failed: No secret key (key not found)"])
def test_a_helper_failure_that_says_not_found_is_an_error_not_anonymous_access(config: Path, tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch,
                                                                                said: str) -> None:
    """Any failing helper whose message held "not found" was taken for "no credentials for this server": the
    command went on anonymously (or with another entry), and the registry's refusal blamed missing credentials.
    Docker takes only ErrCredentialsNotFound's exact text so, as the toolkit does now."""
    failing_helper(tmp_path, monkeypatch, "pass", f"#!/bin/sh\ncat >/dev/null\necho '{said}'\nexit 1\n")
    config.write_text(json.dumps({"credsStore": "pass", "auths": {HOST: {"auth": b64("other:entry")}}}))
    with pytest.raises(CredentialError) as failed:
        resolve(HOST)
    assert str(failed.value) == f"docker-credential-pass get for {HOST} failed: {said}"
    helper(tmp_path, monkeypatch, "pass", {})       # docker's own "credentials not found in native keychain"
    assert resolve(HOST) == Credential("other", "entry", source=f"auths['{HOST}'] in {config}")


def test_what_a_failing_helper_writes_to_stderr_is_never_shown(config: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing on stdout, the first line of a failing helper's stderr was the error's text: a helper's trace
    (`set -x`) or a tool it runs can print the secret there. Docker shows stdout only; the toolkit too now, and
    says how to see the rest."""
    failing_helper(tmp_path, monkeypatch, "traced",
                   "#!/bin/sh\ncat >/dev/null\necho '+ printf {\"Secret\":\"s3cret-token\"}' >&2\nexit 3\n")
    config.write_text(json.dumps({"credsStore": "traced"}))
    with pytest.raises(CredentialError) as failed:
        resolve(HOST)
    assert "s3cret-token" not in str(failed.value)
    assert str(failed.value) == (f"docker-credential-traced get for {HOST} failed: exit 3 (its error output is not "
                                 f"shown: it may hold a secret; run `echo {HOST} | docker-credential-traced get` to "
                                 "see it)")


@pytest.mark.parametrize(("settings", "said"), [
    ({"credHelpers": ["ecr"]}, "`credHelpers` is not an object"),
    ({"credHelpers": {HOST: {"helper": "ecr"}}}, f"credHelpers['{HOST}'] for {HOST} is not a helper's name"),
    ({"credsStore": ["desktop"]}, "`credsStore` is not a helper's name"),
    ({"credsStore": 5, "credHelpers": {"other.example": 5}}, "`credsStore` is not a helper's name"),
])
def test_a_helper_setting_that_names_no_helper_is_an_error_not_skipped(config: Path, settings: dict[str, object],
                                                                       said: str) -> None:
    """A `credHelpers` that was no object, an entry or a `credsStore` that was no string, was passed over as if it
    were not there: the host's credentials then came from `auths` (another login) or none were sent, and the
    registry's refusal blamed missing credentials. A broken `auths` was already an error naming the file; these are
    too (an entry for another host still does no harm)."""
    config.write_text(json.dumps({**settings, "auths": {HOST: {"auth": b64("stale:login")}}}))
    with pytest.raises(CredentialError) as failed:
        resolve(HOST)
    assert str(failed.value) == f"{config}: {said}; fix or remove it"
    config.write_text(json.dumps({"credHelpers": {"other.example": 5}, "credsStore": None,
                                  "auths": {HOST: {"auth": b64("u:p")}}}))
    assert resolve(HOST) == Credential("u", "p", source=f"auths['{HOST}'] in {config}")
