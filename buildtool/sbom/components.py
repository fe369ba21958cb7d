"""What the SBOM says about each package, from the probe's raw metadata (image-tests/scripts/packages.py):
Debian purls as purl-spec's deb type and syft write them, licenses as the metadata declares them,
and the dependency graph the packages' own metadata gives (Requires-Dist with the image's markers,
Depends/Pre-Depends with Provides and alternatives). Pure functions over the probe's JSON, no engine.

Missing or unparseable metadata is an error naming the package: an SBOM built from a guess would be
read by scanners as a fact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from buildtool.contracts.locks import normalize


class ProbeError(ValueError):
    """The probe's output lacks or garbles what the SBOM needs."""


# -- Debian -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Deb:
    name: str
    version: str
    arch: str
    source: str
    source_version: str
    depends: str          # Pre-Depends and Depends, as dpkg lists them
    provides: str
    licenses: tuple[str, ...] | None

    @property
    def key(self) -> str:
        return f"{self.name}:{self.arch}"

    def qualifiers(self, distro: str) -> dict[str, str]:
        """arch, distro and (as syft writes it) upstream: the source package when it has another
        name, with its version when that differs (a binNMU, or a source of another version)."""
        found = {"arch": self.arch, "distro": distro}
        if self.source_version != self.version:
            found["upstream"] = f"{self.source}@{self.source_version}"
        elif self.source != self.name:
            found["upstream"] = self.source
        return found


_DEB_TEXTS = ("Package", "Version", "Architecture", "source:Package", "source:Version", "Pre-Depends", "Depends",
              "Provides")


def debs(probe: Mapping[str, Any]) -> list[Deb]:
    rows = probe.get("deb_packages")
    if rows is None:
        raise ProbeError("the probe's output has no deb_packages (made by an older packages.py?)")
    found = []
    for row in rows:
        if not isinstance(row, dict):
            raise ProbeError(f"a deb_packages entry of the probe is {row!r}, not an object")
        name = str(row.get("Package") or "")
        missing = [k for k in ("Package", "Version", "Architecture", "source:Package", "source:Version")
                   if not row.get(k)]
        if missing:
            raise ProbeError(f"Debian package {name or row!r}: dpkg gave no {', '.join(missing)}")
        wrong = next((k for k in _DEB_TEXTS if not isinstance(row.get(k, ""), str)), None)
        if wrong:
            raise ProbeError(f"Debian package {name}: the probe gave {wrong} {row[wrong]!r}, not text")
        found.append(Deb(name, row["Version"], row["Architecture"], row["source:Package"], row["source:Version"],
                         ", ".join(d for d in (row.get("Pre-Depends"), row.get("Depends")) if d),
                         str(row.get("Provides") or ""), _deb_licenses(name, row.get("licenses"))))
    return sorted(found, key=lambda d: d.key)


def _deb_licenses(name: str, licenses: Any) -> tuple[str, ...] | None:
    """A row's `licenses` as packages.py writes them: None (no machine-readable copyright file) or a list of
    license names; anything else is a ProbeError naming the package (a text was read letter by letter, an
    empty name was a cyclonedx exception)."""
    if licenses is None:
        return None
    if not (isinstance(licenses, list) and all(isinstance(n, str) and n.strip() for n in licenses)):
        raise ProbeError(f"Debian package {name}: the probe gave licenses {licenses!r}, not a list of license names")
    return tuple(licenses)


def distro(probe: Mapping[str, Any]) -> tuple[str, str]:
    """(purl namespace, distro qualifier) from /etc/os-release: ("debian", "debian-12")."""
    release = probe.get("os_release") or {}
    os_id, version_id = (release.get("ID"), release.get("VERSION_ID")) if isinstance(release, dict) else ("", "")
    if not (os_id and version_id and isinstance(os_id, str) and isinstance(version_id, str)):
        raise ProbeError(f"the image's /etc/os-release names no ID and VERSION_ID ({release!r}); "
                         "the Debian purls need both")
    return os_id, f"{os_id}-{version_id}"


def _relation_names(text: str) -> list[list[str]]:
    """`a (>= 1) | b:any, c` -> [[a, b], [c]]: groups of alternatives, names without versions or arch."""
    groups = []
    for group in text.split(","):
        alternatives = [re.split(r"[\s(\[<]", alt.strip(), maxsplit=1)[0] for alt in group.split("|")]
        names = [a.split(":", 1)[0] for a in alternatives if a]
        if names:
            groups.append(names)
    return groups


def deb_graph(packages: list[Deb]) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """(key -> keys it depends on, key -> relations no installed package satisfies). Each group of
    alternatives resolves to its first alternative that is installed or provided by an installed package."""
    by_name: dict[str, list[Deb]] = {}
    for pkg in packages:
        by_name.setdefault(pkg.name, []).append(pkg)
        for provided in _relation_names(pkg.provides):
            by_name.setdefault(provided[0], []).append(pkg)
    edges: dict[str, set[str]] = {p.key: set() for p in packages}
    unresolved: dict[str, list[str]] = {}
    for pkg in packages:
        for group in _relation_names(pkg.depends):
            target = next((_same_arch(by_name[n], pkg.arch) for n in group if n in by_name), None)
            if target is None:
                unresolved.setdefault(pkg.key, []).append(" | ".join(group))
            elif target.key != pkg.key:
                edges[pkg.key].add(target.key)
    return edges, unresolved


def _same_arch(candidates: list[Deb], arch: str) -> Deb:
    """The candidate of the depender's architecture (then `all`, then the first by key)."""
    return min(candidates, key=lambda d: (d.arch != arch, d.arch != "all", d.key))


# -- Python -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Dist:
    name: str          # PEP 503
    version: str
    license_expression: str
    license: str
    license_classifiers: tuple[str, ...]
    requires: tuple[str, ...] = field(default=())


def dists(probe: Mapping[str, Any]) -> list[Dist]:
    details = probe.get("python_details")
    if details is None:
        raise ProbeError("the probe's output has no python_details (made by an older packages.py?)")
    versions = probe.get("python_packages", {})
    if not (isinstance(details, dict) and isinstance(versions, dict)):
        raise ProbeError("the probe's python_details and python_packages are not both objects (name -> metadata, "
                         "name -> version)")
    unnamed = probe.get("python_unnamed")
    if not (isinstance(unnamed, list) and all(isinstance(u, str) for u in unnamed)):
        raise ProbeError("the probe's output has no python_unnamed (a list of text; made by an older packages.py?)")
    if unnamed:
        raise ProbeError(f"Python distribution metadata {unnamed[0]!r} has no Name"
                         f"{f' (and {len(unnamed) - 1} more)' if len(unnamed) > 1 else ''}: the SBOM cannot list it; "
                         "reinstall or remove that distribution in the image")
    if set(details) != set(versions):
        raise ProbeError("python_details and python_packages name different distributions: "
                         + ", ".join(sorted(set(details) ^ set(versions))[:5]))
    return [_dist(name, d) for name, d in sorted(details.items())]


_TEXTS = ("version", "license_expression", "license")
_LISTS = ("license_classifiers", "requires_dist")


def _dist(name: str, detail: Any) -> Dist:
    """One distribution of python_details, as packages.py writes it: every field there, of its type (a field
    missing or of another type is a ProbeError naming the package and the field, never a default)."""
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name):   # else `libc6:amd64` would be a Debian key
        raise ProbeError(f"Python distribution {name!r}: not a normalised (PEP 503) distribution name")
    if not isinstance(detail, dict):
        raise ProbeError(f"Python distribution {name}: its python_details entry is {detail!r}, not an object")
    for key in (*_TEXTS, *_LISTS):
        value = detail.get(key)
        if key in _TEXTS and not isinstance(value, str):
            raise ProbeError(f"Python distribution {name}: the probe gave no {key} (text; found {value!r})")
        if key in _LISTS and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ProbeError(f"Python distribution {name}: the probe gave no {key} (a list of text; found {value!r})")
    if not detail["version"]:
        raise ProbeError(f"Python distribution {name}: the probe gave an empty version")
    license = detail["license"]
    return Dist(name, detail["version"], detail["license_expression"], "" if license.upper() == "UNKNOWN" else license,
                tuple(detail["license_classifiers"]), tuple(detail["requires_dist"]))


def python_graph(found: list[Dist], environment: Mapping[str, str]) -> tuple[dict[str, set[str]],
                                                                            dict[str, list[str]]]:
    """(name -> names it requires, name -> requirements not installed). Markers are evaluated with the
    image's environment; extras count where an installed dependent asks for them."""
    from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
    from packaging.requirements import InvalidRequirement, Requirement

    if not environment or not isinstance(environment, Mapping):
        raise ProbeError("the probe's output has no marker_environment to evaluate Requires-Dist markers with")
    wrong = next((k for k, v in environment.items() if not isinstance(v, str)), None)
    if wrong is not None:
        raise ProbeError(f"the probe's marker_environment gives {wrong} {environment[wrong]!r}, not text")
    parsed: dict[str, list[Requirement]] = {}
    for dist in found:
        try:
            parsed[dist.name] = [Requirement(line) for line in dist.requires]
        except InvalidRequirement as exc:
            raise ProbeError(f"{dist.name} {dist.version}: unparseable Requires-Dist: {exc}") from None
    extras: dict[str, set[str]] = {d.name: {""} for d in found}
    edges: dict[str, set[str]] = {d.name: set() for d in found}
    unresolved: dict[str, set[str]] = {}
    changed = True
    while changed:     # a new extra of one distribution can add requirements of its own
        changed = False
        for name, requirements in parsed.items():
            for req in requirements:
                try:
                    wanted = req.marker is None or any(req.marker.evaluate({**environment, "extra": extra})
                                                       for extra in sorted(extras[name]))
                except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName) as exc:
                    raise ProbeError(f"{name}: marker of {str(req)!r} cannot be evaluated: {exc}") from None
                if not wanted:
                    continue
                target = normalize(req.name)
                if target not in edges:
                    unresolved.setdefault(name, set()).add(str(req))
                    continue
                edges[name].add(target)
                new = {normalize(e) for e in req.extras} - extras[target]
                if new:
                    extras[target] |= new
                    changed = True
    edges = {name: targets - {name} for name, targets in edges.items()}
    return edges, {name: sorted(reqs) for name, reqs in sorted(unresolved.items())}


# -- the graph's root -----------------------------------------------------------------------------

def top_level(edges: Mapping[str, Iterable[str]]) -> list[str]:
    """What the root depends on: the nodes nothing else depends on, plus one node (the first by name)
    of each cycle that nothing outside it depends on (libc6 and libgcc-s1 depend on each other), so that
    every node is reachable from the root and nothing reachable otherwise is listed."""
    depended: dict[str, set[str]] = {n: set() for n in edges}
    for node, targets in edges.items():
        for target in targets:
            depended[target].add(node)

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        stack = [start]
        while stack:
            node = stack.pop()
            if node not in seen:
                seen.add(node)
                stack.extend(edges[node])
        return seen

    tops = sorted(n for n in edges if not depended[n])
    reached: set[str] = set().union(*(reach(n) for n in tops)) if tops else set()
    while len(reached) < len(edges):
        for node in sorted(set(edges) - reached):
            mine = reach(node)
            if depended[node] <= mine:      # only its own cycle depends on it
                tops.append(node)
                reached |= mine
                break
    return sorted(tops)
