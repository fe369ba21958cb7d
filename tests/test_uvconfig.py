"""uv's settings in a build (the `uv.toml` secret): the host's pip settings, local folders through
the loopback server, unreachable remote indexes left out, credentials never in a log line."""

from __future__ import annotations

import tomllib
from pathlib import Path

from buildtool.imagebuild import pipconfig
from buildtool.imagebuild.pipconfig import HostPip, pip_secrets, reachable, redact, render_uv_toml


def test_uv_toml_mirrors_pip_settings_with_loopback_urls(monkeypatch):
    monkeypatch.setattr(pipconfig, "answers", lambda url, timeout=10.0: "down" not in url)
    host = HostPip(index_url="https://mirror.example/simple",
                   extra_index_urls=("file:///opt/pypi/simple", "https://u:secret@down.example/simple"),
                   find_links=("/opt/wheels",), trusted_hosts=("mirror.example",))
    served = {"/opt/pypi/simple": "http://127.0.0.1:9999/m0/simple/", "/opt/wheels": "http://127.0.0.1:9999/m1/"}
    conf = tomllib.loads(render_uv_toml(host, served, ("https://download.pytorch.org/whl/cpu",)))
    assert conf["index-url"] == "https://mirror.example/simple"
    # The cell's own index first, the host's local index through the loopback server, the unreachable one left out.
    assert conf["extra-index-url"] == ["https://download.pytorch.org/whl/cpu", "http://127.0.0.1:9999/m0/simple/"]
    assert conf["find-links"] == ["http://127.0.0.1:9999/m1/"]
    assert conf["allow-insecure-host"] == ["mirror.example", "127.0.0.1"]
    assert conf["index-strategy"] == "unsafe-best-match"


def test_secrets_session_writes_a_private_uv_toml_per_cell_index_set(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(pipconfig, "answers", lambda url, timeout=10.0: True)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with pip_secrets(HostPip(find_links=(str(wheels),))) as secrets:
        plain = secrets.files["uv.toml"]
        assert oct(plain.stat().st_mode & 0o777) == "0o600"
        cell = secrets.uv_config(("https://download.pytorch.org/whl/cpu",))
        assert cell != plain and cell == secrets.uv_config(("https://download.pytorch.org/whl/cpu",))
        assert "download.pytorch.org" in cell.read_text() and "127.0.0.1" in plain.read_text()
    assert not plain.exists() and not cell.exists()   # gone with the session


def test_unreachable_indexes_are_named_without_their_credentials(monkeypatch):
    monkeypatch.setattr(pipconfig, "answers", lambda url, timeout=10.0: "up" in url)
    lines: list[str] = []
    kept = reachable(("https://up.example/simple", "https://user:tok123@down.example/simple"), lines.append)
    assert kept == ("https://up.example/simple",)
    assert lines and "tok123" not in lines[0] and "https://user:****@down.example/simple" in lines[0]
    assert redact("https://a.example/simple") == "https://a.example/simple"
