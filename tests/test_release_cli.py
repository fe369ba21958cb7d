"""The release command's input checks and table, without a registry."""

from __future__ import annotations

import pytest

from buildtool.cli.release import print_report
from buildtool.release.promote import ImageRelease, ReleaseReport


def test_table_prints_test_ids_with_brackets_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    item = ImageRelease(cell="pytorch-cpu:2.13", image="pytorch-cpu", source="s", release_repo="r",
                        status="refused", problems=["skipped: common/test_run_profile.py::test_ulimit[memlock] (x)"])
    print_report(ReleaseReport("0.1.0", "abc[1]", [item]))
    out = capsys.readouterr().out
    assert "test_ulimit[memlock]" in out and "abc[1]" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--version", "0.1.0", "--from", "no/such-branch"], "--from 'no/such-branch' is neither a commit"),
    (["--version", "x.y"], "--version 'x.y' is not a version"),
    (["--version", "0.1.0", "--accept-skip", "("], "--accept-skip '(' is not a regular expression"),
    (["--version", "0.1.0", "--framework", "nope"], "unknown FRAMEWORK='nope'"),
])
def test_bad_input_is_one_line_and_exit_2(project, run_cli, args, message) -> None:  # noqa: ANN001
    code, out, err = run_cli("release", *args, "--matrix", str(project / "matrix.yaml"))
    assert code == 2, (out, err)
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (project / "docs/releases").exists()


def test_unreachable_registry_is_exit_2_naming_the_fix(project, run_cli, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("REGISTRY", "127.0.0.1:1")     # nothing listens on port 1
    monkeypatch.delenv("RELEASE_REGISTRY", raising=False)
    code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu",
                             "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and "registry 127.0.0.1:1 is unreachable" in err and "REGISTRY" in err
    assert not (project / "docs/releases").exists()
