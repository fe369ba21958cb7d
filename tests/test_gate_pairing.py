"""Issue 48, the one-GPU pairing: a one-GPU runner's verdict of a GPU cell is completed by a multi-GPU verdict
of the same digest only when that verdict passes every check a verdict passes alone, and the newest-failure
rule runs across both. Each attack the audit found, through release's gate and `verify` (one reading, one
decision: buildtool.validate.verdict_choice), which must agree; before issue 48 verify refused every valid pair.
In-memory registry (tests/memregistry.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from buildtool.release.chain import Verification, verify_reference
from tests import signing
from tests.conftest import fixture_matrix
from tests.gate_scenarios import scenario
from tests.test_release_platforms import Dev
from tests.test_verify_strict import checkout, single

CUDA = {c.key: c for c in fixture_matrix().cells}["pytorch-cuda:2.13"]
BUSBW = "pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw"
OTHERS = ["common/test_x.py::test_common", "common/test_contents.py::test_gpus_visible",
          "pytorch/test_x.py::test_pytorch"]
H100 = "NVIDIA H100 80GB HBM3"
ONE_AT, MULTI_AT, LATER = "2026-03-02T02:00:00+00:00", "2026-03-02T03:00:00+00:00", "2026-03-02T04:00:00+00:00"


def body(digest: str, gpus: int, *, busbw: str, started: str, selected: bool = False, others: str = "passed",
         model: str = H100, figure: dict[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    """A verdict of pytorch-cuda on `gpus` GPUs of `model` (host gpu-<gpus>); `selected`: a -k run of the
    bus-bandwidth test only; `figure`: the bus-bandwidth record (default: what the run measured)."""
    skip = ("one-gpu-on-runner", "one GPU on this runner") if busbw == "skipped" else ("", "")
    tests = [] if selected else [signing.result(OTHERS[0]), signing.result(OTHERS[1], others, gpu=True),
                                 signing.result(OTHERS[2])]
    tests.append(signing.result(BUSBW, busbw, *skip, gpu=True))
    complete = not selected and busbw == "passed" and others == "passed"
    result = "passed" if complete else ("failed" if "failed" in (busbw, others) else "incomplete")
    found = signing.verdict(CUDA, digest, result, tests=tests, started=started, platform="linux/amd64", **changes)
    found["defined_tests"] = [*OTHERS, BUSBW]
    found["gpu_tests"] = [OTHERS[1], BUSBW]
    if selected:
        found["selection"] = {"expression": "test_ddp_nccl_allreduce_busbw", "deselected": OTHERS}
    found["runner"] = {"hostname": f"gpu-{gpus}", "gpu_runner": True, "driver": "580.65.06", "cuda_driver": "13.0",
                       "gpus": [{"index": str(i), "name": model} for i in range(gpus)], "gpus_usable": True}
    if busbw == "passed":
        found["figures"] = {"allreduce_busbw": figure or {"ranks": gpus, "gpu_model": model, "peak_GBps": 300.0}}
    return found


def paired(*extra: Callable[[str], dict[str, Any]], one_at: str = ONE_AT, **multi: Any) -> tuple[Dev, str]:
    """A pytorch-cuda image with a one-GPU runner's verdict and a multi-GPU -k run of the bus-bandwidth test
    (`multi` changes it), and `extra` verdicts (each made for the image's digest)."""
    dev = Dev(CUDA)
    digest = dev.image("amd64")
    dev.evidence(digest, "linux/amd64", verdict=False)
    signing.attest(dev.client, dev.repo, digest, body(digest, 1, busbw="skipped", started=one_at))  # type: ignore[arg-type]
    options = {"busbw": "passed", "started": MULTI_AT, "selected": True, **multi}
    signing.attest(dev.client, dev.repo, digest, body(digest, 2, **options))   # type: ignore[arg-type]
    for make in extra:
        signing.attest(dev.client, dev.repo, digest, make(digest))   # type: ignore[arg-type]
    single(dev, digest)
    return dev, digest


WRONG_RANKS = {"ranks": 1, "gpu_model": "NVIDIA A100-SXM4-80GB", "peak_GBps": 300.0}
WRONG_MODEL = {"ranks": 2, "gpu_model": "NVIDIA A100-SXM4-80GB", "peak_GBps": 300.0}


def failure_after(runner: int) -> Callable[[str], dict[str, Any]]:
    def failure(digest: str) -> dict[str, Any]:
        if runner == 1:    # the one-GPU runner's whole run again, a test failed: the newest whole run
            return body(digest, 1, busbw="skipped", started=LATER, others="failed")
        return body(digest, 2, busbw="failed", started=LATER, selected=True)   # the multi-GPU -k run again, failed
    return failure


def between(digest: str) -> dict[str, Any]:
    """A multi-GPU run between the one-GPU run and the companion that failed another test."""
    found = body(digest, 2, busbw="passed", started="2026-03-02T02:30:00+00:00", selected=True)
    found["tests"] = [signing.result(OTHERS[2], "failed"), *found["tests"]]
    found["selection"] = {"expression": "test_pytorch or busbw", "deselected": OTHERS[:2]}
    found["result"] = "failed"
    return found


def early(digest: str) -> dict[str, Any]:
    return body(digest, 1, busbw="skipped", started="2026-03-01T00:00:00+00:00", others="failed")


for _name, _make in {
    "pairing/valid": lambda: paired(),
    "pairing/companion-inventory-disagrees": lambda: paired(figure=WRONG_RANKS),
    "pairing/companion-on-another-model": lambda: paired(figure=WRONG_MODEL),
    "pairing/companion-emulated": lambda: paired(emulated=True),
    "pairing/failure-after-on-the-one-gpu-runner": lambda: paired(failure_after(1)),
    "pairing/failure-after-on-the-multi-gpu-runner": lambda: paired(failure_after(2)),
    "pairing/failure-between-the-pair": lambda: paired(between),
    "pairing/failure-before-both": lambda: paired(early),
}.items():
    scenario(_name)(lambda make=_make: make()[0])


def both(dev: Dev) -> tuple[list[str], Verification]:
    item = dev.gather()
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}",   # type: ignore[arg-type]
                             signing.trusted(), checkout(dev.cell))
    assert found.problems == item.problems, (found.problems, item.problems)    # one gate, one answer
    return item.problems, found


def test_a_valid_pair_releases_and_verifies() -> None:
    """Before issue 48, verify refused every valid pair (release accepted it): it judged the one-GPU verdict alone."""
    dev, _ = paired()
    problems, found = both(dev)
    assert problems == [] and found.ok, (problems, found.problem)
    lines = dict(found.chains[0].lines)
    assert lines["paired"].startswith(f"multi-GPU checks from: {BUSBW} passed in verdict sha256:")
    bare = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}",   # type: ignore[arg-type]
                            signing.trusted())
    assert bare.ok, bare.problem      # the chain alone agrees too


def one_gpu_refusal(problems: list[str], why: str) -> None:
    assert any(f"{BUSBW} skipped as one-gpu-on-runner on 1x {H100}: release also needs a trusted verdict" in p
               and why in p for p in problems), problems


@pytest.mark.parametrize(("multi", "why"), [
    pytest.param({"figure": WRONG_RANKS},
                 "its inventory does not hold: the bus-bandwidth test ran on 1 GPUs, but the runner lists 2",
                 id="inventory-disagrees-with-its-own-busbw-record"),
    pytest.param({"figure": WRONG_MODEL},
                 "its inventory does not hold: the bus-bandwidth test reports GPU model 'NVIDIA A100-SXM4-80GB'",
                 id="busbw-on-another-model"),
    pytest.param({"emulated": True}, "it ran linux/amd64 under emulation: an emulated GPU run is not a GPU run",
                 id="emulated"),
])
def test_a_companion_that_would_not_pass_alone_does_not_pair(multi: dict[str, Any], why: str) -> None:
    dev, _ = paired(**multi)
    problems, found = both(dev)
    one_gpu_refusal(problems, why)
    assert not found.ok


@pytest.mark.parametrize("runner", [1, 2])
def test_a_failure_after_the_pair_from_either_runner_counts(runner: int) -> None:
    """Before: the upload-order rule ran only when the chosen verdict passed, so a failure after the pair (the
    one-GPU runner's or the multi-GPU runner's) was ignored."""
    dev, digest = paired(failure_after(runner))
    problems, found = both(dev)
    failed = OTHERS[1] if runner == 1 else BUSBW
    assert any(p.startswith(f"verdict of {digest} is 'failed' (failed: {failed})") for p in problems), problems
    assert not found.ok


def test_a_failure_between_the_one_gpu_run_and_its_companion_counts() -> None:
    """A multi-GPU run that failed another test after the one-GPU run and before the companion: not older than
    the pair, so it counts (a failure is older only than what came after it on every clock)."""
    dev, digest = paired(between)
    problems, _ = both(dev)
    assert any(p.startswith(f"verdict of {digest} is 'failed' (failed: {OTHERS[2]})") for p in problems), problems
    assert any("(failed, started 2026-03-02T02:30:00+00:00, by gpu-2) counts over" in p for p in problems), problems


def test_an_older_failure_before_both_does_not_count() -> None:
    dev, _ = paired(early)
    problems, found = both(dev)
    assert problems == [] and found.ok, problems


OTHER_MATRIX = "sha256:" + "e" * 64

for _name, _multi in {
    "pairing/companion-of-another-matrix": {"matrix_digest": OTHER_MATRIX},
    "pairing/companion-of-other-library-promises": {"libraries": {"cudnn": "9.0.0.1", "nccl": "2.0.1"}},
    "pairing/companion-recording-no-binding": {"schema": 5},
}.items():
    scenario(_name)(lambda multi=_multi: paired(**multi)[0])


@pytest.mark.parametrize(("multi", "why"), [
    pytest.param({"matrix_digest": OTHER_MATRIX}, f"the verdict ran with the matrix {OTHER_MATRIX}, which is not the "
                 "matrix committed", id="another-matrix"),
    pytest.param({"libraries": {"cudnn": "9.0.0.1", "nccl": "2.0.1"}}, "the verdict checked the library promises "
                 "cudnn 9.0.0.1, nccl 2.0.1, but the matrix promises none", id="other-library-promises"),
    pytest.param({"schema": 5}, "the verdict is schema 5: it does not record the matrix and library promises",
                 id="schema-5"),
])
def test_a_companion_bound_to_another_matrix_does_not_complete_the_one_gpu_verdict(multi: dict[str, Any],
                                                                                   why: str) -> None:
    """Before: only the one-GPU verdict's binding (schema 6: the matrix and library promises it ran with) was
    checked, so a multi-GPU verdict that ran with an edited matrix, or recorded none, decided the multi-GPU
    tests; a verdict alone of that kind is refused."""
    dev, _ = paired(**multi)
    problems, found = both(dev)
    assert any(p.startswith("the multi-GPU verdict sha256:") and "that completes the one-GPU runner's verdict does "
               f"not count: {why}" in p for p in problems), problems
    assert not found.ok


# -- the checks of data moving between ranks (not marked gpu) that a one-GPU runner skips as not run -------------

IDENTICAL = "pytorch/test_ddp.py::test_ddp_ranks_end_identical"


def ranks_paired(companion_ran_it: bool) -> tuple[Dev, str]:
    """A one-GPU verdict that skipped the bus-bandwidth test and IDENTICAL (DDP's ranks ending identical, not marked
    gpu: it also runs with gloo) as one-gpu-on-runner, and a multi-GPU -k run that passed the bus-bandwidth test and,
    when `companion_ran_it`, IDENTICAL."""
    dev = Dev(CUDA)
    digest = dev.image("amd64")
    dev.evidence(digest, "linux/amd64", verdict=False)
    one = body(digest, 1, busbw="skipped", started=ONE_AT)
    one["tests"].append(signing.result(IDENTICAL, "skipped", "one-gpu-on-runner", "one GPU on this runner: torchrun "
                                       "ran one rank, so no data moved between ranks"))
    multi = body(digest, 2, busbw="passed", started=MULTI_AT, selected=True)
    if companion_ran_it:
        multi["tests"].append(signing.result(IDENTICAL))
        multi["selection"] = {"expression": "busbw or identical", "deselected": OTHERS}
    else:
        multi["selection"]["deselected"] = [*OTHERS, IDENTICAL]
    for found in (one, multi):
        found["defined_tests"] = [*OTHERS, IDENTICAL, BUSBW]
        signing.attest(dev.client, dev.repo, digest, found)   # type: ignore[arg-type]
    single(dev, digest)
    return dev, digest


scenario("pairing/one-gpu-ranks-check-passed-by-the-companion")(lambda: ranks_paired(True)[0])
scenario("pairing/one-gpu-ranks-check-not-run-by-the-companion")(lambda: ranks_paired(False)[0])


def test_a_ranks_check_skipped_on_one_gpu_releases_with_a_companion_that_passed_it() -> None:
    """Before: the code was for tests marked gpu only, so DDP's ranks check could not carry it (it passed on one GPU,
    one rank, nothing moved) and a verdict where it did was refused as a misplaced skip."""
    dev, _ = ranks_paired(True)
    problems, found = both(dev)
    assert problems == [] and found.ok, (problems, found.problem)
    assert f"{IDENTICAL} passed in verdict sha256:" in dict(found.chains[0].lines)["paired"]


def test_a_companion_that_did_not_pass_the_ranks_check_does_not_release_the_one_gpu_verdict() -> None:
    dev, digest = ranks_paired(False)
    problems, found = both(dev)
    assert not found.ok
    assert not [p for p in problems if "may not carry" in p], problems
    select = "-k 'test_ddp_nccl_allreduce_busbw or test_ddp_ranks_end_identical'` on such a runner"   # one word
    assert any(p.startswith(f"{BUSBW}, {IDENTICAL} skipped as one-gpu-on-runner on 1x {H100}: release also needs a "
                            f"trusted verdict of {digest}") and f"it did not pass {IDENTICAL} not run" in p
               and select in p for p in problems), problems


def test_a_ranks_check_skipped_as_one_gpu_on_a_runner_of_more_is_refused_naming_it() -> None:
    """The runner's inventory was checked against the bus-bandwidth test's one-GPU skip only: a verdict of an
    eight-GPU runner could skip DDP's ranks check as one-gpu-on-runner, and its companion need not have passed it
    for the gate to see a lie. Refused, naming the check and the runner's GPU count."""
    dev = Dev(CUDA)
    digest = dev.image("amd64")
    dev.evidence(digest, "linux/amd64", verdict=False)
    found = body(digest, 8, busbw="passed", started=ONE_AT)
    found["tests"].append(signing.result(IDENTICAL, "skipped", "one-gpu-on-runner", "one GPU on this runner"))
    found["defined_tests"] = [*OTHERS, IDENTICAL, BUSBW]
    signing.attest(dev.client, dev.repo, digest, found)   # type: ignore[arg-type]
    single(dev, digest)
    problems, verification = both(dev)
    assert not verification.ok
    assert any(f"{IDENTICAL} was skipped as one-gpu-on-runner, but the runner lists 8 GPUs" in p for p in problems), \
        problems
