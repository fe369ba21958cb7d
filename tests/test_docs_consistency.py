"""What the README and docs/*.md name must exist as named: a repository path, a `make` target and the make
variables set with it, a `buildtool` command and the options written after it. A page that names a module removed
since (docs/gpu.md named buildtool/release/gpusplit.py after issue 48 had moved the pairing out of it) or an option
no command has sends a reader to something that is not there. docs/images.md is generated and not read here."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md") if p.name != "images.md")]
TOP = r"(?:buildtool|tests|scripts|bench|docs|templates|image-tests|config|tools|dockerfiles|\.github|\.ci)"
PATH = re.compile(r"(?<![\w./-])(?:\.\./)?(" + TOP + r"/[A-Za-z0-9_./-]*[A-Za-z0-9_/])")
# Paths that a command makes, not the repository: the release notes a release writes, the wheels folder
# `make gpu-smoke-wheels` fills, what `npm ci` installs.
MADE = ("docs/releases/", "bench/wheels", "tools/sigstore-verify/node_modules/")
CODE = re.compile(r"`([^`\n]+)`|^((?:make|buildtool) [^\n]*)$", re.M)
MAKE = re.compile(r"\bmake ((?:[a-z][a-z0-9-]* ?)+)((?:\[?[A-Z_]+=[^ \]`]*\]? ?)*)")
BUILDTOOL = re.compile(r"\bbuildtool ([a-z][a-z0-9-]*)((?: (?:write|ci-matrix)\b)?)([^|;&`]*)")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z]\b)")
# `tests/test_x.py::test_name`, and `::test_other` after it for another test of the same file.
TEST = re.compile(r"(?<![\w/])(tests/[\w/]+\.py)::(test_\w+)|`::(test_\w+)")


def places(page: str, pattern: re.Pattern[str]) -> list[tuple[int, re.Match[str]]]:
    text = (ROOT / page).read_text()
    return [(text.count("\n", 0, m.start()) + 1, m) for m in pattern.finditer(text)]


def paths_missing(page: str) -> list[str]:
    missing = []
    for line, match in places(page, PATH):
        path = match.group(1).split("::")[0].split("#")[0].rstrip(".")
        if not any(c in path for c in "<>*{") and not path.startswith(MADE) and not (ROOT / path).exists():
            missing.append(f"{page}:{line}: {path}")
    return missing


def make_problems(snippet: str, makefile: str) -> list[str]:
    targets = set(re.findall(r"^([a-zA-Z_-]+):", makefile, re.M))
    problems = []
    for match in MAKE.finditer(snippet):
        problems += [f"no make target {t!r}" for t in match.group(1).split() if t not in targets]
        problems += [f"the Makefile reads no {v}" for v in re.findall(r"([A-Z_]+)=", match.group(2))
                     if not re.search(rf"\b{v}\b", makefile)]
    return problems


@cache
def options_of(command: tuple[str, ...]) -> set[str] | None:
    from buildtool.cli import _command

    found = _command()   # typer's own click: its groups have `commands`, its commands none
    for name in command:
        found = getattr(found, "commands", {}).get(name)
    if found is None:
        return None
    return {opt for param in found.params for opt in (*param.opts, *param.secondary_opts)} | {"--help"}


def buildtool_problems(snippet: str) -> list[str]:
    problems = []
    for match in BUILDTOOL.finditer(snippet):
        command = (match.group(1), *match.group(2).split())
        options = options_of(command)
        if options is None:
            problems.append(f"no command `buildtool {' '.join(command)}`")
            continue
        problems += [f"`buildtool {' '.join(command)}` has no option {o}" for o in OPTION.findall(match.group(3))
                     if o not in options]
    return problems


@pytest.mark.parametrize("page", PAGES)
def test_every_repository_path_a_page_names_exists(page: str) -> None:
    assert paths_missing(page) == []


def undefined_tests(page: str) -> list[str]:
    missing, path = [], None
    for line, match in places(page, TEST):
        path = match.group(1) or path
        name = match.group(2) or match.group(3)
        if path is None or not re.search(rf"^(?:async )?def {name}\b", (ROOT / path).read_text(), re.M):
            missing.append(f"{page}:{line}: {path}::{name}")
    return missing


@pytest.mark.parametrize("page", PAGES)
def test_every_test_a_page_names_is_defined(page: str) -> None:
    assert undefined_tests(page) == []


@pytest.mark.parametrize("page", PAGES)
def test_every_make_target_and_variable_a_page_names_is_the_makefiles(page: str) -> None:
    makefile = (ROOT / "Makefile").read_text()
    problems = [f"{page}:{line}: {p}" for line, m in places(page, CODE)
                for p in make_problems(m.group(1) or m.group(2), makefile)]
    assert problems == []


@pytest.mark.parametrize("page", PAGES)
def test_every_buildtool_command_and_option_a_page_names_exists(page: str) -> None:
    problems = [f"{page}:{line}: {p}" for line, m in places(page, CODE)
                for p in buildtool_problems(m.group(1) or m.group(2))]
    assert problems == []


def test_the_checks_find_what_they_look_for() -> None:
    assert make_problems("make nightly NIGHTLY_OUT=x", "nightly:\n\techo $(NIGHTLY_OUT)\n") == []
    assert make_problems("make nightli NIGHTLY_OUTS=x", "nightly:\n\techo $(NIGHTLY_OUT)\n") == [
        "no make target 'nightli'", "the Makefile reads no NIGHTLY_OUTS"]
    assert buildtool_problems("buildtool verify IMAGE --keys FILE --trust-local-key") == []
    assert buildtool_problems("buildtool verify IMAGE --key FILE") == ["`buildtool verify` has no option --key"]
    assert buildtool_problems("buildtool workflows write --cron X") == []
    assert buildtool_problems("buildtool gpusplit") == ["no command `buildtool gpusplit`"]
    named = "`tests/test_a.py::test_b`, `::test_c`, `pytorch/test_d.py::test_e`"
    assert [m.groups() for m in TEST.finditer(named)] == [("tests/test_a.py", "test_b", None), (None, None, "test_c")]
    assert [m.group(1) for m in PATH.finditer("see `buildtool/release/gpusplit.py` and ../docs/gpu.md")] == [
        "buildtool/release/gpusplit.py", "docs/gpu.md"]
