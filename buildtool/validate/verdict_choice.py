"""Which verdict counts, of the trusted verdicts of one digest and cell: the one rule release, `verify` and the
report apply. buildtool.validate.verdicts reads the registry; this decides, from what the testers signed. Pure.

Only what a tester signed orders verdicts: each verdict's signed `started`, bounded by the reader's clock
(unplaceable); nothing a pusher can rewrite without a trusted key takes part. The rules (the base, one-GPU
companions, the newest-failure rule, failures that cannot be placed) are written out in docs/release-trust.md,
"Which verdict counts".
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from buildtool.common.refs import shown, shown_plain
from buildtool.contracts import skips
from buildtool.contracts.gpu import BUSBW_FIGURE
from buildtool.contracts.verdict import Verdict, recorded_failure, when

if TYPE_CHECKING:
    from buildtool.attest.referrers import Referrer

# How far apart two runners' clocks may be (NTP keeps them within seconds), and how far after the reader's clock a
# verdict may be dated: within it, a failure is never shown older than another runner's pass.
CLOCK_SKEW_S = 300


def unplaceable(started: str, now: dt.datetime) -> str:
    """Why a verdict's signed `started` cannot be placed in time ("" when it can)."""
    placed = when(started)
    if placed is None:
        return f"its started time {started[:40]!r} does not parse"
    if placed > now + dt.timedelta(seconds=CLOCK_SKEW_S):
        return (f"it is dated {started[:40]}, more than {CLOCK_SKEW_S} s after this machine's clock "
                f"({now.isoformat(timespec='seconds')})")
    return ""


@dataclass(frozen=True)
class Found:
    """A verdict that verified: signed by a trusted tester key, about this digest (and cell, where asked)."""

    artifact: str                  # digest of the attestation artifact it was read from
    verdict: Verdict
    keyid: str
    referrer: Referrer | None      # its descriptor, as its own manifest says (release copies it)

    @property
    def started(self) -> dt.datetime:
        placed = when(self.verdict.started)
        assert placed is not None, "an unplaceable verdict is never ordered by time"
        return placed


@dataclass
class Decision:
    """The verdict that counts (`counted`), why it is not simply the newest (`note`), and for a one-GPU runner's
    verdict the multi-GPU verdict that completes it (`companion`; `covered`: test id -> where it passed) or why
    none does (`why_not`)."""

    counted: Found | None = None
    note: str = ""
    companion: Found | None = None
    covered: dict[str, str] = field(default_factory=dict)
    why_not: list[str] = field(default_factory=list)

    @property
    def companion_note(self) -> str:
        return "; ".join(sorted(set(self.covered.values())))


def has_failure(verdict: Verdict) -> bool:
    """A failure by its summary or by its own record (recorded_failure): a `passed` over a failed test is one."""
    return verdict.result == "failed" or bool(recorded_failure(verdict))


def whole_run(verdict: Verdict) -> bool:
    return not verdict.selection.expression and not verdict.selection.deselected


def not_shown_older(failure: Found, other: Found) -> bool:
    """Whether the signed times cannot show `failure` ran before `other` (the newest-failure rule)."""
    same_clock = failure.keyid == other.keyid and failure.verdict.runner.hostname == other.verdict.runner.hostname
    margin = 0 if same_clock else CLOCK_SKEW_S
    return failure.started + dt.timedelta(seconds=margin) >= other.started


def _newest(found: list[Found]) -> Found:
    return max(found, key=lambda f: (f.started, has_failure(f.verdict), f.artifact))


def one_gpu_skips(verdict: Verdict) -> list[str]:
    return [t.id for t in verdict.tests if t.result == "skipped" and t.skip_code == skips.ONE_GPU_ON_RUNNER.code]


def gpus_text(verdict: Verdict) -> str:
    gpus = verdict.runner.gpus
    return f"{len(gpus)}x {gpus[0].name}" if gpus else "no GPU"


def decide(found: list[Found], unplaced: list[tuple[Found, str]]) -> Decision:
    """The decision over the placed verdicts `found` and the failures that cannot be placed."""
    if unplaced:
        first, why = unplaced[0]
        return Decision(first, f"verdict {first.artifact} ({first.verdict.result}) counts as the newest: {why}, so "
                               "no older pass can be ordered after it")
    if not found:
        return Decision()
    base = _newest([f for f in found if whole_run(f.verdict)] or found)
    decision = Decision(base)
    needed = one_gpu_skips(base.verdict)
    if needed:
        _pair(decision, base, [f for f in found if f is not base], needed)
    members = [base, *([decision.companion] if decision.companion else [])]
    blockers = [f for f in found if all(f is not m for m in members) and has_failure(f.verdict)
                and any(not_shown_older(f, m) for m in members)]
    if blockers and not has_failure(base.verdict):
        blocker = _newest(blockers)
        shown = ", ".join(f"{m.artifact} (started {m.verdict.started})" for m in members)
        return Decision(blocker, f"verdict {blocker.artifact} ({blocker.verdict.result}, started "
                                 f"{blocker.verdict.started}, by {blocker.verdict.runner.hostname}) counts over "
                                 f"{shown}: its signed time does not show it ran before "
                                 f"{'them' if len(members) > 1 else 'it'} (runners' clocks may differ by "
                                 f"{CLOCK_SKEW_S} s); validate the image again")
    return decision


def _pair(decision: Decision, base: Found, others: list[Found], needed: list[str]) -> None:
    """The newest multi-GPU verdict that ran the tests `base` skipped as one-gpu-on-runner decides them: it
    completes the base when it passes everything a verdict passes alone (pair_problem); else why not."""
    ran = [f for f in others if len(f.verdict.runner.gpus) >= 2
           and any(t.id in needed and t.result in ("passed", "failed") for t in f.verdict.tests)]
    for other in [_newest(ran)] if ran else others:
        problem = pair_problem(base.verdict, other.verdict, needed)
        if problem:
            decision.why_not.append(f"verdict {other.artifact[:19]}… ({other.verdict.started}): {problem}")
            continue
        decision.companion = other
        decision.covered = {test_id: f"{test_id} passed in verdict {other.artifact[:19]}… on "
                                     f"{gpus_text(other.verdict)} ({other.verdict.started})" for test_id in needed}
        return


def pair_problem(base: Verdict, other: Verdict, needed: list[str]) -> str:
    """Why `other` cannot supply the multi-GPU tests `base` skipped ("" when it can): it must pass every check
    a verdict passes alone, and have run and passed each of them."""
    if other.digest != base.digest or other.cell != base.cell:
        return f"it is of {other.cell} {other.digest}"
    if other.platform != base.platform:
        return f"it ran on {other.platform or 'an unrecorded platform'}, not {base.platform or 'the same'}"
    if other.test_code != base.test_code:
        return f"it ran image-tests {other.test_code[:19]}, not {base.test_code[:19]}"
    if other.emulated:
        return f"it ran {other.platform} under emulation: an emulated GPU run is not a GPU run"
    if len(other.runner.gpus) < 2 or other.runner.gpus_usable is not True:
        return f"its runner had {gpus_text(other)}{'' if other.runner.gpus_usable else ' (not usable)'}"
    inventory = inventory_problems(other)
    if inventory:
        return f"its inventory does not hold: {inventory[0]}"
    failed = [t.id for t in other.tests if t.result == "failed"]
    if failed or other.result == "failed":
        return f"it failed ({', '.join(failed[:2]) or other.result})"
    contradiction = recorded_failure(other)
    if contradiction:
        return f"it failed by its own record: {contradiction}"
    results = {t.id: t.result for t in other.tests}
    not_passed = [f"{i} {results.get(i, 'not run')}" for i in needed if results.get(i) != "passed"]
    return f"it did not pass {', '.join(not_passed)}" if not_passed else ""


def inventory_problems(verdict: Verdict) -> list[str]:
    """A GPU verdict must say which GPUs its GPU tests ran on, and agree with what they report: `runner.gpus`
    non-empty, each with a model name, `gpus_usable` true; the bus-bandwidth test's figure (ranks, gpu_model)
    equal to the inventory (it passed: the figure must be there); any check skipped as one GPU: the inventory
    lists one.
    A passed GPU test with no usable GPU is a verdict that lies."""
    runner = verdict.runner
    gpus = runner.gpus
    if not gpus:
        return ["the verdict's runner lists no GPU (runner.gpus is empty), yet this is a GPU cell whose GPU tests "
                "must have run on GPUs; validate on a GPU runner"]
    problems = []
    if runner.gpus_usable is not True:
        problems.append(f"the runner's GPUs were not usable (gpus_usable is {runner.gpus_usable}"
                        + (f": {runner.gpu_problem}" if runner.gpu_problem else "")
                        + "), yet this is a GPU cell whose GPU tests must have run on them")
    names = [g.name for g in gpus]
    if not all(names):
        problems.append("the verdict's runner lists a GPU without a model name: the inventory is not nvidia-smi's")
    # Figures are a free-form map of what the image tests measured (name -> JSON), in every schema.
    figure = verdict.figures.get(BUSBW_FIGURE)
    busbw = next((t for t in verdict.tests if t.id.split("[", 1)[0].endswith("::test_ddp_nccl_allreduce_busbw")),
                 None)
    if busbw is not None and busbw.result == "passed" and not isinstance(figure, dict):
        problems.append(f"{busbw.id} passed but the verdict has no {BUSBW_FIGURE} figure (ranks, GPU model) "
                        "to check against the runner's GPUs")
    if len(gpus) != 1:   # every check that skips as one GPU (the ranks checks too), not the bus bandwidth alone
        problems += [f"{i} was skipped as one-gpu-on-runner, but the runner lists {len(gpus)} GPUs"
                     for i in one_gpu_skips(verdict)]
    if isinstance(figure, dict):
        ranks, model = figure.get("ranks"), figure.get("gpu_model")
        if ranks != len(gpus):     # the image's output: shown cut
            problems.append(f"the bus-bandwidth test ran on {shown_plain(ranks)} GPUs, but the runner lists "
                            f"{len(gpus)} ({', '.join(names)})")
        if model not in names:
            shown_model = shown(model) if isinstance(model, str) else shown_plain(repr(model))
            problems.append(f"the bus-bandwidth test reports GPU model {shown_model}, but the runner lists "
                            f"{', '.join(sorted(set(names)))}")
    return problems
