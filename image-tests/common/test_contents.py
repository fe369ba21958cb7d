"""What the image contains matches what its matrix cell, labels and tag claim."""

from __future__ import annotations

import pytest
from harness import skip

from buildtool.contracts import skips


def test_python_version(contents, target):
    expected = target["expect"].get("python")
    if not expected:
        skip(skips.STANDIN_PYTHON, target["expect"].get("python_skip_reason") or "no Python version claimed")
    actual = contents["python"]
    assert actual == expected or actual.startswith(expected + "."), (
        f"image claims Python {expected} but contains Python {actual}")


def test_framework_version(contents, target):
    module = target["framework_info"]["module"]
    assert "import_error" not in contents, f"import {module} fails in the image: {contents['import_error']}"
    actual = contents["framework_version"]
    wrong = [c for c in target["expect"]["framework_claims"] if c["value"] != actual]
    assert not wrong, "; ".join(
        f"{c['source']} claims {module} {c['value']} but the image contains {module} {actual}"
        + (f" ({c['note']})" if c.get("note") else "") for c in wrong)


def test_extra_packages(contents, target):
    expected = target["expect"].get("packages", {})
    if not expected:
        skip(skips.NO_PINNED_PACKAGES, "the cell pins no extra packages")
    wrong = {name: (version, contents["packages"].get(name)) for name, version in expected.items()
             if contents["packages"].get(name) != version}
    assert not wrong, "; ".join(
        f"{name}: cell pins {want} but the image has {have or 'nothing installed'}"
        for name, (want, have) in sorted(wrong.items()))


@pytest.mark.gpu(what="GPU visibility check (device count, nvidia-smi)")
def test_gpus_visible(contents, target, runner_gpus, require_gpu, main):
    require_gpu(f"GPU visibility check ({target['framework']} device count, nvidia-smi)")
    assert contents.get("gpu_count") == len(runner_gpus), (
        f"the runner has {len(runner_gpus)} GPUs but {target['framework']} in the image sees "
        f"{contents.get('gpu_count')} (is the container started with --gpus all?)")
    listed = main.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], step="nvidia-smi in the image",
                      timeout=30)
    assert listed.ok, listed.cause()
    assert len([line for line in listed.out.splitlines() if line.strip().isdigit()]) == len(runner_gpus)
