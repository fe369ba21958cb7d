"""The pull-request workflow's `test` job on a GitHub-hosted runner (ubuntu-24.04): its user is `runner`, not root
(passwordless sudo; Docker already running, the user in the docker group). The job's own `run:` lines, followed into
the Makefile recipes and the scripts they run, must install the extras the README's test command installs into the
.venv `make test` runs with, and run nothing that needs root except through sudo (scripts' `as_root`)."""

from __future__ import annotations

import re
import tomllib

import yaml

from buildtool.render.workflows import PR_PATH
from tests.conftest import REPO

# Commands that need root on a hosted runner; the read-only forms of some need none.
ROOT_COMMANDS = re.compile(r"(?<![\w/.$-])(apt-get|apt|dpkg|systemctl|dockerd|mount|update-binfmts)(?![\w-])")
QUOTED = re.compile(r'"(?:\\.|[^"\\])*"|\'[^\']*\'')
EXTRAS = re.compile(r"-e '\.\[([\w,-]+)\]'")


def recipe(target: str) -> str:
    """The recipe lines of a Makefile target."""
    found = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)*)", (REPO / "Makefile").read_text(), re.M)
    assert found, f"the Makefile has no target {target}"
    return found.group(1)


def reached(text: str, seen: dict[str, str] | None = None) -> dict[str, str]:
    """The scripts `text` runs (`bash scripts/X.sh`, `bash "$ROOT/scripts/X.sh"`, `make T`) and theirs: path -> text."""
    seen = {} if seen is None else seen
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    for target in re.findall(r"(?:^|&&|;)\s*make ((?:[\w-]+ ?)+)", code, re.M):
        for name in target.split():
            if f"make:{name}" not in seen:
                seen[f"make:{name}"] = recipe(name)
                reached(seen[f"make:{name}"], seen)
    for rel in re.findall(r'bash "?(?:\$ROOT/)?(scripts/[\w.-]+\.sh)', code):
        if rel not in seen:
            seen[rel] = (REPO / rel).read_text()
            reached(seen[rel], seen)
    return seen


def installed_extras(texts: dict[str, str]) -> set[str]:
    return {extra for text in texts.values() for group in EXTRAS.findall(text) for extra in group.split(",")}


def root_without_sudo(where: str, text: str) -> list[str]:
    """Each line of `text` that runs a command needing root other than through as_root or sudo."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = "" if line.lstrip().startswith("#") else QUOTED.sub('""', line).split(" #", 1)[0]
        for hit in ROOT_COMMANDS.finditer(code):
            before, after = code[:hit.start()], code[hit.end():]
            if before.endswith("command -v ") or (hit.group(1) == "systemctl" and after.startswith(" is-active")):
                continue   # read-only: needs no root
            if not re.search(r"(?:^|[\s;&|(])(?:as_root|sudo)\s", before):
                found.append(f"{where}:{number}: {line.strip()}")
    return found


def pr_test_job() -> dict:
    return yaml.safe_load((REPO / PR_PATH).read_text())["jobs"]["test"]


def test_the_pr_test_job_installs_the_test_extras_into_the_venv_make_test_runs_with() -> None:
    """It ran `make setup` (setup.sh: `-e .`, no extras) and pip's `.[dev]` into setup-python's Python, while
    `make test` runs .venv/bin/python once setup.sh made .venv: no pynacl, tuf, torch, ... for the tests."""
    readme = (REPO / "README.md").read_text()
    [command] = [line for line in readme.splitlines() if line.endswith("make check lint test")]
    needed = installed_extras(reached(command))
    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert needed and needed <= declared, (command, needed, declared)
    assert re.search(r"^PYTHON \?= \$\(if \$\(wildcard \.venv/bin/python\),\.venv/bin/python", (REPO / "Makefile")
                     .read_text(), re.M), "make test no longer runs .venv's python: what this test follows changed"
    runs = "\n".join(step.get("run", "") for step in pr_test_job()["steps"])
    assert "make test" in runs.splitlines()
    scripts = {rel: text for rel, text in reached(runs).items() if rel.startswith("scripts/")}
    assert "scripts/setup.sh" in scripts, "the job no longer makes .venv with setup.sh"
    assert needed <= installed_extras(scripts), f"the job installs {installed_extras(scripts)}, the tests need {needed}"


def test_the_pr_test_job_runs_nothing_needing_root_without_sudo_and_leaves_the_venv_the_users() -> None:
    runs = [step["run"] for step in pr_test_job()["steps"] if "run" in step]
    assert not [run for run in runs if run.lstrip().startswith("sudo")], "a step run with sudo leaves root's files"
    texts = {"the job": "\n".join(runs), **reached("\n".join(runs))}
    assert [problem for where, text in texts.items() for problem in root_without_sudo(where, text)] == []
    venv = [line for text in texts.values() for line in text.splitlines() if "$VENV" in line or ".venv" in line]
    assert venv and not [line for line in venv if re.search(r"(?:^|\s)(?:as_root|sudo)\s", line)]


def test_the_root_check_finds_a_root_command_without_sudo() -> None:
    assert root_without_sudo("x", "  timeout 600 apt-get update -qq || die \"apt-get failed\"\n") == [
        "x:1: timeout 600 apt-get update -qq || die \"apt-get failed\""]
    assert root_without_sudo("x", "if systemctl is-active --quiet u; then systemctl stop u; fi\n") != []
    assert root_without_sudo("x", "if systemctl is-active --quiet u; then as_root systemctl stop u; fi\n") == []
    assert root_without_sudo("x", "command -v dockerd >/dev/null || need+=(docker.io)  # apt-get\n") == []
    assert root_without_sudo("x", "  as_root setsid nohup dockerd --iptables=false &\nmountpoint -q /x\n") == []
