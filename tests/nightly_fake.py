"""`make nightly` and its steps run for real by make, with a stand-in for the commands that need an engine, a
registry or images (`build`, `validate`, `scaling`, `bundle`, and `report --fetch`'s fetch): each call is recorded,
and a step named in FAKE_FAIL fails. Everything else is the real `buildtool` (plan, and report itself, which
writes the real report from the verdicts the stand-in fetch leaves). What a night's commands are, in which order,
with which history, and what it leaves when a step fails, without images.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FAKE = f"""#!{sys.executable}
import json, os, shutil, sys
args = sys.argv[1:]
stubbed = ("build", "validate", "scaling", "bundle", "report")
if args[:2] != ["-m", "buildtool"] or len(args) < 3 or args[2] not in stubbed:
    os.execv({sys.executable!r}, [{sys.executable!r}, *args])
command, rest = args[2], args[3:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps([command, *rest]) + "\\n")
if command in os.environ.get("FAKE_FAIL", "").split():
    print(f"fake {{command}} failed", file=sys.stderr)
    sys.exit(1)
if command == "scaling":
    flag = "--out" if "--out" in rest else "--metrics-dir"
    os.makedirs(rest[rest.index(flag) + 1], exist_ok=True)
if command == "report":
    # --fetch: tonight's verdicts as the registry would give them; then the real report.
    shutil.copytree(os.environ["FAKE_TONIGHT"], rest[rest.index("--verdicts") + 1])
    rest.remove("--fetch")
    os.execv({sys.executable!r}, [{sys.executable!r}, "-m", "buildtool", "report", *rest])
"""


@dataclass
class Night:
    code: int
    stderr: str
    calls: list[list[str]]

    def call(self, command: str) -> list[str]:
        [found] = [c for c in self.calls if c[0] == command]
        return found

    def commands(self) -> list[str]:
        return [c[0] for c in self.calls]


def fake_python(folder: Path) -> Path:
    path = folder / "fake-python"
    path.write_text(FAKE)
    path.chmod(0o755)
    return path


def run_make(target: str, tmp: Path, tonight: Path, *settings: str, fail: str = "", cwd: Path = REPO,
             env: dict[str, str] | None = None) -> Night:
    """`make TARGET SETTINGS` in `cwd` with the stand-in python; tonight's verdicts are the files in `tonight`."""
    log = tmp / "calls.jsonl"
    log.unlink(missing_ok=True)
    proc = subprocess.run(["make", "--no-print-directory", target, f"PYTHON={fake_python(tmp)}", *settings], cwd=cwd,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {}), "FAKE_LOG": str(log), "FAKE_TONIGHT": str(tonight),
                               "FAKE_FAIL": fail})
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return Night(proc.returncode, proc.stdout + proc.stderr, calls)
