"""What `buildtool diff` compares: each image's packages from the SBOM attached to its digest or,
when it has none (a base, an upstream NGC image, a local image), from a probe of the image itself
(buildtool.imagebuild.image_probe).

A probed side's facts are only what the probe can see (Python, OS, CUDA), never the framework, base,
cell or revision an SBOM records from the build, so a diff with a probed side compares those three
facts alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildtool.common.errors import FailedError, UserError
from buildtool.common.refs import ReferenceError, parse_reference
from buildtool.imagebuild import image_probe
from buildtool.imagebuild.contents import listing_source
from buildtool.registry.client import RegistryClient, RegistryError, RegistryUnreachable
from buildtool.sbom import document as sbom
from buildtool.sbom.document import Change, Contents
from buildtool.sbom.signing import SbomRefused, read_signed_sbom

if TYPE_CHECKING:
    from buildtool.attest.trust import Trusted

# The facts a probe can see in any image; the others (framework, base, cell, revision) come from a build.
PROBE_FACTS = ("python", "os", "cuda")


@dataclass(frozen=True)
class Side:
    """One image of a diff and where its contents came from."""

    image: str                     # as the user named it
    source: str                    # "sbom" or "probe"
    digest: str | None             # the registry's manifest digest; None for an image named without a registry
    contents: Contents
    sbom: str | None = None        # the SBOM artifact's digest
    image_id: str | None = None    # the local image a probe ran
    environments: tuple[image_probe.Environment, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        counts = f"{len(self.contents.python)} Python and {len(self.contents.apt)} Debian packages"
        if self.source == "sbom":
            return f"{self.image}: SBOM {self.sbom} of {self.digest}: {counts}"
        pythons = ", ".join(f"{e.python} ({e.version}, {len(e.packages)})" for e in self.environments)
        why = "no SBOM attached" if self.digest else "named without a registry"
        return (f"{self.image}: {why}, probed image {self.image_id}: {counts}; "
                f"Python environments: {pythons or 'none (Debian packages only)'}")

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "digest": self.digest, "source": self.source, "sbom": self.sbom,
                "image_id": self.image_id,   # the rest only for a probed side: an SBOM names no environments
                "python_environments": [e.to_json() for e in self.environments] if self.source == "probe" else None}


def read_side(image: str, root: Path | None, timeout: float = image_probe.PROBE_TIMEOUT_S, *,
              trusted: Trusted) -> Side:
    """IMAGE's contents: its SBOM as a builder `trusted` signed it when the registry holds one for its digest
    (an unsigned SBOM, or a plain one that is not the signed document, is refused: sbom_attestation.
    read_signed_sbom), else a probe of it. An image named without a registry is a local (or Docker Hub)
    image: always probed."""
    try:
        ref = parse_reference(image)
    except ReferenceError as exc:
        raise UserError(f"{image!r} is not an image reference ({exc}); name one like "
                        "127.0.0.1:5000/pytorch-cpu:2.13, REPO@sha256:... or a local image") from None
    digest = None
    if ref.domain:
        client = RegistryClient(ref.registry)
        try:
            digest = ref.digest or client.manifest_digest(ref.repository, ref.ref_in_repo)
            if not digest:
                raise UserError(f"{image}: no such tag in {ref.registry}/{ref.repository}")
            found = read_signed_sbom(client, ref.repository, digest, trusted)
        except RegistryUnreachable as exc:   # the address is wrong or nothing runs there: exit 2, as sbom and verify
            raise UserError(f"cannot read {image}: {exc}") from None
        except SbomRefused as exc:
            raise FailedError(f"{image}: {exc}") from None
        except RegistryError as exc:
            raise FailedError(f"cannot read {image}: {str(exc)[:300]}") from None
        if found is not None:
            return Side(image=image, source="sbom", digest=digest, contents=sbom.contents(found[0]),
                        sbom=found[1])
    # By digest when the registry named one: the probe lists exactly the image the digest is.
    target = f"{ref.name}@{digest}" if digest else image
    probed = image_probe.probe_image(target, listing_source(root), timeout=timeout)
    listing = probed.listing()   # its packages sorted by name
    # Keyed as an SBOM's contents are: PEP 503 Python names, Debian names (name:arch for a multi-arch pair).
    contents = sbom.Contents(facts={k: listing[k] for k in PROBE_FACTS if listing[k]},
                             python=listing["python_packages"], apt=listing["apt_packages"])
    return Side(image=image, source="probe", digest=digest, contents=contents, image_id=probed.image_id,
                environments=probed.environments)


def compared(before: Side, after: Side) -> list[Change]:
    """The changes between two sides (sbom.diff's order). Where one side was probed, only the facts a probe
    sees are compared: its framework or base is unknown, not absent."""
    if "probe" in (before.source, after.source):
        return sbom.diff(_probe_facts(before.contents), _probe_facts(after.contents))
    return sbom.diff(before.contents, after.contents)


def _probe_facts(found: Contents) -> Contents:
    return replace(found, facts={k: v for k, v in found.facts.items() if k in PROBE_FACTS})
