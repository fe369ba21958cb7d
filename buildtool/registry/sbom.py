"""SBOMs: what is in an image, as CycloneDX JSON, addressed by the image's digest.

One in-image probe (image-tests/scripts/packages.py, standard library only) lists the
Python distributions and the Debian packages; `make_sbom` turns that into a CycloneDX 1.6
document with cyclonedx-python-lib (purls `pkg:pypi/...`, `pkg:deb/<distro>/...`), the
image itself as `metadata.component` and the facts people ask first (framework, Python,
CUDA, base) as properties. The document is deterministic: no timestamp, a serial number
derived from the digest, components sorted, so the same image gives the same bytes.

It is stored as an OCI referrer artifact of the image (artifactType SBOM_TYPE, through
buildtool.registry.referrers), so any OCI 1.1 client finds it: `oras discover`, or on
registries without the referrers API (distribution 2.8) `skopeo inspect --raw
docker://REPO:sha256-<hex>` (the fallback index) and `skopeo copy docker://REPO@<artifact> dir:D`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from buildtool.contracts import label_keys
from buildtool.contracts.names import SBOM_TYPE
from buildtool.registry import referrers
from buildtool.registry.client import RegistryClient, RegistryError

PROPERTY = label_keys.SBOM_PROPERTY
SBOM_TITLE = "sbom.cdx.json"
# Facts listed first in release notes and `buildtool diff`, in this order.
HEADLINE = ("framework", "python", "cuda", "base")


def make_sbom(probe: dict[str, Any], *, repository: str, digest: str, facts: dict[str, str]) -> dict[str, Any]:
    """A CycloneDX 1.6 document (as a dict) for the image `repository@digest`."""
    import uuid  # here, with cyclonedx: release reads SBOMs and never makes one

    from cyclonedx.model import Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    name = repository.rsplit("/", 1)[-1]
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"{repository}@{digest}"))
    bom.metadata.timestamp = None  # type: ignore[assignment]  # the same image gives the same document
    root = Component(
        type=ComponentType.CONTAINER, name=name, version=digest, bom_ref=f"{repository}@{digest}",
        purl=PackageURL("oci", name=name, version=digest, qualifiers={"repository_url": repository}),
        properties=[Property(name=f"{PROPERTY}:{key}", value=str(value))
                    for key, value in sorted(facts.items()) if value])
    bom.metadata.component = root
    components = []
    for pkg, version in sorted(probe.get("python_packages", {}).items()):
        purl = PackageURL("pypi", name=pkg, version=version)
        components.append(Component(type=ComponentType.LIBRARY, name=pkg, version=version, purl=purl,
                                    bom_ref=str(purl)))
    distro = _distro(probe.get("os", ""))
    for pkg, version in sorted(probe.get("apt_packages", {}).items()):
        base, _, arch = pkg.partition(":")
        purl = PackageURL("deb", namespace=distro, name=base, version=version,
                          qualifiers={"arch": arch} if arch else None)
        components.append(Component(type=ComponentType.LIBRARY, name=base, version=version, purl=purl,
                                    bom_ref=str(purl)))
    for component in components:
        bom.components.add(component)
    bom.register_dependency(root, components)
    return json.loads(JsonV1Dot6(bom).output_as_string())


def _distro(pretty: str) -> str | None:
    lowered = pretty.lower()
    for name in ("debian", "ubuntu"):
        if name in lowered:
            return name
    return None


def validate_sbom(document: dict[str, Any]) -> None:
    """Raise ValueError when the document is not valid CycloneDX 1.6 JSON."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(document))
    if error is not None:
        raise ValueError(f"not valid CycloneDX 1.6: {str(error)[:300]}")


# -- reading ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Contents:
    """What an SBOM says an image contains."""

    facts: dict[str, str]
    python: dict[str, str] = field(default_factory=dict)   # name -> version
    apt: dict[str, str] = field(default_factory=dict)


def contents(document: dict[str, Any]) -> Contents:
    """Package sets of a CycloneDX document (ours or any with pypi/deb purls)."""
    from packageurl import PackageURL

    root = (document.get("metadata") or {}).get("component") or {}
    facts = {p["name"].split(":", 1)[1]: p.get("value", "") for p in root.get("properties", [])
             if str(p.get("name", "")).startswith(f"{PROPERTY}:")}
    python: dict[str, str] = {}
    apt: dict[str, str] = {}
    for component in document.get("components", []):
        try:
            purl = PackageURL.from_string(component.get("purl", ""))
        except ValueError:
            continue
        if purl.type == "pypi":
            python[purl.name] = purl.version or ""
        elif purl.type == "deb":
            apt[purl.name] = purl.version or ""
    return Contents(facts=facts, python=dict(sorted(python.items())), apt=dict(sorted(apt.items())))


@dataclass(frozen=True)
class Change:
    kind: str      # added, removed, changed
    scope: str     # fact, python, apt
    name: str
    before: str | None
    after: str | None

    def line(self) -> str:
        label = self.name if self.scope == "fact" else f"{self.name} ({self.scope})"
        if self.kind == "added":
            return f"added {label} {self.after}"
        if self.kind == "removed":
            return f"removed {label} {self.before}"
        return f"{label}: {self.before} -> {self.after}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "scope": self.scope, "name": self.name, "before": self.before,
                "after": self.after}


def diff(before: Contents, after: Contents) -> list[Change]:
    """Changes from `before` to `after`: the headline facts first, then Python, then apt packages."""
    changes: list[Change] = []
    for key in (*HEADLINE, *sorted(set(before.facts) | set(after.facts))):
        if key in {c.name for c in changes if c.scope == "fact"}:
            continue
        old, new = before.facts.get(key), after.facts.get(key)
        if old != new and (old or new):
            kind = "added" if not old else "removed" if not new else "changed"
            changes.append(Change(kind, "fact", key, old, new))
    for scope, old_set, new_set in (("python", before.python, after.python), ("apt", before.apt, after.apt)):
        for name in sorted(set(old_set) | set(new_set)):
            old, new = old_set.get(name), new_set.get(name)
            if old == new:
                continue
            kind = "added" if old is None else "removed" if new is None else "changed"
            changes.append(Change(kind, scope, name, old, new))
    return changes


# -- the registry ----------------------------------------------------------------------------

def store_sbom(client: RegistryClient, repo: str, digest: str, document: dict[str, Any]) -> str:
    """Attach the SBOM to `repo@digest` as a referrer; returns the artifact's digest."""
    data = json.dumps(document, sort_keys=True, indent=1).encode()
    referrer = referrers.attach(client, repo, digest, SBOM_TYPE,
                                [referrers.Payload(media_type=SBOM_TYPE, data=data, title=SBOM_TITLE)])
    return referrer.digest


def find_sbom(client: RegistryClient, repo: str, digest: str) -> referrers.Referrer | None:
    """The newest SBOM attached to `repo@digest`, or None."""
    found = referrers.referrers(client, repo, digest, SBOM_TYPE)
    return found[-1] if found else None


def load_sbom(client: RegistryClient, repo: str, digest: str) -> tuple[dict[str, Any], str] | None:
    """(document, artifact digest) of the newest SBOM of `repo@digest`, or None when it has none."""
    referrer = find_sbom(client, repo, digest)
    if referrer is None:
        return None
    for payload in referrers.fetch(client, repo, referrer, digest):
        if payload.media_type == SBOM_TYPE:
            document = json.loads(payload.data)
            component = (document.get("metadata") or {}).get("component") or {}
            if component.get("version") != digest:
                raise RegistryError(f"SBOM {referrer.digest} describes {component.get('version')}, not {digest}")
            return document, referrer.digest
    raise RegistryError(f"artifact {referrer.digest} of {repo}@{digest} holds no {SBOM_TYPE} layer")
