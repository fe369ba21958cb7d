"""HTTPS downloads can verify the server: OpenSSL's CA file or folder, which Python's default SSL context and
so urllib use (torch.hub weights, Keras and dataset downloads), holds certificates (testinfra's `host`)."""

import re

import pytest

pytestmark = pytest.mark.shared(why="reads the image's CA certificates")
CAFILE, CAPATH = "/usr/lib/ssl/cert.pem", "/usr/lib/ssl/certs"   # OpenSSL's own defaults on Debian and Ubuntu


def test_python_trusts_the_system_ca_certificates(host):
    env = host.environment()
    cafile, capath = host.file(env.get("SSL_CERT_FILE", CAFILE)), host.file(env.get("SSL_CERT_DIR", CAPATH))
    # grep reads each hashed name through its link: one left behind by a removed certificate leads to none.
    found = host.run("grep -l -s -e 'BEGIN CERTIFICATE' -- %s/*", capath.path).stdout.splitlines()
    hashed = any(re.fullmatch(r"[0-9a-f]{8}\.\d+", path.rsplit("/", 1)[-1]) for path in found)
    assert (cafile.exists and cafile.contains("BEGIN CERTIFICATE")) or hashed, (
        f"Python's default SSL context trusts no CA certificate (none in {cafile.path} or {capath.path}): "
        "every HTTPS download through urllib (torch.hub weights, datasets) fails with CERTIFICATE_VERIFY_FAILED; "
        "install ca-certificates in the image")
