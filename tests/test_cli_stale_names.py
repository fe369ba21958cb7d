"""A stale generated file is named as it is on disk: render and check printed its path through rich, which read a
`[/]` in a folder's name as markup (a traceback after the files were written) and `:ok:` as an emoji."""

from __future__ import annotations

from pathlib import Path


def test_render_and_check_name_a_stale_file_as_it_is(project: Path, run_cli) -> None:
    for folder in ("dockerfiles/old/[/]", "dockerfiles/old/[red]:ok:"):
        (project / folder).mkdir(parents=True)
        (project / folder / "Dockerfile").write_text("FROM scratch\n")
    matrix = str(project / "matrix.yaml")
    code, out, err = run_cli("render", "--matrix", matrix)
    assert code == 0 and "Traceback" not in err, err
    assert "stale: dockerfiles/old/[/]/Dockerfile belongs to no cell; delete it or run `buildtool render --prune`" \
        in err.splitlines(), err
    assert "stale: dockerfiles/old/[red]:ok:/Dockerfile belongs to no cell; delete it or run `buildtool render " \
        "--prune`" in err.splitlines(), err
    code, out, err = run_cli("check", "--offline", "--matrix", matrix)
    assert code == 1 and "Traceback" not in err, err
    assert "stale: dockerfiles/old/[/]/Dockerfile belongs to no cell in the matrix; delete it or run `buildtool " \
        "render --prune`" in err.splitlines(), err
    code, out, err = run_cli("render", "--prune", "--matrix", matrix)
    assert code == 0, err
    assert "deleted dockerfiles/old/[/]/Dockerfile (its cell is gone from the matrix)" in out.splitlines(), out
    assert not (project / "dockerfiles/old/[/]/Dockerfile").exists()
