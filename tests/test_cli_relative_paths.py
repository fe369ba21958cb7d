"""A relative path given on the command line is the current folder's, as every CLI takes it: `validate --reports` and
`build --log-dir` took theirs relative to the project root while `report --verdicts`, `--baseline` and the others took
the current folder, so from docs/ `validate --reports out` wrote <root>/out and `report --verdicts out` read docs/out.
Left out, each is still the project root's folder (reports/, build-logs/)."""

from __future__ import annotations

import hashlib
import signal
from pathlib import Path

import pytest


def _validate_reports(run_cli, monkeypatch: pytest.MonkeyPatch, project: Path, *args: str) -> Path:
    """The folder `buildtool validate IMAGE ARGS` would write its reports under (as the runner joins it)."""
    from buildtool.cli import validate
    from buildtool.validate import runner

    seen: list[Path] = []

    def capture(ref, loaded, root, options, log, platform):  # noqa: ANN001, ANN202
        # The matrix was read from the root, whatever the current folder (it was exit 2 "cannot be read" from docs/)
        assert options.matrix_digest == runner.matrix_digest(loaded, root) == "sha256:" + hashlib.sha256(
            (project / "matrix.yaml").read_bytes()).hexdigest()
        seen.append((root / options.reports).resolve())
        return {"image": ref, "result": "passed", "tests": [], "incomplete": []}

    monkeypatch.setattr(runner, "validate_image", capture)
    monkeypatch.setattr(validate, "_ref_platforms", lambda ref, wanted: [None])
    monkeypatch.setattr(signal, "signal", lambda *a: None)   # validate's SIGTERM handler stays out of pytest
    code, out, err = run_cli("validate", "127.0.0.1:5000/foreign:1", "--no-store", "--json",
                             "--matrix", str(project / "matrix.yaml"), *args)
    assert code == 0, err
    [folder] = seen
    return folder


def test_validate_reports_is_the_current_folders(project: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: `--reports out` from docs/ was <root>/out."""
    (project / "docs").mkdir(exist_ok=True)
    monkeypatch.chdir(project / "docs")
    assert _validate_reports(run_cli, monkeypatch, project, "--reports", "out") == (project / "docs" / "out").resolve()
    assert _validate_reports(run_cli, monkeypatch, project) == (project / "reports").resolve()


def test_build_log_dir_is_the_current_folders(project: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: `--log-dir logs` from docs/ was <root>/logs."""
    from buildtool.imagebuild.builder import Builder

    seen: list[Path] = []

    def capture(self, plans):  # noqa: ANN001, ANN202
        seen.append(self.options.log_dir.resolve())
        return []

    monkeypatch.setattr(Builder, "run", capture)
    (project / "docs").mkdir(exist_ok=True)
    monkeypatch.chdir(project / "docs")
    for args in (["--log-dir", "logs"], []):
        code, _, err = run_cli("build", "-f", "pytorch-cpu:2.13", "--matrix", str(project / "matrix.yaml"), *args)
        assert code == 0, err
    assert seen == [(project / "docs" / "logs").resolve(), (project / "build-logs").resolve()]


def test_a_failed_run_names_the_folder_its_reports_went_to(project: Path, run_cli,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """From docs/ without --reports, the reports went to <root>/reports and the failure said `see reports under
    reports/`, which from docs/ is a folder that does not exist."""
    from buildtool.cli import validate
    from buildtool.validate import runner

    monkeypatch.setattr(runner, "validate_image", lambda ref, loaded, root, options, log, platform: {
        "image": ref, "result": "failed", "tests": [], "incomplete": []})
    monkeypatch.setattr(validate, "_ref_platforms", lambda ref, wanted: [None])
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    (project / "docs").mkdir(exist_ok=True)
    monkeypatch.chdir(project / "docs")
    for args, folder in (([], project / "reports"), (["--reports", "out"], project / "docs" / "out")):
        code, out, err = run_cli("validate", "127.0.0.1:5000/foreign:1", "--no-store", "--json",
                                 "--matrix", str(project / "matrix.yaml"), *args)
        assert code == 1, err
        assert f"see reports under {folder.resolve()}/" in " ".join(err.split()), err
