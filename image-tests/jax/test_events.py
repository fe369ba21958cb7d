"""JAX training's loss written as TensorBoard scalars (scripts/jax_events.py: TensorBoard's own
event writer, as JAX has none) is served by TensorBoard in the same image, value for value.
(TensorBoard of the other frameworks' images reading them is common/test_cross_tensorboard.py.)"""

from __future__ import annotations

import math
import uuid

import pytest

pytestmark = pytest.mark.shared(why="event files and a TensorBoard query")

LOGDIR = f"imgtest-jax-events-{uuid.uuid4().hex[:6]}"  # relative: the image's working directory
RUN = "train"
TB_START_S = 60


@pytest.fixture(scope="module")
def written(main, target):
    script, *extra = target["framework_info"]["events_writer"]
    probe = main.python(script, LOGDIR, RUN, *extra, step="JAX writing its loss as event files")
    found = probe.result
    assert isinstance(found, dict) and found.get("ok"), (
        f"JAX could not write event files in the image's working directory: "
        f"{(found or {}).get('error') or probe.cause()}")
    return found


def test_tensorboard_serves_the_loss_jax_wrote(main, written):
    probe = main.python("tb_query.py", "--logdir", LOGDIR, "--mode", "scalars", "--run", RUN, "--tag", "loss",
                        "--timeout", str(TB_START_S), step="TensorBoard serving the JAX scalars",
                        quiet=TB_START_S + 30)
    found = probe.result
    assert isinstance(found, dict), probe.cause()
    assert found["started"], f"TensorBoard could not start: {found.get('error') or probe.cause()}"
    status, values = found["scalars"]
    assert status == 200 and isinstance(values, list), (
        f"TensorBoard does not serve the loss scalars: tags={found['tags']} scalars={found['scalars']}")
    served = [row[2] for row in values]   # [wall_time, step, value]
    wrote = written["values"]
    same = len(served) == len(wrote) and all(math.isclose(a, b, rel_tol=1e-6)
                                             for a, b in zip(served, wrote, strict=False))
    assert same, f"TensorBoard serves {served}, JAX wrote {wrote}"
    assert wrote[-1] < wrote[0], f"the loss JAX wrote did not fall: {wrote}"
