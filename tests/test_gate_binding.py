"""Issue 48, what a verdict and a provenance are bound to. A verdict records the matrix it read and the NVIDIA
library promises it checked (schema 6): release refuses one whose promises are not the matrix cell's now (the
catalogue states the matrix's promises as checked in the image) or whose matrix is not committed; the library
check must have run on every NGC cell that is not a stand-in. A provenance's every field that names the source
(the source's and the tool's gitCommit, each lock file's sha256, the matrix digest) must be what git holds at
the revision being released. Through release's gate and `verify` (one gate): in-memory registry."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from buildtool.attest.provenance_model import LOCK_PREFIX, SOURCE, TOOL_PREFIX
from buildtool.release.chain import verify_reference
from tests import signing
from tests.conftest import fixture_matrix
from tests.gate_scenarios import scenario
from tests.test_release_platforms import Dev
from tests.test_verify_strict import checkout, single

CELLS = {c.key: c for c in fixture_matrix().cells}
CPU, NGC = CELLS["pytorch-cpu:2.13"], CELLS["pytorch-ngc:25.01"]
LIBS = "common/test_nvidia_libraries.py::test_nvidia_libraries_are_the_ones_the_base_promises"


def both(dev: Dev, cell: Any = None) -> list[str]:
    """Release's gate of the dev image (as `cell`, default the dev image's), and verify's, which must agree."""
    if cell is not None:
        dev.cell, dev.plan = cell, dataclasses.replace(dev.plan, cell=cell)
    problems = dev.gather().problems
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}",   # type: ignore[arg-type]
                             signing.trusted(), checkout(dev.cell))
    assert found.problems == problems, (found.problems, problems)
    return problems


def ngc_image(**verdict: Any) -> Dev:
    """An NGC cell's image (its provenance: not a stand-in) validated with `verdict` changes."""
    dev = Dev(NGC)
    digest = dev.image("amd64")
    dev.evidence(digest, "linux/amd64", verdict=False)
    tests = [signing.result(f"{g}/test_x.py::test_{g}") for g in NGC.tests]
    body = signing.verdict(NGC, digest, tests=verdict.pop("tests", tests), platform="linux/amd64", **verdict)
    body["runner"] = {"hostname": "gpu-2", "gpu_runner": True, "driver": "580.65.06", "cuda_driver": "13.0",
                      "gpus": [{"index": "0", "name": "NVIDIA H100 80GB HBM3"}], "gpus_usable": True}
    signing.attest(dev.client, dev.repo, digest, body)   # type: ignore[arg-type]
    single(dev, digest)
    return dev


@scenario("binding/ngc-library-check-skipped-as-a-stand-in")
def ngc_standin_skip() -> Dev:
    tests = [signing.result(f"{g}/test_x.py::test_{g}") for g in NGC.tests]
    tests.append(signing.result(LIBS, "skipped", "standin-libraries", "not run: a stand-in image"))
    return ngc_image(tests=tests)


scenario("binding/ngc-checked-its-promises")(ngc_image)


def test_an_ngc_image_whose_library_check_was_skipped_as_a_stand_in_is_refused() -> None:
    """Before: `standin-libraries` was an expected skip on every NGC cell (each has a stand-in for CI), so a real
    NGC image released with its library check skipped."""
    problems = both(ngc_standin_skip())
    assert any(p.startswith(f"1 test(s) skipped where the matrix expects them to run: {LIBS}") and
               p.endswith("; no --accept-skip waives these codes") for p in problems), problems


def test_an_ngc_verdict_checked_against_other_promises_is_refused() -> None:
    """The matrix's cuDNN promise edited after validation: the old verdict checked the old promise. Before, it
    still released, and the catalogue stated the new version as checked in the image."""
    dev = ngc_image()
    assert both(dev) == []
    assert NGC.libraries is not None
    edited = dataclasses.replace(NGC, libraries=NGC.libraries.model_copy(update={"cudnn": "9.8.0.87"}))
    problems = both(dev, edited)
    assert (f"the verdict checked the library promises cudnn {NGC.libraries.cudnn}, nccl {NGC.libraries.nccl}, but "
            f"the matrix promises cudnn 9.8.0.87, nccl {NGC.libraries.nccl} for {NGC.key} now: validate the image "
            "again (the catalogue states what the matrix promises)") in problems, problems


OTHER_MATRIX = "sha256:" + "e" * 64


@scenario("binding/a-verdict-of-another-matrix")
def other_matrix() -> Dev:
    dev = Dev(CPU)
    digest = dev.image("amd64")
    dev.evidence(digest, "linux/amd64", matrix_digest=OTHER_MATRIX)
    single(dev, digest)
    return dev


def test_a_verdict_of_another_matrix_is_refused() -> None:
    other = OTHER_MATRIX
    problems = both(other_matrix())
    assert any(p.startswith(f"the verdict ran with the matrix {other}, which is not the matrix committed at the "
                            "image's revision or the release commit") for p in problems), problems


@scenario("binding/a-schema-5-verdict")
def schema_5() -> Dev:
    dev = Dev(CPU)
    digest = dev.image("amd64")
    dev.evidence(digest, "linux/amd64", schema=5)
    single(dev, digest)
    return dev


def test_a_verdict_that_records_no_binding_is_refused() -> None:
    """A schema-5 verdict (the one before) is still read (the report shows it), but does not say what it was bound
    to: release refuses it. (A schema-4 verdict: tests/test_release_platforms.py.)"""
    dev = schema_5()
    assert "the verdict is schema 5: it does not record the matrix and library promises it checked " \
           "(schema 6); validate the image again" in both(dev)


# -- the provenance's source fields, against git at its revision -------------------------------------------------

def provenance_image(change: Any) -> Dev:
    """A CPU image whose provenance (built at this checkout's HEAD, locks and matrix as committed there) `change`
    edits before it is signed."""
    dev = Dev(CPU)
    digest = dev.image("amd64")
    signing.attest_sbom(dev.client, dev.repo, digest)   # type: ignore[arg-type]
    body = signing.provenance(CPU, platform="linux/amd64", matrix_digest=signing.committed_matrix())
    body["buildDefinition"]["resolvedDependencies"] = [
        d for d in body["buildDefinition"]["resolvedDependencies"] if not d["name"].startswith(LOCK_PREFIX)]
    body["buildDefinition"]["resolvedDependencies"] += signing.committed_locks(CPU)
    change(body)
    signing.attach_provenance(dev.client, dev.repo, digest, body)   # type: ignore[arg-type]
    signing.attest(dev.client, dev.repo, digest, signing.verdict(CPU, digest, platform="linux/amd64"))  # type: ignore[arg-type]
    single(dev, digest)
    return dev


def dependency(body: dict[str, Any], name: str) -> dict[str, Any]:
    return next(d for d in body["buildDefinition"]["resolvedDependencies"] if d["name"] == name)


scenario("binding/provenance-of-the-committed-sources")(lambda: provenance_image(lambda body: None))


def test_a_provenance_whose_sources_are_the_committed_ones_passes() -> None:
    assert both(provenance_image(lambda body: None)) == []


OTHER_COMMIT = "f" * 40


PROVENANCE_CHANGES = [
    (lambda b: dependency(b, SOURCE)["digest"].update(gitCommit=OTHER_COMMIT),
     f"the provenance's source names gitCommit {OTHER_COMMIT}, not its revision"),
    (lambda b: dependency(b, f"{TOOL_PREFIX}buildtool")["digest"].update(gitCommit=OTHER_COMMIT),
     f"the provenance's tool:buildtool names gitCommit {OTHER_COMMIT}, not its revision"),
    (lambda b: b["buildDefinition"]["externalParameters"].update(matrix_digest="sha256:" + "e" * 64),
     "the provenance's matrix_digest sha256:" + "e" * 64 + " is not matrix.yaml as committed at"),
    (lambda b: b["buildDefinition"]["resolvedDependencies"][-1]["digest"].update(sha256="e" * 64),
     "is not that file as committed at"),
    (lambda b: b["buildDefinition"]["resolvedDependencies"].append(
        {"name": f"{LOCK_PREFIX}dockerfiles/no-such/requirements.lock", "digest": {"sha256": "e" * 64}}),
     "lock:dockerfiles/no-such/requirements.lock: no such file committed at"),
]
for _n, (_change, _) in enumerate(PROVENANCE_CHANGES):
    scenario(f"binding/provenance-source-field-{_n}")(lambda change=_change: provenance_image(change))


@pytest.mark.parametrize(("change", "cause"), PROVENANCE_CHANGES)
def test_a_provenance_field_that_names_another_source_is_refused(change: Any, cause: str) -> None:
    """Before: only `revision` was compared with the commit; gitCommit (what SLSA verifiers read), the lock
    digests and the matrix digest could name anything, and the image released and verified."""
    problems = both(provenance_image(change))
    assert any(cause in p for p in problems), problems
