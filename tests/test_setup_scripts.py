"""scripts/setup.sh in a copy of the repository, on a PATH of stand-ins (the packages, engine and registry found, or
missing, as a test needs) and the core tools it runs: a step that fails says which, in one `setup: error:` line."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = ("bash", "cat", "cut", "sha256sum", "sed", "grep", "mkdir", "chmod", "timeout", "seq", "sleep", "tail",
        "dirname")
FOUND = ("docker-registry", "skopeo", "mmdebstrap", "arch-test", "debootstrap", "dockerd", "curl")


def run_setup(tmp_path: Path, *, lock: str, missing: tuple[str, ...] = (), uid: int = 1000,
              apt_get: str = "exit 0", stand_ins: dict[str, str] | None = None, venv_python: str | None = None,
              ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """STAND_INS: commands' bodies in place of the defaults (and of CORE's links); VENV_PYTHON: the venv's python's
    script in place of the default below."""
    root, stubs, calls = tmp_path / "repo", tmp_path / "bin", tmp_path / "calls"
    (root / "scripts").mkdir(parents=True)
    stubs.mkdir()
    calls.write_text("")
    # The engine's client is an absolute path in the script: the stand-in's here.
    text = (REPO / "scripts/setup.sh").read_text().replace("/usr/bin/docker", str(stubs / "docker"))
    (root / "scripts/setup.sh").write_text(text)
    shutil.copy(REPO / "scripts/as-root.sh", root / "scripts")   # what setup.sh sources
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (root / "requirements.lock").write_text(lock)
    venv = root / ".venv/bin"
    venv.mkdir(parents=True)
    # The venv's python: writes no uv settings, and imports nothing (so the project is installed).
    (venv / "python").write_text(venv_python or '#!/bin/bash\n[[ "$2" == *render_uv_toml* ]] && exit 0\nexit 1\n')
    (venv / "python").chmod(0o755)
    for name in CORE:
        if name not in (stand_ins or {}):
            (stubs / name).symlink_to(shutil.which(name))
    bodies = {"docker": "echo 27.0", "id": f"echo {uid}", "apt-get": apt_get,
              **{name: "exit 0" for name in FOUND if name not in missing}, **(stand_ins or {})}
    for name, body in bodies.items():
        (stubs / name).write_text(f'#!/bin/bash\necho "{name} $*" >> {calls}\n{body}\n')
        (stubs / name).chmod(0o755)
    if "docker.io" in missing:
        (stubs / "docker").unlink()
    proc = subprocess.run(["bash", str(root / "scripts/setup.sh")], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(stubs), "PYTHON": sys.executable, "HOME": os.environ.get("HOME", "/")})
    return proc, [c for c in calls.read_text().splitlines() if c.startswith("apt-get")]


def test_a_lock_that_pins_no_uv_is_named_not_a_silent_exit(tmp_path: Path) -> None:
    """`uv_pin="$(grep ... | cut ...)"` under pipefail: a lock without uv== ended the script with exit 1 and no word,
    before the check that names it."""
    proc, _ = run_setup(tmp_path, lock="jinja2==3.1.6\n")
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last == "setup: error: requirements.lock pins no uv (uv==VERSION); run make lock-deps", proc.stderr


def test_a_failed_apt_get_update_is_named(tmp_path: Path) -> None:
    """`timeout 600 apt-get update -qq` under set -e: a timeout (124, which prints nothing) or a failure ended the
    script with its status and no word of which step failed."""
    proc, calls = run_setup(tmp_path, lock="uv==0.13.9\n", missing=("skopeo",), uid=0, apt_get="exit 100")
    assert proc.returncode == 2 and calls == ["apt-get update -qq"], proc.stderr
    assert proc.stderr.splitlines()[-1] == "setup: error: apt-get update failed (exit 100; 124: timed out after 600 s)"


def test_a_machine_without_curl_gets_it_not_a_registry_that_did_not_answer(tmp_path: Path) -> None:
    """Step 4 asks the registry whether it answers with curl, which no step installed: on a machine without it
    (a minimal Debian) the check failed whatever the registry did, and after 30 s the script blamed the registry
    ("registry did not answer"). curl is one of the packages step 1 installs now."""
    proc, _ = run_setup(tmp_path, lock="uv==0.13.9\n", missing=("curl",))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == ("setup: error: missing curl; run this script as root or with passwordless "
                                            "sudo (it installs them with apt)"), proc.stderr
    proc, calls = run_setup(tmp_path / "root", lock="uv==0.13.9\n", missing=("curl",), uid=0, apt_get="exit 100")
    assert calls == ["apt-get update -qq"] and "installing curl (apt-get)" in proc.stderr, proc.stderr


def _running(pid: int) -> bool:
    """PID is a process that has not ended (a zombie has)."""
    try:
        return pid > 0 and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _still_running_after_a_moment(pid: int) -> bool:
    """Whether `pid` still runs 5 s on (a kill sent just before the script exits may take a moment to land); it is
    killed either way, so no test leaves it behind."""
    try:
        for _ in range(50):
            if not _running(pid):
                break
            time.sleep(0.1)
        return _running(pid)
    finally:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_registry_that_does_not_answer_is_stopped_not_left_running(tmp_path: Path) -> None:
    """Step 4 starts docker-registry in the background and waits 30 s for it to answer; one that did not was left
    running (holding the port or its storage against the next try) while the script said it had failed."""
    pid_file = tmp_path / "registry.pid"
    never = f'echo $$ > {pid_file}\nexec {shutil.which("sleep")} 120'   # started, never answering
    proc, _ = run_setup(tmp_path, lock="uv==0.13.9\n", stand_ins={
        "curl": "exit 7", "docker-registry": never, "setsid": 'exec "$@"', "nohup": 'exec "$@"', "sleep": "exit 0"})
    for _ in range(20):   # a stand-in killed before it wrote its pid wrote none: it is not running either
        if pid_file.exists():
            break
        time.sleep(0.1)
    pid = int(pid_file.read_text()) if pid_file.exists() else 0
    alive = _still_running_after_a_moment(pid)
    assert proc.returncode == 2 and not alive, proc.stderr
    assert proc.stderr.splitlines()[-1] == ("setup: error: registry did not answer on 127.0.0.1:5000 within 30 s "
                                            "(stopped it; log: .state/registry.log)"), proc.stderr


def test_a_dockerd_that_does_not_answer_is_stopped_not_left_running(tmp_path: Path) -> None:
    """Step 3 starts dockerd through as_root in the background and waits 60 s for it to answer; one that did not
    was left running (holding the socket and /var/lib/docker against the next try): `$!` is the background shell
    or sudo, not dockerd, and nothing stopped even that."""
    pid_file = tmp_path / "dockerd.pid"
    sleep = shutil.which("sleep")
    hung = f"echo $$ > {pid_file}\nwhile :; do {sleep} 1; done"   # started, never answering (and named dockerd)
    proc, _ = run_setup(tmp_path, lock="uv==0.13.9\n", uid=0, stand_ins={
        "docker": "exit 1", "dockerd": hung, "setsid": 'exec "$@"', "nohup": 'exec "$@"',
        "sleep": f"exec {sleep} 0.05"})
    pid = int(pid_file.read_text()) if pid_file.exists() else 0
    alive = _still_running_after_a_moment(pid)
    assert proc.returncode == 2 and pid and not alive, proc.stderr
    assert proc.stderr.splitlines()[-1] == ("setup: error: dockerd did not answer within 60 s (stopped it; "
                                            "log: .state/dockerd.log)"), proc.stderr


def test_the_uv_settings_holding_an_index_token_are_the_users_alone(tmp_path: Path) -> None:
    """.state/uv.toml (the host's pip index URLs for uv, credentials and all) was written by a shell redirect: mode
    0644 under the usual umask, so every local user could read the index token. It is 0600 now, an earlier file's
    mode narrowed too."""
    import stat

    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nfind-links = https://builder:s3cr3t-idx@wheels.example.invalid/simple\n")
    old = tmp_path / "repo/.state/uv.toml"
    old.parent.mkdir(parents=True)
    old.write_text("")
    old.chmod(0o644)
    # The venv's python: the real one for the uv settings (this checkout's buildtool, the pip.conf above).
    real = (f'#!/bin/bash\nif [[ "$2" == *render_uv_toml* ]]; then PIP_CONFIG_FILE={conf} '
            f'PYTHONPATH={REPO} exec {sys.executable} "$@"; fi\nexit 1\n')
    before = os.umask(0o022)
    try:
        proc, _ = run_setup(tmp_path, lock="jinja2==3.1.6\n", venv_python=real)
    finally:
        os.umask(before)
    assert proc.returncode == 2 and "pins no uv" in proc.stderr, proc.stderr   # past the uv settings
    assert "s3cr3t-idx" in old.read_text()     # the settings were written: the token is in them
    assert stat.S_IMODE(old.stat().st_mode) == 0o600


def test_the_state_folder_and_its_logs_are_the_users_alone(tmp_path: Path) -> None:
    """.state/pip.log, uv.log and apt.log were made with the umask (0644): a failed install's log can quote an index
    URL's query token, which uv does not mask. The folder is the user's alone now, one made earlier included."""
    (tmp_path / "repo/.state").mkdir(parents=True)
    (tmp_path / "repo/.state").chmod(0o755)
    run_setup(tmp_path, lock="uv==0.13.9\n")
    assert stat.S_IMODE((tmp_path / "repo/.state").stat().st_mode) == 0o700
