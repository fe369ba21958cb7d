"""`pip check` with the image's own Python: does every installed distribution have what it
requires, at a version it accepts? Writes {"pip": version or "", "rc", "problems": [lines],
"error"} to result.json; the test decides. Offline (pip reads the installed metadata only) and with
no pip configuration of the image's (PIP_CONFIG_FILE=/dev/null): only what is installed counts.
Standard library only, Python 3.8 syntax."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import subprocess
import sys

from probe_io import result

OK_LINE = "No broken requirements found."
# The lines pip check prints for a problem (pip 20 to 26); anything else on its stdout is the image's
# own start-up talk (a sitecustomize or .pth hook that prints), never a finding.
PROBLEM = re.compile(r"^\S+ \S+ (requires .*, which is not installed\.|has requirement .*, but you have .*"
                     r"|is not supported on this platform\.?)$")


# NVIDIA's arm64 server wheels (nvidia-cusparselt-cu13 0.8.1, measured) are published as *_aarch64.whl files,
# the name uv and pip select by, but their WHEEL metadata says `Tag: py3-none-manylinux2014_sbsa`, a platform
# no installer knows, so `pip check` calls them "not supported on this platform" on every arm64 machine.
# Only that exact mislabel is a note, on aarch64 only; any other unsupported wheel stays a problem.
UNSUPPORTED = re.compile(r"^(?P<name>\S+) (?P<version>\S+) is not supported on this platform\.?$")
SBSA_TAG = re.compile(r"^[a-z0-9.]+-[a-z0-9_]+-manylinux(?:2014|_2_[0-9]+)_sbsa$")


def wheel_tags(name: str) -> list[str]:
    """The `Tag:` lines of an installed distribution's WHEEL file ([] when it has none)."""
    try:
        text = importlib.metadata.distribution(name).read_text("WHEEL") or ""
    except importlib.metadata.PackageNotFoundError:
        return []
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]


def classify(problems: list, tags_of, machine: str) -> tuple:
    """(problems, notes): an aarch64 wheel whose every WHEEL tag is NVIDIA's *_sbsa mislabel is a note."""
    kept, notes = [], []
    for line in problems:
        found = UNSUPPORTED.match(line)
        tags = tags_of(found.group("name")) if found and machine == "aarch64" else []
        if tags and all(SBSA_TAG.match(tag) for tag in tags):
            notes.append(f"{line} (its WHEEL metadata says {', '.join(tags)}: NVIDIA's name for arm64 servers)")
        else:
            kept.append(line)
    return kept, notes


def main() -> int:
    if importlib.util.find_spec("pip") is None:
        result({"pip": "", "rc": None, "problems": [], "error": f"pip is not installed for {sys.executable}"})
        return 0
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    run = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, env=env,
                         timeout=300)
    lines = [line.strip() for line in run.stdout.splitlines() if line.strip()]
    problems = [line for line in lines if PROBLEM.match(line)]
    findings, notes = classify(problems, wheel_tags, platform.machine())
    error = ""
    if run.returncode == 0 and problems:
        error = f"`pip check` exited 0 but named problems: {' | '.join(problems)[:400]}"
    elif run.returncode != 0 and not problems:
        tail = [line.strip() for line in run.stderr.splitlines() if line.strip()][-3:]
        error = f"`pip check` exited {run.returncode} without naming a problem: {' | '.join(tail)[:400]}"
    elif run.returncode == 0 and OK_LINE not in lines:
        error = f"`pip check` exited 0 but did not say {OK_LINE!r}: {' | '.join(lines)[:400]}"
    result({"pip": importlib.metadata.version("pip"), "rc": run.returncode, "problems": findings,
            "notes": notes, "error": error})
    return 0


if __name__ == "__main__":
    sys.exit(main())
