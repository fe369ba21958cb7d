"""What an image or a registry said (a test's message, a build's error, a package listing) reaches the user as it is:
never through rich, which read `:name:` as an emoji code even with markup off, and with each control character
escaped, so an ANSI sequence or a line break in it cannot colour, hide or forge a line of a CI log."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

ESC = "\x1b"


def _verdict(message: str, skip_reason: str = "") -> dict:
    """A failed verdict whose test messages came from inside the image."""
    return {"image": "127.0.0.1:5000/foreign:1", "cell": "pytorch-cpu:2.13", "platform": "linux/amd64",
            "emulated": False, "digest": "sha256:" + "a" * 64, "result": "failed", "duration_s": 1.0, "incomplete": [],
            "tests": [{"id": "test_a.py::test_a", "result": "failed", "message": message, "skip_reason": ""},
                      {"id": "test_b.py::test_b", "result": "skipped", "message": "", "skip_reason": skip_reason}]}


def _validate(run_cli, monkeypatch: pytest.MonkeyPatch, project: Path, verdict: dict, *args: str
              ) -> tuple[int, str, str]:
    from buildtool.cli import validate
    from buildtool.validate import runner

    monkeypatch.setattr(runner, "validate_image", lambda *a, **k: verdict)
    monkeypatch.setattr(validate, "_ref_platforms", lambda ref, wanted: [None])
    monkeypatch.setattr(signal, "signal", lambda *a: None)   # validate's SIGTERM handler stays out of pytest
    return run_cli("validate", "127.0.0.1:5000/foreign:1", "--no-store", "--matrix", str(project / "matrix.yaml"),
                   "--reports", str(project / "reports"), *args)


def test_validate_json_prints_each_verdict_as_it_is(project: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """`validate --json` went through rich: a test's message holding `:ok:` came out as 🆗, so the document was not
    the verdict stored."""
    verdict = _verdict("expected :ok: got :x:", skip_reason="no :thumbs_up:")
    code, out, err = _validate(run_cli, monkeypatch, project, verdict, "--json")
    assert code == 1, err
    assert json.loads(out) == [verdict]


def test_validate_lines_escape_what_a_test_in_the_image_printed(project: Path, run_cli,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A FAILED or SKIPPED line carried the test's text as the image gave it: an ANSI sequence coloured the CI log
    (or erased the line), `:ok:` was an emoji; a skip reason's line break forged a line of its own."""
    verdict = _verdict(f"{ESC}[2K{ESC}[32mPASSED{ESC}[0m :ok:\nsecond line", skip_reason="why\nPASSED all")
    code, out, err = _validate(run_cli, monkeypatch, project, verdict)
    assert code == 1, err
    assert ESC not in out + err
    assert "FAILED test_a.py::test_a: \\x1b[2K\\x1b[32mPASSED\\x1b[0m :ok:" in out.splitlines(), out
    assert "SKIPPED test_b.py::test_b: why\\nPASSED all" in out.splitlines(), out
    assert "PASSED all" not in [line.strip() for line in out.splitlines()]


def test_build_failure_line_escapes_what_the_build_printed(project: Path, run_cli,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed cell's line quoted the build's error (a RUN step's output, a registry's answer) through rich: its
    ANSI sequences reached the CI log, `:x:` became an emoji."""
    from buildtool.imagebuild.builder import Builder, CellResult

    failed = CellResult(cell="pytorch-cpu:2.13", result="failed", message=f"RUN a:x:b {ESC}[1A{ESC}[2Kbuilt ok")
    monkeypatch.setattr(Builder, "run", lambda self, plans: [failed])
    code, out, err = run_cli("build", "-f", "pytorch-cpu:2.13", "--matrix", str(project / "matrix.yaml"))
    assert code == 1, err
    assert ESC not in out + err
    assert "pytorch-cpu:2.13: failed: RUN a:x:b \\x1b[1A\\x1b[2Kbuilt ok" in err.splitlines(), err


def test_diff_lines_escape_what_a_probed_image_listed(run_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image without an SBOM is probed: its package names and versions are its own text, and `diff` printed
    them as they were: an ANSI sequence or a line break in a version reached the terminal or the CI log."""
    from buildtool.imagebuild import image_diff
    from buildtool.sbom.document import Contents

    def side(image: str, *args: object, **kwargs: object) -> image_diff.Side:
        version = "1.0" if image.endswith(":a") else f"2.0{ESC}[8m\nadded evil 6.6.6"
        return image_diff.Side(image=image, source="probe", digest=None, image_id=f"id-{ESC}[31m",
                               contents=Contents(facts={}, python={"numpy": version}))

    monkeypatch.setattr(image_diff, "read_side", side)
    code, out, err = run_cli("diff", "local/x:a", "local/x:b")
    assert code == 0, err
    assert ESC not in out + err
    assert out.splitlines() == ["numpy (python): 1.0 -> 2.0\\x1b[8m\\nadded evil 6.6.6"], out


def test_verify_lines_escape_what_the_registry_holds(project: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify printed what it read from the registry as it was: a line break and an ANSI sequence in an index
    entry's platform or in a problem quoting an artifact forged a `result  verified` line in the CI log."""
    from buildtool.release import chain

    forged = f"linux/amd64\nresult  verified{ESC}[8m"
    found = chain.Verification(image="registry.example.org/x:1", chains=[chain.Chain(
        image="registry.example.org/x@sha256:" + "a" * 64, platform=forged, problem=f"bad{ESC}[2K\nresult  verified")])
    monkeypatch.setattr(chain, "verify_reference", lambda *a, **k: found)
    code, out, err = run_cli("verify", "registry.example.org/x:1", "--matrix", str(project / "matrix.yaml"))
    assert code == 1, err
    assert ESC not in out + err
    assert not any(line.startswith("result  verified") for line in out.splitlines()), out
    assert out.splitlines()[0] == "platform linux/amd64\\nresult  verified\\x1b[8m", out
    assert err.strip().splitlines() == ["failed: bad\\x1b[2K\\nresult  verified"], err
