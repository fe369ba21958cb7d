"""uv's settings in a build (the `uv.toml` secret): the host's pip settings, local folders through
the loopback server, unreachable remote indexes left out, credentials never in a log line; and the
`lock-urls` secret, which maps a lock's local file URLs to the loopback server."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from buildtool.common.errors import FailedError, UserError
from buildtool.imagebuild import pipconfig
from buildtool.imagebuild.pipconfig import HostPip, pip_secrets, reachable, redact, render_lock_urls, render_uv_toml


def test_uv_toml_mirrors_pip_settings_with_loopback_urls(monkeypatch):
    monkeypatch.setattr(pipconfig, "answers", lambda url, timeout=10.0: "down" not in url)
    host = HostPip(index_url="https://mirror.example/simple",
                   extra_index_urls=("file:///opt/pypi/simple", "https://u:secret@down.example/simple"),
                   find_links=("/opt/wheels",), trusted_hosts=("mirror.example",))
    served = {"/opt/pypi/simple": "http://127.0.0.1:9999/m0/simple/", "/opt/wheels": "http://127.0.0.1:9999/m1/"}
    conf = tomllib.loads(render_uv_toml(host, served))
    assert conf["index-url"] == "https://mirror.example/simple"
    # The host's local index through the loopback server, the unreachable one left out.
    assert conf["extra-index-url"] == ["http://127.0.0.1:9999/m0/simple/"]
    assert conf["find-links"] == ["http://127.0.0.1:9999/m1/"]
    assert conf["allow-insecure-host"] == ["mirror.example", "127.0.0.1"]
    assert conf["index-strategy"] == "unsafe-best-match"


def test_secrets_session_writes_private_uv_toml_and_lock_urls(tmp_path: Path, monkeypatch):
    """The lock-urls secret maps each served folder's file URLs (a find-links folder; a local index's folder
    above `simple/`, whose pages link to ../../files/) to the loopback URL serving it, and nothing else."""
    monkeypatch.setattr(pipconfig, "answers", lambda url, timeout=10.0: True)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (tmp_path / "pypi" / "simple").mkdir(parents=True)
    host = HostPip(extra_index_urls=(f"file://{tmp_path}/pypi/simple",), find_links=(str(wheels),))
    with pip_secrets(host) as secrets:
        plain, urls = secrets.files["uv.toml"], secrets.files["lock-urls"]
        assert oct(plain.stat().st_mode & 0o777) == oct(urls.stat().st_mode & 0o777) == "0o600"
        assert "127.0.0.1" in plain.read_text()
        index, links = secrets.served[f"{tmp_path}/pypi/simple"], secrets.served[str(wheels)]
        assert secrets.file_urls == {f"file://{tmp_path}/pypi/": index.removesuffix("simple/"),
                                     f"file://{wheels}/": links}
        lock = tmp_path / "pylock.tools.toml"
        lock.write_text(f'url = "file://{tmp_path}/pypi/files/a-1-py3-none-any.whl"\n'
                        f'url = "file://{wheels}/b-1+cpu-py3-none-any.whl"\n'
                        'url = "file:///elsewhere/c-1-py3-none-any.whl"\n'
                        'url = "https://files.pythonhosted.org/d-1-py3-none-any.whl"\n')
        mapped = subprocess.run(["sed", "-f", str(urls), str(lock)], capture_output=True, text=True, timeout=30)
        assert mapped.stdout.splitlines() == [f'url = "{index.removesuffix("simple/")}files/a-1-py3-none-any.whl"',
                                              f'url = "{links}b-1+cpu-py3-none-any.whl"',
                                              'url = "file:///elsewhere/c-1-py3-none-any.whl"',
                                              'url = "https://files.pythonhosted.org/d-1-py3-none-any.whl"']
    assert not plain.exists() and not urls.exists()   # gone with the session


def test_the_loopback_server_never_serves_a_hidden_file_of_the_folder_above_an_index(tmp_path: Path, monkeypatch):
    """A local index is served from the folder above its `simple/` (its pages link to ../../files/): for an index
    at ~/simple that is the home folder, and ~/.docker/config.json, ~/.netrc or ~/.ssh were served to every local
    user and every build step on loopback for the whole build. No package file or index page is a hidden one."""
    import urllib.error
    import urllib.request

    monkeypatch.setattr(pipconfig, "answers", lambda url, cert="", timeout=10.0: True)
    home = tmp_path / "home"
    (home / "simple" / "a").mkdir(parents=True)
    (home / "simple" / "a" / "index.html").write_text('<a href="../../files/a-1-py3-none-any.whl">a</a>')
    (home / "files").mkdir()
    (home / "files" / "a-1-py3-none-any.whl").write_bytes(b"wheel")
    (home / ".docker").mkdir()
    (home / ".docker" / "config.json").write_text('{"auths": {"reg.example": {"auth": "c2VjcmV0OnMzY3JldA=="}}}')
    (home / ".netrc").write_text("default login someone password hunter2\n")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def status(url: str) -> int:
        try:
            with opener.open(url, timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as exc:
            return exc.code

    with pip_secrets(HostPip(index_url=f"file://{home}/simple")) as secrets:
        root = secrets.served[f"{home}/simple"].removesuffix("simple/")
        assert status(f"{root}simple/a/") == status(f"{root}files/a-1-py3-none-any.whl") == 200
        assert [status(f"{root}{hidden}") for hidden in (".docker/config.json", ".netrc", ".docker/", "%2Enetrc")] \
            == [404, 404, 404, 404]


def test_lock_urls_take_every_character_of_a_folder_literally(tmp_path: Path):
    """A folder name with sed's special characters maps itself and nothing else (`.` is not any character)."""
    script = tmp_path / "lock-urls"
    script.write_text(render_lock_urls({"file:///opt/a.b|c[1]&/": "http://127.0.0.1:1/m0/&|x/"}))
    lock = tmp_path / "pylock.toml"
    lock.write_text('url = "file:///opt/a.b|c[1]&/w.whl"\nurl = "file:///opt/aXb|c[1]&/w.whl"\n')
    mapped = subprocess.run(["sed", "-f", str(script), str(lock)], capture_output=True, text=True, timeout=30)
    assert mapped.stdout == 'url = "http://127.0.0.1:1/m0/&|x/w.whl"\nurl = "file:///opt/aXb|c[1]&/w.whl"\n'
    with pytest.raises(ValueError, match="a folder name with a line break cannot be served"):
        render_lock_urls({"file:///opt/a\nb/": "http://127.0.0.1:1/m0/"})


def test_unreachable_indexes_are_named_without_their_credentials(monkeypatch):
    monkeypatch.setattr(pipconfig, "answers", lambda url, timeout=10.0: "up" in url)
    lines: list[str] = []
    kept = reachable(("https://up.example/simple", "https://user:tok123@down.example/simple"), lines.append)
    assert kept == ("https://up.example/simple",)
    assert lines and "tok123" not in lines[0] and "https://user:****@down.example/simple" in lines[0]
    assert redact("https://a.example/simple") == "https://a.example/simple"


TOKEN_URL = "https://ghp_abcdEFGH1234@pypi.example.com/simple"


def test_a_token_given_as_the_user_name_is_redacted_and_scrubbed():
    """`https://TOKEN@host/simple` (no password): the user name is the secret, and it was shown in full."""
    from buildtool.imagebuild.cell_inputs import secret_strings

    assert redact(TOKEN_URL) == "https://****@pypi.example.com/simple"
    assert secret_strings(HostPip(index_url=TOKEN_URL)) == ["ghp_abcdEFGH1234"]
    assert redact("https://user:tok123@a.example/simple") == "https://user:****@a.example/simple"


def test_a_token_given_as_the_user_name_before_an_empty_password_is_redacted(monkeypatch):
    """`https://TOKEN:@host/` (Gemfury's documented index URL: the token is the user name, the password empty) was
    shown as `https://TOKEN:****@host/`: the colon made redact keep the user name, the token itself, in the log line
    that says an index cannot be reached and in the errors that name the index."""
    from buildtool.imagebuild.cell_inputs import secret_strings

    url = "https://fury_Tok3nABCD:@pypi.fury.io/acme/"
    assert redact(url) == "https://****@pypi.fury.io/acme/"
    lines: list[str] = []
    monkeypatch.setattr(pipconfig, "answers", lambda url, cert="", timeout=10.0: False)
    assert reachable((url,), lines.append) == ()
    assert lines and "fury_Tok3nABCD" not in lines[0] and "https://****@pypi.fury.io/acme/" in lines[0]
    assert secret_strings(HostPip(index_url=url)) == ["fury_Tok3nABCD"]
    assert redact("https://user:tok123@a.example/simple") == "https://user:****@a.example/simple"   # as before


def test_a_stand_in_build_log_is_scrubbed_of_index_tokens(tmp_path, monkeypatch):
    """The stand-in build ran with the host's pip settings but never scrubbed its log, as the builder does."""
    from buildtool.imagebuild import bases, engine

    monkeypatch.setattr(HostPip, "from_host", classmethod(lambda cls: HostPip(index_url=TOKEN_URL)))
    monkeypatch.setattr(pipconfig, "answers", lambda url, cert="", timeout=10.0: True)   # the token's index answers
    monkeypatch.setattr(engine, "resolve_build_client", lambda: None)

    def build(client, request):
        request.log_path.write_text(f"#5 Looking in indexes: {TOKEN_URL}\n#5 ERROR: no matching distribution\n")
        raise engine.BuildFailed("pip install failed")

    monkeypatch.setattr(engine, "build", build)
    log = tmp_path / "base-standin-x.log"
    with pytest.raises(FailedError, match="stand-in x:tag: pip install failed"):
        bases._build_standin(None, "FROM scratch\n", {}, "x:tag", log)  # type: ignore[arg-type]
    assert "ghp_abcdEFGH1234" not in log.read_text() and "https://****@pypi.example.com/simple" in log.read_text()


def test_an_index_behind_the_hosts_own_ca_is_asked_through_it(tmp_path: Path, monkeypatch):
    """An index whose certificate only the host's pip CA (HostPip.cert) vouches for, as an intercepting proxy's:
    asked through that CA it answers, so uv.toml, the build's reachability note and lock's uv arguments keep it
    (was: asked with the default bundle, called unreachable and left out)."""
    import ssl
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from buildtool.imagebuild import lock
    from tests.conftest import fixture_matrix
    from tests.pki import make_ca

    class Index(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:  # noqa: N802
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    ca = make_ca(tmp_path / "pki")
    issued = ca.issue("index", ["127.0.0.1"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), Index)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(issued.cert), str(issued.key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{server.server_address[1]}/simple"
    host = HostPip(extra_index_urls=(url,), cert=str(ca.cert))
    pipconfig.answers.cache_clear()
    try:
        assert not pipconfig.answers(url)                  # the default bundle does not vouch for it
        assert tomllib.loads(render_uv_toml(host, {}))["extra-index-url"] == [url]
        said: list[str] = []
        assert reachable((url,), said.append, host.cert) == (url,) and said == []
        ran: list[list[str]] = []

        def run_uv(argv: list[str], env: dict[str, str], cwd: Path) -> None:
            ran.append(argv)
            raise FailedError("stop")

        monkeypatch.setattr(lock, "uv_binary", lambda: "uv")
        monkeypatch.setattr(lock, "_run_uv", run_uv)
        cell = next(c for c in fixture_matrix().cells if c.key == "pytorch-cpu:2.13")
        with pytest.raises(FailedError, match="^stop$"):
            lock.compile_cell(cell, host, lock.Pins(), base=None, log=said.append)
        assert ["--extra-index-url", url] == ran[0][ran[0].index(url) - 1:ran[0].index(url) + 1]
        assert not [line for line in said if url in line]
    finally:
        pipconfig.answers.cache_clear()
        server.shutdown()
        server.server_close()


def test_a_main_index_that_does_not_answer_is_refused_not_replaced_by_pypi(monkeypatch):
    """Left out of uv.toml, an unreachable index-url made uv fetch from PyPI: a site that allows only its own
    mirror was not told. Extra indexes are still left out (the locks' hashes decide what is installed)."""
    monkeypatch.setattr(pipconfig, "answers", lambda url, cert="", timeout=10.0: False)
    with pytest.raises(UserError) as refused:
        render_uv_toml(HostPip(index_url="https://u:tok123@mirror.example/simple"), {})
    assert str(refused.value) == ("the pip index-url https://u:****@mirror.example/simple does not answer from "
                                  "here, and uv would use PyPI in its place: make it reachable, or unset it (`pip "
                                  "config list` shows where)")
    assert "extra-index-url" not in render_uv_toml(HostPip(extra_index_urls=("https://down.example/simple",)), {})


@pytest.mark.parametrize(("url", "shown", "secret"), [
    ("https://pkgs.example/simple?token=s3cr3tQUERY", "https://pkgs.example/simple", "s3cr3tQUERY"),
    ("https://pkgs.example/simple#s3cr3tFRAG", "https://pkgs.example/simple", "s3cr3tFRAG"),
    ("https://user:ab/s3cr3tSLASH@pkgs.example/simple", "https://user:****@pkgs.example/simple", "ab/s3cr3tSLASH"),
])
def test_a_token_in_the_query_or_after_a_slash_is_redacted_and_scrubbed(tmp_path: Path, url: str, shown: str,
                                                                        secret: str):
    """A token in the query or fragment (common.urls counts both as secrets), or a password with an unescaped
    `/`, was shown whole by redact and never scrubbed from a build log."""
    from buildtool.imagebuild.cell_inputs import scrub_log, secret_strings

    assert redact(url) == shown
    log = tmp_path / "build.log"
    log.write_text(f"Looking in indexes: {url}\nGET {url.replace('%', '')}/torch/ 200\n")
    scrub_log(log, secret_strings(HostPip(extra_index_urls=(url,))))
    assert secret not in log.read_text() and "****" in log.read_text()


def test_a_percent_encoded_password_is_scrubbed_as_written_and_decoded(tmp_path: Path):
    from buildtool.imagebuild.cell_inputs import scrub_log, secret_strings

    log = tmp_path / "build.log"
    log.write_text("https://user:p%40ss-w0rd@pkgs.example/simple\nauth user:p@ss-w0rd\n")
    scrub_log(log, secret_strings(HostPip(index_url="https://user:p%40ss-w0rd@pkgs.example/simple")))
    assert "p%40ss-w0rd" not in log.read_text() and "p@ss-w0rd" not in log.read_text()


def test_a_secret_that_is_part_of_another_does_not_leave_the_longer_ones_tail(tmp_path: Path):
    """Secrets were replaced in the order found: `tokA` (one index's password) turned another index's token
    `tokAsecondPART` into `****secondPART`, most of that token left in the log."""
    from buildtool.imagebuild.cell_inputs import scrub_log, secret_strings

    host = HostPip(index_url="https://u:tokA@a.example/simple",
                   extra_index_urls=("https://tokAsecondPART@b.example/simple",))
    log = tmp_path / "build.log"
    log.write_text("Looking in indexes: https://tokAsecondPART@b.example/simple\n")
    scrub_log(log, secret_strings(host))
    assert "secondPART" not in log.read_text() and "https://****@b.example/simple" in log.read_text()
