"""The package part of release notes: what changed in an image since the previous release of
its cell, read from the SBOMs stored with both digests (the `packages` entry of docs/contents.md).

Each platform manifest of an index has its own SBOM, so an index gets one section per platform, each
compared with the SAME platform's image in the previous release (`subjects`), never diffed against another
platform's SBOM. `package_section` is called once per platform image while the release is planned (the
promotion copies each SBOM itself, so it travels with its digest).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from buildtool.common.documents import render_document
from buildtool.common.refs import split_repo_path
from buildtool.registry.client import RegistryClient, RegistryError, RegistryUnreachable
from buildtool.release.model import ImageRelease
from buildtool.sbom.document import Contents, contents, diff, load_sbom

# Listed in the notes; the JSON keeps every change.
NOTES_LIMIT = 60


@dataclass(frozen=True)
class Subject:
    """One SBOM to report: a platform manifest of an index, or a single manifest (platform "")."""

    digest: str
    platform: str = ""                   # os/arch of an index entry; "" for a single manifest
    previous_release: str | None = None  # None: the first release of this image version
    previous_digest: str | None = None   # that release's image of the same platform; None: it has none

    @property
    def where(self) -> str:
        """How notes name the image: `linux/arm64 (sha256:...)` for an index entry, the digest otherwise."""
        return f"{self.platform} ({self.digest})" if self.platform else self.digest


def subjects(item: ImageRelease) -> list[Subject]:
    """One subject per platform manifest of `item` (item.evidence, in the index's order), each paired
    with the same platform's image in the previous release (item.previous["platforms"]: platform ->
    digest of each platform manifest it had; a single manifest's platform is the one its config declares)."""
    previous = item.previous
    single = len(item.evidence) == 1 and not item.evidence[0].platform
    out = []
    for ev in item.evidence:
        if previous is None:
            out.append(Subject(ev.digest, ev.platform))
            continue
        before: dict[str, str] = previous["platforms"]
        # A single manifest is known by the platform its config declares ("" when it declares none).
        name = ev.platform or (item.platforms[0].config_platform if item.platforms else "")
        digest = before.get(name)
        if digest is None and single and len(before) == 1 and (not name or "" in before):
            # A single manifest after a single manifest, one of them declaring no platform: the cell's only image.
            digest = next(iter(before.values()))
        out.append(Subject(ev.digest, ev.platform, str(previous["release"]), digest))
    return out


def _load(client: RegistryClient, repos: list[str], digest: str) -> tuple[Contents, str, str] | None:
    """(contents, artifact digest, repo) of the first repo holding an SBOM of `digest`."""
    for repo in repos:
        found = load_sbom(client, repo, digest)
        if found is not None:
            return contents(found[0]), found[1], repo
    return None


def package_section(client: RegistryClient, subject: Subject, dev_repo: str, release_repo: str) -> dict[str, Any]:
    """One platform's (or a single manifest's) section of the `packages` entry of an image in
    docs/releases/<version>.json.

    `sbom` names where the image's SBOM is once released (release copies it with the image);
    `changes` lists what differs from the previous release's SBOM of the same platform, headline facts first."""
    _, dev = split_repo_path(dev_repo)
    _, rel = split_repo_path(release_repo)
    section: dict[str, Any] = {"sbom": None, "previous_sbom": None, "facts": {}, "python_packages": 0,
                               "apt_packages": 0, "changes": [], "note": ""}
    if subject.platform:
        section = {"platform": subject.platform, "digest": subject.digest, **section}
    try:
        now = _load(client, [dev, rel], subject.digest)
        if now is None:
            section["note"] = f"no SBOM is stored for {subject.where}: its packages and their changes are unknown"
            return section
        current, artifact, _ = now
        section.update(sbom=f"{release_repo}@{artifact}", facts=current.facts, python_packages=len(current.python),
                       apt_packages=len(current.apt))
        if subject.previous_release is None:
            section["note"] = "first release of this image version"
            return section
        if subject.previous_digest is None:   # never compared with another platform's SBOM
            what = subject.platform or "this platform"
            section["note"] = f"first release of {what}: release {subject.previous_release} has no image for {what}"
            return section
        before = _load(client, [rel, dev], subject.previous_digest)
        if before is None:
            section["note"] = (f"the previous release {subject.previous_release} ({subject.previous_digest}"
                               f"{', ' + subject.platform if subject.platform else ''}) has no SBOM: "
                               "package changes unknown")
            return section
        section["previous_sbom"] = f"{release_repo}@{before[1]}"
        section["changes"] = [c.to_json() for c in diff(before[0], current)]
        if not section["changes"]:
            section["note"] = f"same packages as release {subject.previous_release}"
    except (RegistryError, RegistryUnreachable) as exc:
        section["note"] = (f"SBOMs of {subject.platform} " if subject.platform else "SBOMs ") + \
            f"could not be read: {str(exc)[:200]}"
    return section


def packages_entry(found: list[Subject], sections: list[dict[str, Any]]) -> dict[str, Any]:
    """The image's `packages`: its one section for a single manifest (the shape it always had), or
    `{"platforms": [...]}`, one section per platform manifest (each with `platform` and `digest`),
    for an image index."""
    if len(found) == 1 and not found[0].platform:
        return sections[0]
    return {"platforms": sections}


def package_notes(section: dict[str, Any] | None, previous_release: str | None) -> str:
    """The Markdown lines release notes give one image (`section`: its `packages` entry): its SBOM, then
    its package changes, one block per platform for an index (templates/packages.md.j2, which the notes
    template includes)."""
    return render_document("buildtool.release", "packages.md.j2", standalone=True, section=section,
                           previous_release=previous_release, limit=NOTES_LIMIT)
