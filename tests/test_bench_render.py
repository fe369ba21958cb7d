"""bench/bench_render.py's two arms (in process, CLI process) do the same work: from the same tree they write the
same files, every one `buildtool render` writes."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench_render(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setattr(sys, "path", list(sys.path))   # the bench puts the repository on sys.path
    from bench import bench_render as module

    return module


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_both_arms_render_the_same_outputs_the_cli_does(tmp_path: Path, bench_render: ModuleType) -> None:
    """The in-process arm deleted dockerfiles/ (the cells' locks with it) and rendered the Dockerfiles and the
    catalogue without the project root the CLI passes (no apt pins), and no workflows; the CLI arm rendered them
    all, and after its first run wrote nothing: two figures of unlike work printed side by side."""
    matrix = bench_render.project_copy(tmp_path)
    files = bench_render.generated(matrix)
    assert "docs/images.md" in files and any(f.startswith(".github/workflows/") for f in files), files
    assert any(f.endswith("/Dockerfile") for f in files), files
    trees = []
    for arm in bench_render.ARMS.values():
        bench_render.remove_generated(matrix, files)
        assert not any((tmp_path / rel).exists() for rel in files)
        arm(matrix)
        trees.append(_tree(tmp_path))
    assert len(trees) == 2 and trees[0] == trees[1]
    # What they write is what is committed: the copy holds everything render reads (the locks, the releases).
    assert {rel: trees[0][rel] for rel in files} == {rel: (REPO / rel).read_bytes() for rel in files}
