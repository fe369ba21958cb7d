"""scripts/binfmt.sh (setup.sh's QEMU step) against a fake binfmt_misc folder, with stub mountpoint, mount,
update-binfmts, id and uname first on PATH: it does only what is missing, says so, and refuses an entry
the toolkit cannot use with the one line buildtool.contracts.platforms.binfmt_problem would give."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts/binfmt.sh"
GOOD = "enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\noffset 0\n"


def run(tmp_path: Path, *, entry: str | None, mounted: bool = True, enables: str | None = None,
        machine: str = "x86_64") -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The script with stubs; returns it and the stub calls it made."""
    folder, stubs, calls = tmp_path / "binfmt_misc", tmp_path / "bin", tmp_path / "calls"
    folder.mkdir()
    stubs.mkdir()
    calls.write_text("")
    if entry is not None:
        (folder / "qemu-aarch64").write_text(entry)
    if enables:
        (tmp_path / "registered").write_text(enables)
    enable = f"cp {tmp_path}/registered {folder}/qemu-aarch64" if enables else "echo 'update-binfmts: nothing' >&2"
    for name, body in {"mountpoint": f"exit {0 if mounted else 1}", "mount": "", "update-binfmts": enable,
                       "id": "echo 0", "uname": f"echo {machine}"}.items():
        (stubs / name).write_text(f'#!/bin/bash\necho "{name} $*" >> {calls}\n{body}\n')
        (stubs / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "BINFMT_MISC": str(folder)}
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    return proc, [c for c in calls.read_text().splitlines() if not c.startswith(("id ", "uname ", "mountpoint "))]


def test_a_registered_entry_is_found_done_and_nothing_is_run(tmp_path):
    proc, calls = run(tmp_path, entry=GOOD)
    assert proc.returncode == 0, proc.stderr
    assert "binfmt_misc already mounted" in proc.stderr and "qemu-aarch64 already enabled" in proc.stderr
    assert "flags PF" in proc.stderr and calls == []


def test_an_unmounted_binfmt_misc_is_mounted_and_a_disabled_entry_enabled(tmp_path):
    proc, calls = run(tmp_path, entry="disabled\nflags: PF\n", mounted=False, enables=GOOD)
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / "binfmt_misc"
    assert calls == [f"mount -t binfmt_misc binfmt_misc {folder}", "update-binfmts --enable qemu-aarch64"]
    assert "mounting binfmt_misc" in proc.stderr and "enabling binfmt_misc entry qemu-aarch64" in proc.stderr


@pytest.mark.parametrize(("entry", "enables", "cause"), [
    (None, None, "binfmt_misc has no qemu-aarch64 entry after update-binfmts; reinstall qemu-user-static"),
    ("disabled\nflags: PF\n", None, "qemu-aarch64 is disabled; run `update-binfmts --enable qemu-aarch64`"),
    ("enabled\nflags: P\n", None, "qemu-aarch64 lacks flag F (has 'P'), so containers cannot open its interpreter"),
])
def test_an_entry_the_toolkit_cannot_use_is_one_line_naming_the_fix(tmp_path, entry, enables, cause):
    proc, _ = run(tmp_path, entry=entry, enables=enables)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("setup: error:")]
    assert len(errors) == 1 and cause in errors[0], proc.stderr


def test_an_arm64_host_needs_no_emulation(tmp_path):
    proc, calls = run(tmp_path, entry=None, machine="aarch64")
    assert proc.returncode == 0 and "runs natively" in proc.stderr and calls == []
