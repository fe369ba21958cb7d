"""The release manifest (JSON, for machines) and release notes (Markdown, for people).

Both come from what `release` read from the registry: digests, verdicts, image labels and
manifest sizes, never from the work tree. They are deterministic (no wall-clock time), so
re-running a release rewrites identical files. Written to docs/releases/<version>.{json,md}.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from buildtool.attest.provenance_model import pinned_reference
from buildtool.common.documents import render_document
from buildtool.common.errors import UserError
from buildtool.common.files import write_atomic
from buildtool.contracts.image_labels import ImageLabels
from buildtool.contracts.releases import MANIFEST_SCHEMA, RELEASES_DIR
from buildtool.release.model import Evidence, ImageRelease, ReleaseReport
from buildtool.release.package_changes import NOTES_LIMIT


def versions_from_labels(labels: dict[str, str]) -> dict[str, str]:
    """framework/python/base and package versions an image's labels declare (contracts.image_labels:
    a label that does not parse is a LabelError naming it). The base is the matrix's upstream (base.upstream;
    older images name it in base.name), not the mirror a build happened to pull it from."""
    parsed = ImageLabels.parse(labels)
    found = {name: value for name, value in (("framework", parsed.framework_version), ("python", parsed.python),
                                             ("base", parsed.base_upstream or parsed.base_name)) if value}
    if parsed.framework and "framework" in found:
        found["framework"] = f"{parsed.framework} {found['framework']}"
    found.update(parsed.packages or {})
    found.update(parsed.package_labels)
    return dict(sorted(found.items()))


def _verdict_summary(ev: Evidence | None, item: ImageRelease) -> dict[str, Any]:
    ev = ev or Evidence("")     # no platform manifest read: no verdict, no skips, no signer
    v = ev.verdict
    tests = v.tests if v is not None else []
    # The platform the verdict was counted for: the index entry's, else (a single manifest) the one the verdict
    # records; a schema-4 verdict records neither its platform nor whether it ran emulated (None).
    return {
        "ref": ev.verdict_ref,
        "result": v.result if v is not None else None,
        "platform": ev.platform or (v.platform if v is not None and v.schema_ >= 5 else None),
        "emulated": v.emulated if v is not None and v.schema_ >= 5 else None,
        "started": v.started if v is not None else None,
        "test_code": v.test_code if v is not None else None,
        "runner": v.runner.hostname if v is not None else None,
        "signed_by": ev.signer,
        **{r: sum(1 for t in tests if t.result == r) for r in ("passed", "failed", "skipped")},
        "skipped_tests": ev.skips or [{"id": t.id, "reason": t.skip_reason} for t in tests if t.result == "skipped"],
        "ignored_attestations": list(item.ignored),
        "notes": [*item.notes, *(f"{e.platform}: {n}" if e.platform else n for e in item.evidence for n in e.notes)],
    }


def _provenance_summary(item: ImageRelease, ev: Evidence | None) -> dict[str, Any] | None:
    """Who built the image, from what: the signed provenance release checked."""
    if ev is None or ev.provenance is None or ev.provenance_artifact is None:
        return None
    p, artifact = ev.provenance, ev.provenance_artifact
    params, base = p.buildDefinition.externalParameters, p.base
    return {
        "ref": f"{item.source.rsplit(':', 1)[0]}@{artifact.digest}",
        "builder": p.runDetails.builder.id,
        "signed_by": ev.builder_signer,
        "revision": params.revision,
        "platform": params.platform,
        "base": pinned_reference(base) if base else None,
        "started": p.runDetails.metadata.startedOn,
        "finished": p.runDetails.metadata.finishedOn,
    }


def platform_entries(item: ImageRelease) -> list[dict[str, Any]]:
    """One entry per platform manifest: its platform, digest, size, and the verdict (result, whether it ran
    emulated) and provenance that let it through."""
    evidence = {ev.digest: ev for ev in item.evidence}
    out = []
    for p in item.platforms:
        ev = evidence.get(p.digest)
        summary = _verdict_summary(ev, item)
        out.append({"platform": p.platform or p.config_platform or "single", "digest": p.digest, "size": p.size,
                    "verdict": {k: summary[k] for k in ("ref", "result", "platform", "emulated", "runner", "started",
                                                        "signed_by", "passed", "failed", "skipped", "skipped_tests")},
                    "provenance": _provenance_summary(item, ev)})
    return out


def changes(item: ImageRelease) -> list[str]:
    """What differs from the previous release of the same cell, one line each."""
    prev = item.previous
    if prev is None:
        return ["first release of this image version"]
    if prev["digest"] == item.digest:
        return [f"same image as release {prev['release']} ({item.digest})"]
    before, after = versions_from_labels(prev.get("labels", {})), versions_from_labels(item.labels)
    lines = [f"{name}: {before.get(name, '(none)')} -> {after.get(name, '(none)')}"
             for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]
    delta = item.size - int(prev.get("size", 0))
    lines.append(f"size: {_mb(prev.get('size', 0))} -> {_mb(item.size)} ({'+' if delta >= 0 else ''}{_mb(delta)})")
    lines.append(f"digest: {prev['digest']} -> {item.digest}")
    return lines


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def build_manifest(report: ReleaseReport) -> dict[str, Any]:
    images = []
    for item in report.images:
        tags = [t.tag for t in item.tags if t.action in ("create", "move", "exists")]
        first = item.evidence[0] if item.evidence else None
        images.append({
            "cell": item.cell,
            "image": item.image,
            "repository": item.release_repo,
            "tags": tags,
            "references": [f"{item.release_repo}:{t}" for t in tags],
            "pinned": f"{item.release_repo}@{item.digest}",
            "digest": item.digest,
            "media_type": item.media_type,
            "size": item.size,
            "platforms": platform_entries(item),
            "versions": versions_from_labels(item.labels),
            "source": item.source,
            "source_commit": report.revision,
            # The first platform's (the only one's, for a single manifest); `platforms` has each one's.
            "verdict": _verdict_summary(first, item),
            "provenance": _provenance_summary(item, first),
            "previous": None if item.previous is None else
            {k: item.previous[k] for k in ("release", "tag", "digest", "size")},
            "changes": changes(item),
            "packages": item.packages,
            "not_moved": [{"tag": t.tag, "note": t.note} for t in item.tags if t.action == "keep"],
            "repaired": list(item.repaired),
        })
    return {"schema": MANIFEST_SCHEMA, "version": report.version, "source_commit": report.revision,
            "dirty": "-dirty." in report.revision, "images": images}


def render_notes(manifest: dict[str, Any]) -> str:
    """The release notes (templates/notes.md.j2) from the release manifest."""
    return render_document("buildtool.release", "notes.md.j2", filters={"mb": _mb}, limit=NOTES_LIMIT, **manifest)


def merge_manifests(old: dict[str, Any], new: dict[str, Any], source: str = "the earlier release manifest"
                    ) -> dict[str, Any]:
    """A release made in parts (`--framework a`, then `--framework b`) keeps every part;
    an image released again replaces its own entry. An earlier image without its own `source_commit` has the
    file's; one with neither (a file written before the field existed) is a UserError naming `source`."""
    by_cell = {img["cell"]: img for img in old.get("images", [])}
    by_cell.update({img["cell"]: img for img in new["images"]})
    without = [cell for cell, img in by_cell.items()
               if not isinstance(img.get("source_commit", old.get("source_commit")), str)]
    if without:
        raise UserError(f"{source}: image(s) {', '.join(without)} have no `source_commit` (written before it "
                        "existed): add the commit they were released from as `source_commit`, or release under "
                        "a new version")
    commits = sorted({img.get("source_commit", old.get("source_commit")) for img in by_cell.values()})
    merged = dict(new, images=list(by_cell.values()))
    merged["source_commit"] = commits[0] if len(commits) == 1 else ", ".join(commits)
    merged["dirty"] = any("-dirty." in c for c in commits)
    return merged


def write_release_files(root: Path, manifest: dict[str, Any], promoted: bool = True) -> list[Path]:
    """docs/releases/<version>.json and .md (merged with an earlier part of the same release).

    A re-run that promoted nothing leaves existing files alone: they record the release as it
    was made (a later release may have moved `latest` on since)."""
    folder = root / RELEASES_DIR
    json_path, md_path = folder / f"{manifest['version']}.json", folder / f"{manifest['version']}.md"
    if not promoted and json_path.is_file() and md_path.is_file():
        return []
    if json_path.is_file():
        old = _earlier(json_path)
        if old.get("version") == manifest["version"]:
            manifest = merge_manifests(old, manifest, str(json_path))
    write_atomic(json_path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    write_atomic(md_path, render_notes(manifest))
    return [json_path, md_path]


def _earlier(json_path: Path) -> dict[str, Any]:
    """An earlier part's release manifest; never read as {} (this part alone would overwrite the parts' record)."""
    try:
        old = json.loads(json_path.read_text())
        why = "" if isinstance(old, dict) else f"a JSON {type(old).__name__}, not an object"
    except ValueError as exc:
        why = f"not JSON: {str(exc)[:80]}"
    if why:
        raise UserError(f"{json_path}: cannot read the earlier release manifest ({why}); restore the file "
                        "`buildtool release` wrote (git checkout), or remove it")
    return old


def check_mergeable(root: Path, version: str) -> None:
    """The UserError write_release_files would raise on an earlier part of `version`, raised before any tag moves."""
    json_path = root / RELEASES_DIR / f"{version}.json"
    if json_path.is_file():
        old = _earlier(json_path)
        if old.get("version") == version:
            merge_manifests(old, {"images": []}, str(json_path))
