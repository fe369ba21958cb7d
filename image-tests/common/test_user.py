"""The image as `docker run IMAGE CMD` gives it to a user: its entrypoint runs the command, and
its default user can write in its working directory and in /tmp, where training writes
checkpoints, profiler traces and TensorBoard logs (the other write checks, in test_ddp,
test_profiler and test_tensorboard, write there too, as that user)."""

from __future__ import annotations

import pytest
from harness import image_entrypoint, run_once

pytestmark = pytest.mark.shared(why="writes files; the entrypoint check starts a container of its own")


@pytest.fixture(scope="module")
def user(main):
    return main.result("workdir.py", step="check where the image's user can write", site=False)


def _who(user: dict) -> str:
    return f"the image's user {user['uid']}" + (f" ({user['user']})" if user.get("user") else "")


def test_image_user_can_write_in_its_workdir(user):
    place = user["workdir"]
    assert place["ok"], (
        f"{_who(user)} cannot write in its working directory {user['cwd']}: {place.get('error')}; training run with "
        f"`docker run IMAGE` cannot save checkpoints, traces or logs there (make the WORKDIR writable for this user)")


def test_image_user_can_write_tmp(user):
    place = user["tmp"]
    assert place["ok"], f"{_who(user)} cannot write in {place['path']}: {place.get('error')}"


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
