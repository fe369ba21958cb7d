"""bench/bench_platforms.py's validation figure on a stand-in `buildtool validate`: the reports it asks for are
not left behind."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture
def bench_platforms(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setattr(sys, "path", list(sys.path))   # the bench puts the repository on sys.path
    from bench import bench_platforms as module

    return module


@pytest.mark.parametrize("code", [0, 1])
def test_the_validation_reports_folder_is_removed(code: int, monkeypatch: pytest.MonkeyPatch,
                                                  bench_platforms: ModuleType) -> None:
    """Each `buildtool validate` of the bench wrote its JUnit and verdict under /tmp/bench-platforms-<pid>, which
    nothing removed, whether the validation passed or failed."""
    folders: list[Path] = []

    def validate(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        folder = Path(argv[argv.index("--reports") + 1])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "junit.xml").write_text("<testsuites/>\n")   # what validate writes there
        folders.append(folder)
        return subprocess.CompletedProcess(argv, code, "", "failed\n" if code else "")

    monkeypatch.setattr(bench_platforms.subprocess, "run", validate)
    try:
        if code:
            with pytest.raises(SystemExit, match="failed"):
                bench_platforms.validate("img:1", "linux/arm64")
        else:
            assert bench_platforms.validate("img:1", "linux/arm64") >= 0
        left = [folder for folder in folders if folder.exists()]
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    assert len(folders) == 1 and left == [], folders
