"""SBOMs: what is in an image, as CycloneDX JSON, addressed by the image's digest.

One in-image probe (image-tests/scripts/packages.py, standard library only) lists the
Python distributions and the Debian packages; `make_sbom` turns that into a CycloneDX 1.6
document with cyclonedx-python-lib, the image itself as `metadata.component` and the facts
people ask first (framework, Python, CUDA, base) as properties. What scanners match on comes
from the packages' own metadata (buildtool.sbom.components): purls `pkg:pypi/NAME@V`
and `pkg:deb/debian/NAME@V?arch=A&distro=debian-12&upstream=SRC[@SRCV]`, the lock's sha256 of
each Python file it pinned, declared licenses, and a dependency graph whose root depends only
on the packages nothing else needs. Hashes and licenses that the image does not record are
left out (a property says why), never guessed. The document is deterministic: no timestamp,
a serial number derived from the digest, everything sorted, so the same image gives the same bytes.

It is stored as an OCI referrer artifact of the image (artifactType SBOM_TYPE, through
buildtool.attest.referrers), so any OCI 1.1 client finds it: `oras discover`, or on
registries without the referrers API (distribution 2.8) `skopeo inspect --raw
docker://REPO:sha256-<hex>` (the fallback index) and `skopeo copy docker://REPO@<artifact> dir:D`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from buildtool.attest import referrers
from buildtool.common import strict_json
from buildtool.contracts import label_keys
from buildtool.contracts.locks import LockFile, normalize
from buildtool.contracts.names import SBOM_TYPE
from buildtool.registry.client import RegistryClient, RegistryError
from buildtool.sbom import components as packages
from buildtool.sbom import deb_licenses

PROPERTY = label_keys.SBOM_PROPERTY
SBOM_TITLE = "sbom.cdx.json"
# Facts listed first in release notes and `buildtool diff`, in this order.
HEADLINE = ("framework", "python", "cuda", "base")
GENERATOR = "dl-images-buildtool"     # metadata.tools: this project's distribution, at its installed version
DEB_HASH_NOTE = "not recorded: dpkg keeps per-file md5sums, not the hash of the .deb it installed"
LICENSE_PROPERTY = "license"
LICENSE_NONE = ("not declared: the package's /usr/share/doc/<package>/copyright is missing or not machine-readable "
                "(DEP-5), so no license is claimed")
PYTHON_LICENSE_NOT_SPDX = ("not SPDX: the package's License-Expression is no SPDX license expression, so it is "
                           "given as a license name")
DEB_NOT_SERVED_NOTE = "unknown: the Debian archive no longer served this version when `make lock` ran"


def make_sbom(probe: dict[str, Any], *, repository: str, digest: str, facts: dict[str, str],
              locks: Mapping[str, LockFile], identified: Mapping[str, str],
              deb_hashes: Mapping[str, str] | None = None, indexes: Sequence[str] = ()) -> dict[str, Any]:
    """A CycloneDX 1.6 document (as a dict) for the image `repository@digest`. `locks` are the cell's
    lock files by file name (empty for an image not installed from locks): a Python component whose
    version a lock pins gets the sha256 of the lock's wheel when it lists one for the platform, or of the
    one of its wheels `identified` names (name -> sha256, contracts.locks.installed_files). `deb_hashes` (the
    cell's debs.sha256: "name=version" -> sha256 or "-") gives Debian components the .deb's sha256;
    a package it does not list says why it has none. `indexes`: the cell's package indexes (its index URL,
    "" for PyPI, then its extra ones), which name where a Python package that is not PyPI's came from
    (python_repository). Debian licenses are SPDX where Debian's names map (deb_licenses); a package whose
    copyright file names none says so in a property (LICENSE_PROPERTY: LICENSE_NONE), and unlicensed() lists them."""
    import uuid  # here, with cyclonedx: release reads SBOMs and never makes one
    from importlib.metadata import version

    from cyclonedx.model import Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    name = repository.rsplit("/", 1)[-1]
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"{repository}@{digest}"))
    bom.metadata.timestamp = None  # type: ignore[assignment]  # the same image gives the same document
    for tool, kind in ((GENERATOR, ComponentType.APPLICATION), ("cyclonedx-python-lib", ComponentType.LIBRARY)):
        bom.metadata.tools.components.add(Component(type=kind, name=tool, version=version(tool)))
    root = Component(
        type=ComponentType.CONTAINER, name=name, version=digest, bom_ref=f"{repository}@{digest}",
        purl=PackageURL("oci", name=name, version=digest, qualifiers={"repository_url": repository}),
        properties=[Property(name=f"{PROPERTY}:{key}", value=str(value))
                    for key, value in sorted(facts.items()) if value])
    bom.metadata.component = root
    by_ref: dict[str, Component] = {}
    edges: dict[str, set[str]] = {}
    _python_components(probe, locks, identified, indexes, by_ref, edges)
    _deb_components(probe, deb_hashes or {}, by_ref, edges)
    bom.components.update(by_ref.values())
    for key, targets in edges.items():
        bom.register_dependency(by_ref[key], [by_ref[t] for t in sorted(targets)])
    bom.register_dependency(root, [by_ref[t] for t in packages.top_level(edges)])
    return json.loads(JsonV1Dot6(bom).output_as_string())


def _python_components(probe: dict[str, Any], locks: Mapping[str, LockFile], identified: Mapping[str, str],
                       indexes: Sequence[str], by_ref: dict[str, Any], edges: dict[str, set[str]]) -> None:
    """The image's Python distributions as components (into `by_ref`, their dependencies into `edges`)."""
    from packageurl import PackageURL

    dists = packages.dists(probe)
    python_edges, python_missing = packages.python_graph(dists, probe.get("marker_environment") or {})
    for dist in dists:
        origin, sha256, note = _lock_origin(dist, locks, identified.get(dist.name, ""))
        # Only what the cell's locks installed came from the cell's indexes; the base image's own packages
        # (an NGC base's torch 2.9.0a0+...nv25.10, a stand-in's 2.13.0+cpu) came from wherever its maker took them.
        from_locks = origin in locks
        repository_url = python_repository(dist.name, dist.version, indexes) if from_locks else ""
        purl = PackageURL("pypi", name=dist.name, version=dist.version,
                          qualifiers={"repository_url": repository_url} if repository_url else None)
        base_local = not from_locks and _local_version(dist.version)
        licenses, license_note = _python_licenses(dist)
        notes = [("installed-from", origin), ("repository", BASE_REPOSITORY_NOTE if base_local else ""), ("hash", note),
                 (LICENSE_PROPERTY, license_note)]
        by_ref[dist.name] = _library(dist.name, dist.version, purl, sha256, licenses, notes,
                                     python_missing.get(dist.name, []))
        edges[dist.name] = python_edges[dist.name]


def _deb_components(probe: dict[str, Any], deb_hashes: Mapping[str, str], by_ref: dict[str, Any],
                    edges: dict[str, set[str]]) -> None:
    """The image's Debian packages as components (into `by_ref`, their dependencies into `edges`)."""
    from packageurl import PackageURL

    debs = packages.debs(probe)
    if debs:
        namespace, distro = packages.distro(probe)
        deb_edges, deb_missing = packages.deb_graph(debs)
        for deb in debs:
            purl = PackageURL("deb", namespace=namespace, name=deb.name, version=deb.version,
                              qualifiers=deb.qualifiers(distro))
            sha256 = deb_hashes.get(f"{deb.name}={deb.version}", "")
            hash_note = "" if len(sha256) == 64 else DEB_NOT_SERVED_NOTE if sha256 else DEB_HASH_NOTE
            licenses, license_note = _deb_licenses(deb.licenses)
            by_ref[deb.key] = _library(deb.name, deb.version, purl, "" if hash_note else sha256, licenses,
                                       [("hash", hash_note), (LICENSE_PROPERTY, license_note)],
                                       deb_missing.get(deb.key, []))
            edges[deb.key] = deb_edges[deb.key]


def _library(name: str, version: str, purl: Any, sha256: str, licenses: list[Any], notes: list[tuple[str, str]],
             missing: list[str]) -> Any:
    """A package as a library component named by its purl, with its sha256 when known; `notes` (PROPERTY:KEY,
    value; those without a value left out) and the dependencies no installed package satisfies (`missing`)
    as properties."""
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.component import Component, ComponentType

    notes = [*notes, *(("unresolved-dependency", r) for r in missing)]
    return Component(type=ComponentType.LIBRARY, name=name, version=version, purl=purl, bom_ref=str(purl),
                     hashes=[HashType(alg=HashAlgorithm.SHA_256, content=sha256)] if sha256 else None,
                     licenses=licenses, properties=[Property(name=f"{PROPERTY}:{k}", value=v) for k, v in notes if v])


BASE_REPOSITORY_NOTE = ("unknown: a local version (not PyPI's) installed by the base image, not from the cell's "
                        "indexes")


def _local_version(version: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return bool(Version(version).local)
    except InvalidVersion:
        return False


def python_repository(name: str, version: str, indexes: Sequence[str]) -> str:
    """The purl `repository_url` of a Python package: "" for PyPI (purl's default). The cell's own index when
    it is not PyPI; else a version with a local part (`2.13.0+cpu`), which PyPI never holds, names the first
    extra index that is not PyPI; ValueError naming the package when there is none."""
    primary, extras = (indexes[0] if indexes else ""), [i for i in indexes[1:] if i and not _is_pypi(i)]
    if primary and not _is_pypi(primary):
        return primary
    if not _local_version(version):
        return ""
    if not extras:
        raise ValueError(f"{name} {version} is not on PyPI (a local version) and the cell names no other index")
    return extras[0]


def _is_pypi(url: str) -> bool:
    return url.rstrip("/") in ("https://pypi.org/simple", "https://pypi.python.org/simple")


def _deb_licenses(names: tuple[str, ...] | None) -> tuple[list[Any], str]:
    """(CycloneDX licenses, a note) of a Debian package: one SPDX id or expression when all its copyright
    file's names map (the names as Debian wrote them in the note), else each name, SPDX id where it maps
    and Debian's text where not; no names: no license, and the note says why."""
    from cyclonedx.model.license import DisjunctiveLicense, LicenseExpression

    if not names:
        return [], LICENSE_NONE
    unique = sorted(set(names))
    expression = deb_licenses.package_expression(names)
    original = "Debian: " + "; ".join(unique)
    if expression is not None:
        return [DisjunctiveLicense(id=expression) if " " not in expression else LicenseExpression(expression)], original
    found = {name: deb_licenses.spdx_of(name) for name in unique}
    return [DisjunctiveLicense(id=spdx) if spdx and " " not in spdx else DisjunctiveLicense(name=name)
            for name, spdx in found.items()], original


def unlicensed(document: dict[str, Any]) -> list[str]:
    """The Debian packages of an SBOM whose copyright file names no license (LICENSE_NONE), by name."""
    return sorted(c["name"] for c in document.get("components", [])
                  if any(p.get("name") == f"{PROPERTY}:{LICENSE_PROPERTY}" and p.get("value") == LICENSE_NONE
                         for p in c.get("properties", [])))


def _lock_origin(dist: packages.Dist, locks: Mapping[str, LockFile], identified: str) -> tuple[str, str, str]:
    """(installed-from, sha256 or "", why there is no hash) of one distribution."""
    for lock_name, lock in sorted(locks.items()):
        entry = lock.entries.get(dist.name)
        if entry is None:
            continue
        if entry.version != dist.version:
            raise ValueError(f"{dist.name} {dist.version} in the image, {entry.version} in {lock_name}")
        wheels = {w.sha256 for w in entry.wheels}
        if len(wheels) == 1 and entry.sdist is None:   # with an sdist, uv builds that where the wheel does not fit
            return lock_name, next(iter(wheels)), ""
        if identified:
            if identified not in wheels:
                raise ValueError(f"{dist.name}: the file identified as installed ({identified[:12]}...) is not "
                                 f"one {lock_name} admits")
            return lock_name, identified, ""
        if len(wheels) == 1:
            return lock_name, "", (f"not recorded: {lock_name} admits one wheel and the sdist, and the installed "
                                   "wheel's tags are not the wheel's (uv built it from the sdist)")
        return lock_name, "", (f"not recorded: {lock_name} admits {len(wheels)} files (wheels for the platform) "
                               "and not exactly one of them has the installed wheel's tags")
    return "no lock (the base image's own)", "", "not recorded: not installed from a lock"


def _python_licenses(dist: packages.Dist) -> tuple[list[Any], str]:
    """(licenses, a note): License-Expression when declared, in SPDX's canonical form; one that is not SPDX
    is kept as a name, and the note says so (nothing that is not SPDX is written as an SPDX expression).
    Else a one-line License field, else the License :: classifiers; none when the metadata declares none."""
    from cyclonedx.model.license import DisjunctiveLicense, LicenseExpression

    if dist.license_expression:
        expression = deb_licenses.canonical_spdx(dist.license_expression)
        if expression is not None:
            return [LicenseExpression(expression)], ""
        return [DisjunctiveLicense(name=dist.license_expression)], PYTHON_LICENSE_NOT_SPDX
    names = [dist.license] if dist.license else set(dist.license_classifiers)
    return [DisjunctiveLicense(name=n) for n in sorted(names)], ""


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


def shape_problem(document: Any) -> str:
    """Why `contents` cannot read `document` ("" when it can): the parts it reads (metadata.component and its
    properties, components and their purls) must be of CycloneDX's types. A stored SBOM is anyone's who may
    push: a wrong type there is refused by its readers, naming it, never a traceback."""
    if not isinstance(document, dict):
        return "the document is not a JSON object"
    metadata = document.get("metadata") or {}
    root = (metadata.get("component") or {}) if isinstance(metadata, dict) else None
    if not isinstance(root, dict):
        return "metadata.component is not an object" if isinstance(metadata, dict) else "metadata is not an object"
    properties = root.get("properties", [])
    if not isinstance(properties, list) or not all(isinstance(p, dict) and isinstance(p.get("name", ""), str)
                                                   and isinstance(p.get("value", ""), str) for p in properties):
        return "metadata.component.properties is not a list of objects with a text name and value"
    components = document.get("components", [])
    if not isinstance(components, list) or not all(isinstance(c, dict) and isinstance(c.get("purl", ""), str)
                                                   for c in components):
        return "components is not a list of objects with a text purl"
    from packageurl import PackageURL

    for index, component in enumerate(components):   # one left out of `contents` would hide a package
        purl = component.get("purl", "")
        try:
            if purl:
                PackageURL.from_string(purl)
        except ValueError:
            return f"components[{index}].purl {purl[:80]!r} is not a package URL"
    return _package_sets(components)[2]


def contents(document: dict[str, Any]) -> Contents:
    """Package sets of a CycloneDX document (ours or any with pypi/deb purls) that shape_problem accepts."""
    root = (document.get("metadata") or {}).get("component") or {}
    facts = {p["name"].split(":", 1)[1]: p.get("value", "") for p in root.get("properties", [])
             if str(p.get("name", "")).startswith(f"{PROPERTY}:")}
    python, apt, problem = _package_sets(document.get("components", []))
    if problem:
        raise ValueError(problem)
    return Contents(facts=facts, python=dict(sorted(python.items())), apt=dict(sorted(apt.items())))


def _package_sets(components: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, str], str]:
    """(Python packages by PEP 503 name, Debian ones by deb_keys' key, "" or why not: two components of one
    package at two versions, of which a name -> version listing would silently keep one)."""
    from packageurl import PackageURL

    found: list[tuple[str, tuple[str, str], str, int]] = []   # (scope, (name, arch), version, index)
    for index, component in enumerate(components):
        try:
            purl = PackageURL.from_string(component.get("purl", ""))
        except ValueError:
            continue
        if purl.type == "deb":
            arch = purl.qualifiers.get("arch", "") if isinstance(purl.qualifiers, dict) else ""
            found.append(("apt", (purl.name, arch), purl.version or "", index))
        elif purl.type == "pypi":   # another tool's purl may keep the name's case, `.` or `_` (PEP 503: one name)
            found.append(("python", (normalize(purl.name), ""), purl.version or "", index))
    deb_key = _deb_key_of([key for scope, key, _, _ in found if scope == "apt"])
    sets: dict[str, dict[str, tuple[str, int]]] = {"python": {}, "apt": {}}
    for scope, (name, arch), version, index in found:
        key = name if scope == "python" else deb_key[(name, arch)]
        seen = sets[scope].setdefault(key, (version, index))
        if seen[0] != version:
            first, second = (f"components[{i}].purl {components[i]['purl'][:80]!r}" for i in (seen[1], index))
            return {}, {}, (f"{first} and {second} are one package ({scope} {key}) at two versions; a listing holds "
                            "one version of each")
    return ({k: v for k, (v, _) in sets["python"].items()}, {k: v for k, (v, _) in sets["apt"].items()}, "")


def deb_keys(debs: dict[tuple[str, str], str]) -> dict[str, str]:
    """Debian packages by name, as dpkg names them: `name:arch` where the name is installed for more than one
    architecture (multi-arch pairs such as libc6:amd64 and libc6:i386 are two packages)."""
    key = _deb_key_of(list(debs))
    return {key[name_arch]: version for name_arch, version in debs.items()}


def _deb_key_of(debs: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """deb_keys' key of each (name, arch): a name with no architecture (another tool's purl without `arch`) is
    keyed by the name, and counts no architecture of it."""
    archs: dict[str, set[str]] = {}
    for name, arch in debs:
        archs.setdefault(name, set()).update({arch} if arch else ())
    return {(name, arch): f"{name}:{arch}" if arch and len(archs[name]) > 1 else name for name, arch in debs}


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
        return asdict(self)


# Package changes are listed removed, then changed, then added; each group Python before Debian, by name
# (`buildtool diff` and the release notes alike).
KIND_ORDER = ("removed", "changed", "added")
SCOPE_ORDER = ("python", "apt")


def diff(before: Contents, after: Contents) -> list[Change]:
    """Changes from `before` to `after`: the headline facts first, then the packages in KIND_ORDER,
    each kind in SCOPE_ORDER and by name."""
    facts: list[Change] = []
    for key in dict.fromkeys((*HEADLINE, *sorted(set(before.facts) | set(after.facts)))):
        old, new = before.facts.get(key), after.facts.get(key)
        if old != new and (old or new):
            kind = "added" if not old else "removed" if not new else "changed"
            facts.append(Change(kind, "fact", key, old, new))
    found: list[Change] = []
    for scope, old_set, new_set in (("python", before.python, after.python), ("apt", before.apt, after.apt)):
        for name in sorted(set(old_set) | set(new_set)):
            old, new = old_set.get(name), new_set.get(name)
            if old != new:
                kind = "added" if old is None else "removed" if new is None else "changed"
                found.append(Change(kind, scope, name, old, new))
    return facts + sorted(found, key=lambda c: (KIND_ORDER.index(c.kind), SCOPE_ORDER.index(c.scope), c.name))


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
            try:   # anyone with push rights can put any bytes here: refused by name, never a traceback
                document = strict_json.loads(payload.data)
                version = ((document.get("metadata") or {}).get("component") or {}).get("version")
            except strict_json.RepeatedKey as exc:
                # Python keeps the last of a repeated key, other JSON readers the first or none: a plain SBOM that
                # reads here as the signed document could show scanners other packages.
                raise RegistryError(f"SBOM {referrer.digest} of {repo}@{digest} repeats the key {exc} in one JSON "
                                    "object (JSON readers disagree on which one counts)") from None
            except (ValueError, AttributeError):
                raise RegistryError(f"SBOM {referrer.digest} of {repo}@{digest} is not a CycloneDX JSON document") \
                    from None
            if version != digest:
                raise RegistryError(f"SBOM {referrer.digest} describes {repr(version)[:100]}, not {digest}")
            problem = shape_problem(document)
            if problem:
                raise RegistryError(f"SBOM {referrer.digest} of {repo}@{digest} is malformed: {problem}")
            return document, referrer.digest
    raise RegistryError(f"artifact {referrer.digest} of {repo}@{digest} holds no {SBOM_TYPE} layer")
