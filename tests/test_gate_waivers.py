"""Issue 48: a waiver names a skip code and is matched by name, never against the skip's prose. Before, the
gate matched `--accept-skip` as a regular expression over "[code] reason", so a `ulimit-not-granted` skip whose
reason mentioned `no-peer-image` was waived by `--accept-skip no-peer-image`. Release and verify read the same
rule (gates.waiver_for); an unknown or unwaivable code is bad input."""

from __future__ import annotations

import pytest

from buildtool.contracts import skips
from buildtool.contracts.verdict import TestResult as Outcome
from buildtool.contracts.verdict import parse_verdict
from buildtool.release.gates import verdict_problems, waiver_for
from tests.conftest import fixture_matrix
from tests.signing import result, verdict

CPU = {c.key: c for c in fixture_matrix().cells}["pytorch-cpu:2.13"]
D1 = "sha256:" + "1" * 64
ULIMIT = "common/test_run_profile.py::test_ulimit[memlock]"


def ulimit_skip(reason: str, subject: str = "memlock") -> dict[str, object]:
    return result(ULIMIT, "skipped", "ulimit-not-granted", reason, subject=subject)


def problems(skip: dict[str, object], *waivers: str) -> list[str]:
    body = verdict(CPU, D1, tests=[result("common/test_x.py::test_a"), skip])
    return verdict_problems(CPU, D1, parse_verdict(body, "t"), waivers)


def test_a_waiver_of_another_code_does_not_waive_a_skip_whose_reason_mentions_it() -> None:
    skip = ulimit_skip("the engine refused memlock (as with no-peer-image, a runner limit)")
    refused = problems(skip, "no-peer-image")
    assert any("1 test(s) skipped where the matrix expects them to run: " + ULIMIT in p for p in refused), refused
    assert problems(skip, "ulimit-not-granted") == []


def test_a_waiver_with_a_subject_waives_that_subject_only() -> None:
    assert problems(ulimit_skip("refused"), "ulimit-not-granted:memlock") == []
    refused = problems(ulimit_skip("refused"), "ulimit-not-granted:nofile")
    assert any("skipped where the matrix expects them to run: " + ULIMIT in p for p in refused), refused


def test_a_regular_expression_waives_nothing() -> None:
    """What worked before (a regex over the prose) is no waiver now: the gate names codes only."""
    skip = ulimit_skip("cannot grant --ulimit memlock")
    for old in (r"^\[ulimit-not-granted\]", "cannot grant --ulimit memlock", ".*", "ulimit"):
        refused = problems(skip, old)
        assert any("skipped where the matrix expects them to run" in p for p in refused), (old, refused)


def test_waiver_for_names_the_waiver_that_matched() -> None:
    test = Outcome.model_validate(ulimit_skip("x"))
    assert waiver_for(CPU, test, ("no-peer-image", "ulimit-not-granted:memlock")) == "ulimit-not-granted:memlock"


@pytest.mark.parametrize(("text", "why"), [
    ("no-such-code", "no such skip code (waivable codes: ulimit-not-granted, no-peer-image)"),
    ("no-gpu-on-runner", "no-gpu-on-runner cannot be waived (GPU check of a GPU cell on a runner without usable "
                         "GPUs)"),
    (r"^\[no-peer-image\]", "not a skip code (CODE or CODE:SUBJECT"),
    ("no-peer-image:", "not a skip code (CODE or CODE:SUBJECT"),
    # `$` matched before a final line break: the waiver was accepted and waived the skip it names
    ("ulimit-not-granted:memlock\n", "not a skip code (CODE or CODE:SUBJECT"),
    ("no-peer-image\n", "not a skip code (CODE or CODE:SUBJECT"),
])
def test_a_waiver_that_is_not_a_waivable_code_is_refused_naming_why(text: str, why: str) -> None:
    with pytest.raises(ValueError) as raised:
        skips.parse_waiver(text)
    assert why in str(raised.value)
