"""An empty path (`--out ""`, `bundle IMAGE ""`: a variable left unset) is refused in one line naming its flag
(exit 2) before anything runs. typer made it Path(''), which is Path('.'), the current folder: `keys --out ""` wrote
the private key into the checkout, `validate --extra-tests ""` took the checkout for the site's checks, and
`bundle IMAGE "" --force` would have replaced the current folder with the bundle."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli_args_first import COMMANDS, _argv, _base, _flag, _params, outside, run

__all__ = ["outside"]   # the fixture, imported for the tests here

# release (its own fast parser) and verify declare their options elsewhere; their parsing is not this test's.
PATH_PARAMETERS = [(command_path, p.name) for command_path, command in sorted(COMMANDS.items())
                   if command_path not in ("release", "verify")
                   for p in _params(command) if "Path" in str(p.type_descriptor.annotation)]


def test_the_walk_finds_the_path_parameters() -> None:
    assert ("bundle", "dest") in PATH_PARAMETERS and ("keys", "out_dir") in PATH_PARAMETERS
    assert ("validate", "extra_tests") in PATH_PARAMETERS and len(PATH_PARAMETERS) > 15


@pytest.mark.parametrize(("command_path", "name"), PATH_PARAMETERS)
def test_an_empty_path_is_refused_naming_its_flag(outside: list[str], capsys: pytest.CaptureFixture, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch, command_path: str,
                                                  name: str) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    command = COMMANDS[command_path]
    param = next(p for p in _params(command) if p.name == name)
    argv = _argv(command_path, command, _base(command_path, command, tmp_path), param, "")
    code, out, err = run(capsys, *argv)
    assert outside == [] and code == 2, (argv, code, err)
    assert err.strip() == f"error: {_flag(param)}: the path is empty; name a file or folder ('.' for this one)", err
    assert list(tmp_path.iterdir()) == [p for p in tmp_path.iterdir() if p.name == "plan.json"]   # nothing written


@pytest.mark.parametrize("argv", [("release", "--version", "0.1.0", "--matrix", ""),          # its fast parser
                                  ("release", "--matrix", ""),                                    # typer's (no version)
                                  ("verify", "127.0.0.1:5000/x/y:1", "--keys", "")])
def test_release_and_verify_refuse_an_empty_path_too(outside: list[str], capsys: pytest.CaptureFixture,
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      argv: tuple[str, ...]) -> None:
    """`release --matrix ""` was taken as no --matrix (the matrix found from the current folder), `verify --keys ""`
    as the current folder ("'.' is not a file"): each now names the empty flag, as every other command does."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *argv)
    flag = "--keys" if argv[0] == "verify" else "--matrix"
    assert outside == [] and code == 2, (argv, code, err)
    assert err.strip() == f"error: {flag}: the path is empty; name a file or folder ('.' for this one)", err


@pytest.mark.parametrize(("command_path", "name"), PATH_PARAMETERS)
def test_a_path_whose_name_is_too_long_is_one_line_naming_its_flag(outside: list[str], capsys: pytest.CaptureFixture,
                                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   command_path: str, name: str) -> None:
    """The path check asked the file system whether the path was a file or a folder, and a name past its limit
    (ENAMETOOLONG; a folder this user cannot search is the same) was an OSError traceback (exit 1) out of `verify
    --keys`, `keys --out`, `build --log-dir`, `report --previous`, `workflows ci-matrix --plan` and the others."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    command = COMMANDS[command_path]
    param = next(p for p in _params(command) if p.name == name)
    long = str(tmp_path / ("n" * 300) / "x")
    argv = _argv(command_path, command, _base(command_path, command, tmp_path), param, long)
    code, out, err = run(capsys, *argv)
    assert outside == [] and code == 2 and "Traceback" not in err, (argv, code, err)
    assert len(err.strip().splitlines()) == 1 and "too long" in err.lower(), err


@pytest.mark.parametrize("argv", [("release", "--version", "0.1.0", "--matrix"), ("verify", "127.0.0.1:5000/x/y:1",
                                                                               "--keys")])
def test_release_and_verify_say_a_too_long_path_in_one_line_too(outside: list[str], capsys: pytest.CaptureFixture,
                                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                argv: tuple[str, ...]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *argv, str(tmp_path / ("n" * 300) / "x"))
    assert outside == [] and code == 2 and "Traceback" not in err, (argv, code, err)
    assert len(err.strip().splitlines()) == 1 and "too long" in err.lower(), err
