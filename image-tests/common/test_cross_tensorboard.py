"""One TensorBoard over experiments from several images: TensorBoard in this image reads event
files written by the other framework's image, and the other image's TensorBoard reads ours.
Event files pass through a shared temporary folder mounted into both containers."""

from __future__ import annotations

import uuid

import pytest
from harness import skip

from buildtool.contracts import skips

pytestmark = pytest.mark.shared(why="event files and TensorBoard queries in two containers")


@pytest.fixture(scope="module")
def peer(target, start_container):
    """The first other framework with an image of this commit (the framework table lists them)."""
    others = sorted(target.get("peer_frameworks") or {})
    for other in others:
        image = (target.get("peers") or {}).get(other)
        if image:
            info = target["peer_frameworks"][other]
            return info, start_container(image, hint=f"peer-{other}", warm=info["module"], framework=other)
    names = " or ".join(others) or "another framework"
    skip(skips.NO_PEER_IMAGE, f"no {names} image of this commit to exchange event files with "
         f"(build it, or pass --peer FRAMEWORK=IMAGE)")


TB_START_S = 60  # TensorBoard start-up and the scalars appearing (tb_query.py's own bound)


def _write(container, framework: dict, logdir: str, run: str) -> None:
    script, *extra = framework["events_writer"]
    probe = container.python(script, logdir, run, *extra, step=f"{framework['name']} writing event files")
    found = probe.result
    assert probe.ok and isinstance(found, dict) and found.get("ok"), (
        f"{framework['name']} could not write event files: {(found or {}).get('error') or probe.cause()}")


def _read(container, logdir: str, run: str) -> list:
    probe = container.python("tb_query.py", "--logdir", logdir, "--mode", "scalars", "--run", run,
                             "--tag", "loss", "--timeout", str(TB_START_S), step="TensorBoard reading the events",
                             quiet=TB_START_S + 30)
    found = probe.result
    assert isinstance(found, dict), probe.cause()
    assert found.get("started"), f"TensorBoard could not start: {found.get('error') or probe.cause()}"
    status, values = found["scalars"]
    assert status == 200 and isinstance(values, list) and len(values) == 10, (
        f"TensorBoard did not serve the scalars of run {run!r}: tags={found['tags']}, scalars={found['scalars']}")
    return values


def test_our_tensorboard_reads_other_frameworks_events(main, target, peer):
    other, container = peer
    logdir = f"/shared/cross-{uuid.uuid4().hex[:6]}"
    _write(container, other, logdir, f"{other['name']}-run")
    _read(main, logdir, f"{other['name']}-run")


def test_other_tensorboard_reads_our_events(main, target, peer):
    other, container = peer
    logdir = f"/shared/cross-{uuid.uuid4().hex[:6]}"
    _write(main, target["framework_info"], logdir, f"{target['framework']}-run")
    _read(container, logdir, f"{target['framework']}-run")
