"""The package part of release notes: what changed in an image since the previous release of
its cell, read from the SBOMs stored with both digests (framework, Python, CUDA and base first,
then added, removed and changed Python and Debian packages).

Kept apart from the gates and the promotion (release.promote) and from the layout of the notes
(release.notes): `package_section` is called once per image while the release is planned (the
promotion copies the SBOM itself, so it travels with the image).
"""

from __future__ import annotations

from typing import Any

from buildtool.common.documents import render_document
from buildtool.common.refs import split_repo_path
from buildtool.registry.client import RegistryClient, RegistryError, RegistryUnreachable
from buildtool.registry.sbom import Contents, contents, diff, load_sbom

# Listed in the notes; the JSON keeps every change.
NOTES_LIMIT = 60


def _load(client: RegistryClient, repos: list[str], digest: str) -> tuple[Contents, str, str] | None:
    """(contents, artifact digest, repo) of the first repo holding an SBOM of `digest`."""
    for repo in repos:
        found = load_sbom(client, repo, digest)
        if found is not None:
            return contents(found[0]), found[1], repo
    return None


def package_section(client: RegistryClient, digest: str, dev_repo: str, release_repo: str,
                    previous: dict[str, Any] | None) -> dict[str, Any]:
    """The `packages` entry of an image in docs/releases/<version>.json.

    `sbom` names where the image's SBOM is once released (release copies it with the image);
    `changes` lists what differs from the previous release's SBOM, headline facts first."""
    _, dev = split_repo_path(dev_repo)
    _, rel = split_repo_path(release_repo)
    section: dict[str, Any] = {"sbom": None, "previous_sbom": None, "facts": {}, "python_packages": 0,
                               "apt_packages": 0, "changes": [], "note": ""}
    try:
        now = _load(client, [dev, rel], digest)
        if now is None:
            section["note"] = f"no SBOM is stored for {digest}: its packages and their changes are unknown"
            return section
        current, artifact, _ = now
        section.update(sbom=f"{release_repo}@{artifact}", facts=current.facts, python_packages=len(current.python),
                       apt_packages=len(current.apt))
        if previous is None:
            section["note"] = "first release of this image version"
            return section
        before = _load(client, [rel, dev], previous["digest"])
        if before is None:
            section["note"] = (f"the previous release {previous['release']} ({previous['digest']}) has no SBOM: "
                               "package changes unknown")
            return section
        section["previous_sbom"] = f"{release_repo}@{before[1]}"
        section["changes"] = [c.to_json() for c in diff(before[0], current)]
        if not section["changes"]:
            section["note"] = f"same packages as release {previous['release']}"
    except (RegistryError, RegistryUnreachable) as exc:
        section["note"] = f"SBOMs could not be read: {str(exc)[:200]}"
    return section


def package_notes(section: dict[str, Any] | None, previous_release: str | None) -> str:
    """The Markdown lines release notes give one image: its SBOM, then its package changes
    (templates/packages.md.j2, which the notes template includes)."""
    return render_document("buildtool.release", "packages.md.j2", standalone=True, section=section,
                           previous_release=previous_release, limit=NOTES_LIMIT)
