"""What the image contains matches what its matrix cell, labels and tag claim."""

from __future__ import annotations

import pytest
from harness import skip

from buildtool.contracts import skips


@pytest.fixture(scope="module")
def contents(main, target):
    packages = sorted(target["expect"].get("packages", {}))
    info = target["framework_info"]
    result = main.python("contents.py", info["module"], info["gpu_count_expr"], *packages, timeout=180)
    found = result.payload("CONTENTS")
    assert found is not None, f"contents probe failed (rc {result.rc}): {result.tail()}"
    return found


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


def test_gpus_visible(contents, target, runner_gpus, require_gpu, main):
    require_gpu(f"GPU visibility check ({target['framework']} device count, nvidia-smi)")
    assert contents.get("gpu_count") == len(runner_gpus), (
        f"the runner has {len(runner_gpus)} GPUs but {target['framework']} in the image sees "
        f"{contents.get('gpu_count')} (is the container started with --gpus all?)")
    listed = main.exec("nvidia-smi -L", timeout=60)
    assert listed.rc == 0, f"nvidia-smi fails in the image: {listed.tail(3)}"
    assert len([line for line in listed.out.splitlines() if line.startswith("GPU ")]) == len(runner_gpus)
