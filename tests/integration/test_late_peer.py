"""A node that joins the c10d rendezvous more than a minute after the others (a cold node still
pulling a 5 GB image) must not kill them: the store's read timeout follows the join timeout.

Two rendezvous run at once, each with one node started LATE_PEER_S (default 65) seconds after
the other, both on CPU with gloo:
- the image tests' own command (image-tests/pytorch/test_rendezvous.py) in two containers of
  the PyTorch fixture image, the late node being the one that hosts the store (the early node's
  store client waits for it: the read timeout bounds that wait);
- the command Kubernetes and SLURM run (buildtool.launch.multinode.MultiNodeJob.command, with its
  verifier) on the host's torch.

Cost: about 80 s (77 s measured on a quiet machine). Measured here (docs/gpu.md): with torch's
default read_timeout (60 s) an early node still reaches a store host 75 s late (its client
retries the connection once) but gives up on one about two minutes late. LATE_PEER_S=150 runs
that case (about 3.5 minutes): it failed without read_timeout and passed with it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "image-tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "image-tests" / "pytorch"))
import fixture_images  # noqa: E402
from harness import scripts_for  # noqa: E402
from test_rendezvous import torchrun_2nodes  # noqa: E402

from buildtool.common import docker_cli  # noqa: E402
from buildtool.common.net import free_port  # noqa: E402
from buildtool.contracts import frameworks  # noqa: E402
from buildtool.launch.multinode import MultiNodeJob, write_verifier  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]
REPO = Path(__file__).resolve().parents[2]
LATE_S = float(os.environ.get("LATE_PEER_S", "65"))
JOIN_S = 900
RUN_TIMEOUT_S = LATE_S + 240


# Both containers are on the host network: the two nodes tell themselves apart by these addresses (torch's
# rendezvous names a node by its address and pid; two containers on one host may share a pid).
NODE_ADDRS = {False: "127.0.0.2", True: "127.0.0.1"}


def _run(argv: list[str], results: dict[str, subprocess.CompletedProcess[str]], key: str,
         env: dict[str, str] | None = None, delay: float = 0.0, timeout: float = RUN_TIMEOUT_S) -> None:
    time.sleep(delay)
    try:
        results[key] = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        results[key] = subprocess.CompletedProcess(argv, 124, out, f"{err}\nkilled after {timeout:.0f}s")
    except Exception as exc:  # noqa: BLE001 - a thread's exception is otherwise lost: the node's result says it
        results[key] = subprocess.CompletedProcess(argv, 125, "", f"{type(exc).__name__}: {exc}")


def _containers(image: str, results: dict, names: list[str], late_s: float = LATE_S, init: bool = True,
                timeout: float = RUN_TIMEOUT_S) -> list[threading.Thread]:
    """The image tests' two-node command: the store's host (is_host=true) starts `late_s` late."""
    port, run = free_port(), f"late-{uuid.uuid4().hex[:8]}"
    threads = []
    for key, is_host, delay in (("image:early", False, 0.0), ("image:late-host", True, late_s)):
        name = f"t-i10-late-{uuid.uuid4().hex[:8]}"
        names.append(name)
        argv = docker_cli.argv("run", "--rm", *(["--init"] if init else []), "--name", name,
                               "--network", "host",
                               "--shm-size=1g", "-v", f"{scripts_for('pytorch')}:/imagetests:ro",
                               "-e", "DDP_STEPS=10", "-e", f"DDP_TIMEOUT_S={JOIN_S}", "-e", "DDP_DEVICE=cpu",
                               "-e", "DDP_BUSBW=0", image, *torchrun_2nodes(f"127.0.0.1:{port}", JOIN_S, is_host, run,
                                                                       local_addr=NODE_ADDRS[is_host]))
        threads.append(threading.Thread(target=_run, args=(argv, results, key),
                                        kwargs={"delay": delay, "timeout": timeout}))
    return threads


def _launcher_nodes(tmp_path: Path, results: dict) -> list[threading.Thread]:
    """What `buildtool k8s` and `buildtool slurm` run on every node, one node LATE_S late."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    pytorch = frameworks.get("pytorch")
    check = pytorch.multinode
    assert check is not None and pytorch.scripts is not None
    (scripts / check.script).write_text((pytorch.scripts / check.script).read_text())
    write_verifier(scripts)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    (bindir / "torchrun").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m torch.distributed.run \"$@\"\n")
    (bindir / "torchrun").chmod(0o755)
    job = MultiNodeJob(image="unused", nodes=2, gpus_per_node=0, check=check, join_timeout_s=JOIN_S, steps=10)
    argv = job.command(f"127.0.0.1:{free_port()}", f"late-{uuid.uuid4().hex[:8]}", script_dir=str(scripts))
    env = {**os.environ, **job.env, "DDP_DEVICE": "cpu", "DDP_BUSBW": "0",
           "PATH": f"{bindir}:{os.environ['PATH']}"}
    return [threading.Thread(target=_run, args=(argv, results, key), kwargs={"env": env, "delay": delay})
            for key, delay in (("launcher:early", 0.0), ("launcher:late", LATE_S))]


def _run_all(threads: list[threading.Thread], names: list[str]) -> None:
    """Start every node, wait for all, and remove their containers whatever happened."""
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        docker_cli.remove(*names, timeout=60)


def test_a_node_joining_more_than_a_minute_late_is_waited_for(tmp_path):
    assert LATE_S > 60
    image = fixture_images.ensure("pytorch")
    results: dict[str, subprocess.CompletedProcess[str]] = {}
    names: list[str] = []
    threads = _containers(image, results, names) + _launcher_nodes(tmp_path, results)
    started = time.monotonic()
    _run_all(threads, names)
    waited = time.monotonic() - started
    print(f"late node started after {LATE_S:.0f}s; all four nodes done after {waited:.0f}s")
    failed = {k: f"exit {r.returncode}: {(r.stdout + r.stderr)[-1500:]}" for k, r in results.items() if r.returncode}
    assert not failed, failed
    image_out = results["image:early"].stdout + results["image:late-host"].stdout
    assert '"world_size": 2' in image_out and '"identical": true' in image_out, image_out[-2000:]
    launcher_out = results["launcher:early"].stdout + results["launcher:late"].stdout
    # gloo's transport is TCP: the verifier's pass line names the family (issue 49)
    assert "DDP check passed: world size 2, gloo, transport Socket" in launcher_out, launcher_out[-2000:]


def test_two_nodes_with_the_same_pid_on_one_host_are_two_nodes() -> None:
    """Without --init, torchrun is pid 1 in both containers, and both have the host's hostname: to
    torch's rendezvous, which tells nodes apart by (address, pid), they were one node waiting
    forever for a second (a hang seen whenever the two pids happened to match). Each node's own
    --local-addr (test_rendezvous.NODE_ADDRS) keeps them apart. About 20 s."""
    image = fixture_images.ensure("pytorch")
    results: dict[str, subprocess.CompletedProcess[str]] = {}
    names: list[str] = []
    threads = _containers(image, results, names, late_s=2.0, init=False, timeout=150)
    _run_all(threads, names)
    failed = {k: f"exit {r.returncode}: {(r.stdout + r.stderr)[-1500:]}" for k, r in results.items() if r.returncode}
    assert not failed, failed
    out = results["image:early"].stdout + results["image:late-host"].stdout
    assert '"world_size": 2' in out and '"identical": true' in out, out[-2000:]
