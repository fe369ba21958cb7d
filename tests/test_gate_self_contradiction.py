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
from tests.gate_scenarios import same_clock, scenario
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


# -- which verdict counts: a failure by its own record is a failure, whatever its summary says ------------------

def after_a_pass(newer: dict[str, Any]) -> tuple[Dev, str]:
    """A valid whole-run pass (2026-01-01, host ci), then `newer` (changes to a verdict of the image)."""
    dev = Dev(CPU)
    digest = dev.image("amd64")
    dev.evidence(digest, "linux/amd64")
    body = signing.verdict(CPU, digest)
    body.update(newer)
    signing.attest(dev.client, dev.repo, digest, body)   # type: ignore[arg-type]
    single(dev, digest)
    return dev, digest


NEWER = {
    # a -k run on another runner a day later whose pytest exited 1: validate would have said failed
    "selection": ({"result": "incomplete", "started": "2026-01-02T00:00:00+00:00", "pytest_exit": 1,
                   "runner": {"hostname": "other", "gpus": []},
                   "selection": {"expression": "test_pytorch", "deselected": [COMMON]},
                   "tests": [signing.result(TORCH)], "defined_tests": [COMMON, TORCH]},
                  "it says incomplete, but pytest exited with 1"),
    # a pass over a failed test, dated after the reader's clock: a failure nobody can order
    "future": ({"started": "2099-01-01T00:00:00+00:00",
                "tests": [signing.result(COMMON), signing.result(TORCH, "failed")]},
               f"it says passed, but 1 test(s) failed: {TORCH}"),
}

for _kind, (_newer, _) in NEWER.items():
    scenario(f"reading/a-newer-verdict-its-own-record-shows-failed-{_kind}")(
        lambda newer=_newer: after_a_pass(newer)[0])


@pytest.mark.parametrize("kind", NEWER)
def test_a_newer_verdict_whose_own_record_shows_a_failure_counts_over_an_older_pass(kind: str) -> None:
    """Before: which verdict counts read the summary alone: a newer -k run that said `incomplete` with pytest's exit 1
    was no failure (the older pass released), and a future-dated `passed` over a failed test was ignored as a pass
    nobody can place (the older pass released)."""
    dev, digest = after_a_pass(NEWER[kind][0])
    item = dev.gather()
    assert any(p.startswith(f"verdict of {digest} contradicts itself: {NEWER[kind][1]}") for p in item.problems), \
        item.problems
    assert any(" counts " in p and ("counts over" in p or "counts as the newest" in p) for p in item.problems), \
        item.problems      # why it counts, not the older pass, is part of the refusal
    # Release and verify read the clock moments apart, and the future-dated refusal shows it to the second.
    assert same_clock(verify(dev).problems) == same_clock(item.problems)


def test_a_multi_gpu_verdict_whose_own_record_shows_a_failure_does_not_complete_a_one_gpu_verdict() -> None:
    """Before: the companion was judged by its summary and its tests: a -k run on two GPUs that passed the bus-bandwidth
    test but whose pytest exited 1 (validate would have said failed) completed the one-GPU verdict, and released."""
    from tests.test_gate_pairing import paired

    dev, _ = paired(pytest_exit=1)
    item = dev.gather()
    # No companion: it is a failure newer than the one-GPU verdict, and counts over it, saying why.
    assert any("(incomplete, started 2026-03-02T03:00:00+00:00, by gpu-2) counts over" in p for p in item.problems), \
        item.problems
    assert any("contradicts itself: it says incomplete, but pytest exited with 1" in p for p in item.problems)
    assert verify(dev).problems == item.problems
