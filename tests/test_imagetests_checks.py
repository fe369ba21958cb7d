"""Image checks that could not fail on an image with the fault they look for, each shown failing here against a
stand-in (rank files as torchrun's ranks write them, a host's environment) with no engine."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest

IMAGE_TESTS = Path(__file__).resolve().parent.parent / "image-tests"
for _folder in ("", "pytorch", "common"):
    sys.path.insert(0, str(IMAGE_TESTS / _folder))
import harness  # noqa: E402

with warnings.catch_warnings():   # their marks are image-tests' own (image-tests/conftest.py)
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    import test_collectives as collectives_tests


class LoneRanks:
    """torchrun whose every rank ends well but formed a group of its own (world size 1): each all_reduce returns its
    own input, which is the right answer for a world of one."""

    def __init__(self, folder: Path, world: int) -> None:
        self.folder, self.world = folder, world

    def run(self, argv: list[str], step: str, quiet: float = 0, env: dict[str, str] | None = None) -> harness.Probe:
        nproc = int(argv[argv.index("--nproc-per-node") + 1])
        want = [self.world * (self.world + 1) / 2] * 8
        for rank in range(nproc):
            checks = {"all_reduce(SUM)": {"ok": True, "got": want, "want": want}}
            (self.folder / f"rank-{rank}.start.json").write_text("{}")
            (self.folder / f"rank-{rank}.json").write_text(json.dumps(
                {"ok": True, "rank": str(rank), "backend": "gloo", "world_size": self.world, "checks": checks}))
        return harness.Probe(step=step, argv=argv, rc=0, dir=self.folder)


def test_collectives_of_ranks_that_each_ran_alone_fail_naming_their_world_size(tmp_path):
    """Before: passed, the expected sums being computed from the world size each rank reported (1)."""
    with pytest.raises(AssertionError) as failed:
        collectives_tests.test_collectives_give_known_results_on_cpu(LoneRanks(tmp_path, world=1))
    assert str(failed.value).startswith("collectives on 2 ranks (gloo): not every rank joined one group of 2: "
                                        "rank 0 reports world size 1, rank 1 reports world size 1")


def test_collectives_of_ranks_in_one_group_still_pass(tmp_path):
    collectives_tests.test_collectives_give_known_results_on_cpu(LoneRanks(tmp_path, world=2))
