"""A fresh machine to a validated image: the README's main job, both commands timed as whole processes (issue 50).

    bash scripts/setup.sh
    make push validate FRAMEWORK=pytorch-cpu BASE_MIRROR=127.0.0.1:5000

What a fresh machine lacks, each run starts without: `.venv`, the Docker engine's data (images, BuildKit's cache),
the registry's storage, uv's and pip's caches, the dev signing key and the toolkit's caches (the last three as
empty folders of the run's own: XDG_CONFIG_HOME, XDG_CACHE_HOME, UV_CACHE_DIR, PIP_CACHE_DIR). The apt packages and
the machine's pip settings (its local wheel folders; the user's pip.conf is copied into the run's XDG_CONFIG_HOME)
stay: setup.sh finds the packages installed. The run's dev key
is a throwaway (it signed only the bench's image).

Two ways, one of which must be chosen:
- `--wipe`: the machine's own engine and registry, on an idle machine. It stops the dockerd of /var/run/docker.pid
  and the registry listening on 127.0.0.1:5000 (no other engine or registry), deletes the engine's data root, the
  registry's storage and this checkout's `.venv`, then runs the README's commands here as they are: setup.sh starts
  the engine and the registry again. Everything the engine and the registry held is gone: never on a machine others
  are using.
- `--private`: safe on a shared machine. A fresh clone of HEAD, a dockerd of its own (data root, socket and bridge
  of its own, started empty and timed: setup.sh would have started it) and a registry of its own on 127.0.0.1:5001
  (empty storage); the main job is the README's with BASE_MIRROR and REGISTRY naming that registry and DOCKER_HOST
  that engine. Both are stopped and deleted at the end.

Prints each run's two processes, the total, the 1-minute load average before and after, the median of the totals,
and its ratio to the 180 s target and to the 350 s the issue measured (123 s set-up, 227 s main job). Asserts
nothing about time; it fails when a command fails.

    python3 bench/bench_first_hour.py --private [--runs 3]     # as root
    python3 bench/bench_first_hour.py --wipe [--runs 1]        # as root, idle machine only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from buildtool.common import docker_cli  # noqa: E402

TARGET_S = 180.0
BEFORE_S = 123.0 + 227.0
MAIN_JOB = "make push validate FRAMEWORK=pytorch-cpu BASE_MIRROR={registry}"
REGISTRY = "127.0.0.1:5000"
PRIVATE_REGISTRY = "127.0.0.1:5001"
PRIVATE = Path("/var/lib/dl-images-first-hour")      # the private engine's data root and the registry's storage
SOCKET = "/run/dl-images-first-hour.sock"
EXEC_ROOT = "/run/dl-images-first-hour"
# A bridge of the private engine's own (never --bridge=none: that deletes the host's docker0; bench_fresh_runner.py).
BRIDGE, BRIDGE_ADDRESS = "dl-first0", "172.31.253.1/24"


def load() -> float:
    return os.getloadavg()[0]


def timed(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> float:
    """One whole process, its output to `log`; seconds. A failure stops the bench naming the log."""
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed (exit {proc.returncode}) after {seconds:.0f} s: see {log}")
    return seconds


def fresh_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a machine that never ran the toolkit: empty caches and config, no signing keys set."""
    env = {k: v for k, v in os.environ.items() if k not in ("REGISTRY", "RELEASE_REGISTRY", "BASE_MIRROR", "PYTHON",
                                                            "FRAMEWORK", "DL_IMAGES_SIGNING_KEY", "DOCKER_HOST",
                                                            "DL_IMAGES_BUILDER_KEY", "VIRTUAL_ENV")}
    user_pip = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "pip" / "pip.conf"
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "UV_CACHE_DIR", "PIP_CACHE_DIR"):
        (home / name).mkdir(parents=True, exist_ok=True)
        env[name] = str(home / name)
    # The machine's package index stays (the locks name its files by URL; a build serves them from the folders
    # of the pip settings): the user's pip.conf, which lives under XDG_CONFIG_HOME, comes along.
    if user_pip.is_file():
        (home / "XDG_CONFIG_HOME" / "pip").mkdir(exist_ok=True)
        shutil.copy2(user_pip, home / "XDG_CONFIG_HOME" / "pip" / "pip.conf")
    return {**env, **extra}


# -- --wipe: the machine's own engine and registry ------------------------------------------------------------------

def _engine_pid() -> list[int]:
    """The dockerd setup.sh starts: the one whose pid is in the default pidfile (never another's private engine)."""
    try:
        return [int(Path("/var/run/docker.pid").read_text().strip())]
    except (OSError, ValueError):
        return []


def _registry_pid() -> list[int]:
    """The registry listening on 127.0.0.1:5000 (never another one), as `ss` names its process."""
    listing = subprocess.run(["ss", "-ltnpH", "sport = :5000"], capture_output=True, text=True, timeout=30).stdout
    return [int(pid) for pid in re.findall(r'"docker-registry",pid=(\d+)', listing)]


def _stop(pids: list[int], what: str) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    for _ in range(120):
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return
        time.sleep(0.5)
    raise SystemExit(f"{what} (pid {', '.join(map(str, pids))}) did not stop within 60 s")


def registry_storage(pid: int) -> Path:
    """Where the running registry keeps its blobs: its environment's override (setup.sh sets it), else the
    config file it serves (config/registry.yml's rootdirectory)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    environ = dict(item.split(b"=", 1) for item in raw if b"=" in item)
    if b"REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY" in environ:
        return Path(environ[b"REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY"].decode())
    import yaml

    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    config = Path(Path(f"/proc/{pid}/cwd").resolve(), argv[-2].decode() if not argv[-1] else argv[-1].decode())
    return Path(yaml.safe_load(config.read_text())["storage"]["filesystem"]["rootdirectory"])


def wipe() -> None:
    """Stop the engine and the registry and delete what they held, and this checkout's .venv."""
    info = subprocess.run(docker_cli.argv("info", "--format", "{{json .DockerRootDir}}"), capture_output=True,
                          text=True, timeout=60)
    data_root = Path(json.loads(info.stdout)) if info.returncode == 0 else Path("/var/lib/docker")
    registries = _registry_pid()
    storages = [registry_storage(pid) for pid in registries]
    _stop(registries, "the registry on 127.0.0.1:5000")
    _stop(_engine_pid(), "dockerd (/var/run/docker.pid)")
    for path in (data_root, *storages, ROOT / ".venv"):
        print(f"deleting {path}", file=sys.stderr)
        shutil.rmtree(path, ignore_errors=True)


def run_wipe(home: Path, logs: Path) -> tuple[float, float]:
    wipe()
    env = fresh_env(home)
    setup = timed(["bash", "scripts/setup.sh"], ROOT, env, logs / "setup.log")
    main = timed(["bash", "-c", MAIN_JOB.format(registry=REGISTRY)], ROOT, env, logs / "main-job.log")
    return setup, main


# -- --private: an engine and a registry of the bench's own ---------------------------------------------------------

class Private:
    """A dockerd and a registry of the bench's own, empty at start, stopped and deleted at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, logs: Path) -> float:
        """Start both from nothing; seconds until both answer (what setup.sh would have spent on them)."""
        started = time.monotonic()
        shutil.rmtree(PRIVATE, ignore_errors=True)
        (PRIVATE / "engine").mkdir(parents=True)
        (PRIVATE / "registry").mkdir()
        if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0:
            for argv in (["ip", "link", "add", BRIDGE, "type", "bridge"],
                         ["ip", "addr", "add", BRIDGE_ADDRESS, "dev", BRIDGE], ["ip", "link", "set", BRIDGE, "up"]):
                subprocess.run(argv, check=True, capture_output=True)
        engine_log, registry_log = (logs / "dockerd.log").open("ab"), (logs / "registry.log").open("ab")
        self.procs.append(subprocess.Popen(
            ["dockerd", "--data-root", str(PRIVATE / "engine"), "--exec-root", EXEC_ROOT, "--pidfile",
             f"{EXEC_ROOT}.pid", "-H", f"unix://{SOCKET}", "--iptables=false", "--ip-forward=false",
             "--ip-masq=false", f"--bridge={BRIDGE}"], stdout=engine_log, stderr=engine_log,
            stdin=subprocess.DEVNULL, start_new_session=True))
        self.procs.append(subprocess.Popen(
            ["docker-registry", "serve", str(ROOT / "config/registry.yml")], stdout=registry_log, stderr=registry_log,
            stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY": str(PRIVATE / "registry"),
                 "REGISTRY_HTTP_ADDR": PRIVATE_REGISTRY}))
        for _ in range(240):
            engine = subprocess.run(docker_cli.argv("-H", f"unix://{SOCKET}", "version"), capture_output=True)
            registry = subprocess.run(["curl", "-fsS", "-m", "2", "-o", "/dev/null", f"http://{PRIVATE_REGISTRY}/v2/"],
                                      capture_output=True)
            if engine.returncode == 0 and registry.returncode == 0:
                return time.monotonic() - started
            time.sleep(0.25)
        raise SystemExit(f"the private engine or registry did not start (logs in {logs})")

    def stop(self) -> None:
        while self.procs:
            proc = self.procs.pop()
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(PRIVATE, ignore_errors=True)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def run_private(home: Path, logs: Path) -> tuple[float, float]:
    checkout = home / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(checkout)], check=True, timeout=300)
    private = Private()
    try:
        services = private.start(logs)
        # setup.sh finds this engine and this registry answering (it would start the machine's own otherwise).
        env = fresh_env(home, DOCKER_HOST=f"unix://{SOCKET}", DOCKER_SOCK=SOCKET, REGISTRY=PRIVATE_REGISTRY,
                        SETUP_REGISTRY_ADDR=PRIVATE_REGISTRY)
        setup = services + timed(["bash", "scripts/setup.sh"], checkout, env, logs / "setup.log")
        main = timed(["bash", "-c", MAIN_JOB.format(registry=PRIVATE_REGISTRY)], checkout, env, logs / "main-job.log")
        print(f"  (set-up includes {services:.1f} s starting the private engine and registry)", file=sys.stderr)
        return setup, main
    finally:
        private.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--wipe", action="store_true", help="the machine's own engine and registry, wiped first")
    mode.add_argument("--private", action="store_true", help="a private engine and registry, a fresh clone")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--logs", type=Path, default=None, help="where each run's logs go (default: a new folder)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.exit(2, f"--runs {args.runs}: give 1 or more runs\n")
    if os.geteuid() != 0:
        raise SystemExit("run as root: the bench starts and stops dockerd and the registry")
    logs_root = args.logs or Path(tempfile.mkdtemp(prefix="bench-first-hour-logs-"))
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    print(f"first hour, {'wipe' if args.wipe else 'private'}, HEAD {head}, {os.cpu_count()} cores; logs in "
          f"{logs_root}", file=sys.stderr)
    totals = []
    for run in range(1, args.runs + 1):
        logs = logs_root / f"run{run}"
        logs.mkdir(parents=True, exist_ok=True)
        before = load()
        with tempfile.TemporaryDirectory(prefix="bench-first-hour-") as tmp:
            setup, main_job = (run_wipe if args.wipe else run_private)(Path(tmp), logs)
        totals.append(setup + main_job)
        print(f"run {run}: setup.sh {setup:.1f} s, main job {main_job:.1f} s, total {setup + main_job:.1f} s "
              f"(load {before:.2f} -> {load():.2f})")
    median = statistics.median(totals)
    print(f"median total of {len(totals)}: {median:.1f} s; {median / TARGET_S:.2f}x the {TARGET_S:.0f} s target, "
          f"{median / BEFORE_S:.2f}x the {BEFORE_S:.0f} s measured before (issue 50)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
