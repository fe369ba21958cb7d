"""Release manifest and notes from a report: deterministic, merged by cell, what changed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from buildtool.contracts import label_keys
from buildtool.contracts.verdict import parse_verdict
from buildtool.release.model import Evidence
from buildtool.release.notes import build_manifest, changes, render_notes, versions_from_labels, write_release_files
from buildtool.release.promote import ImageRelease, Platform, ReleaseReport, TagAction
from tests.signing import complete

D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
LABELS = {label_keys.FRAMEWORK: "pytorch", label_keys.FRAMEWORK_VERSION: "2.13.0+cpu",
          label_keys.PYTHON: "3.11", label_keys.PACKAGES: json.dumps({"tensorboard": "2.21.0"}),
          f"{label_keys.PACKAGE_PREFIX}torch-tb-profiler": "0.4.3", "unrelated": "x"}


def item(cell: str = "pytorch-cpu:2.13", digest: str = D1, size: int = 2_000_000, labels: dict | None = None,
         previous: dict | None = None) -> ImageRelease:
    it = ImageRelease(cell=cell, image=cell.split(":")[0], source=f"r/{cell.split(':')[0]}-dev:abc-2.13",
                      release_repo=f"r/{cell.split(':')[0]}", digest=digest, media_type="x",
                      platforms=[Platform("", digest, size, labels if labels is not None else LABELS)],
                      evidence=[Evidence(digest, verdict=parse_verdict(complete({
                          "result": "passed", "started": "t", "test_code": "c", "runner": {"hostname": "h"},
                          "tests": [{"id": "a", "result": "passed"},
                                    {"id": "b", "result": "skipped", "skip_reason": "no GPU here"}]}), "x"),
                          verdict_ref=f"r/x-dev@{D2}")],
                      tags=[TagAction("2.13-0.2.0", False, None, "create"), TagAction("2.13", True, D2, "move"),
                            TagAction("latest", True, D2, "keep", "stays on release 0.3.0 (newer)")],
                      status="promoted", previous=previous)
    return it


def test_versions_from_labels() -> None:
    assert versions_from_labels(LABELS) == {"framework": "pytorch 2.13.0+cpu", "python": "3.11",
                                            "tensorboard": "2.21.0", "torch-tb-profiler": "0.4.3"}


def test_the_notes_name_the_upstream_base_not_the_mirror_it_was_pulled_from() -> None:
    upstream = "docker.io/library/debian:bookworm-slim"
    mirrored = {**LABELS, label_keys.OCI_BASE_NAME: f"127.0.0.1:5000/{upstream.split('/', 1)[1]}",
                label_keys.BASE_UPSTREAM: upstream}
    assert versions_from_labels(mirrored)["base"] == upstream
    assert versions_from_labels({**LABELS, label_keys.OCI_BASE_NAME: upstream})["base"] == upstream   # older images


def test_first_release_and_same_image() -> None:
    assert changes(item()) == ["first release of this image version"]
    same = item(previous={"release": "0.1.0", "tag": "2.13-0.1.0", "digest": D1, "size": 1, "labels": {}})
    assert changes(same) == [f"same image as release 0.1.0 ({D1})"]


def test_changes_list_versions_size_and_digest() -> None:
    old = dict(LABELS, **{label_keys.FRAMEWORK_VERSION: "2.12.0+cpu"})
    lines = changes(item(previous={"release": "0.1.0", "tag": "2.13-0.1.0", "digest": D2, "size": 1_500_000,
                                   "labels": old}))
    assert lines == ["framework: pytorch 2.12.0+cpu -> pytorch 2.13.0+cpu", "size: 1.5 MB -> 2.0 MB (+0.5 MB)",
                     f"digest: {D2} -> {D1}"]


def test_manifest_lists_tags_that_point_at_the_digest_only() -> None:
    manifest = build_manifest(ReleaseReport("0.2.0", "abc", [item()]))
    [img] = manifest["images"]
    assert img["tags"] == ["2.13-0.2.0", "2.13"]
    assert img["not_moved"] == [{"tag": "latest", "note": "stays on release 0.3.0 (newer)"}]
    assert img["verdict"]["passed"] == 1 and img["verdict"]["skipped_tests"] == [{"id": "b", "reason": "no GPU here"}]
    notes = render_notes(manifest)
    assert "Skipped (allowed by the matrix): b: no GPU here" in notes and "Not moved: `latest`" in notes


def test_files_are_deterministic_merged_and_kept_on_noop(tmp_path: Path) -> None:
    first = build_manifest(ReleaseReport("0.2.0", "abc", [item()]))
    paths = write_release_files(tmp_path, first)
    assert [p.name for p in paths] == ["0.2.0.json", "0.2.0.md"]
    text = paths[0].read_text()
    write_release_files(tmp_path, first)
    assert paths[0].read_text() == text
    second = build_manifest(ReleaseReport("0.2.0", "def", [item("tensorflow-cpu:2.21", D2)]))
    write_release_files(tmp_path, second)
    merged = json.loads(paths[0].read_text())
    assert [i["cell"] for i in merged["images"]] == ["pytorch-cpu:2.13", "tensorflow-cpu:2.21"]
    assert merged["source_commit"] == "abc, def"
    assert write_release_files(tmp_path, first, promoted=False) == []     # a no-op re-run keeps the record
    assert json.loads(paths[0].read_text()) == merged
    assert not list(tmp_path.rglob(".0.2.0*"))                               # no temp files left


def test_catalogue_helpers_read_releases_in_version_order(tmp_path: Path) -> None:
    from buildtool.contracts.releases import latest_by_cell, load_release_manifests

    write_release_files(tmp_path, build_manifest(ReleaseReport("0.10.0", "b", [item(digest=D2)])))
    write_release_files(tmp_path, build_manifest(ReleaseReport("0.9.0", "a", [item(digest=D1)])))
    (tmp_path / "docs/releases/notes.json").write_text("{}")          # ignored: not a release manifest
    assert [m["version"] for m in load_release_manifests(tmp_path)] == ["0.9.0", "0.10.0"]
    assert latest_by_cell(tmp_path)["pytorch-cpu:2.13"] == {
        "release": "0.10.0", "tags": ["2.13-0.2.0", "2.13"], "pinned": f"r/pytorch-cpu@{D2}", "digest": D2,
        "sbom": None, "platforms": [{"platform": "single", "digest": D2, "emulated": False}]}


@pytest.mark.parametrize(("text", "cause"), [
    ("[]", "a JSON list, not an object"),
    ("{", "Expecting property name"),
    ('{"version": "0.2.0", "images": []}', "its version is '0.2.0', not the file name's"),
    ('{"version": "0.1.0", "images": {}}', "`images` is not a list of objects"),
    ('{"version": "0.1.0", "images": [{"tags": []}]}', "image 0 (no cell): cell, pinned, digest missing or of "
                                                       "another type"),
    ('{"version": "0.1.0", "images": [{"cell": "c", "tags": [], "pinned": "p", "digest": "d", "packages": "x"}]}',
     "image 0 (c): packages missing or of another type"),
])
def test_a_release_manifest_the_catalogue_cannot_read_is_one_line_naming_it(tmp_path: Path, text: str,
                                                                            cause: str) -> None:
    """docs/releases/<version>.json is a file release wrote: one the catalogue cannot read fails closed, naming
    it (was a TypeError or KeyError traceback), rather than being skipped (an older release listed as the newest).
    A file not named by a version is not a release manifest and is still left alone."""
    from buildtool.common.errors import UserError
    from buildtool.contracts.releases import latest_by_cell

    write_release_files(tmp_path, build_manifest(ReleaseReport("0.0.9", "a", [item(digest=D1)])))
    path = tmp_path / "docs/releases/0.1.0.json"
    path.write_text(text)
    with pytest.raises(UserError, match=re.escape(f"{path}: cannot read the release manifest (") + re.escape(cause)):
        latest_by_cell(tmp_path)
    path.unlink()
    (tmp_path / "docs/releases/notes.json").write_text("[]")
    assert latest_by_cell(tmp_path)["pytorch-cpu:2.13"]["release"] == "0.0.9"


def test_a_release_file_without_source_commit_is_refused_naming_file_and_field(tmp_path: Path) -> None:
    """A part released into a file written before `source_commit` existed raised TypeError (None against str)."""
    from buildtool.common.errors import UserError

    first = build_manifest(ReleaseReport("0.2.0", "abc", [item()]))
    write_release_files(tmp_path, first)
    path = tmp_path / "docs/releases/0.2.0.json"
    legacy = json.loads(path.read_text())
    del legacy["source_commit"]
    for img in legacy["images"]:
        del img["source_commit"]
    path.write_text(json.dumps(legacy))
    second = build_manifest(ReleaseReport("0.2.0", "def", [item("tensorflow-cpu:2.21", D2)]))
    with pytest.raises(UserError) as caught:
        write_release_files(tmp_path, second)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "`source_commit`" in message and "pytorch-cpu:2.13" in message
    assert "\n" not in message
    assert json.loads(path.read_text()) == legacy                           # the earlier record is kept


@pytest.mark.parametrize(("text", "why"), [("{not json", "not JSON"), ("[1, 2]", "a JSON list, not an object")])
def test_an_earlier_release_file_that_cannot_be_read_is_refused_not_overwritten(tmp_path: Path, text: str,
                                                                                 why: str) -> None:
    """An earlier part's file that was not JSON was read as {} and overwritten by this part alone (the earlier parts'
    record lost), and one holding a JSON list raised AttributeError; now both are refused, naming the file."""
    from buildtool.common.errors import UserError

    path = tmp_path / "docs/releases/0.2.0.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(UserError) as caught:
        write_release_files(tmp_path, build_manifest(ReleaseReport("0.2.0", "abc", [item()])))
    assert str(caught.value).startswith(f"{path}: cannot read the earlier release manifest ({why}")
    assert path.read_text() == text and not (tmp_path / "docs/releases/0.2.0.md").exists()
