"""The package part of release notes (release.packages): SBOM link and changes in the notes and
the release JSON, headline facts first; the cases with no SBOM say so instead of staying silent."""

from __future__ import annotations

import json

from buildtool.registry.sbom import contents, diff, make_sbom
from buildtool.release.notes import build_manifest, render_notes
from buildtool.release.packages import package_notes
from buildtool.release.promote import ReleaseReport
from tests import sbom_probe
from tests.test_release_notes import D1, item

D0 = "sha256:" + "0" * 64
PROBE = sbom_probe.minimal({"torch": "2.13.0+cpu", "torch-tb-profiler": "0.4.3"}, {"bash": "5.2"})
FACTS = {"framework": "pytorch 2.13.0+cpu", "python": "3.11.2", "cuda": "", "base": "debian:bookworm-slim@sha256:1"}


def _section() -> dict:
    before = contents(make_sbom(PROBE, repository="r/x-dev", digest=D0, facts=FACTS, locks={}, identified={}))
    probe = sbom_probe.probe_copy(PROBE)
    sbom_probe.set_python(probe, "torch-tb-profiler", None)
    sbom_probe.set_python(probe, "torch", "2.13.1+cpu")
    after = contents(make_sbom(probe, repository="r/x-dev", digest=D1, locks={}, identified={},
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
