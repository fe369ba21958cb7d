"""Which verdict counts is bounded by the clock (issue 37): a verdict dated past the reader's clock, or whose time
does not parse, never counts as a pass, and a failure that does counts as the newest. Only signed times order
verdicts (issue 48): across runners a failure within the clocks' skew of a pass counts over it. Release and verify
read the one rule (buildtool.validate.verdict_choice). In-memory registry."""

from __future__ import annotations

import datetime as dt

from buildtool.release.chain import verify_digest
from buildtool.validate.verdicts import CLOCK_SKEW_S, find_verdicts
from tests import signing
from tests.conftest import fixture_matrix
from tests.memregistry import MemRegistry

REPO = "team/pytorch-cpu"
CPU = next(c for c in fixture_matrix().cells if c.key == "pytorch-cpu:2.13")
NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


def attach(client: MemRegistry, digest: str, result: str, started: str, hostname: str = "ci") -> str:
    tests = [signing.result(f"{g}/test_x.py::test_{g}", result) for g in CPU.tests]
    body = signing.verdict(CPU, digest, result, tests=tests, started=started,
                           runner={"hostname": hostname, "gpu_runner": False, "gpus": [], "driver": "",
                                   "cuda_driver": "", "gpu_problem": ""})
    return signing.attest(client, REPO, digest, body).digest   # type: ignore[arg-type]


def chosen(client: MemRegistry, digest: str):  # noqa: ANN201
    return find_verdicts(client, REPO, digest, signing.trusted(), CPU.key, now=NOW)   # type: ignore[arg-type]


def test_a_pass_dated_in_the_future_does_not_outrank_a_failure_signed_now() -> None:
    client = MemRegistry()
    digest = client.push_image(REPO, "x")
    future = attach(client, digest, "passed", "2099-01-01T00:00:00+00:00")
    failure = attach(client, digest, "failed", "2026-06-01T11:59:00+00:00")
    findings = chosen(client, digest)
    assert findings.chosen is not None and findings.chosen.artifact == failure
    (rejected,) = findings.rejected
    assert rejected.artifact == future
    assert rejected.reason == (f"a pass whose time cannot be placed: it is dated 2099-01-01T00:00:00+00:00, more "
                               f"than {CLOCK_SKEW_S} s after this machine's clock (2026-06-01T12:00:00+00:00)")


def test_a_pass_within_the_skew_still_counts() -> None:
    client = MemRegistry()
    digest = client.push_image(REPO, "x")
    attach(client, digest, "failed", "2026-06-01T11:00:00+00:00")
    soon = attach(client, digest, "passed", (NOW + dt.timedelta(seconds=CLOCK_SKEW_S - 10)).isoformat())
    findings = chosen(client, digest)
    assert findings.chosen is not None and findings.chosen.artifact == soon and findings.order_note == ""


def test_a_newer_failure_whose_time_does_not_parse_blocks_the_older_pass() -> None:
    client = MemRegistry()
    digest = client.push_image(REPO, "x")
    attach(client, digest, "passed", "2026-06-01T10:00:00+00:00")
    failure = attach(client, digest, "failed", "yesterday-ish")
    findings = chosen(client, digest)
    assert findings.chosen is not None and findings.chosen.artifact == failure
    assert "its started time 'yesterday-ish' does not parse" in findings.order_note
    assert findings.order_note.startswith(f"verdict {failure} (failed) counts as the newest")


def test_a_failure_dated_in_the_future_counts_as_the_newest() -> None:
    client = MemRegistry()
    digest = client.push_image(REPO, "x")
    attach(client, digest, "passed", "2026-06-01T10:00:00+00:00")
    failure = attach(client, digest, "failed", "2099-01-01T00:00:00+00:00")
    findings = chosen(client, digest)
    assert findings.chosen is not None and findings.chosen.artifact == failure
    assert "dated 2099-01-01T00:00:00+00:00" in findings.order_note


def test_a_failure_signed_within_the_clock_skew_before_another_runners_pass_counts() -> None:
    """Two runners' clocks may differ by CLOCK_SKEW_S: a failure signed on runner-a a minute before runner-b signed
    a pass is not shown to have run before it, so it counts (issue 48: upload order, which a pusher can rewrite,
    no longer takes part); signed more than the skew before, it is older and the pass counts."""
    client = MemRegistry()
    digest = client.push_image(REPO, "x")
    passed = attach(client, digest, "passed", "2026-06-01T11:00:00+00:00", "runner-b")
    failure = attach(client, digest, "failed", "2026-06-01T10:59:00+00:00", "runner-a")
    findings = chosen(client, digest)
    assert findings.chosen is not None and findings.chosen.artifact == failure
    assert findings.order_note == (f"verdict {failure} (failed, started 2026-06-01T10:59:00+00:00, by runner-a) counts "
                                   f"over {passed} (started 2026-06-01T11:00:00+00:00): its signed time does not show "
                                   f"it ran before it (runners' clocks may differ by {CLOCK_SKEW_S} s); validate the "
                                   "image again")
    client = MemRegistry()
    digest = client.push_image(REPO, "x")
    passed = attach(client, digest, "passed", "2026-06-01T11:00:00+00:00", "runner-b")
    attach(client, digest, "failed", "2026-06-01T10:54:59+00:00", "runner-a")
    findings = chosen(client, digest)
    assert findings.chosen is not None and findings.chosen.artifact == passed and findings.order_note == ""


def test_on_one_runner_its_signed_times_order_its_verdicts() -> None:
    """The same key and hostname: one clock. A pass signed a second after a failure counts, uploaded before it."""
    client = MemRegistry()
    digest = client.push_image(REPO, "x")
    passed = attach(client, digest, "passed", "2026-06-01T10:00:01+00:00")
    attach(client, digest, "failed", "2026-06-01T10:00:00+00:00")
    findings = chosen(client, digest)
    assert findings.chosen is not None and findings.chosen.artifact == passed and findings.order_note == ""


def test_a_pass_newer_by_every_order_counts() -> None:
    client = MemRegistry()
    digest = client.push_image(REPO, "x")
    attach(client, digest, "failed", "2026-06-01T10:00:00+00:00")
    passed = attach(client, digest, "passed", "2026-06-01T11:00:00+00:00")
    findings = chosen(client, digest)
    assert findings.chosen is not None and findings.chosen.artifact == passed and findings.order_note == ""


def test_verify_reads_the_same_rule() -> None:
    client = MemRegistry()
    digest = client.push_image(REPO, "x")
    signing.attest_sbom(client, REPO, digest)   # type: ignore[arg-type]
    signing.attach_provenance(client, REPO, digest, signing.provenance(CPU))   # type: ignore[arg-type]
    attach(client, digest, "passed", "2099-01-01T00:00:00+00:00")
    chain = verify_digest(client, REPO, digest, signing.trusted(), now=NOW)   # type: ignore[arg-type]
    assert not chain.ok and "has no valid verdict" in chain.problem and "dated 2099-01-01" in chain.problem
