"""The image as `docker run IMAGE CMD` gives it to a user: its entrypoint runs the command, and its default
user can write in its working directory, in /tmp and in its HOME, where training writes checkpoints, profiler
traces, TensorBoard logs and caches (torch.hub, pip, compiled kernels). Read and written through testinfra's
`host`, as that user in that working directory; the other write checks (test_ddp, test_profiler,
test_tensorboard) write there too."""

from __future__ import annotations

import pytest
from harness import image_entrypoint, run_once

pytestmark = pytest.mark.shared(why="writes files; the entrypoint check starts a container of its own")
# A file made, written, synced and removed: what a checkpoint needs of a folder (a read-only or full file
# system fails here too, not only permissions).
WRITE = 'f=$(mktemp -p %s .imagetest-write-XXXXXXXX) && head -c 4096 /dev/zero > "$f" && sync "$f" && rm -f -- "$f"'


@pytest.fixture(scope="module")
def who(host) -> str:
    name = host.run("id -un")    # a uid without a passwd entry has no name
    return f"the image's user {host.check_output('id -u')}" + (f" ({name.stdout.strip()})" if name.rc == 0 else "")


def cannot_write(host, folder: str) -> str:
    """Why the image's user cannot write in `folder` ('' when it can)."""
    wrote = host.run(WRITE, folder)
    return "" if wrote.rc == 0 else (wrote.stderr.strip().splitlines() or [f"exit {wrote.rc}"])[-1]


def test_image_user_can_write_in_its_workdir(host, who):
    cwd = host.check_output("pwd")
    error = cannot_write(host, cwd)
    assert not error, (
        f"{who} cannot write in its working directory {cwd}: {error}; training run with `docker run IMAGE` cannot "
        "save checkpoints, traces or logs there (make the WORKDIR writable for this user)")


def test_image_user_can_write_tmp(host, who):
    tmp = host.environment().get("TMPDIR") or "/tmp"
    error = cannot_write(host, tmp)
    assert not error, f"{who} cannot write in {tmp}: {error}"


def test_image_user_can_write_its_home(host, who):
    home = host.environment().get("HOME", "")
    assert home, f"{who} has no HOME: caches (torch.hub, pip, compiled kernels) have nowhere to go"
    error = cannot_write(host, home)
    assert not error, (f"{who} cannot write in its HOME {home}: {error}; torch.hub, pip and compiled kernels cache "
                       "there (give the user a writable home)")


def test_entrypoint_runs_the_command(target, out_root):
    argv = ["python3", "/imagetests/ran.py", "marker"]
    flags = [*target["run_flags"], *target.get("extra_run_flags", [])]
    probe, _ = run_once(target["image"], flags, argv, run_id=target["run_id"], out_root=out_root,
                        step="`docker run IMAGE python3 ...` through the entrypoint")
    if probe.error:
        raise AssertionError(probe.cause())
    entry = image_entrypoint(target["image"])
    assert not probe.cut, (
        f"`docker run IMAGE python3 ...` did not run: {probe.hung()}; the image's entrypoint {entry} "
        f"keeps the container running without running the command it is given")
    ran = isinstance(probe.result, dict) and probe.result.get("ran") and probe.result.get("argv") == ["marker"]
    assert ran, (f"`docker run IMAGE python3 ...` did not run the command: the image's entrypoint {entry} ignored it "
                 f"(exit code {probe.rc}; last output: {(probe.tail(1) or 'none')[:200]})")
