"""A build log never keeps the host's index credentials: not the cell's log, not the copy kept by image."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from buildtool.imagebuild import engine
from buildtool.imagebuild.pipconfig import HostPip

TOKEN = "s3cr3tTOKEN"
INDEX = f"https://user:{TOKEN}@pkgs.example.invalid/simple"
IMAGE = "sha256:" + "7" * 64


def test_the_log_kept_by_image_is_scrubbed_as_the_cells_log_is(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """pip echoes the index URL it was given into the build output: the builder scrubs the token from the cell's
    log, and the copy engine.build keeps under by-image/<id>.log (the log a later push's provenance reads) was
    made from the scrubbed log, never from the raw one."""
    from buildtool.imagebuild import builder
    from buildtool.matrix.loader import load_matrix
    from buildtool.matrix.plan import Settings, plan_cell

    root = Path(__file__).resolve().parents[1]
    cell = next(c for c in load_matrix(root / "matrix.yaml").cells if c.key == "pytorch-cpu:2.13")
    settings = Settings(registry="127.0.0.1:5999/team")
    plan = plan_cell(cell, settings, "nightly-1")
    run = builder.Builder(root, "matrix.yaml", settings, "nightly-1", builder.BuildOptions(log_dir=tmp_path), print)

    def fake_run(argv, **kwargs):  # noqa: ANN001, ANN003, ANN202
        Path(argv[argv.index("--iidfile") + 1]).write_text(IMAGE)
        kwargs["stdout"].write(f"#9 1.20 Looking in indexes: {INDEX}\n")
        return subprocess.CompletedProcess(argv, 0)

    client = engine.BuildClient(("client-stand-in", "build"), (), "classic")
    monkeypatch.setattr(engine.subprocess, "run", fake_run)
    monkeypatch.setattr(builder.Builder, "_build_env",
                        lambda self: (client, SimpleNamespace(files={}), HostPip(index_url=INDEX)))
    monkeypatch.setattr(builder, "build_labels", lambda *args: {})
    base = SimpleNamespace(ref="127.0.0.1:5000/library/debian:bookworm-slim", pinned="b@sha256:" + "b" * 64,
                           digest="sha256:" + "b" * 64)
    log = tmp_path / "pytorch-cpu-2.13.log"
    assert run._buildkit(plan, base, "sha256:" + "f" * 64, log, None) == IMAGE   # type: ignore[arg-type]
    kept = engine.image_record(tmp_path, IMAGE)
    assert kept is not None and kept[1].is_file()
    for text in (log.read_text(), kept[1].read_text(), kept[0].read_text()):
        assert TOKEN not in text
    assert "Looking in indexes: https://user:****@pkgs.example.invalid/simple" in kept[1].read_text()
