"""One TensorBoard over experiments from several images: TensorBoard in this image reads event
files written by the other framework's image, and the other image's TensorBoard reads ours.
Event files pass through a shared temporary folder mounted into both containers."""

from __future__ import annotations

import uuid

import pytest
from harness import skip

from buildtool.contracts import skips


@pytest.fixture(scope="module")
def peer(target, start_container):
    """The first other framework with an image of this commit (the framework table lists them)."""
    others = sorted(target.get("peer_frameworks") or {})
    for other in others:
        image = (target.get("peers") or {}).get(other)
        if image:
            return target["peer_frameworks"][other], start_container(image, hint=f"peer-{other}")
    names = " or ".join(others) or "another framework"
    skip(skips.NO_PEER_IMAGE, f"no {names} image of this commit to exchange event files with "
         f"(build it, or pass --peer FRAMEWORK=IMAGE)")


def _write(container, framework: dict, logdir: str, run: str) -> None:
    script, *extra = framework["events_writer"]
    result = container.python(script, logdir, run, *extra, timeout=240)
    assert result.rc == 0, f"{framework['name']} could not write event files: {result.tail(5)}"


def _read(container, logdir: str, run: str) -> list:
    result = container.python("tb_query.py", "--logdir", logdir, "--mode", "scalars", "--run", run,
                              "--tag", "loss", "--timeout", "90", timeout=150)
    found = result.payload("TB_RESULT")
    assert found and found.get("started"), f"TensorBoard did not start: {(found or {}).get('log_tail', result.tail())}"
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
