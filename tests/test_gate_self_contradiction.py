"""A verdict whose signed summary (`result`) says `passed` while its own signed record shows a failure (a failed test,
pytest's non-zero exit, a run that did not end by itself): validate never writes one (a failure is always `failed`,
contracts.verdict.derive_result), the report shows it failed (report.verdict_files.false_pass), and release,
`verify` and validate's reuse refuse it, naming the contradiction. In-memory registry (tests/memregistry.py)."""

from __future__ import annotations

from typing import Any

import pytest

from buildtool.contracts.verdict import parse_verdict
from buildtool.release.gates import verdict_problems
from tests import signing
from tests.gate_scenarios import scenario
from tests.test_release_platforms import CPU, Dev
from tests.test_verify_strict import single, verify

D1 = "sha256:" + "1" * 64
COMMON, TORCH = "common/test_x.py::test_common", "pytorch/test_x.py::test_pytorch"
CONTRADICTIONS = {
    "a-failed-test": ({"tests": [signing.result(COMMON), signing.result(TORCH, "failed")]},
                      f"it says passed, but 1 test(s) failed: {TORCH}"),
    "pytest-exit": ({"pytest_exit": 1}, "it says passed, but pytest exited with 1"),
    "run-cut-short": ({"problem": "the validation deadline (600 s) ran out"},
                      "it says passed, but the run did not end by itself (the validation deadline (600 s) ran out)"),
}


def contradicting(digest: str, kind: str) -> dict[str, Any]:
    body = signing.verdict(CPU, digest)
    body.update(CONTRADICTIONS[kind][0])
    return body


@pytest.mark.parametrize("kind", CONTRADICTIONS)
def test_the_gate_refuses_a_pass_its_own_results_contradict(kind: str) -> None:
    """Before: the gate read `result` alone, so a signed `passed` over a failed test released the image."""
    found = verdict_problems(CPU, D1, parse_verdict(contradicting(D1, kind), "test verdict"))
    assert f"verdict of {D1} contradicts itself: {CONTRADICTIONS[kind][1]}; validate the image again" in found, found


def contradicting_image(kind: str) -> tuple[Dev, str]:
    dev = Dev(CPU)
    digest = dev.image("amd64")
    dev.evidence(digest, "linux/amd64", verdict=False)
    signing.attest(dev.client, dev.repo, digest, contradicting(digest, kind))   # type: ignore[arg-type]
    single(dev, digest)
    return dev, digest


for _kind in CONTRADICTIONS:
    scenario(f"reading/a-pass-its-own-record-contradicts-{_kind}")(lambda kind=_kind: contradicting_image(kind)[0])


@pytest.mark.parametrize("kind", CONTRADICTIONS)
def test_release_and_verify_refuse_a_pass_its_own_results_contradict(kind: str) -> None:
    dev, digest = contradicting_image(kind)
    want = f"verdict of {digest} contradicts itself: {CONTRADICTIONS[kind][1]}"
    item = dev.gather()
    assert item.status == "refused" and any(p.startswith(want) for p in item.problems), item.problems
    gated = verify(dev)
    assert gated.problems == item.problems
    bare = verify(dev, with_checkout=False)      # the chain alone, no checkout: the same cause
    assert not bare.ok and bare.problem == f"the {want}", bare.problem
