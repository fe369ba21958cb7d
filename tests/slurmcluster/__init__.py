"""A real SLURM on this one machine, for tests: munged, slurmctld and three slurmd, all private.

Debian's slurm-wlm 22.05 is built with MULTIPLE_SLURMD, so several slurmd run on one host as distinct
nodes (own names, own ports, all on 127.0.0.1):

- n1, n2: partition `debug` (the default); the two-node checks run here;
- n3: a node whose /dev/shm is 64 MiB (its slurmd runs in a mount namespace of its own with a small
  tmpfs there): partition `smallshm` = n1,n3, for the /dev/shm fault of HPC containers that share it.

Everything lives under one folder (config, state, logs, munge key and socket, runc state); the ports
are picked free at start. Every daemon runs in the foreground as a child of this process and is stopped
by its PID; jobs are cancelled and containers deleted first; `leftovers()` lists this cluster's processes
still running (slurmstepd and runc tied to the folder, and what runs below them), and `stop()` ends those too
(by PID) and returns them.

SLURM's OCI containers: oci.conf runs oci_run.py (beside this file), which gives each logical node a
hostname of its own and applies test faults (a late start, a smaller /dev/shm) before exec'ing runc.
The apptainer stand-in (apptainer_standin.py) runs `apptainer exec ... docker://IMAGE` with runc.

A developer can keep one running: `python -m tests.slurmcluster DIR` (Ctrl-C stops it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from buildtool.common.net import free_port

HERE = Path(__file__).resolve().parent
OCI_RUN = HERE / "oci_run.py"
APPTAINER_STANDIN = HERE / "apptainer_standin.py"
PACKAGES = "slurm-wlm munge runc umoci skopeo"
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "runc", "umoci", "skopeo")
NODES = ("n1", "n2", "n3")
SMALL_SHM = "64m"
SMALL_SHM_NODE = "n3"
# Containers see the nodes at distinct loopback addresses, as separate hosts (see oci_run.py).
NODE_ADDRS = {"n1": "127.0.1.1", "n2": "127.0.1.2", "n3": "127.0.1.3"}
CALL_TIMEOUT_S = 30
# Executables whose processes belong to this cluster when they refer to its folder.
DAEMON_EXES = ("munged", "slurmctld", "slurmd", "slurmstepd", "runc")


class ClusterError(RuntimeError):
    pass


def _which(tool: str) -> str | None:
    return shutil.which(tool) or (f"/usr/sbin/{tool}" if Path("/usr/sbin", tool).exists() else None)


def missing_tools() -> list[str]:
    return [t for t in TOOLS if _which(t) is None]


def hosts_file() -> str:
    """/etc/hosts for this cluster's containers: every node name at its own loopback address."""
    return "127.0.0.1 localhost\n" + "".join(f"{addr} {node}\n" for node, addr in NODE_ADDRS.items())


class LocalSlurm:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.conf = self.root / "etc" / "slurm.conf"
        self.socket = self.root / "munge" / "munge.socket.2"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def env(self) -> dict[str, str]:
        """The environment SLURM's commands need to talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, timeout_s: float = 60) -> None:
        missing = missing_tools()
        if missing:
            raise ClusterError(f"missing {' '.join(missing)}: apt-get install {PACKAGES} "
                               "(scripts/setup-tests.sh installs them)")
        for sub in ("etc", "log", "state", "runc", "faults"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._start_munge(timeout_s)
            self._write_config()
            self._spawn("slurmctld", [str(_which("slurmctld")), "-D", "-i", "-f", str(self.conf)])
            slurmd = str(_which("slurmd"))
            for node in NODES:
                (self.root / "state" / f"slurmd-{node}").mkdir(exist_ok=True)
                argv = [slurmd, "-D", "-f", str(self.conf), "-N", node]
                if node == SMALL_SHM_NODE:
                    # Its own mount namespace with a small /dev/shm: what every job on that node sees.
                    small = (f"mount -t tmpfs -o size={SMALL_SHM},mode=1777 shm /dev/shm && exec "
                             + " ".join(shlex.quote(a) for a in argv))
                    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", small]
                self._spawn(f"slurmd-{node}", argv)
            self._until(self._all_idle, timeout_s, "the nodes did not become idle")
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, argv: list[str], **kw: object) -> None:
        with (self.root / "log" / f"{name}.out").open("ab") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                env=self.env, start_new_session=True, **kw)  # type: ignore[call-overload]

    def _start_munge(self, timeout_s: float) -> None:
        munge = self.socket.parent
        munge.mkdir(exist_ok=True)
        # munged refuses a socket folder that others cannot traverse.
        for path in (self.root, *self.root.parents):
            if not os.stat(path).st_mode & 0o001:
                raise ClusterError(f"{path} must be searchable by others (chmod o+x) for munged's socket")
        self.root.chmod(0o755)
        shutil.chown(munge, "munge", "munge")
        munge.chmod(0o755)
        key = munge / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            shutil.chown(key, "munge", "munge")
            key.chmod(0o400)
        self._spawn("munged", [str(_which("munged")), "--foreground", f"--socket={self.socket}", f"--key-file={key}",
                               f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                               f"--seed-file={munge / 'munged.seed'}"], user="munge", group="munge")
        self._until(self.socket.is_socket, timeout_s, "munged did not create its socket")

    def _write_config(self) -> None:
        host = socket.gethostname().split(".")[0]
        root = self.root
        # CPUs=4 on a 2-core machine (config_overrides: believe the config): the test jobs mostly wait
        # (rendezvous, faults), so several may share it.
        nodes = "\n".join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs=4 "
                          "RealMemory=4000 State=UNKNOWN" for n in NODES)
        self.conf.write_text(f"""\
ClusterName=t{hashlib.sha1(str(root).encode()).hexdigest()[:10]}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/state/slurmd-%n
SlurmctldPidFile={root}/state/slurmctld.pid
SlurmdPidFile={root}/state/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
# The late-node jobs are submitted first and read back minutes later; on CI's slower machine that was
# past the default 300 s and slurmctld had purged them.
MinJobAge=3600
{nodes}
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=30:00 State=UP
PartitionName=smallshm Nodes=n1,{SMALL_SHM_NODE} MaxTime=30:00 State=UP
""")
        runc = f"runc --root={root}/runc"
        run = f"{shlex.quote(sys.executable)} {shlex.quote(str(OCI_RUN))} {shlex.quote(str(root))} %n %n.%u.%j.%s.%t %b"
        (self.conf.parent / "oci.conf").write_text(f"""\
RunTimeQuery="{runc} state %n.%u.%j.%s.%t"
RunTimeKill="{runc} kill -a %n.%u.%j.%s.%t"
RunTimeDelete="{runc} delete --force %n.%u.%j.%s.%t"
RunTimeRun="{run}"
""")

    def _until(self, check: Callable[[], bool], timeout_s: float, message: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ClusterError(f"{name} exited ({proc.returncode}); logs in {self.root / 'log'}")
            if check():
                return
            time.sleep(0.1)
        why = self.run(["sinfo", "-h", "-R", "-N", "-o", "%N %T %E"], check=False).stdout.strip()
        raise ClusterError(f"{message} within {timeout_s:.0f} s ({why or 'sinfo says nothing'}); logs in "
                           f"{self.root / 'log'}")

    def _all_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
        states = dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)
        return all(states.get(n) == "idle" for n in NODES)

    def stop(self) -> list[int]:
        """Cancel jobs, delete containers, stop every daemon by PID (TERM, KILL after 10 s).

        Returns the PIDs of processes that outlived their daemons (tied to this folder) and had to be killed.
        """
        ctl = self.procs.get("slurmctld")
        if ctl is not None and ctl.poll() is None:
            self.run(["scancel", "--quiet", "--user", "root"], check=False)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.run(["squeue", "-h"], check=False).stdout.strip():
                time.sleep(0.5)
        self.delete_containers()
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self.procs.clear()
        stragglers = self.leftovers()
        for pid in stragglers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return stragglers

    def containers(self) -> list[str]:
        if not (self.root / "runc").is_dir():
            return []
        proc = subprocess.run(["runc", f"--root={self.root}/runc", "list", "-q"], capture_output=True, text=True,
                              timeout=CALL_TIMEOUT_S)
        return proc.stdout.split()

    def delete_containers(self) -> None:
        for cid in self.containers():
            subprocess.run(["runc", f"--root={self.root}/runc", "delete", "--force", cid], capture_output=True,
                           timeout=CALL_TIMEOUT_S)

    def leftovers(self) -> list[int]:
        """PIDs of this cluster's processes still running: the daemons started here, SLURM's and runc's processes
        tied to this cluster's folder (slurmstepd daemonises away from slurmd), and everything below them."""
        root = str(self.root)
        parents: dict[int, int] = {}
        seeds = {p.pid for p in self.procs.values() if p.poll() is None}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                parents[pid] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                exe = os.path.basename(os.readlink(entry / "exe"))
                if exe not in DAEMON_EXES:
                    continue
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                fds = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
            except (OSError, ValueError, IndexError):
                continue
            if root in cmdline or any(f.startswith(root) for f in fds):
                seeds.add(pid)
        children: dict[int, list[int]] = {}
        for pid, parent in parents.items():
            children.setdefault(parent, []).append(pid)
        found, todo = set(), list(seeds)
        while todo:
            pid = todo.pop()
            if pid not in found and pid in parents:
                found.add(pid)
                todo.extend(children.get(pid, []))
        mine = os.getpid()
        ancestors = set()
        while mine in parents and mine not in ancestors:
            ancestors.add(mine)
            mine = parents[mine]
        return sorted(found - ancestors)

    # -- using it ----------------------------------------------------------------------------

    def run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=CALL_TIMEOUT_S, env=self.env)
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv)}: {proc.stderr.strip()}")
        return proc

    def apptainer_standin(self, bundles: dict[str, Path]) -> Path:
        """A folder to put first on PATH whose `apptainer` runs an image's bundle with runc (the stand-in)."""
        folder = self.root / "apptainer"
        (folder / "spool").mkdir(parents=True, exist_ok=True)
        (folder / "bundles.json").write_text(json.dumps({k: str(v) for k, v in bundles.items()}))
        bindir = folder / "bin"
        bindir.mkdir(exist_ok=True)
        wrapper = bindir / "apptainer"
        wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(APPTAINER_STANDIN))} "
                           f"{shlex.quote(str(self.root))} \"$@\"\n")
        wrapper.chmod(0o755)
        return bindir

    def fault(self, job_name: str, node: str, kind: str, value: str) -> Path:
        """A fault for oci_run.py in jobs named JOB_NAME on NODE: `delay` (seconds before the container that
        runs torchrun starts), `shm` (the size of /dev/shm there) or `hosts` (the text of its /etc/hosts)."""
        if kind not in ("delay", "shm", "hosts"):
            raise ValueError(f"unknown fault {kind!r}")
        path = self.root / "faults" / f"{job_name}.{node}.{kind}"
        path.write_text(value)
        return path


def main(argv: list[str]) -> int:
    """python -m tests.slurmcluster DIR: start a cluster in DIR, print its SLURM_CONF, stop it on Ctrl-C."""
    if len(argv) != 1:
        print("usage: python -m tests.slurmcluster DIR", file=sys.stderr)
        return 2
    cluster = LocalSlurm(Path(argv[0]))
    cluster.start()
    print(f"export SLURM_CONF={cluster.conf}   # Ctrl-C stops the cluster", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0
