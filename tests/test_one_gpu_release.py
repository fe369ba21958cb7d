"""Issue 39 finding 3: one-GPU runners can release a GPU cell. The bus-bandwidth test skips with
`one-gpu-on-runner` on one GPU; no waiver covers a GPU check, yet the refusal suggested --accept-skip. Now the
one-GPU runner's verdict releases when a trusted verdict of the same digest, cell, platform and image-tests,
from a runner with two or more usable GPUs, passed those tests (release.gpusplit); otherwise the refusal names
exactly that verdict and never suggests --accept-skip."""

from __future__ import annotations

from typing import Any

import pytest

from buildtool.contracts.verdict import Verdict, parse_verdict
from buildtool.release.gates import verdict_problems
from buildtool.validate.verdict_choice import Decision, Found, decide
from tests.conftest import fixture_matrix
from tests.signing import KEY, result, verdict

CELLS = {c.key: c for c in fixture_matrix().cells}
CUDA = CELLS["pytorch-cuda:2.13"]
D1 = "sha256:" + "1" * 64
BUSBW = "pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw"
OTHERS = ["common/test_x.py::test_a", "common/test_contents.py::test_gpus_visible", "pytorch/test_ddp.py::test_loss"]
GH200 = "NVIDIA GH200 480GB"
REF_ONE, REF_MULTI = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def run(gpus: int, *, busbw: str, others: str = "passed", platform: str = "linux/arm64", name: str = GH200,
        started: str = "2026-03-02T02:00:00+00:00", selected: bool = False, **changes: Any) -> Verdict:
    """A verdict of pytorch-cuda on `gpus` GPUs; `selected`: a -k run of the bus-bandwidth test only."""
    skip = ("one-gpu-on-runner", "one GPU on this runner") if busbw == "skipped" else ("", "")
    tests = [] if selected else [result(OTHERS[0]), result(OTHERS[1], others, gpu=True), result(OTHERS[2])]
    tests.append(result(BUSBW, busbw, *skip, gpu=True))
    complete = not selected and busbw == "passed" and others == "passed"
    body = verdict(CUDA, D1, "passed" if complete else ("failed" if "failed" in (busbw, others) else "incomplete"),
                   tests=tests, started=started, platform=platform, **changes)
    body["defined_tests"] = [*OTHERS, BUSBW]
    body["gpu_tests"] = [OTHERS[1], BUSBW]
    if selected:
        body["selection"] = {"expression": "test_ddp_nccl_allreduce_busbw", "deselected": OTHERS}
    body["runner"] = {"hostname": f"gpu-{gpus}", "gpu_runner": True, "driver": "580.65.06", "cuda_driver": "13.0",
                      "gpus": [{"index": str(i), "name": name} for i in range(gpus)], "gpus_usable": True}
    if busbw == "passed":
        body["figures"] = {"allreduce_busbw": {"ranks": gpus, "gpu_model": name, "peak_GBps": 300.0}}
    return parse_verdict(body, "test verdict")


def split(chosen: Verdict, chosen_ref: str, others: list[tuple[str, Verdict]]) -> Decision:
    """The decision release and verify take over these verdicts (buildtool.validate.verdict_choice)."""
    return decide([Found(ref, v, KEY.public().keyid, None) for ref, v in [(chosen_ref, chosen), *others]], [])


def gate(chosen: Verdict, others: list[tuple[str, Verdict]], chosen_ref: str = REF_ONE) -> list[str]:
    pair = split(chosen, chosen_ref, others)
    assert pair.counted is not None
    return verdict_problems(CUDA, D1, pair.counted.verdict, (), None, pair.covered, tuple(pair.why_not))


ONE = run(1, busbw="skipped")


def test_a_one_gpu_verdict_alone_names_exactly_the_verdict_it_lacks_and_no_waiver() -> None:
    """Before issue 39 the refusal ended '(or waive a runner limit with --accept-skip)', which cannot help."""
    found = gate(ONE, [])
    assert any(f"{BUSBW} skipped as one-gpu-on-runner on 1x {GH200}: release also needs a trusted verdict of {D1} "
               "for pytorch-cuda:2.13 on linux/arm64, with the same image-tests, from a runner with two or more usable "
               "GPUs in which it passed (there is none); run `buildtool validate IMAGE --require-gpu -k "
               "test_ddp_nccl_allreduce_busbw` on such a runner (--accept-skip cannot waive a GPU check)" in p
               for p in found), found
    assert not any("waive the runner's limit" in p or "waive a runner limit" in p for p in found), found


@pytest.mark.parametrize("chosen_is_the_one_gpu_run", [True, False])
def test_the_one_gpu_verdict_and_a_multi_gpu_busbw_run_release_together(chosen_is_the_one_gpu_run: bool) -> None:
    multi = run(2, busbw="passed", selected=True,
                started="2026-03-01T02:00:00+00:00" if chosen_is_the_one_gpu_run else "2026-03-03T02:00:00+00:00")
    if chosen_is_the_one_gpu_run:
        assert gate(ONE, [(REF_MULTI, multi)]) == []
    else:   # the -k run is newer: the one-GPU verdict is found among the others and judged
        pair = split(multi, REF_MULTI, [(REF_ONE, ONE)])
        assert pair.counted is not None and pair.counted.verdict is ONE and BUSBW in pair.covered
        assert "on 2x NVIDIA GH200 480GB" in pair.covered[BUSBW]
        assert gate(multi, [(REF_ONE, ONE)], REF_MULTI) == []


@pytest.mark.parametrize(("other", "why"), [
    (run(2, busbw="passed", selected=True, platform="linux/amd64"), "it ran on linux/amd64, not linux/arm64"),
    (run(1, busbw="skipped", started="2026-03-01T00:00:00+00:00"), f"its runner had 1x {GH200}"),
    (run(2, busbw="passed", selected=True, test_code="sha256:" + "9" * 64), "it ran image-tests sha256:9999999999"),
])
def test_a_companion_of_another_platform_gpu_count_result_or_test_code_is_refused_naming_why(other, why) -> None:
    found = gate(ONE, [(REF_MULTI, other)])
    assert any("release also needs a trusted verdict" in p and why in p for p in found), found


def test_a_multi_gpu_failure_no_older_than_the_one_gpu_run_counts_itself() -> None:
    """Issue 48: the newest-failure rule runs across the pair. A multi-GPU run that failed the bus-bandwidth
    test, signed at the one-GPU run's time on another runner, is not shown older than it: it counts, and the
    refusal names its failed test (before, it was only a companion that did not cover)."""
    failed = run(2, busbw="failed", selected=True)
    pair = split(ONE, REF_ONE, [(REF_MULTI, failed)])
    assert pair.counted is not None and pair.counted.verdict is failed
    assert pair.note.startswith(f"verdict {REF_MULTI} (failed, started 2026-03-02T02:00:00+00:00, by gpu-2) "
                                f"counts over {REF_ONE} (started 2026-03-02T02:00:00+00:00): its signed time does "
                                "not show it ran before it"), pair.note
    found = gate(ONE, [(REF_MULTI, failed)])
    assert any(p.startswith(f"verdict of {D1} is 'failed' (failed: {BUSBW})") for p in found), found


def test_a_newer_multi_gpu_failure_outvotes_an_older_pass() -> None:
    older = run(2, busbw="passed", selected=True, started="2026-03-01T00:00:00+00:00")
    newer = run(2, busbw="failed", selected=True, started="2026-03-01T12:00:00+00:00")
    found = gate(ONE, [(REF_MULTI, older), ("sha256:" + "c" * 64, newer)])
    assert any("it failed" in p for p in found), found


def test_a_one_gpu_verdict_whose_other_tests_failed_is_not_rescued() -> None:
    multi = run(2, busbw="passed", selected=True, started="2026-03-01T00:00:00+00:00")
    found = gate(run(1, busbw="skipped", others="failed"), [(REF_MULTI, multi)])
    assert any("is 'failed'" in p for p in found), found


def test_release_notes_name_both_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through release's own verdict gate (gather), as test_verdict_gate does for the groups."""
    from buildtool.matrix.plan import CellPlan
    from buildtool.release import gather, promote
    from buildtool.release.model import Evidence
    from buildtool.release.testcode import KnownCode
    from buildtool.validate import verdicts
    from tests.signing import CODE, KEY, trusted

    multi = run(2, busbw="passed", selected=True, started="2026-03-03T02:00:00+00:00")
    found = [verdicts.Found(artifact=ref, verdict=v, keyid=KEY.public().keyid, referrer=None)  # type: ignore[arg-type]
             for ref, v in ((REF_ONE, ONE), (REF_MULTI, multi))]
    monkeypatch.setattr(verdicts, "find_verdicts", lambda *args, **kwargs: verdicts.Findings(found=found))
    plan = CellPlan(cell=CUDA, revision="0123456789ab", dev_repo="127.0.0.1:5000/pytorch-cuda-dev",
                    dev_tag="0123456789ab-2.13", release_repo="127.0.0.1:5000/pytorch-cuda",
                    release_tags=("2.13-0.1.0",), moving_tags=(), base=CUDA.base)
    item = Evidence(D1, platform="linux/arm64")
    options = promote.ReleaseOptions("0.1.0", "0123456789ab", trusted=trusted(),
                                     known_code=KnownCode({CODE: ("image-tests at the image's revision", None)}))
    gather._gate_verdict(None, item, plan, "pytorch-cuda-dev", options, True)  # type: ignore[arg-type]
    verdict_or_gpu = [p for p in item.problems if "one-gpu" in p or "GPU test" in p or "incomplete" in p]
    assert verdict_or_gpu == [], item.problems
    assert item.verdict is ONE and any("multi-GPU checks from: " + BUSBW in n for n in item.notes), item.notes
    assert [s["accepted_by"] for s in item.skips] == [f"{BUSBW} passed in verdict {REF_MULTI[:19]}… on 2x {GH200} "
                                                      "(2026-03-03T02:00:00+00:00)"]


def test_accept_skip_is_suggested_only_for_codes_it_can_waive() -> None:
    cpu = CELLS["pytorch-cpu:2.13"]
    lock = result("common/test_locked_packages.py::test_locked_packages_installed_at_their_versions", "skipped",
                  "no-lock-label", "no label")
    ulimit = result("common/test_run_profile.py::test_ulimit[memlock]", "skipped", "ulimit-not-granted",
                    "the engine refused", subject="memlock")
    ok = result("common/test_x.py::test_a")
    refused = verdict_problems(cpu, D1, parse_verdict(verdict(cpu, D1, tests=[ok, lock]), "t"))
    assert any(p.endswith("; no --accept-skip waives these codes") for p in refused), refused
    waivable = verdict_problems(cpu, D1, parse_verdict(verdict(cpu, D1, tests=[ok, ulimit]), "t"))
    # The exact flag that waives it (issue 50), not a list of codes to assemble one from.
    assert any(p.endswith("(or waive the runner's limit: pass --accept-skip ulimit-not-granted)")
               for p in waivable), waivable
