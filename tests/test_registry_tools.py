"""Tools the toolkit runs against a registry (skopeo) get RegistryClient's credentials through a private
auth file (never argv), its CA folder and its plain-HTTP decision."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from buildtool.imagebuild import push_path
from buildtool.registry.tools import skopeo_access

HOST = "tls-registry.test:5443"
PASSWORD = "tool-pass-123"

FAKE_SKOPEO = """#!/usr/bin/env python3
import json, os, stat, sys
record = {"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items()}}
for arg in sys.argv[1:]:
    if arg.startswith("--dest-authfile=") or arg.startswith("--src-authfile="):
        path = arg.split("=", 1)[1]
        record["authfile"] = {"path": path, "mode": stat.S_IMODE(os.stat(path).st_mode),
                              "dir_mode": stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode),
                              "content": json.load(open(path))}
    if arg.startswith("--digestfile"):
        pass
if "--digestfile" in sys.argv:
    open(sys.argv[sys.argv.index("--digestfile") + 1], "w").write("sha256:" + "d" * 64)
json.dump(record, open(os.environ["FAKE_SKOPEO_RECORD"], "w"))
"""


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("REGISTRY_USER", "REGISTRY_PASSWORD", "REGISTRY_AUTH_HOST", "REGISTRY_AUTH_FILE",
                 "DL_IMAGES_INSECURE_REGISTRIES", "DOCKER_HOST"):
        monkeypatch.delenv(name, raising=False)
    docker = tmp_path / "docker"
    docker.mkdir()
    auth = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    (docker / "config.json").write_text(json.dumps({"auths": {HOST: {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(docker))
    certs = tmp_path / "certs.d"
    (certs / HOST).mkdir(parents=True)
    (certs / HOST / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("DL_IMAGES_CERTS_D", str(certs))
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "skopeo"
    script.write_text(FAKE_SKOPEO)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SKOPEO_RECORD", str(tmp_path / "record.json"))
    return tmp_path


def test_skopeo_push_gets_a_private_authfile_and_the_ca_folder_never_the_password_in_argv(env: Path) -> None:
    assert push_path.skopeo_push(f"{HOST}/team/x-dev:abc-1") == "sha256:" + "d" * 64
    record = json.loads((env / "record.json").read_text())
    argv = " ".join(record["argv"])
    assert PASSWORD not in argv and base64.b64encode(f"alice:{PASSWORD}".encode()).decode() not in argv
    assert PASSWORD not in json.dumps(record["env"])
    assert f"--dest-cert-dir={env / 'certs.d' / HOST}" in record["argv"]
    assert "--dest-tls-verify=false" not in record["argv"]
    authfile = record["authfile"]
    assert authfile["mode"] == 0o600 and authfile["dir_mode"] == 0o700
    assert authfile["content"] == {"auths": {HOST: {"auth": base64.b64encode(f"alice:{PASSWORD}".encode()).decode()}}}
    assert not Path(authfile["path"]).exists() and not Path(authfile["path"]).parent.exists()


def test_skopeo_access_for_a_host_without_credentials_and_an_insecure_one(
        env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with skopeo_access("other.example", "src") as args:
        assert args == []
    monkeypatch.setenv("DL_IMAGES_INSECURE_REGISTRIES", "other.example")
    with skopeo_access("other.example", "src") as args:
        assert args == ["--src-tls-verify=false"]
    with skopeo_access("127.0.0.1:5000", "dest") as args:
        assert args == ["--dest-tls-verify=false"]


def test_skopeo_reads_the_ca_folder_the_client_reads(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One lookup (tools.host_ca_files) for RegistryClient and skopeo: the host as written (docker's certs.d rule),
    and for a host without a port also HOST:443, which the client read and skopeo did not."""
    from buildtool.registry import tools

    certs = env / "certs.d"
    for folder in ("Mixed.Example:5443", "Mixed.Example:443"):
        (certs / folder).mkdir()
        (certs / folder / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    with skopeo_access("Mixed.Example:5443", "dest") as args:
        assert args == [f"--dest-cert-dir={certs / 'Mixed.Example:5443'}"]
    with skopeo_access("mixed.example:5443", "dest") as args:
        assert args == []                                   # another folder name: docker would not read it either
    with skopeo_access("Mixed.Example", "src") as args:
        assert args == [f"--src-cert-dir={certs / 'Mixed.Example:443'}"]
    assert tools.host_ca_files("Mixed.Example") == [certs / "Mixed.Example:443" / "ca.crt"]


def test_a_ca_bundle_folder_is_read_as_a_capath_beside_the_hosts_ca(env: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """REQUESTS_CA_BUNDLE naming a folder (requests reads it as openssl's capath) crashed ssl_context for a host with
    a certs.d CA (IsADirectoryError, a traceback); one naming nothing too. A folder now works; nothing is one line."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from buildtool.common.errors import UserError
    from buildtool.registry.tools import ssl_context

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test ca")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(key, hashes.SHA256()))
    (env / "certs.d" / HOST / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    folder = tmp_path / "capath"
    folder.mkdir()
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(folder))
    context = ssl_context(HOST)
    assert context is not None and context.cert_store_stats()["x509_ca"] == 1   # the host's CA; the folder is lazy
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "none.pem"))
    with pytest.raises(UserError, match=f"^REQUESTS_CA_BUNDLE: {tmp_path / 'none.pem'} is no CA bundle"):
        ssl_context(HOST)
