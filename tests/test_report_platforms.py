"""The nightly report of a multi-platform cell (an image index: one verdict per platform manifest): every
platform is its own row, keyed by (cell, platform) in loading, the trend and the saved files, so one
platform's pass never hides another's failure; `report --fetch` reads each platform manifest's verdict
from the registry (the in-memory one, tests/memregistry.py) and names a platform that has none."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from buildtool.common.errors import UserError
from buildtool.contracts.gpu import BUSBW_FIGURE
from buildtool.matrix.schema import Cell
from buildtool.registry.client import OCI_INDEX, OCI_MANIFEST, NotFound, RegistryError
from buildtool.report import fetch
from buildtool.report.nightly import build_report, busbw_rows, render_html, render_markdown
from buildtool.report.rows import Row
from buildtool.report.verdict_files import load_verdicts, parse_verdict, save_verdicts
from tests import signing
from tests.conftest import fixture_matrix
from tests.memregistry import MemRegistry
from tests.test_report import DDP, SHM, test, verdict

CELL = "pytorch-cpu:2.13"
AMD, ARM = "linux/amd64", "linux/arm64"


def platform_verdict(platform: str, result: str, *, started: str = "2026-11-29T02:00:00", digest: str = "",
                     check: str = SHM, emulated: bool | None = None) -> dict[str, Any]:
    """A schema-5 verdict of CELL's `platform` image, whose check `check` had `result` (arm64: emulated)."""
    body = verdict(CELL, [test(check, result, "arm64 says no" if result == "failed" else ""), test(DDP, "passed")],
                   digest=digest or "sha256:" + ("aa" if platform == AMD else "bb") * 32, started=started, schema=5)
    return {**body, "platform": platform, "emulated": platform == ARM if emulated is None else emulated}


def write(folder: Path, verdicts: list[dict[str, Any]]) -> Path:
    """As validate leaves them: <cell>/<digest>/verdict.json."""
    for v in verdicts:
        path = folder / v["cell"].replace(":", "_") / v["digest"][7:19] / "verdict.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(v))
    return folder


# -- loading: one row per platform --------------------------------------------------------------------

def test_an_arm64_failure_is_a_row_of_its_own_and_counts_beside_a_newer_amd64_pass(tmp_path: Path) -> None:
    """The fail-open bug: keyed by cell, the newer amd64 pass hid the arm64 failure."""
    rows = load_verdicts(write(tmp_path, [platform_verdict(ARM, "failed", started="2026-11-29T01:00:00"),
                                          platform_verdict(AMD, "passed", started="2026-11-29T03:00:00")]))
    report = build_report(rows)
    assert sorted(r.result for r in report.rows) == ["failed", "passed"] and report.counts["failed"] == 1
    assert report.failed_images == [CELL]
    assert sorted((r.cell, r.platform, r.result) for r in rows) == [(CELL, AMD, "passed"), (CELL, ARM, "failed")]
    md = render_markdown(report)
    assert "1 images passed, 1 failed, 0 incomplete" in md
    assert f"- ❌ `{CELL}` on linux/arm64 (emulated) `{SHM}`: arm64 says no" in md
    assert "| image | platform | result |" in md
    assert f"| `{CELL}` | linux/arm64 (emulated) | ❌ **FAIL**" in md and f"| `{CELL}` | linux/amd64 | ✅ pass" in md
    page = render_html(report)
    assert '<td class="platform emulated">linux/arm64 (emulated)</td>' in page
    assert '<td class="platform">linux/amd64</td>' in page and 'data-platform="linux/arm64"' in page


def test_the_newest_verdict_wins_only_within_one_cell_and_platform(tmp_path: Path) -> None:
    rows = load_verdicts(write(tmp_path, [
        platform_verdict(ARM, "failed", started="2026-11-28T02:00:00", digest="sha256:" + "01" * 32),
        platform_verdict(ARM, "passed", started="2026-11-29T02:00:00", digest="sha256:" + "02" * 32),
        platform_verdict(AMD, "failed", started="2026-11-27T02:00:00")]))
    assert sorted((r.result, r.digest[7:9]) for r in rows) == [("failed", "aa"), ("passed", "02")]
    assert sorted((r.platform, r.result, r.digest[7:9]) for r in rows) == [(AMD, "failed", "aa"),
                                                                         (ARM, "passed", "02")]


def test_a_schema_4_verdict_is_the_single_images_only_platform(tmp_path: Path) -> None:
    """A schema-4 verdict records no platform; beside one recorded platform of the cell it is that image (the
    newest wins, as before); beside two it is an older single image, kept as a row of its own."""
    old = verdict(CELL, [test(SHM, "failed", "old")], digest="sha256:" + "04" * 32, started="2026-11-28T02:00:00")
    rows = load_verdicts(write(tmp_path / "one", [old, platform_verdict(AMD, "passed")]))
    assert [(r.platform, r.result) for r in rows] == [(AMD, "passed")]
    rows = load_verdicts(write(tmp_path / "two", [old, platform_verdict(AMD, "passed"),
                                                  platform_verdict(ARM, "passed")]))
    assert sorted((r.platform, r.result) for r in rows) == [("", "failed"), (AMD, "passed"), (ARM, "passed")]
    md = render_markdown(build_report(rows))
    assert f"| `{CELL}` | single image, platform not recorded | ❌ **FAIL**" in md


def test_a_missing_record_names_a_known_platform_or_is_refused(tmp_path: Path) -> None:
    record = {"missing": True, "cell": CELL, "image": "r/x:abc", "reason": "no verdict", "platform": ARM}
    assert parse_verdict(record, "m").platform == ARM and parse_verdict(record, "m").result == "failed"
    (tmp_path / "c.verdict.json").write_text(json.dumps(dict(record, platform="linux/s390x")))
    with pytest.raises(UserError, match=r"c\.verdict\.json: malformed missing-verdict record: .*platform.*"
                                        r"unknown platform 'linux/s390x'"):
        load_verdicts(tmp_path)


# -- the trend: the same cell and platform ------------------------------------------------------------------

def test_the_trend_compares_each_platform_with_its_own_previous_night() -> None:
    """Last night amd64 failed and arm64 passed; tonight both fail: arm64 is newly failing, amd64 is not
    (keyed by cell, arm64 was compared with amd64's failure and nothing was new)."""
    before = [parse_verdict(platform_verdict(ARM, "passed"), "b"), parse_verdict(platform_verdict(AMD, "failed"), "b")]
    now = [parse_verdict(platform_verdict(AMD, "failed"), "n"), parse_verdict(platform_verdict(ARM, "failed"), "n")]
    report = build_report(now, before)
    assert [(t.cell, t.platform, t.check, t.before) for t in report.newly_failing] == [(CELL, ARM, SHM, "passed")]
    assert [r.platform for r in report.rows] == [ARM, AMD]          # the newly failing platform first
    md = render_markdown(report)
    assert f"- ❌ `{CELL}` on linux/arm64 (emulated) `{SHM}` (was passed)" in md
    fixed = build_report(before, now)
    assert [(t.platform, t.check) for t in fixed.fixed] == [(ARM, SHM)] and fixed.newly_failing == []


def test_the_trend_pairs_a_schema_4_night_with_the_same_single_image_recorded() -> None:
    """The night verdicts began to record platforms: a single-platform cell's schema-4 verdict and its
    schema-5 one are the same image, so the trend still sees what is newly failing."""
    before = [parse_verdict(verdict(CELL, [test(SHM, "passed")]), "b")]
    now = [parse_verdict(platform_verdict(AMD, "failed"), "n")]
    assert [(t.platform, t.check) for t in build_report(now, before).newly_failing] == [(AMD, SHM)]


def test_bus_bandwidth_is_compared_with_the_same_platforms_previous_night() -> None:
    """A verdict without its own baseline is compared with last night's figure of the same cell and platform."""
    def night(amd: float, arm: float) -> list[Row]:
        rows = []
        for platform, peak in ((AMD, amd), (ARM, arm)):
            body = platform_verdict(platform, "passed", emulated=False)
            body["figures"] = {BUSBW_FIGURE: {"peak_GBps": peak, "ranks": 8, "gpu_model": "G"}}
            rows.append(parse_verdict(body, platform))
        return rows

    report = build_report(night(300.0, 90.0), night(310.0, 100.0))
    found = {b.platform: (b.previous_GBps, b.verdict) for b in busbw_rows(report)}
    assert found == {AMD: (310.0, "no floor for this model"), ARM: (100.0, "no floor for this model")}
    assert f"| `{CELL}` on linux/arm64 | 8x G | 90.0 GB/s |" in render_markdown(report)


# -- saving: a file per platform ---------------------------------------------------------------------------

def test_saved_files_of_two_platforms_are_distinct_and_single_platform_names_are_as_before(tmp_path: Path) -> None:
    records = [platform_verdict(AMD, "passed"), platform_verdict(ARM, "failed"),
               verdict("tensorflow-cpu:2.21", [test(SHM, "passed")], schema=5)]
    paths = save_verdicts(records, tmp_path)
    assert sorted(p.name for p in paths) == ["pytorch-cpu_2.13.linux-amd64.verdict.json",
                                             "pytorch-cpu_2.13.linux-arm64.verdict.json",
                                             "tensorflow-cpu_2.21.verdict.json"]
    assert sorted((r.cell, r.platform, r.result) for r in load_verdicts(tmp_path)) == [
        (CELL, AMD, "passed"), (CELL, ARM, "failed"), ("tensorflow-cpu:2.21", AMD, "passed")]


def test_two_records_that_would_share_a_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"pytorch-cpu_2\.13\.linux-arm64\.verdict\.json: two fetched records"):
        save_verdicts([platform_verdict(ARM, "passed"), platform_verdict(ARM, "failed")], tmp_path)
    assert not list(tmp_path.iterdir())        # nothing half written


# -- fetching: each platform manifest's verdict from the registry ------------------------------------------

MULTI = dataclasses.replace({c.key: c for c in fixture_matrix().cells}[CELL], platforms=(AMD, ARM))
REPO = "t/pytorch-cpu-dev"


class Registry(MemRegistry):
    def image(self, arch: str, payload: bytes) -> str:
        return self.push_image(REPO, f"{arch}-{payload.hex()}", payload, architecture=arch)

    def validated(self, arch: str, payload: bytes, result: str = "passed", recorded: str = "") -> str:
        digest = self.image(arch, payload)
        failed = [signing.result("common/test_shm.py::test_shm", "failed")] if result == "failed" else None
        body = signing.verdict(MULTI, digest, result, tests=failed, platform=recorded or f"linux/{arch}",
                               emulated=arch == "arm64")
        if failed:
            body["pytest_exit"] = 1
        signing.attest(self, REPO, digest, body)   # type: ignore[arg-type]
        return digest

    def index(self, tag: str, children: list[tuple[str, str]]) -> str:
        entries = [{"mediaType": OCI_MANIFEST, "digest": d, "size": len(self.get_manifest(REPO, d)[0]),
                    "platform": {"os": "linux", "architecture": arch}} for d, arch in children]
        body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
        return self.put_manifest(REPO, tag, body, OCI_INDEX)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Registry:
    found = Registry()
    monkeypatch.setattr(fetch, "RegistryClient", lambda host, **_: found)
    return found


def _fetch(registry: Registry, tags: dict[str, str], cell: Cell = MULTI) -> list[dict[str, Any]]:
    return fetch.fetch_verdicts({key: f"{registry.host}/{REPO}:{tag}" for key, tag in tags.items()},
                                signing.trusted(), platforms={key: cell.platforms for key in tags})


def test_fetch_reads_each_platforms_verdict_and_an_arm64_failure_counts(registry: Registry, tmp_path: Path) -> None:
    amd, arm = registry.validated("amd64", b"a"), registry.validated("arm64", b"b", "failed")
    registry.index("abc-2.13", [(amd, "amd64"), (arm, "arm64")])
    fetched = _fetch(registry, {CELL: "abc-2.13"})
    assert [v.get("missing", False) for v in fetched] == [False, False]      # a verdict of each platform
    assert [(v["platform"], v["digest"], v["result"], v["size_bytes"]) for v in fetched] == [
        (AMD, amd, "passed", 1), (ARM, arm, "failed", 1)]
    save_verdicts(fetched, tmp_path)
    report = build_report(load_verdicts(tmp_path))
    assert sorted((r.platform, r.result) for r in report.rows) == [(AMD, "passed"), (ARM, "failed")]
    assert report.counts["failed"] == 1


def test_fetch_names_a_platform_without_a_verdict_or_without_an_image(registry: Registry, tmp_path: Path) -> None:
    amd = registry.validated("amd64", b"a")
    arm = registry.image("arm64", b"b")                      # built, never validated
    registry.index("abc-2.13", [(amd, "amd64"), (arm, "arm64")])
    registry.index("amd-only-2.13", [(amd, "amd64")])      # the arm64 build failed
    registry.push_image(REPO, "single-2.13", b"s")          # a single manifest where the matrix says two
    fetched = _fetch(registry, {CELL: "abc-2.13", "jax-cpu:0.10": "amd-only-2.13", "x:1": "single-2.13",
                                "y:1": "never-built-2.13"})
    by = {(v["cell"], v.get("platform", "")): v for v in fetched}
    assert set(by) == {(CELL, AMD), (CELL, ARM), ("jax-cpu:0.10", AMD), ("jax-cpu:0.10", ARM),
                       ("x:1", AMD), ("x:1", ARM), ("y:1", AMD), ("y:1", ARM)}
    unvalidated = by[(CELL, ARM)]
    assert unvalidated["missing"] is True and unvalidated["digest"] == arm
    assert f"abc-2.13 linux/arm64 image {arm} has no verdict" in unvalidated["reason"]
    assert "without a linux/arm64 image" in by[("jax-cpu:0.10", ARM)]["reason"]
    assert "is an index of linux/amd64" in by[("jax-cpu:0.10", ARM)]["reason"]
    assert "single image manifest, but the matrix gives x:1 the platforms linux/amd64, linux/arm64" \
        in by[("x:1", ARM)]["reason"] and by[("x:1", AMD)]["missing"] is True
    assert "no image" in by[("y:1", ARM)]["reason"]
    save_verdicts(fetched, tmp_path)
    rows = {(r.cell, r.platform): r for r in load_verdicts(tmp_path)}
    assert len(rows) == 8 and rows[(CELL, ARM)].result == "failed"
    assert "has no verdict" in rows[(CELL, ARM)].checks["image/verdict"].message
    md = render_markdown(build_report(list(rows.values())))
    assert f"- ❌ `{CELL}` on linux/arm64 `image/verdict`: " in md


def test_fetch_records_a_child_manifest_the_registry_no_longer_has_and_goes_on(
        registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index naming a platform manifest the registry lacks: NotFound no longer aborts `report --fetch`. Gone
    before the index is read, the strict index read fails and every platform of the cell is missing, naming it
    (as release refuses such an index); gone between that read and the platform's own (deleted meanwhile), that
    platform is missing and the other keeps its verdict (NotFound escaped and ended the whole fetch)."""
    amd, arm = registry.validated("amd64", b"a"), registry.validated("arm64", b"b")
    registry.index("abc-2.13", [(amd, "amd64"), (arm, "arm64")])
    reads: list[str] = []
    real = registry.get_manifest

    def get_manifest(repo: str, ref: str) -> tuple[bytes, str, str]:
        reads.append(ref)
        if ref == arm and reads.count(arm) > 1:
            raise NotFound(f"{repo}:{ref} not found")
        return real(repo, ref)
    monkeypatch.setattr(registry, "get_manifest", get_manifest)
    fetched = _fetch(registry, {CELL: "abc-2.13"})
    assert [(v["platform"], v.get("missing", False)) for v in fetched] == [(AMD, False), (ARM, True)]
    assert fetched[1]["digest"] == arm and fetched[1]["reason"] == (
        f"{registry.host}/{REPO}:abc-2.13 names a linux/arm64 image {arm} the registry no longer has; push the "
        "cell again")
    monkeypatch.delattr(registry, "get_manifest")      # the registry's own again
    del registry.manifests[(REPO, arm)]
    fetched = _fetch(registry, {CELL: "abc-2.13"})
    assert [(v["platform"], v.get("missing", False)) for v in fetched] == [(AMD, True), (ARM, True)]
    assert all(f"its image index cannot be read: {REPO}:{arm} not found" in v["reason"] for v in fetched)


def test_fetch_refuses_a_verdict_that_records_another_platform(registry: Registry) -> None:
    """The arm64 manifest's verdict says linux/amd64: counted as it says, it would be keyed as amd64's and
    one would hide the other. As release, it does not count for arm64."""
    amd, arm = registry.validated("amd64", b"a"), registry.validated("arm64", b"b", recorded=AMD)
    registry.index("abc-2.13", [(amd, "amd64"), (arm, "arm64")])
    fetched = _fetch(registry, {CELL: "abc-2.13"})
    assert [(v["platform"], v.get("missing", False)) for v in fetched] == [(AMD, False), (ARM, True)]
    assert "records platform linux/amd64, not linux/arm64" in fetched[1]["reason"]


def test_fetch_of_a_single_platform_cell_is_as_before(registry: Registry, tmp_path: Path) -> None:
    single = dataclasses.replace(MULTI, platforms=(AMD,))
    digest = registry.validated("amd64", b"a")
    registry.put_manifest(REPO, "abc-2.13", registry.get_manifest(REPO, digest)[0], OCI_MANIFEST)
    fetched = _fetch(registry, {CELL: "abc-2.13", "y:1": "never-built-2.13"}, single)
    assert [(v["cell"], v["digest"], v.get("platform")) for v in fetched] == [(CELL, digest, AMD), ("y:1", "", None)]
    assert [p.name for p in save_verdicts(fetched, tmp_path)] == ["pytorch-cpu_2.13.verdict.json", "y_1.verdict.json"]


def test_the_report_reads_verdicts_as_release_does_and_shows_what_blocks(registry: Registry) -> None:
    """Issue 48: the report's reading is release's (validate.verdicts): a listed artifact that is not in the
    registry blocks, and the report's row says so rather than showing the older pass."""
    amd, arm = registry.validated("amd64", b"a"), registry.validated("arm64", b"b")
    registry.index("abc-2.13", [(amd, "amd64"), (arm, "arm64")])
    raw, media_type, _ = registry.get_manifest(REPO, f"sha256-{arm.partition(':')[2]}")
    index = json.loads(raw)
    index["manifests"].append({"mediaType": OCI_MANIFEST, "digest": "sha256:" + "9" * 64, "size": 1})
    registry.put_manifest(REPO, f"sha256-{arm.partition(':')[2]}", json.dumps(index).encode(), media_type)
    by = {v["platform"]: v for v in _fetch(registry, {CELL: "abc-2.13"})}
    assert by[AMD]["result"] == "passed"
    assert by[ARM]["missing"] is True and "a verdict cannot be read or typed: sha256:99" in by[ARM]["reason"]


def test_fetch_of_a_manifest_that_is_not_json_is_one_error_naming_the_reference(registry: Registry) -> None:
    """A dev tag whose manifest is not JSON (or an image whose layer sizes are not integers) is a bad answer of the
    registry: one RegistryError naming the reference (exit 1), not a JSONDecodeError's traceback."""
    registry.put_manifest(REPO, "garbled-2.13", b"not json", OCI_MANIFEST)
    with pytest.raises(RegistryError, match=rf"^{registry.host}/{REPO}:garbled-2.13 \(digest sha256:[0-9a-f]{{64}}\): "
                                            r"the registry's manifest is not JSON \(Expecting value"):
        _fetch(registry, {CELL: "garbled-2.13"}, dataclasses.replace(MULTI, platforms=(AMD,)))
    registry.put_manifest(REPO, "list-2.13", b"[]", OCI_MANIFEST)
    with pytest.raises(RegistryError, match="list-2.13 .*: the registry's manifest is not a JSON object"):
        _fetch(registry, {CELL: "list-2.13"}, dataclasses.replace(MULTI, platforms=(AMD,)))
    digest = registry.validated("amd64", b"a")
    manifest = json.loads(registry.get_manifest(REPO, digest)[0])
    manifest["layers"][0]["size"] = "big"
    big = registry.put_manifest(REPO, "big-2.13", json.dumps(manifest).encode(), OCI_MANIFEST)
    signing.attest(registry, REPO, big, signing.verdict(MULTI, big, "passed", platform=AMD))  # type: ignore[arg-type]
    with pytest.raises(RegistryError, match="big-2.13: the registry's manifest gives a layer the size 'big', not a "
                                            "non-negative integer"):
        _fetch(registry, {CELL: "big-2.13"}, dataclasses.replace(MULTI, platforms=(AMD,)))


def test_fetch_refuses_an_image_whose_verdict_pin_was_overwritten_as_release_does(registry: Registry,
                                                                                  tmp_path: Path) -> None:
    """A verdict pin tag pointed at another manifest is tampering: release, verify and reuse refuse the image. The
    report showed the verdict that still counts (a pass) with no word; now the image is a missing record, failed,
    with release's reason."""
    from buildtool.contracts.names import verdict_pin_tag

    digest = registry.validated("amd64", b"a")
    registry.put_manifest(REPO, "abc-2.13", registry.get_manifest(REPO, digest)[0], OCI_MANIFEST)
    tag = next(t for t in registry.tags(REPO) if t.startswith(verdict_pin_tag(digest, "sha256:" + "0" * 64)[:-32]))
    other = registry.image("amd64", b"other")
    registry.put_manifest(REPO, tag, registry.get_manifest(REPO, other)[0], OCI_MANIFEST)
    [fetched] = _fetch(registry, {CELL: "abc-2.13"}, dataclasses.replace(MULTI, platforms=(AMD,)))
    assert fetched["missing"] is True and fetched["digest"] == digest
    assert fetched["reason"] == (f"{registry.host}/{REPO}:abc-2.13: a verdict of {digest} was overwritten in the "
                                 f"registry ({tag} now names {other}): the registry was tampered with; find out who "
                                 "wrote it, then validate the image again")
    save_verdicts([fetched], tmp_path)
    report = build_report(load_verdicts(tmp_path))
    assert [r.result for r in report.rows] == ["failed"] and report.failed_images == [CELL]
