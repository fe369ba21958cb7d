"""Which SBOM a verdict names: the image's signed SBOM attestation (buildtool.sbom.signing),
verified against the builder keys validate trusts, read before the tests run.

Validate trusts config/trusted-keys.yaml and, for an image in a loopback registry, this machine's dev key
(a developer's push signs with it). That only decides which document the verdict names: release and
`buildtool verify` verify the attestation again against their own trust, and compare its digest.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from buildtool.attest.keys import TrustedKeys, dev_public_key, load_trusted
from buildtool.common.refs import is_loopback_host
from buildtool.registry.client import RegistryClient
from buildtool.sbom.signing import find_sbom_attestation
from buildtool.validate.containers import Resolved


def validate_trust(root: Path, host: str, dev: bool = True) -> TrustedKeys:
    """config/trusted-keys.yaml, and this machine's dev key for a loopback registry (`dev` false: never)."""
    trusted = load_trusted(root)
    local = dev_public_key() if dev and is_loopback_host(host) else None
    if local is not None:
        trusted.add_dev(local)
    return trusted


def verdict_sbom(image: Resolved, root: Path, log: Callable[[str], None]) -> tuple[str, str]:
    """(sbom digest, "") of the image's signed SBOM, or ("", why there is none that verifies)."""
    if not image.host or not image.repo:
        return "", "the image is not in a registry, so it has no signed SBOM to name"
    trusted = validate_trust(root, image.host)
    findings = find_sbom_attestation(RegistryClient(image.host), image.repo, image.digest, trusted)
    if findings.chosen is None:
        why = findings.why_none()
        log(f"{image.digest}: {why}; the verdict names no SBOM and release will refuse the image")
        return "", why
    log(f"SBOM {findings.digest} of {image.digest} signed by {trusted.describe(findings.signer)}")
    return findings.digest, ""
