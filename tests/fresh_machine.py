"""A fresh machine on this one, for the same-digest check of issue 52: its own Docker engine (a second dockerd:
its own --data-root, --exec-root, --pidfile, -H socket and bridge) and its own local registry (docker-registry
with its own storage), both empty, and a checkout of the commit; nothing shared with the machine's engine and
registry (127.0.0.1:5000), which other work uses. Everything it started is stopped and removed on exit.

Two such machines run one after the other on the same registry port: the image's labels name the base by the
reference the build pulled (`127.0.0.1:<port>/library/debian:...`), as two real machines' local registries
would both be 127.0.0.1:5000. Used by tests/integration/test_fresh_machines.py and
bench/bench_fresh_machines.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from buildtool.common import docker_cli

ROOT = Path(__file__).resolve().parents[1]
CELL = "pytorch-cpu:2.13"


class FreshMachine:
    """`with FreshMachine("a", port) as machine:` a private engine and registry under one folder."""

    def __init__(self, name: str, port: int, bridge_net: int) -> None:
        self.name, self.port = name, port
        self.folder = Path("/nonexistent")      # made on entry (nothing is left behind by a machine never entered)
        self.socket = self.folder / "docker.sock"
        self.bridge = f"dlm{name}{os.getpid() % 10000}"[:15]
        self.bridge_address = f"172.31.{bridge_net}.1/24"
        self._dockerd: subprocess.Popen[bytes] | None = None
        self._registry: subprocess.Popen[bytes] | None = None

    # -- the machine's environment ------------------------------------------------------------------------

    @property
    def registry(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What a process of this machine runs with: its engine, its registry as mirror and dev registry, config
        and cache folders of its own (the dev key is made afresh; no cache of the host's). The host's package
        index settings stay (PIP_*, /etc and a copy of its user pip.conf: the package index is the same on every
        machine)."""
        own = self.folder / "home"
        return {**os.environ, "DOCKER_HOST": f"unix://{self.socket}", "REGISTRY": f"{self.registry}/fresh",
                "BASE_MIRROR": self.registry, "XDG_CONFIG_HOME": str(own / ".config"),
                "XDG_CACHE_HOME": str(own / ".cache"), "DOCKER_CONFIG": str(own / ".docker"),
                "UV_CACHE_DIR": str(own / ".cache/uv"), "DL_IMAGES_BUILDER_ID": ""}

    def checkout(self, commit: str) -> Path:
        """A clone of this repository at `commit` (the same on every machine, whatever HEAD does meanwhile)."""
        dest = self.folder / "checkout"
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(dest)], check=True, timeout=300)
        subprocess.run(["git", "-C", str(dest), "checkout", "-q", "-B", "fresh-machine", commit], check=True,
                       timeout=60)
        return dest


    # -- start and stop -------------------------------------------------------------------------------------

    def __enter__(self) -> FreshMachine:
        self.folder = Path(tempfile.mkdtemp(prefix=f"dl-images-machine-{self.name}-", dir="/var/tmp"))
        self.socket = self.folder / "docker.sock"
        self._copy_index_settings()
        try:
            self._start_registry()
            self._start_engine()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _copy_index_settings(self) -> None:
        """The package index is the same on every machine: the host's user pip settings (under XDG_CONFIG_HOME,
        which this machine has its own of) are copied to this machine's, as a user of both machines would have
        them. The locks name the index's files by URL; a build serves them from these settings' folders."""
        config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        found = config_home / "pip" / "pip.conf"
        if found.is_file():
            own = self.folder / "home" / ".config" / "pip"
            own.mkdir(parents=True, exist_ok=True)
            shutil.copy2(found, own / "pip.conf")

    def _start_registry(self) -> None:
        storage = self.folder / "registry"
        storage.mkdir()
        config = self.folder / "registry.yml"
        config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {storage}\n"
                          f"  delete:\n    enabled: true\nhttp:\n  addr: {self.registry}\n")
        log = (self.folder / "registry.log").open("ab")
        self._registry = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=log,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        for _ in range(60):
            try:
                if requests.get(f"http://{self.registry}/v2/", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if self._registry.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError(f"machine {self.name}: the registry did not answer on {self.registry} "
                           f"(see {self.folder / 'registry.log'})")

    def _start_engine(self) -> None:
        # A bridge of its own: `--bridge=none` would delete the host engine's docker0.
        for argv in (["ip", "link", "add", self.bridge, "type", "bridge"],
                     ["ip", "addr", "add", self.bridge_address, "dev", self.bridge],
                     ["ip", "link", "set", self.bridge, "up"]):
            subprocess.run(argv, check=True, capture_output=True, timeout=30)
        log = (self.folder / "dockerd.log").open("ab")
        argv = ["dockerd", "--data-root", str(self.folder / "data"), "--exec-root", str(self.folder / "exec"),
                "--pidfile", str(self.folder / "dockerd.pid"), "-H", f"unix://{self.socket}",
                "--iptables=false", "--ip-forward=false", "--ip-masq=false", f"--bridge={self.bridge}"]
        self._dockerd = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        for _ in range(120):
            if subprocess.run(docker_cli.argv("info"), env=self.env(), capture_output=True,
                              timeout=30).returncode == 0:
                return
            if self._dockerd.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError(f"machine {self.name}: its dockerd did not start (see {self.folder / 'dockerd.log'})")

    def __exit__(self, *exc: object) -> None:
        for proc in (self._dockerd, self._registry):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=30)
        self._dockerd = self._registry = None
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)
        # The engine unmounts its layers when it stops; anything still mounted below is unmounted first.
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(self.folder))]
        for mount in sorted(mounts, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- what the machine does --------------------------------------------------------------------------------

    def buildtool(self, checkout: Path, *args: str, timeout: float = 3000) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "buildtool", *args], cwd=checkout, env=self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def make_base(self, checkout: Path) -> tuple[float, str]:
        """`buildtool bases` for the cell: (wall seconds of the whole process, the base tag's digest)."""
        started = time.monotonic()
        run = self.buildtool(checkout, "bases", "--framework", CELL, "--mirror", self.registry, timeout=1800)
        seconds = time.monotonic() - started
        if run.returncode != 0:
            raise RuntimeError(f"machine {self.name}: buildtool bases exited {run.returncode}: {run.stderr[-2000:]}")
        return seconds, self.manifest_digest("library/debian", "bookworm-slim")

    def push_cell(self, checkout: Path) -> dict[str, object]:
        """`buildtool build --push` of the cell (bases already there): its JSON result."""
        run = self.buildtool(checkout, "build", "--framework", CELL, "--push", "--json", "--log-dir",
                             str(self.folder / "logs"))
        if run.returncode != 0:
            raise RuntimeError(f"machine {self.name}: build --push exited {run.returncode}: {run.stdout[-1500:]}"
                               f"\n{run.stderr[-2500:]}")
        (result,) = json.loads(run.stdout)["results"]
        return dict(result)

    def manifest_digest(self, repo: str, ref: str) -> str:
        from buildtool.registry.client import RegistryClient

        found = RegistryClient(self.registry).manifest_digest(repo, ref)
        if found is None:
            raise RuntimeError(f"machine {self.name}: {self.registry}/{repo}:{ref} is not there")
        return found

    def config(self, repo: str, digest: str) -> dict[str, object]:
        from buildtool.registry.client import RegistryClient

        client = RegistryClient(self.registry)
        manifest = json.loads(client.get_manifest(repo, digest)[0])
        return dict(json.loads(client.get_blob(repo, manifest["config"]["digest"])))


def head_commit() -> str:
    """This repository's HEAD, taken once for every machine of a run."""
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True, capture_output=True, text=True,
                          timeout=60).stdout.strip()
