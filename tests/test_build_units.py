"""Unit tests of the build step's pure parts: no engine, no registry."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from buildtool.common.errors import UserError
from buildtool.common.units import short_digest
from buildtool.contracts import label_keys, names
from buildtool.imagebuild import engine
from buildtool.imagebuild.bases import (
    _standin_dockerfile,
    debian_suite,
    is_loopback_registry,
    local_mirror,
    standin_framework_version,
)
from buildtool.imagebuild.builder import BaseInfo, build_labels, cell_content_key, scrub_log, secret_strings
from buildtool.imagebuild.pipconfig import CA_IN_BUILD, SECRET_CA, SECRET_CONF, HostPip, pip_secrets, render_conf
from buildtool.matrix.plan import Settings, plan_cell
from buildtool.render.dockerfiles import render_cell_dockerfile
from buildtool.validate.labels import dockerfile_labels
from tests.conftest import REPO, fixture_matrix

ROOT = Path(__file__).resolve().parents[1]
LISTING = """\
:env:.cert='/env/ca.pem'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.extra-index-url='file:///opt/pypi/simple https://user:s3cr3t-token@pkgs.example.com/simple'
global.find-links='/ignored'
install.trusted-host='pkgs.example.com'
"""


@pytest.fixture(scope="module")
def matrix():
    return fixture_matrix()


def cell(matrix, key):
    return next(c for c in matrix.cells if c.key == key)


def test_host_pip_parse_takes_environment_over_files():
    host = HostPip.parse(LISTING)
    assert host.cert == "/env/ca.pem"
    assert host.find_links == ("/opt/wheels",)
    assert host.extra_index_urls == ("file:///opt/pypi/simple", "https://user:s3cr3t-token@pkgs.example.com/simple")
    assert host.trusted_hosts == ("pkgs.example.com",)



def test_host_pip_reads_the_sections_pip_install_reads_and_no_other():
    """pip install reads [global], then [install], then PIP_* (pip/_internal/cli/parser.py: override_order is
    global, the command's name, :env:); the build took [download] too, which only `pip download` reads, so a
    host's download index replaced the index the host installs from."""
    listing = ("global.index-url='https://a.example/simple'\n"
               "download.index-url='https://mirror.example/simple'\ndownload.no-index='yes'\n")
    host = HostPip.parse(listing)
    assert (host.index_url, host.no_index) == ("https://a.example/simple", False)
    assert HostPip.parse(listing + "install.index-url='https://b.example/simple'\n").index_url == \
        "https://b.example/simple"


def test_host_pip_reads_a_value_written_over_several_lines_as_pip_lists_it():
    """pip.conf's several locations one a line (`extra-index-url =` then one URL a line) reach `pip config list` as
    the value's repr, `'\\nhttps://...\\nhttps://...'`: it was read as one location with literal `\\n` in it, so
    the build's pip and uv lost both indexes, and neither token was a secret the logs are scrubbed of."""
    listing = ("global.extra-index-url='\\nhttps://u:tok-one@a.example/simple\\nhttps://u:tok-two@b.example/simple'\n"
               "global.find-links=\"/opt/it's wheels\"\n")
    host = HostPip.parse(listing)
    assert host.extra_index_urls == ("https://u:tok-one@a.example/simple", "https://u:tok-two@b.example/simple")
    assert host.find_links == ("/opt/it's", "wheels")    # pip splits it on white space too
    assert {"tok-one", "tok-two"} <= set(secret_strings(host))


@pytest.mark.parametrize(("listing", "no_index"), [(":env:.no-index='t'", True), ("global.no-index='Y'", True),
                                                  ("install.no-index='on'", True), (":env:.no-index='off'", False),
                                                  ("global.no-index='f'", False), ("", False),
                                                  ("global.no-index='yes'\n:env:.no-index=''", True)])
def test_host_pip_reads_no_index_as_pip_does(listing: str, no_index: bool):
    """pip reads a flag with its strtobool (y, t, on, ... any case) and skips an empty value; `no-index = t` was
    read as false, so the build would reach the indexes the host's pip is kept from."""
    assert HostPip.parse(listing).no_index is no_index


@pytest.mark.parametrize(("listing", "where"), [(":env:.no-index='maybe'", "PIP_NO_INDEX in the environment"),
                                                ("install.no-index='2'", "`install.no-index` in pip's configuration")])
def test_a_no_index_pip_refuses_is_refused_naming_where_it_is_set(listing: str, where: str):
    """pip install refuses a flag that is no boolean; it was read as false (fail open). Now one line naming it."""
    value = listing.split("=", 1)[1]
    with pytest.raises(UserError) as caught:
        HostPip.parse(listing)
    assert str(caught.value) == (f"pip's no-index setting {value} ({where}) is no boolean: pip reads y, yes, t, true, "
                                 "on, 1 or n, no, f, false, off, 0 and refuses anything else; fix it (`pip config "
                                 "list` shows where it is set)")


def test_a_pip_configuration_pip_refuses_is_refused_naming_pips_error(tmp_path: Path, monkeypatch):
    """A broken pip.conf is pip's own refusal in one line (was: read as no settings, PyPI without the host's CA);
    the line it quotes (which may hold an index token) is not shown. A Python without pip has no settings."""
    import subprocess
    import sys

    conf = tmp_path / "bad.conf"
    conf.write_text("[global\nindex-url = https://user:s3cr3t-token@mirror.example/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    with pytest.raises(UserError, match=r"^the host's pip configuration is refused by pip \(`pip config list`: "
                                        r"Configuration file could not be loaded\. file: '.*bad\.conf', line: 1\); "
                                        r"fix that file") as caught:
        HostPip.from_host()
    assert "s3cr3t" not in str(caught.value) and "\n" not in str(caught.value)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=60)
    assert HostPip.from_host(str(tmp_path / "bare" / "bin" / "python")) == HostPip()

def test_a_ca_bundle_that_does_not_exist_is_one_line_naming_the_setting(tmp_path: Path, monkeypatch, project: Path,
                                                                      run_cli):
    """PIP_CERT (or pip.conf's `cert`) naming no file is one line naming the setting and the file (was: requests'
    OSError "Could not find a suitable TLS CA certificate bundle" as a traceback from `buildtool check`)."""
    monkeypatch.setenv("PIP_CERT", "/nonexistent/ca.pem")
    with pytest.raises(UserError, match=r"^pip's CA bundle /nonexistent/ca\.pem \(PIP_CERT\) does not exist; point "
                                        r"PIP_CERT at an existing CA bundle file, or unset it"):
        HostPip.from_host()
    code, _, err = run_cli("check", "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and err.strip().splitlines() == [
        "error: pip's CA bundle /nonexistent/ca.pem (PIP_CERT) does not exist; point PIP_CERT at an existing CA "
        "bundle file, or unset it (`pip config list` shows where it is set)"]
    monkeypatch.delenv("PIP_CERT")
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\ncert = {tmp_path / 'gone.pem'}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    with pytest.raises(UserError, match=r"\(`cert` in pip's configuration\) does not exist"):
        HostPip.from_host()
    (tmp_path / "gone.pem").write_text("")
    assert HostPip.from_host().cert == str(tmp_path / "gone.pem")


def test_render_conf_points_at_the_secret_ca_and_maps_local_folders():
    host = HostPip.parse(LISTING)
    conf = render_conf(host, {"/opt/pypi/simple": "http://127.0.0.1:9/m0/simple/",
                              "/opt/wheels": "http://127.0.0.1:9/m1/"}, has_ca=True)
    assert f"cert = {CA_IN_BUILD}" in conf
    assert "extra-index-url = http://127.0.0.1:9/m0/simple/ https://user:s3cr3t-token@pkgs.example.com/simple" in conf
    assert "find-links = http://127.0.0.1:9/m1/" in conf
    assert "retries = 1" in conf
    assert "file://" not in conf and "/env/ca.pem" not in conf
    assert "cert" not in render_conf(host, {}, has_ca=False)


def test_pip_secrets_serves_index_and_find_links_and_nothing_else(tmp_path):
    index = tmp_path / "pypi" / "simple" / "demo"
    index.mkdir(parents=True)
    (index / "index.html").write_text('<a href="../../files/demo-1.0-py3-none-any.whl">demo</a>')
    (tmp_path / "pypi" / "files").mkdir()
    (tmp_path / "pypi" / "files" / "demo-1.0-py3-none-any.whl").write_bytes(b"wheel-bytes")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "local-2.0-py3-none-any.whl").write_bytes(b"local-wheel")
    (tmp_path / "private.txt").write_text("not served")
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n")
    host = HostPip(extra_index_urls=(f"file://{tmp_path}/pypi/simple",), find_links=(str(wheels),), cert=str(ca))
    with pip_secrets(host) as secrets:
        assert secrets.files[SECRET_CA] == ca
        conf = secrets.files[SECRET_CONF].read_text()
        assert oct(secrets.files[SECRET_CONF].stat().st_mode & 0o777) == "0o600"
        index_url = secrets.served[f"{tmp_path}/pypi/simple"]
        links_url = secrets.served[str(wheels)]
        assert index_url in conf and links_url in conf
        page = urllib.request.urlopen(index_url + "demo/", timeout=5).read().decode()
        wheel_url = urllib.parse.urljoin(index_url + "demo/", "../../files/demo-1.0-py3-none-any.whl")
        assert urllib.request.urlopen(wheel_url, timeout=5).read() == b"wheel-bytes"
        assert "demo" in page
        assert "local-2.0-py3-none-any.whl" in urllib.request.urlopen(links_url, timeout=5).read().decode()
        base = links_url.rsplit("/m", 1)[0]
        for escape in (f"{links_url}../private.txt", f"{links_url}%2e%2e/private.txt", f"{base}/nomount/x"):
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(escape, timeout=5)
        conf_path = secrets.files[SECRET_CONF]
    assert not conf_path.exists()
    with pytest.raises(OSError):
        urllib.request.urlopen(links_url, timeout=2)


def test_secret_strings_and_scrub(tmp_path):
    host = HostPip.parse(LISTING)
    found = secret_strings(host)
    assert "s3cr3t-token" in found
    log = tmp_path / "x.log"
    log.write_text("Looking in indexes: https://user:s3cr3t-token@pkgs.example.com/simple\n")
    scrub_log(log, found)
    assert "s3cr3t-token" not in log.read_text()


def test_content_key_follows_dockerfile_base_digest_and_context(matrix, tmp_path):
    c = cell(matrix, "pytorch-cpu:2.13")
    plan = plan_cell(c, Settings(base_mirror="127.0.0.1:5000"), "abc")
    base = BaseInfo(ref=plan.base, digest="sha256:" + "1" * 64)
    key = cell_content_key(plan, ROOT, base)
    assert key == cell_content_key(plan, ROOT, base)
    assert key != cell_content_key(plan, ROOT, BaseInfo(ref=plan.base, digest="sha256:" + "2" * 64))
    # Same base digest through another mirror (or none): same key, so mirrors share images.
    direct = plan_cell(c, Settings(), "def")
    assert cell_content_key(direct, ROOT, BaseInfo(ref=direct.base, digest=base.digest)) == key
    fake_root = tmp_path
    target = fake_root / c.dockerfile
    target.parent.mkdir(parents=True)
    for item in (ROOT / c.dockerfile).parent.iterdir():   # the Dockerfile and the cell's locks
        (target.parent / item.name).write_bytes(item.read_bytes())
    assert cell_content_key(plan, fake_root, base) == key
    (target.parent / "pylock.tools.toml").write_text((target.parent / "pylock.tools.toml").read_text() + "\n")
    assert cell_content_key(plan, fake_root, base) != key   # a lock change is a content change
    (target.parent / "pylock.tools.toml").write_bytes(((ROOT / c.dockerfile).parent / "pylock.tools.toml").read_bytes())
    (target.parent / "extra.sh").write_text("echo hi\n")
    assert cell_content_key(plan, fake_root, base) != key
    target.write_bytes((ROOT / c.dockerfile).read_bytes() + b"\nRUN true\n")
    assert cell_content_key(plan, fake_root, base) != key


FULL = "0123456789abcdef0123456789abcdef01234567"


def test_labels_carry_revision_base_run_profile_and_standin(matrix):
    c = cell(matrix, "pytorch-ngc:25.10")
    plan = plan_cell(c, Settings(base_mirror="127.0.0.1:5000"), "0123456789ab")
    base = BaseInfo(ref=plan.base, digest="sha256:" + "3" * 64,
                    labels={label_keys.STANDIN: "true", label_keys.STANDIN_FRAMEWORK: "2.13.0+cpu"})
    labels = build_labels(plan, base, "sha256:key", FULL, matrix.source)
    assert labels[label_keys.OCI_REVISION] == FULL
    assert labels[label_keys.OCI_BASE_DIGEST] == base.digest
    assert labels[label_keys.CONTENT_KEY] == "sha256:key"
    assert labels[label_keys.STANDIN] == "true" and labels[label_keys.STANDIN_FRAMEWORK] == "2.13.0+cpu"
    run = json.loads(labels[label_keys.RUN_PROFILE])
    assert run["shm_size"] == "8g" and run["docker_flags"] == c.run.docker_flags()
    real = build_labels(plan, BaseInfo(ref=plan.base, digest=base.digest), "k", f"{FULL}-dirty.0a1b2c3d",
                        matrix.source)
    assert label_keys.STANDIN not in real and real[label_keys.OCI_REVISION] == f"{FULL}-dirty.0a1b2c3d"


@pytest.mark.parametrize("mirror", ["127.0.0.1:5000", ""])
def test_the_base_name_is_what_the_build_pulled_beside_its_digest(matrix, mirror: str):
    """base.name and base.digest belong together: the reference pulled (the mirror's, when there is
    one) and that reference's digest; the upstream it stands for is the template's base.upstream."""
    c = cell(matrix, "pytorch-cpu:2.13")
    plan = plan_cell(c, Settings(base_mirror=mirror), "0123456789ab")
    base = BaseInfo(ref=plan.base, digest="sha256:" + "4" * 64)
    labels = build_labels(plan, base, "k", FULL, matrix.source)
    assert labels[label_keys.OCI_BASE_NAME] == plan.base == (
        "127.0.0.1:5000/library/debian:bookworm-slim" if mirror else c.base)
    assert labels[label_keys.OCI_BASE_DIGEST] == base.digest
    assert dockerfile_labels(render_cell_dockerfile(matrix, c, REPO / "templates"))[label_keys.BASE_UPSTREAM] == c.base


@pytest.mark.parametrize("revision", ["abc123", "0123456789ab", "0123456789ab-dirty.0a1b2c3d", "nightly-42"])
def test_a_revision_label_that_is_not_the_full_commit_is_refused(matrix, revision: str):
    plan = plan_cell(cell(matrix, "pytorch-cpu:2.13"), Settings(), "0123456789ab")
    with pytest.raises(UserError, match=rf"pytorch-cpu:2.13: revision '{revision}' is not a full commit"):
        build_labels(plan, BaseInfo(ref=plan.base, digest="sha256:" + "4" * 64), "k", revision, "https://x.example")


def test_base_pinned_by_digest():
    info = BaseInfo(ref="127.0.0.1:5000/library/debian:bookworm-slim", digest="sha256:" + "a" * 64)
    assert info.pinned == "127.0.0.1:5000/library/debian@sha256:" + "a" * 64
    assert BaseInfo(ref="127.0.0.1:5000/x", digest="sha256:b").pinned == "127.0.0.1:5000/x@sha256:b"


@pytest.mark.parametrize(("ref", "name"), [
    ("docker.io/library/debian@sha256:" + "a" * 64, "docker.io/library/debian"),
    ("docker.io/library/debian:bookworm@sha256:" + "a" * 64, "docker.io/library/debian"),
    ("127.0.0.1:5000/x:t@sha256:" + "a" * 64, "127.0.0.1:5000/x"),
    ("127.0.0.1:5000/x@sha256:" + "a" * 64, "127.0.0.1:5000/x"),
])
def test_a_base_pinned_by_digest_in_the_matrix_gives_one_digest(ref: str, name: str):
    """A matrix base `repo@sha256:...` (or `repo:tag@sha256:...`): BASE_IMAGE is the name and the resolved digest
    once, not `repo@sha256@sha256:...`."""
    digest = "sha256:" + "a" * 64
    assert BaseInfo(ref=ref, digest=digest).pinned == f"{name}@{digest}"


def test_bases_helpers(matrix):
    assert debian_suite("docker.io/library/debian:bookworm-slim") == ("bookworm", True)
    assert debian_suite("docker.io/library/debian:trixie") == ("trixie", False)
    assert is_loopback_registry("127.0.0.1:5000") and is_loopback_registry("localhost:5000/x")
    assert not is_loopback_registry("mirror.example.com")
    assert local_mirror("") == "127.0.0.1:5000"
    with pytest.raises(UserError):
        local_mirror("nvcr.io=mirror.example.com")
    tf = cell(matrix, "tensorflow-ngc:25.02")
    assert standin_framework_version(tf) == "2.21.0"
    text = _standin_dockerfile(cell(matrix, "pytorch-ngc:25.10"), "127.0.0.1:5000/library/debian:bookworm-slim")
    assert f'{label_keys.STANDIN}="true"' in text and "WORKDIR /workspace" in text
    assert "--no-cache-dir torch==2.13.0+cpu\n" in text and "--mount=type=secret,id=pip-ca" in text


def test_bad_docker_client_setting_is_one_line_user_error(tmp_path):
    with pytest.raises(UserError, match="DOCKER_CLIENT") as caught:
        engine.resolve_build_client(str(tmp_path / "no-such-docker"))
    assert "\n" not in str(caught.value)


def test_missing_engine_is_one_line_user_error(monkeypatch):
    engine.sdk.cache_clear()
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    try:
        with pytest.raises(UserError) as info:
            engine.sdk()
        message = str(info.value)
        assert "\n" not in message and "scripts/setup.sh" in message
    finally:
        engine.sdk.cache_clear()


def test_pull_and_push_keep_a_registry_port_in_the_repository(monkeypatch):
    """A tagless reference on a registry with a port is the repository `127.0.0.1:5000/x` (latest), not the
    repository `127.0.0.1` with tag `5000/x`."""
    asked: list[tuple[str, str, object]] = []

    class Api:
        def pull(self, repo, tag=None, **_):
            asked.append(("pull", repo, tag))

        def push(self, repo, tag=None, **_):
            asked.append(("push", repo, tag))
            return [{"aux": {"Digest": "sha256:" + "d" * 64}}]

    monkeypatch.setattr(engine, "sdk", lambda: type("Sdk", (), {"api": Api()})())
    engine.pull("127.0.0.1:5000/library/debian")
    engine.pull("127.0.0.1:5000/library/debian:bookworm-slim")
    engine.push("127.0.0.1:5000/x")
    engine.push("127.0.0.1:5000/x:t")
    assert asked == [("pull", "127.0.0.1:5000/library/debian", None),
                     ("pull", "127.0.0.1:5000/library/debian", "bookworm-slim"),
                     ("push", "127.0.0.1:5000/x", "latest"), ("push", "127.0.0.1:5000/x", "t")]

def test_short_digest():
    assert short_digest("sha256:" + "ab" * 32) == "sha256:abababababab"


def test_a_local_image_is_reused_by_content_key_only_when_it_is_a_dev_image_of_the_cell() -> None:
    """Images built FROM a dev image (fault fixtures, users' derived images) inherit its labels, the
    content key among them; only a dev tag of the cell's own dev repository makes one reusable."""
    from buildtool.imagebuild.builder import built_for

    matrix = fixture_matrix()
    cell = next(c for c in matrix.cells if c.key == "pytorch-cpu:2.13")
    plan = plan_cell(cell, Settings(), "abcdef123456")
    own_repo = names.dev_repo(names.DEFAULT_REGISTRY, "pytorch-cpu")
    other_repo = names.dev_repo(names.DEFAULT_REGISTRY, "other")
    derived = {"Id": "sha256:d",
               "RepoTags": ["t-imgtest-pytorch-banner:1234", f"{other_repo}:{names.dev_tag('x', '2.13')}"]}
    other_version = {"Id": "sha256:v", "RepoTags": [f"{own_repo}:{names.dev_tag('0123456789ab', '2.12')}"]}
    untagged = {"Id": "sha256:u", "RepoTags": None}
    genuine = {"Id": "sha256:g", "RepoTags": [f"{own_repo}:{names.dev_tag('0123456789ab', '2.13')}"]}
    assert built_for(plan, [derived, other_version, untagged, genuine]) == [genuine]
    assert built_for(plan, [derived, untagged]) == []


def test_pip_secrets_fails_instead_of_hanging_when_its_file_server_cannot_start(tmp_path, monkeypatch):
    """A machine out of threads: the server's thread does not start. The error comes back and the socket is
    closed; shutdown() would wait forever for a serve_forever that never ran."""
    import threading

    from buildtool.imagebuild import pipconfig

    real_thread = threading.Thread   # pipconfig.threading is this module: the runner below needs the real one

    class NoThread(threading.Thread):
        def start(self):
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(pipconfig.threading, "Thread", NoThread)
    (tmp_path / "wheels").mkdir()
    host = HostPip(find_links=(str(tmp_path / "wheels"),))
    servers = []
    real_server = pipconfig.socketserver.ThreadingTCPServer
    monkeypatch.setattr(pipconfig.socketserver, "ThreadingTCPServer",
                        lambda *a, **k: servers.append(real_server(*a, **k)) or servers[-1])
    outcome: list[BaseException] = []

    def enter() -> None:
        try:
            with pip_secrets(host):
                pass
        except RuntimeError as exc:
            outcome.append(exc)

    runner = real_thread(target=enter, daemon=True)
    runner.start()
    runner.join(timeout=15)
    assert not runner.is_alive(), "pip_secrets hung on a file server whose thread never started"
    assert [str(e) for e in outcome] == ["can't start new thread"]
    assert servers and servers[0].socket.fileno() == -1   # closed


def test_a_ca_bundle_that_is_a_folder_is_one_line_naming_it(tmp_path: Path, monkeypatch):
    """PIP_CERT (or pip.conf's `cert`) naming a folder passed: the build's secrets left the CA out (is_file), so pip
    and uv in the build trusted their own bundle without a word. Refused now, naming the setting and the folder."""
    from buildtool.imagebuild.pipconfig import pip_secrets

    folder = tmp_path / "certs"
    folder.mkdir()
    monkeypatch.setenv("PIP_CERT", str(folder))
    with pytest.raises(UserError) as caught:
        HostPip.from_host()
    assert str(caught.value) == (f"pip's CA bundle {folder} (PIP_CERT) is a folder; point PIP_CERT at one CA bundle "
                                 "file (the folder's PEM certificates put together), or unset it (`pip config list` "
                                 "shows where it is set)")
    with pytest.raises(UserError, match=r"\(PIP_CERT\) is a folder"), pip_secrets(HostPip(cert=str(folder))):
        pass
