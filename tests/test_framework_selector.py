"""FRAMEWORK is one image, cell, framework or all (README, docs/commands.md); only `release` takes a comma list
(`--framework`, repeatable or comma list). Every other command that takes FRAMEWORK refuses a list with one line
saying so, before it reads the matrix or calls out (it was refused as one unknown name, `'a,b'`, after the load)."""

from __future__ import annotations

from pathlib import Path

import pytest

from buildtool.cli.release_run import _cells
from tests.conftest import fixture_matrix

LIST = "pytorch-cpu,tensorflow-cpu"


@pytest.mark.parametrize("command", [["plan"], ["build"], ["build", "--push"], ["bases"], ["lock"], ["validate"],
                                     ["report"]])
def test_a_comma_list_is_refused_by_every_command_but_release_in_one_line(
        run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    monkeypatch.chdir(tmp_path)   # nothing to read here: the refusal comes first
    code, out, err = run_cli(*command, "--framework", LIST)
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1, err
    assert (f"--framework '{LIST}': this command takes one image, cell, framework or all, not a comma list "
            "(only release takes several); run it once for each") in err


def test_release_still_takes_a_comma_list_and_repeats() -> None:
    loaded = fixture_matrix()
    keys = [c.key for c in _cells(loaded, [LIST])]
    assert keys == [c.key for c in loaded.cells if c.name in ("pytorch-cpu", "tensorflow-cpu")]
    assert [c.key for c in _cells(loaded, ["pytorch-cpu", "tensorflow-cpu"])] == keys
