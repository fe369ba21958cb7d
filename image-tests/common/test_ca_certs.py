"""HTTPS downloads can verify the server: Python's default SSL context, which urllib uses (torch.hub
weights, Keras and dataset downloads), trusts the system's CA certificates (scripts/ca_certs.py)."""

import pytest

pytestmark = pytest.mark.shared(why="reads the image's CA certificates")


def test_python_trusts_the_system_ca_certificates(main):
    found = main.result("ca_certs.py", step="load the CA certificates Python's SSL context trusts")
    assert found["loaded"] or found["hashed"], (
        f"Python's default SSL context trusts no CA certificate (none in {found['cafile']} or {found['capath']}): "
        "every HTTPS download through urllib (torch.hub weights, datasets) fails with CERTIFICATE_VERIFY_FAILED; "
        "install ca-certificates in the image")
