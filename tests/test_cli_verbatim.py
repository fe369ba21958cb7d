"""What a command prints for machines or to apply reaches stdout as it is: rich reads `:name:` as an emoji code
(and expands tabs) even with markup off, so JSON and diffs printed through it were not the text they stood for."""

from __future__ import annotations

import json
from pathlib import Path


def test_build_json_prints_each_cells_message_as_it_is(project: Path, run_cli, monkeypatch):
    """`build --json` went through rich too: a failed cell's message holding `:x:` came out as ❌."""
    from buildtool.imagebuild.builder import Builder, CellResult

    failed = CellResult(cell="pytorch-cpu:2.13", result="failed", message="step RUN a:x:b failed")
    monkeypatch.setattr(Builder, "run", lambda self, plans: [failed])
    code, out, err = run_cli("build", "--json", "-f", "pytorch-cpu:2.13", "--matrix", str(project / "matrix.yaml"))
    assert code == 1, err
    assert json.loads(out) == {"results": [failed.to_json()]}


def test_keys_names_its_folder_in_a_work_tree_as_it_is(run_cli, tmp_path: Path):
    """The warning for a key pair made inside a git work tree printed the folder through rich: `:ok:` in its name
    came out as 🆗, naming a folder that does not exist."""
    (tmp_path / ".git").mkdir()
    folder = tmp_path / "keys:ok:"
    code, out, err = run_cli("keys", "--name", "k", "--out", str(folder))
    assert code == 0, err
    assert f"warning: {folder} is inside a git work tree; never commit k.key" in err.splitlines(), err
