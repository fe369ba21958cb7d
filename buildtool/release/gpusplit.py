"""One-GPU runners (issue 39): a GPU cell released from two verdicts of the same digest.

A runner with one GPU (a cloud `g` instance, a one-GH200 server) runs every test of a GPU cell except the
multi-GPU checks, which skip with `one-gpu-on-runner` (bus bandwidth: an all-reduce on one GPU moves no
data). Such a verdict is `incomplete`, and no waiver covers a GPU check. It counts as complete when a
second verdict covers exactly those tests: trusted (it verified, as every verdict `find_verdicts` returns),
of the same digest, cell, platform and image-tests code, run on a runner with two or more usable GPUs,
with no failed test, and the newest such verdict that ran them passed each of them. Either of the two may
be the one that counts (the newest); the other is looked for among the rest. Pure: what release read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from buildtool.contracts import skips
from buildtool.contracts.verdict import Verdict


@dataclass
class Split:
    """The verdict the gate judges (`base`: the one-GPU runner's), and for each of its one-gpu-on-runner
    skips the multi-GPU verdict that passed it (`covered`: test id -> description), or why none did."""

    base: Verdict
    base_ref: str
    covered: dict[str, str] = field(default_factory=dict)
    why_not: list[str] = field(default_factory=list)   # each other verdict, and why it does not cover them

    @property
    def companion_note(self) -> str:
        return "; ".join(sorted(set(self.covered.values())))


def one_gpu_skips(verdict: Verdict) -> list[str]:
    return [t.id for t in verdict.tests if t.result == "skipped" and t.skip_code == skips.ONE_GPU_ON_RUNNER.code]


def _gpus(verdict: Verdict) -> str:
    gpus = verdict.runner.gpus
    return f"{len(gpus)}x {gpus[0].name}" if gpus else "no GPU"


def _companion_problem(base: Verdict, other: Verdict, needed: list[str]) -> str:
    """Why `other` cannot supply the multi-GPU tests `base` skipped ("" when it can)."""
    if other.digest != base.digest or other.cell != base.cell:
        return f"it is of {other.cell} {other.digest}"
    if other.platform != base.platform:
        return f"it ran on {other.platform or 'an unrecorded platform'}, not {base.platform or 'the same'}"
    if other.test_code != base.test_code:
        return f"it ran image-tests {other.test_code[:19]}, not {base.test_code[:19]}"
    if len(other.runner.gpus) < 2 or other.runner.gpus_usable is not True:
        return f"its runner had {_gpus(other)}{'' if other.runner.gpus_usable else ' (not usable)'}"
    failed = [t.id for t in other.tests if t.result == "failed"]
    if failed or other.result == "failed":
        return f"it failed ({', '.join(failed[:2]) or other.result})"
    results = {t.id: t.result for t in other.tests}
    not_passed = [f"{i} {results.get(i, 'not run')}" for i in needed if results.get(i) != "passed"]
    return f"it did not pass {', '.join(not_passed)}" if not_passed else ""


def split(chosen: Verdict, chosen_ref: str, others: list[tuple[str, Verdict]]) -> Split:
    """The one-GPU verdict and what covers its multi-GPU skips. `chosen` is the verdict that counts; when it
    is itself a multi-GPU run that skipped nothing as one-gpu, the newest one-GPU verdict of the same
    digest that it covers is judged instead (its complete run of the other tests is what releases)."""
    base, base_ref = chosen, chosen_ref
    if not one_gpu_skips(chosen) and len(chosen.runner.gpus) >= 2:
        for ref, other in sorted(others, key=lambda o: o[1].started, reverse=True):
            needed = one_gpu_skips(other)
            if needed and not _companion_problem(other, chosen, needed):
                base, base_ref = other, ref
                break
    needed = one_gpu_skips(base)
    found = Split(base, base_ref)
    if not needed:
        return found
    pool = [(chosen_ref, chosen)] if base is not chosen else []
    pool += [(ref, v) for ref, v in others if v is not base]
    # The newest multi-GPU verdict that ran these tests decides: an older pass does not outvote a newer failure.
    ran = [(ref, v) for ref, v in pool if len(v.runner.gpus) >= 2
           and any(t.id in needed and t.result in ("passed", "failed") for t in v.tests)]
    for ref, other in sorted(ran, key=lambda o: o[1].started, reverse=True)[:1] or pool:
        problem = _companion_problem(base, other, needed)
        if problem:
            found.why_not.append(f"verdict {ref[:19]}… ({other.started}): {problem}")
            continue
        for test_id in needed:
            found.covered[test_id] = f"{test_id} passed in verdict {ref[:19]}… on {_gpus(other)} ({other.started})"
        break
    return found
