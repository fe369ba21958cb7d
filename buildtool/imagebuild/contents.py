"""What a built image contains: one in-image probe, checked against the cell's locks, and
turned into the SBOM that is attached to the image's digest when it is pushed.

The SBOM is stored twice: the plain CycloneDX artifact (what scanners read) and the same document
as an in-toto attestation signed with the builder's key (buildtool.sbom.signing: what
validate names in the verdict and release and `buildtool verify` check).

The probe is image-tests/scripts/packages.py (standard library only), run once in a
throw-away container without network. A pushed image whose Python packages differ from its
lock (the label_keys.PACKAGES label the build wrote from it) fails the build: an image
never gets an SBOM that contradicts its lock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildtool.attest.dsse import PrivateKey
from buildtool.common.errors import FailedError
from buildtool.contracts.image_labels import ImageLabels, LabelError
from buildtool.contracts.locks import LockFile, installed_files, normalize
from buildtool.imagebuild import engine
from buildtool.registry.client import RegistryClient
from buildtool.sbom import document as sbom
from buildtool.sbom import signing as sbom_attestation

PROBE = Path("image-tests") / "scripts" / "packages.py"
# A project without image-tests of its own uses the toolkit's.
_TOOLKIT = Path(__file__).resolve().parents[2]


def listing_source(root: Path | None) -> str:
    script = root / PROBE if root is not None and (root / PROBE).is_file() else _TOOLKIT / PROBE
    return script.read_text()


def probe(root: Path, image: str, timeout: int = 180) -> dict[str, Any]:
    """The probe's JSON for `image` (Python and Debian packages, Python version, CUDA)."""
    source = listing_source(root)
    try:
        output = engine.run_output(image, ["python", "-c", source], timeout=timeout)
        return dict(json.loads(output.strip().splitlines()[-1]))
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        raise FailedError(f"the package probe failed in {image}: {str(exc).splitlines()[0][:160]}") from None


def lock_mismatches(locked: dict[str, str], installed: dict[str, str]) -> list[str]:
    # Both sides by their PEP 503 name (`Foo_Bar` is `foo-bar`), which each problem names.
    have = {normalize(k): v for k, v in installed.items()}
    want = {normalize(k): v for k, v in locked.items()}
    return [f"{name}: locked {version}, image has {have.get(name) or 'nothing installed'}"
            for name, version in sorted(want.items()) if have.get(name) != version]


def facts(labels: ImageLabels, found: dict[str, Any]) -> dict[str, str]:
    """The headline of an SBOM and of release notes: framework, Python, CUDA, base (+ cell, revision)."""
    cuda = str(found.get("cuda") or "")
    if not cuda:   # PyPI's CUDA wheels: the runtime's version, e.g. nvidia-cuda-runtime-cu12
        cuda = next((v for k, v in sorted(found.get("python_packages", {}).items())
                     if k.startswith("nvidia-cuda-runtime")), "")
    return {
        "framework": f"{labels.framework} {labels.standin_framework or labels.framework_version}".strip(),
        "python": str(found.get("python", "")),
        "cuda": cuda,
        "base": labels.base_name + (f"@{labels.base_digest}" if labels.base_digest else ""),
        "os": str(found.get("os", "")),
        "cell": labels.cell,
        "revision": labels.revision,
        "standin": "true" if labels.standin else "",
    }


@dataclass(frozen=True)
class LockedContents:
    """What the cell's locks say its image holds, as its SBOM names it."""

    locks: Mapping[str, LockFile]                 # the Python lock files, whose wheels' sha256 the SBOM carries
    deb_hashes: Mapping[str, str] | None = None   # the apt lock's package hashes
    indexes: tuple[str, ...] = ()                 # the cell's index URL ("" for PyPI) and extra ones


def attach_sbom(root: Path, client: RegistryClient, repo: str, digest: str, local_ref: str,
                locked: LockedContents, key: PrivateKey) -> str:
    """Probe the local image, check it against its lock, attach its SBOM to repo@digest, plain and
    signed with the builder's `key` (the Python components carry the sha256 of the locked wheel; of several for
    a package, the one with the installed wheel's tags).
    Returns the plain SBOM artifact's digest. When `key` already signed an SBOM of the digest and the
    plain one is that document, both are kept; otherwise the document is made again from the image.
    The indexes are those the Python purls name (sbom.make_sbom)."""
    existing = sbom.find_sbom(client, repo, digest)
    signed = sbom_attestation.signed_by(client, repo, digest, key.public())
    if existing is not None and signed is not None and \
            not sbom_attestation.plain_sbom_problem(client, repo, digest, signed.digest):
        return existing.digest
    try:
        labels = ImageLabels.parse(engine.image_labels(local_ref))
    except LabelError as exc:
        raise FailedError(f"{local_ref}: {exc}") from None
    found = probe(root, local_ref)
    wrong = lock_mismatches(dict(labels.packages or {}), found.get("python_packages", {}))
    if wrong:
        raise FailedError(f"{local_ref} differs from its lock: " + "; ".join(wrong[:5])
                          + (f" (and {len(wrong) - 5} more)" if len(wrong) > 5 else ""))
    try:
        identified = installed_files(found.get("python_details") or {}, locked.locks)
        document = sbom.make_sbom(found, repository=f"{client.host}/{repo}", digest=digest,
                                  facts=facts(labels, found), locks=locked.locks, identified=identified,
                                  deb_hashes=locked.deb_hashes, indexes=locked.indexes)
    except ValueError as exc:
        raise FailedError(f"the SBOM of {local_ref} cannot be made: {exc}") from None
    sbom.validate_sbom(document)
    made = sbom_attestation.sbom_digest(document)
    if existing is not None and not sbom_attestation.plain_sbom_problem(client, repo, digest, made):
        plain = existing.digest
    else:
        plain = sbom.store_sbom(client, repo, digest, document)
    if signed is None or signed.digest != made:
        sbom_attestation.attest_sbom(client, repo, digest, document, key)
    return plain
