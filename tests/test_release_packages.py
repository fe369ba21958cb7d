"""The package part of release notes (release.packages): SBOM link and changes in the notes and
the release JSON, headline facts first; the cases with no SBOM say so instead of staying silent. An image
index gets one section per platform, each compared with the same platform's image in the previous release."""

from __future__ import annotations

import json

from buildtool.common.refs import split_repo_path
from buildtool.matrix.plan import Settings
from buildtool.registry.client import OCI_INDEX, OCI_MANIFEST
from buildtool.release.model import Evidence, ImageRelease, ReleaseOptions
from buildtool.release.notes import build_manifest, render_notes
from buildtool.release.package_changes import Subject, package_notes, package_section, packages_entry, subjects
from buildtool.release.promote import ReleaseReport, release
from buildtool.sbom.document import contents, diff, make_sbom, store_sbom
from tests import sbom_probe, signing
from tests.test_release_notes import D1, item
from tests.test_release_platforms import MULTI, REVISION, Dev

D0 = "sha256:" + "0" * 64
PROBE = sbom_probe.minimal({"torch": "2.13.0+cpu", "torch-tb-profiler": "0.4.3"}, {"bash": "5.2"})
FACTS = {"framework": "pytorch 2.13.0+cpu", "python": "3.11.2", "cuda": "", "base": "debian:bookworm-slim@sha256:1"}


def _section() -> dict:
    before = contents(make_sbom(PROBE, repository="r/x-dev", digest=D0, facts=FACTS, locks={}, identified={},
                                indexes=sbom_probe.INDEXES))
    probe = sbom_probe.probe_copy(PROBE)
    sbom_probe.set_python(probe, "torch-tb-profiler", None)
    sbom_probe.set_python(probe, "torch", "2.13.1+cpu")
    after = contents(make_sbom(probe, repository="r/x-dev", digest=D1, locks={}, identified={},
                               indexes=sbom_probe.INDEXES,
                               facts=dict(FACTS, framework="pytorch 2.13.1+cpu", base="debian@sha256:2")))
    return {"sbom": "r/pytorch-cpu@sha256:" + "a" * 64, "previous_sbom": "r/pytorch-cpu@sha256:" + "b" * 64,
            "facts": after.facts, "python_packages": 1, "apt_packages": 1,
            "changes": [c.to_json() for c in diff(before, after)], "note": ""}


def test_notes_list_the_sbom_and_every_change_headline_first() -> None:
    lines = package_notes(_section(), "0.1.0").splitlines()
    assert lines[0] == "- SBOM (CycloneDX, 1 Python and 1 Debian packages): `r/pytorch-cpu@sha256:" + "a" * 64 + "`"
    body = lines[lines.index("Package changes since release 0.1.0 (from the SBOMs):") + 2:]
    assert body == ["- 0 added, 1 removed, 1 changed",
                    "- framework: pytorch 2.13.0+cpu -> pytorch 2.13.1+cpu",
                    "- base: debian:bookworm-slim@sha256:1 -> debian@sha256:2",
                    "- REMOVED torch-tb-profiler (python) 0.4.3",   # removals before changes, as `buildtool diff`
                    "- torch (python): 2.13.0+cpu -> 2.13.1+cpu"]


def test_release_json_and_markdown_carry_the_package_section() -> None:
    released = item(previous={"release": "0.1.0", "tag": "2.13-0.1.0", "digest": D0, "size": 1, "labels": {}})
    released.packages = _section()
    manifest = build_manifest(ReleaseReport("0.2.0", "abc1234", [released]))
    assert manifest["images"][0]["packages"]["changes"][0]["name"] == "framework"
    notes = render_notes(json.loads(json.dumps(manifest)))
    assert "Package changes since release 0.1.0 (from the SBOMs):" in notes
    assert "- REMOVED torch-tb-profiler (python) 0.4.3" in notes


def test_missing_sboms_are_said_not_hidden() -> None:
    note = f"no SBOM is stored for {D1}: its packages and their changes are unknown"
    section = {"sbom": None, "changes": [], "note": note, "python_packages": 0, "apt_packages": 0}
    assert package_notes(section, "0.1.0").splitlines()[-1] == f"- {note}"
    assert package_notes(None, None).splitlines() == []


# -- an image index: one section per platform, each against the same platform's previous image ----------

def _document(digest: str, python: dict[str, str]) -> dict:
    return make_sbom(sbom_probe.minimal(python, {"bash": "5.2"}), repository="t/pytorch-cpu-dev", digest=digest,
                     facts=FACTS, locks={}, identified={}, indexes=sbom_probe.INDEXES)


def _validated(dev: Dev, arch: str, python: dict[str, str]) -> str:
    """A platform image of the dev index with its own SBOM (signed and plain), provenance and a verdict naming it."""
    digest = dev.image(arch)
    sbom = signing.attest_sbom(dev.client, dev.repo, digest, _document(digest, python))   # type: ignore[arg-type]
    signing.attach_provenance(dev.client, dev.repo, digest,   # type: ignore[arg-type]
                              signing.provenance(dev.cell, platform=f"linux/{arch}"))
    signing.attest(dev.client, dev.repo, digest, signing.verdict(   # type: ignore[arg-type]
        dev.cell, digest, "passed", platform=f"linux/{arch}", emulated=arch != "amd64", sbom=sbom))
    return digest


def _previous(dev: Dev, images: dict[str, dict[str, str] | None], index: bool = True) -> dict[str, str]:
    """Release 0.0.9 of the cell in the release repository: an index of `images` (arch -> its SBOM's Python
    packages; None: no SBOM), or the one image itself (not `index`). Returns arch -> that image's SBOM
    artifact (its platform digest where it has none)."""
    rel = split_repo_path(dev.plan.release_repo)[1]
    entries, sboms = [], {}
    for arch, python in images.items():
        digest = dev.image(arch, payload=f"0.0.9 {arch}".encode())   # another image than this release's
        raw = dev.client.get_manifest(dev.repo, digest)[0]
        dev.client.put_manifest(rel, digest if index else "2.13-0.0.9", raw, OCI_MANIFEST)
        sboms[arch] = digest if python is None else store_sbom(dev.client, rel, digest,   # type: ignore[arg-type]
                                                               _document(digest, python))
        entries.append({"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw),
                        "platform": {"os": "linux", "architecture": arch}})
    if index:
        body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
        dev.client.put_manifest(rel, "2.13-0.0.9", body, OCI_INDEX)
    return sboms


def _release(dev: Dev) -> ImageRelease:
    """`release` (a dry run: the package sections are planned before any write) of the dev index."""
    dev.client.ping = lambda: None   # type: ignore[attr-defined]
    options = ReleaseOptions("0.1.0", REVISION, dry_run=True, trusted=signing.trusted(),
                             known_code=signing.known_code(), source_check=signing.source_check())
    settings = Settings(registry=f"{dev.client.host}/t", release_registry=f"{dev.client.host}/t/rel")
    [item] = release([MULTI], settings, options, client_for=lambda host: dev.client).images   # type: ignore[arg-type,return-value]
    assert item.status == "dry-run", item.problems
    return item


def _changes(section: dict) -> list[str]:
    return [f"{c['kind']} {c['name']}" for c in section["changes"]]


def test_each_platform_of_an_index_has_its_own_package_changes_against_its_own_previous_image() -> None:
    dev = Dev()
    before = _previous(dev, {"amd64": {"torch": "2.12.0", "amd-only": "1"},
                             "arm64": {"torch": "2.12.0", "arm-only": "1"}})
    amd = _validated(dev, "amd64", {"torch": "2.13.0", "amd-only": "1"})
    arm = _validated(dev, "arm64", {"torch": "2.13.0", "arm-only": "2"})
    dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    packages = _release(dev).packages
    assert packages is not None and list(packages) == ["platforms"]
    amd64, arm64 = packages["platforms"]
    assert (amd64["platform"], amd64["digest"], arm64["platform"], arm64["digest"]) == \
        ("linux/amd64", amd, "linux/arm64", arm)
    # Each compared with the same platform's SBOM of release 0.0.9: no amd-only/arm-only cross-talk.
    assert amd64["previous_sbom"].endswith(before["amd64"]) and arm64["previous_sbom"].endswith(before["arm64"])
    assert _changes(amd64) == ["changed torch"]
    assert _changes(arm64) == ["changed arm-only", "changed torch"]
    notes = package_notes(packages, "0.0.9")
    assert "Packages of linux/amd64 (changes since release 0.0.9, from its SBOM):" in notes
    arm_block = notes.split("Packages of linux/arm64 (changes since release 0.0.9, from its SBOM):")[1]
    assert "- arm-only (python): 1 -> 2" in arm_block and "amd-only" not in arm_block


def _release_torch_2_13_on_both_platforms(dev: Dev) -> tuple[str, dict, dict]:
    """Validated amd64 and arm64 images with torch 2.13.0 under one index, released: the amd64
    image's digest and the release's package sections (amd64, arm64)."""
    amd = _validated(dev, "amd64", {"torch": "2.13.0"})
    arm = _validated(dev, "arm64", {"torch": "2.13.0"})
    dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    packages = _release(dev).packages
    assert packages is not None
    amd64, arm64 = packages["platforms"]
    return amd, amd64, arm64


def test_a_platform_new_in_this_release_is_said_new_not_diffed_against_another_platform() -> None:
    dev = Dev()
    before = _previous(dev, {"amd64": {"torch": "2.12.0"}}, index=False)   # a single amd64 manifest
    _, amd64, arm64 = _release_torch_2_13_on_both_platforms(dev)
    assert amd64["previous_sbom"].endswith(before["amd64"]) and _changes(amd64) == ["changed torch"]
    assert arm64["previous_sbom"] is None and arm64["changes"] == []
    assert arm64["note"] == "first release of linux/arm64: release 0.0.9 has no image for linux/arm64"


def test_a_missing_arm64_sbom_is_named_for_arm64_and_does_not_hide_amd64s_changes() -> None:
    dev = Dev()
    before = _previous(dev, {"amd64": {"torch": "2.12.0"}, "arm64": None})   # release 0.0.9's arm64: no SBOM
    amd, amd64, arm64 = _release_torch_2_13_on_both_platforms(dev)
    assert _changes(amd64) == ["changed torch"]
    assert arm64["note"] == (f"the previous release 0.0.9 ({before['arm64']}, linux/arm64) has no SBOM: "
                             "package changes unknown")
    # This release's own arm64 SBOM missing (read outside the gates, which refuse such an image).
    missing = "sha256:" + "9" * 64
    item = ImageRelease("c", "i", "s", "r", evidence=[Evidence(amd, "linux/amd64"), Evidence(missing, "linux/arm64")])
    found = subjects(item)
    sections = [package_section(dev.client, s, dev.plan.dev_repo, dev.plan.release_repo)   # type: ignore[arg-type]
                for s in found]
    amd64, arm64 = packages_entry(found, sections)["platforms"]
    assert amd64["sbom"] is not None and arm64["sbom"] is None
    assert arm64["note"] == f"no SBOM is stored for linux/arm64 ({missing}): its packages and their changes are unknown"
    assert f"- {arm64['note']}" in package_notes({"platforms": [amd64, arm64]}, None).split("linux/arm64 (from")[1]


def test_release_json_and_notes_of_an_index_carry_one_package_block_per_platform() -> None:
    released = item(previous={"release": "0.1.0", "tag": "2.13-0.1.0", "digest": D0, "size": 1, "labels": {}})
    arm = dict(_section(), platform="linux/arm64", digest=D1, changes=[], note="same packages as release 0.1.0")
    released.packages = {"platforms": [dict(_section(), platform="linux/amd64", digest=D0), arm]}
    manifest = json.loads(json.dumps(build_manifest(ReleaseReport("0.2.0", "abc1234", [released]))))
    assert [s["platform"] for s in manifest["images"][0]["packages"]["platforms"]] == ["linux/amd64", "linux/arm64"]
    notes = render_notes(manifest)
    amd_block, arm_block = notes.split("Packages of linux/amd64 (changes since release 0.1.0, from its SBOM):")[1] \
        .split("Packages of linux/arm64 (changes since release 0.1.0, from its SBOM):")
    assert "- REMOVED torch-tb-profiler (python) 0.4.3" in amd_block
    assert "- same packages as release 0.1.0" in arm_block and "torch-tb-profiler" not in arm_block.split("Changes")[0]
    assert "Package changes since release" not in notes   # the single-manifest heading is not used


def test_a_single_manifest_is_compared_with_its_previous_image_by_the_platform_its_config_declares() -> None:
    from buildtool.release.gates import Platform

    def single(declared: str, before: dict[str, str]) -> ImageRelease:
        return ImageRelease("c", "i", "s", "r", digest=D1,
                            platforms=[Platform("", D1, 1, {}, config_platform=declared)],
                            evidence=[Evidence(D1)],
                            previous={"release": "0.1.0", "digest": "sha256:p", "platforms": before})

    # After a single manifest: the cell's only image, whether or not one of them declares its platform.
    assert [s.previous_digest for s in subjects(single("linux/amd64", {"linux/amd64": "sha256:p"}))] == ["sha256:p"]
    assert [s.previous_digest for s in subjects(single("", {"linux/amd64": "sha256:p"}))] == ["sha256:p"]
    assert [s.previous_digest for s in subjects(single("linux/amd64", {"": "sha256:p"}))] == ["sha256:p"]
    # After an index: its entry of the same platform (the index digest has no SBOM), or none.
    assert [s.previous_digest for s in subjects(single("linux/arm64", {"linux/amd64": "sha256:a",
                                                                        "linux/arm64": "sha256:b"}))] == ["sha256:b"]
    assert [s.previous_digest for s in subjects(single("linux/arm64", {"linux/amd64": "sha256:a"}))] == [None]
    assert subjects(ImageRelease("c", "i", "s", "r", evidence=[Evidence(D1)])) == [Subject(D1)]   # first release
