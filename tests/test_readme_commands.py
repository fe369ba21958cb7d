"""The README shows a new user's first hour as commands that work on their own machine (issue 50): the set-up and
the main job, then verify and release of that image on the local registry with the flags that cure the refusals,
then validate again. tests/integration/test_first_hour.py runs exactly these lines, read from the README."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[list[str]]:
    """The README's shell blocks up to its test command, each a list of command lines, in the README's order."""
    text = (ROOT / "README.md").read_text()
    blocks = [[line for line in block.splitlines() if line.strip()]
              for block in re.findall(r"```sh\n(.*?)```", text, re.S)]
    tests = [b for b in blocks if any("setup-tests.sh" in line for line in b)]
    assert tests, "the README has no test command (bash scripts/setup-tests.sh ...)"
    return blocks[:blocks.index(tests[0])]


def test_the_readme_shows_the_main_job_then_verify_release_and_validate_again() -> None:
    main, release, again = readme_commands()
    assert main == ["bash scripts/setup.sh && make push validate FRAMEWORK=pytorch-cpu BASE_MIRROR=127.0.0.1:5000"]
    verify, promote = release
    assert verify.startswith("make verify FRAMEWORK=pytorch-cpu ") and promote.startswith(
        "make release VERSION=0.1.0 FRAMEWORK=pytorch-cpu ")
    # The flags that cure what a developer's machine is refused for: the dev key, the peer-image skips.
    for line in release:
        assert "--trust-local-key" in line and "--accept-skip no-peer-image" in line, line
    assert again == ["make validate FRAMEWORK=pytorch-cpu"]


def test_the_readmes_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci/run").read_text()
    text = (ROOT / "README.md").read_text()
    command = next(line for line in text.splitlines() if line.startswith("bash scripts/setup-tests.sh"))
    assert command == "bash scripts/setup-tests.sh && make check lint test"
    assert f"\n{command}\n" in ci
