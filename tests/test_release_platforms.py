"""Release of a multi-platform dev image (an OCI image index): every platform manifest is gated on its own
signed verdict, SBOM and provenance, found by its own digest, and a refusal names the platform. No registry
process: the in-memory one (tests/memregistry.py) takes the writes anyone with push access can make."""

from __future__ import annotations

import dataclasses
import json

import pytest

from buildtool.common.refs import split_repo_path
from buildtool.contracts import label_keys
from buildtool.matrix.plan import CellPlan, Settings, plan_cell
from buildtool.matrix.schema import Cell
from buildtool.registry.client import OCI_INDEX, OCI_MANIFEST
from buildtool.release.gates import entry_problems, index_entries
from buildtool.release.gather import gather
from buildtool.release.model import ImageRelease, ReleaseOptions
from buildtool.release.notes import build_manifest, render_notes
from buildtool.release.promote import ReleaseReport
from tests import signing
from tests.conftest import fixture_matrix
from tests.memregistry import MemRegistry

CPU = {c.key: c for c in fixture_matrix().cells}["pytorch-cpu:2.13"]
GPU = {c.key: c for c in fixture_matrix().cells}["pytorch-cuda:2.13"]
MULTI = dataclasses.replace(CPU, platforms=("linux/amd64", "linux/arm64"), emulation_factor=4)
MULTI_GPU = dataclasses.replace(GPU, platforms=("linux/amd64", "linux/arm64"), emulation_factor=4)
# The dev tag of the commit the fixtures' provenances name (signing.provenance: HEAD): release compares the two.
REVISION = signing.head_commit()[:12]


def labels(cell: Cell = MULTI) -> dict[str, str]:
    return {label_keys.CELL: cell.key, label_keys.FRAMEWORK: cell.framework,
            label_keys.FRAMEWORK_VERSION: cell.framework_version, label_keys.PYTHON: cell.python,
            label_keys.OCI_BASE_NAME: cell.base, label_keys.OCI_BASE_DIGEST: signing.BASE_DIGEST}


class Dev:
    """A cell's dev image in the in-memory registry: platform images, then the index at the dev tag."""

    def __init__(self, cell: Cell = MULTI) -> None:
        self.cell = cell
        self.client = MemRegistry()
        self.plan: CellPlan = plan_cell(cell, Settings(registry=f"{self.client.host}/t",
                                                       release_registry=f"{self.client.host}/t/rel"),
                                        REVISION, "0.1.0")
        self.repo = split_repo_path(self.plan.dev_repo)[1]

    def image(self, arch: str, config_arch: str | None = None, payload: bytes | None = None,
              extra_labels: dict[str, str] | None = None) -> str:
        """One platform's image (its config declaring `config_arch`, default `arch`; `extra_labels` beside the
        cell's); returns its digest."""
        config = json.dumps({"architecture": config_arch or arch, "os": "linux",
                             "config": {"Labels": {**labels(self.cell), **(extra_labels or {})}}}).encode()
        layer = payload or arch.encode() * 64
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                               "digest": self.client.put_blob(self.repo, config), "size": len(config)},
                    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                "digest": self.client.put_blob(self.repo, layer), "size": len(layer)}]}
        raw = json.dumps(manifest).encode()
        from buildtool.registry.client import sha256_digest

        return self.client.put_manifest(self.repo, sha256_digest(raw), raw, OCI_MANIFEST)

    def validated(self, arch: str, result: str = "passed", emulated: bool | None = None, **verdict: object) -> str:
        """A platform image as push and validate leave it: SBOM and provenance signed by the builder, a
        verdict signed by the tester, each attached to this platform manifest's digest."""
        digest = self.image(arch)
        self.evidence(digest, f"linux/{arch}", result, arch != "amd64" if emulated is None else emulated, **verdict)
        return digest

    def evidence(self, digest: str, platform: str, result: str = "passed", emulated: bool = False,
                 verdict: bool = True, **changes: object) -> None:
        signing.attest_sbom(self.client, self.repo, digest)   # type: ignore[arg-type]
        signing.attach_provenance(self.client, self.repo, digest,   # type: ignore[arg-type]
                                  signing.provenance(self.cell, platform=platform))
        if verdict:
            body = signing.verdict(self.cell, digest, result, platform=platform, emulated=emulated, **changes)
            signing.attest(self.client, self.repo, digest, body)   # type: ignore[arg-type]

    def index(self, children: list[tuple[str, str]], tag: str | None = None) -> str:
        """The index over (digest, os/arch) at the dev tag."""
        entries = []
        for digest, platform in children:
            raw = self.client.get_manifest(self.repo, digest)[0]
            os_, arch = platform.split("/", 1)
            entries.append({"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw),
                            "platform": {"os": os_, "architecture": arch}})
        body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
        return self.client.put_manifest(self.repo, tag or self.plan.dev_tag, body, OCI_INDEX)

    def gather(self) -> ImageRelease:
        options = ReleaseOptions("0.1.0", REVISION, trusted=signing.trusted(), known_code=signing.known_code(),
                                 source_check=signing.source_check())
        return gather(self.client, self.plan, options)   # type: ignore[arg-type]


def test_an_index_whose_every_platform_passed_on_its_own_evidence_is_ready() -> None:
    dev = Dev()
    amd, arm = dev.validated("amd64"), dev.validated("arm64")
    index = dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    item = dev.gather()
    assert item.status == "ready", item.problems
    assert item.digest == index and [(e.platform, e.digest) for e in item.evidence] == [("linux/amd64", amd),
                                                                                          ("linux/arm64", arm)]
    assert all(e.verdict is not None and e.verdict.digest == e.digest for e in item.evidence)
    assert all(e.sbom_attestation is not None and e.provenance is not None for e in item.evidence)


def test_a_platform_without_a_verdict_refuses_the_index_naming_it() -> None:
    dev = Dev()
    amd, arm = dev.validated("amd64"), dev.image("arm64")
    dev.evidence(arm, "linux/arm64", verdict=False)
    dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    item = dev.gather()
    assert item.status == "refused"
    assert f"linux/arm64: {arm} has no verdict in the registry; run `make validate FRAMEWORK={MULTI.key}` first" \
        in item.problems
    assert not any(p.startswith("linux/amd64") for p in item.problems), item.problems


def test_a_failed_arm64_verdict_refuses_the_index_naming_the_platform_and_the_test() -> None:
    dev = Dev()
    failed = [signing.result("common/test_x.py::test_common"), signing.result("pytorch/test_ddp.py::test_ddp",
                                                                              "failed")]
    amd, arm = dev.validated("amd64"), dev.validated("arm64", "failed", tests=failed)
    dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    item = dev.gather()
    assert item.status == "refused"
    assert any(p.startswith(f"linux/arm64: verdict of {arm} is 'failed'") and "test_ddp" in p
               for p in item.problems), item.problems


def test_the_amd64_verdict_copied_onto_the_arm64_manifest_does_not_count() -> None:
    """Anyone with push access can attach the amd64 manifest's signed verdict to the arm64 digest: its
    signed subject is the amd64 digest, so it does not verify there, and arm64 has no verdict."""
    dev = Dev()
    amd, arm = dev.image("amd64"), dev.image("arm64")
    dev.evidence(amd, "linux/amd64", verdict=False)
    dev.evidence(arm, "linux/arm64", verdict=False)
    signed = signing.envelope(f"{dev.client.host}/{dev.repo}", amd, signing.verdict(MULTI, amd, platform="linux/amd64",
                                                                                 emulated=False))
    signing.attach_raw(dev.client, dev.repo, amd, signed)   # type: ignore[arg-type]
    dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    assert dev.gather().evidence[0].verdict is not None        # it counts where it belongs
    signing.attach_raw(dev.client, dev.repo, arm, signed)   # type: ignore[arg-type]
    item = dev.gather()
    assert item.status == "refused"
    [problem] = [p for p in item.problems if p.startswith("linux/arm64")]
    assert f"linux/arm64: {arm} has no valid verdict" in problem, problem
    assert f"replayed: signed for {amd}, not for {arm}" in problem, problem


def test_a_verdict_signed_for_the_arm64_digest_but_recording_amd64_is_refused() -> None:
    """The tester signed a verdict about the arm64 digest that says it ran linux/amd64: not a verdict of arm64."""
    dev = Dev()
    amd = dev.validated("amd64")
    arm = dev.image("arm64")
    dev.evidence(arm, "linux/amd64")
    dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    item = dev.gather()
    assert "linux/arm64: the verdict records platform linux/amd64, not linux/arm64; validate linux/arm64 (each " \
           "platform of the index has its own verdict)" in item.problems, item.problems


def test_an_unknown_platform_in_the_index_is_refused_by_name_never_skipped() -> None:
    dev = Dev()
    amd, arm = dev.validated("amd64"), dev.validated("arm64")
    riscv = dev.image("riscv64")
    dev.evidence(riscv, "linux/riscv64", verdict=False)
    dev.index([(amd, "linux/amd64"), (arm, "linux/arm64"), (riscv, "linux/riscv64")])
    item = dev.gather()
    assert item.status == "refused"
    assert [p for p in item.problems if "riscv64" in p] == [
        f"linux/riscv64 ({riscv}): a platform this toolkit does not know (it knows linux/amd64, linux/arm64); an "
        "index is released only when every platform in it was validated: push the cell again"]


def test_an_index_that_gained_a_platform_after_validation_is_refused_naming_the_new_one() -> None:
    """amd64 validated as a single-platform cell's index; then the dev tag is re-pointed at an index with an
    arm64 image nobody validated (the cell has both platforms now)."""
    dev = Dev()
    amd = dev.validated("amd64")
    dev.index([(amd, "linux/amd64")])
    assert any("the index has no linux/arm64 manifest" in p for p in dev.gather().problems)
    arm = dev.image("arm64")
    dev.evidence(arm, "linux/arm64", verdict=False)
    dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    item = dev.gather()
    assert item.problems == [f"linux/arm64: {arm} has no verdict in the registry; run `make validate "
                             f"FRAMEWORK={MULTI.key}` first"]


def test_a_platform_the_cell_does_not_have_is_refused_even_when_validated() -> None:
    dev = Dev(CPU)      # a single-platform cell (linux/amd64)
    amd, arm = dev.validated("amd64"), dev.validated("arm64")
    dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    assert dev.gather().problems == [f"linux/arm64 ({arm}): not a platform the matrix gives {CPU.key} "
                                     "(linux/amd64); push the cell again"]


def test_an_entry_whose_image_is_of_another_platform_is_refused() -> None:
    dev = Dev()
    amd = dev.validated("amd64")
    fake = dev.image("arm64", config_arch="amd64")    # an amd64 image listed as arm64
    dev.evidence(fake, "linux/arm64")
    dev.index([(amd, "linux/amd64"), (fake, "linux/arm64")])
    assert f"linux/arm64 ({fake}): its image config declares linux/amd64, not linux/arm64" in dev.gather().problems


def test_a_single_manifest_for_a_multi_platform_cell_is_refused() -> None:
    dev = Dev()
    amd = dev.validated("amd64")
    raw = dev.client.get_manifest(dev.repo, amd)[0]
    dev.client.put_manifest(dev.repo, dev.plan.dev_tag, raw, OCI_MANIFEST)
    assert f"{amd} is a single image manifest, but the matrix gives {MULTI.key} the platforms linux/amd64, " \
           "linux/arm64: its dev tag must be an image index; push the cell again" in dev.gather().problems


def test_an_emulated_verdict_of_a_gpu_cell_is_refused() -> None:
    """An emulated GPU run is not a GPU run, whatever the verdict claims passed."""
    from tests.test_verdict_gate import H100, gpu_verdict, two  # a GPU verdict with an agreeing inventory

    dev = Dev(MULTI_GPU)
    body = gpu_verdict(two(), busbw={"ranks": 2, "gpu_model": H100["name"], "peak_GBps": 300.0})
    amd = dev.image("amd64")
    arm = dev.image("arm64")
    for digest, platform, emulated in ((amd, "linux/amd64", False), (arm, "linux/arm64", True)):
        dev.evidence(digest, platform, verdict=False)
        full = signing.verdict(MULTI_GPU, digest, tests=body["tests"], runner=body["runner"],
                               figures=body["figures"], gpu_tests=body["gpu_tests"], platform=platform,
                               emulated=emulated)
        signing.attest(dev.client, dev.repo, digest, full)   # type: ignore[arg-type]
    dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    problems = dev.gather().problems
    assert f"linux/arm64: the verdict ran linux/arm64 under emulation, but {MULTI_GPU.key} is a GPU cell: its GPU " \
           "tests count only from a native linux/arm64 GPU runner" in problems, problems
    assert not any(p.startswith("linux/amd64") for p in problems), problems


@pytest.mark.parametrize(("entries", "cause"), [
    ([("sha256:a", "linux/amd64"), ("sha256:b", "linux/amd64"), ("sha256:c", "linux/arm64")],
     "linux/amd64 is in the index twice (sha256:a and sha256:b)"),
    ([("sha256:a", "linux/amd64"), ("sha256:b", "")], "index entry sha256:b declares no platform"),
    ([("sha256:a", "linux/amd64")], "the index has no linux/arm64 manifest"),
])
def test_entry_rules(entries: list[tuple[str, str]], cause: str) -> None:
    manifest = {"manifests": [{"digest": d, "mediaType": OCI_MANIFEST,
                               **({"platform": dict(zip(("os", "architecture"), p.split("/"), strict=True))}
                                  if p else {})} for d, p in entries]}
    assert any(cause in p for p in entry_problems(MULTI, index_entries(manifest)))


def test_buildkit_attestation_manifests_are_no_platform_but_an_unannotated_unknown_is_refused() -> None:
    attestation = {"digest": "sha256:x", "platform": {"os": "unknown", "architecture": "unknown"},
                   "annotations": {"vnd.docker.reference.type": "attestation-manifest"}}
    plain = {"digest": "sha256:y", "platform": {"os": "unknown", "architecture": "unknown"}}
    assert index_entries({"manifests": [attestation]}) == []
    [entry] = index_entries({"manifests": [plain]})
    assert any("unknown/unknown (sha256:y): a platform this toolkit does not know" in p
               for p in entry_problems(MULTI, [entry]))


def test_an_entry_whose_platform_has_a_longer_variant_is_refused_not_read_as_its_prefix() -> None:
    """Before, known_platform read only the first three parts of linux/arm64/v8/x, so an entry no arm64 runtime
    selects passed as the cell's linux/arm64 manifest."""
    amd = {"digest": "sha256:a", "platform": {"os": "linux", "architecture": "amd64"}}
    odd = {"digest": "sha256:b", "platform": {"os": "linux", "architecture": "arm64", "variant": "v8/x"}}
    problems = entry_problems(MULTI, index_entries({"manifests": [amd, odd]}))
    assert any(p.startswith("linux/arm64/v8/x (sha256:b): a platform this toolkit does not know") for p in problems)


def test_notes_and_json_list_each_platform_with_its_verdict_and_whether_it_ran_emulated() -> None:
    dev = Dev()
    amd, arm = dev.validated("amd64"), dev.validated("arm64")
    dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    item = dev.gather()
    assert item.status == "ready", item.problems
    manifest = build_manifest(ReleaseReport("0.1.0", REVISION, [item]))
    [img] = manifest["images"]
    assert [(p["platform"], p["digest"], p["verdict"]["result"], p["verdict"]["emulated"])
            for p in img["platforms"]] == [("linux/amd64", amd, "passed", False), ("linux/arm64", arm, "passed", True)]
    assert all(p["verdict"]["ref"].endswith(e.attestation.digest)   # type: ignore[union-attr]
               for p, e in zip(img["platforms"], item.evidence, strict=True))
    notes = render_notes(manifest)
    assert f"- linux/arm64 `{arm}`" in notes and "passed, run under emulation on ci" in notes
    assert "linux/amd64 passed: 2 passed, 0 skipped; linux/arm64 passed (emulated): 2 passed, 0 skipped" in notes


def test_a_schema_4_verdict_counts_for_a_single_manifest_but_not_for_an_index_entry() -> None:
    """Schema 4 records no platform: its digest alone binds it, which says the platform of a single image only.
    Since issue 48 release takes only schema-6 verdicts (they record the matrix and promises they checked): the
    single image's schema-4 verdict is refused for that alone, not for its platform."""
    dev = Dev()
    amd, arm = dev.image("amd64"), dev.image("arm64")
    for digest, platform in ((amd, "linux/amd64"), (arm, "linux/arm64")):
        dev.evidence(digest, platform, verdict=False)
        signing.attest(dev.client, dev.repo, digest, signing.verdict(MULTI, digest, schema=4))   # type: ignore[arg-type]
    dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    problems = dev.gather().problems
    assert "linux/arm64: the verdict records platform (none), not linux/arm64; validate linux/arm64 (each platform " \
           "of the index has its own verdict)" in problems, problems
    single = Dev(CPU)
    digest = single.image("amd64")
    single.evidence(digest, "linux/amd64", verdict=False)
    signing.attest(single.client, single.repo, digest, signing.verdict(CPU, digest, schema=4))   # type: ignore[arg-type]
    raw = single.client.get_manifest(single.repo, digest)[0]
    single.client.put_manifest(single.repo, single.plan.dev_tag, raw, OCI_MANIFEST)
    item = single.gather()
    assert item.problems == ["the verdict is schema 4: it does not record the matrix and library promises it checked "
                             "(schema 6); validate the image again"], item.problems


def test_promotion_copies_the_index_byte_for_byte_with_each_platforms_artifacts_on_its_own_digest() -> None:
    from buildtool.attest.referrers import referrers
    from buildtool.contracts.names import ATTESTATION_TYPE
    from buildtool.release.execute import promote
    from buildtool.release.model import TagAction

    dev = Dev()
    amd, arm = dev.validated("amd64"), dev.validated("arm64")
    index = dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")])
    item = dev.gather()
    assert item.status == "ready", item.problems
    item.tags = [TagAction("2.13-0.1.0", False, None, "create")]
    promote(dev.client, item, dev.plan, None)   # type: ignore[arg-type]
    rel = split_repo_path(dev.plan.release_repo)[1]
    raw, media_type, digest = dev.client.get_manifest(rel, "2.13-0.1.0")
    assert (raw, media_type, digest) == (dev.client.get_manifest(dev.repo, dev.plan.dev_tag)[0], OCI_INDEX, index)
    for ev in item.evidence:
        assert dev.client.manifest_digest(rel, ev.digest) == ev.digest
        [copied] = referrers(dev.client, rel, ev.digest, ATTESTATION_TYPE)   # type: ignore[arg-type]
        assert ev.attestation is not None and copied.digest == ev.attestation.digest
    assert referrers(dev.client, rel, index, ATTESTATION_TYPE) == []   # type: ignore[arg-type]


def test_an_entry_that_serves_an_index_is_refused_as_one() -> None:
    """Before, an arm64 entry declared an image manifest but named an index: read_platforms passed it over and
    entry_problems looked only at the declared type, so the refusal named a provenance/label mismatch instead."""
    dev = Dev()
    amd, arm = dev.validated("amd64"), dev.validated("arm64")
    raw = dev.client.get_manifest(dev.repo, arm)[0]
    inner = dev.client.put_manifest(dev.repo, "inner", json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                                    "manifests": [{"mediaType": OCI_MANIFEST, "digest": arm, "size": len(raw),
                                                   "platform": {"os": "linux", "architecture": "arm64"}}]}).encode(),
                                    OCI_INDEX)
    dev.evidence(inner, "linux/arm64", emulated=True)
    dev.index([(amd, "linux/amd64"), (inner, "linux/arm64")])
    assert (f"linux/arm64 ({inner}): the registry serves an index for it, not one platform's image manifest; push "
            "the cell again") in dev.gather().problems


@pytest.mark.parametrize("platform", [{"os": "linux/arm64", "architecture": "v8"},
                                      {"os": "linux", "architecture": "arm64/v8"},
                                      {"os": "linux", "architecture": "arm64", "variant": "v8/x"}])
def test_an_entry_whose_platform_fields_hold_a_slash_is_refused_as_a_broken_index(platform: dict[str, str]) -> None:
    """Before, release joined os/architecture/variant with "/" and read {"os": "linux/arm64", "architecture": "v8"} as
    linux/arm64/v8, so it released an index no arm64 runtime selects anything from (they compare the fields)."""
    dev = Dev()
    amd, arm = dev.validated("amd64"), dev.validated("arm64")
    index = json.loads(dev.client.get_manifest(dev.repo, dev.index([(amd, "linux/amd64"), (arm, "linux/arm64")]))[0])
    index["manifests"][1]["platform"] = platform
    dev.client.put_manifest(dev.repo, dev.plan.dev_tag, json.dumps(index).encode(), OCI_INDEX)
    item = dev.gather()
    cause = (f"index entry {arm} is broken: its platform {json.dumps(platform)} has a '/' in a field (os, architecture "
             "and variant are one word each), so no runtime selects it; push the cell again")
    assert item.status != "ready" and item.problems[0] == cause, item.problems
    # verify reads the index alike: the entry is not checked as linux/arm64, and the refusal names it.
    from buildtool.release.chain import manifests

    found, problems, _ = manifests(dev.client, dev.repo, dev.plan.dev_tag)  # type: ignore[arg-type]
    assert found == [(amd, "linux/amd64")] and problems[0] == cause, problems


def test_an_image_whose_config_platform_fields_hold_a_slash_is_refused_naming_them() -> None:
    """Before, release joined the image config's os/architecture/variant with "/": a config of architecture
    "arm64/v8" read as linux/arm64/v8, so an image no runtime takes for linux/arm64 passed as that platform."""
    dev = Dev()
    amd = dev.validated("amd64")
    odd = dev.image("arm64", config_arch="arm64/v8")
    dev.evidence(odd, "linux/arm64")
    dev.index([(amd, "linux/amd64"), (odd, "linux/arm64")])
    problems = dev.gather().problems
    assert (f"linux/arm64 ({odd}): its image config declares the broken platform "
            '{"architecture": "arm64/v8", "os": "linux"} (a \'/\' in a field), not linux/arm64') in problems, problems
