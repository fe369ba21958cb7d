"""What the image contains matches what its matrix cell, labels and tag claim."""

from __future__ import annotations

import pytest
from harness import skip
from infra import normalized

from buildtool.contracts import gpu, label_keys, skips, versions

pytestmark = pytest.mark.shared(why="reads the image's contents")


def test_python_version(contents, target):
    expected = target["expect"].get("python")
    if not expected:
        skip(skips.STANDIN_PYTHON, target["expect"].get("python_skip_reason") or "no Python version claimed")
    actual = contents["python"]
    assert actual == expected or actual.startswith(expected + "."), (
        f"image claims Python {expected} but contains Python {actual}")


def test_framework_version(contents, target):
    """The public version must equal each claim's (packaging.version); the local part must be the
    cell's build: +cpu, +cu<CUDA>, NGC's <commit>.nvYY.MM, a source build's .devN+<commit>
    (buildtool.contracts.versions)."""
    module = target["framework_info"]["module"]
    assert "import_error" not in contents, f"import {module} fails in the image: {contents['import_error']}"
    actual = contents["framework_version"]
    wrong = []
    for claim in target["expect"]["framework_claims"]:
        expect = versions.Expectation(claim["local_pattern"], claim["local_text"], bool(claim.get("source_dev")))
        found = versions.problems(actual, claim["value"], expect)
        if found:
            wrong.append(f"{claim['source']} claims {module} {claim['value']} but the image contains {module} "
                         f"{actual}: {'; '.join(found)}" + (f" ({claim['note']})" if claim.get("note") else ""))
    assert not wrong, "; ".join(wrong)


def test_extra_packages(pip_packages, target):
    """The packages the cell pins, as the image's `pip` lists them (testinfra's `host`)."""
    expected = target["expect"].get("packages", {})
    if not expected:
        skip(skips.NO_PINNED_PACKAGES, "the cell pins no extra packages")
    wrong = {name: (version, pip_packages.get(normalized(name))) for name, version in expected.items()
             if pip_packages.get(normalized(name)) != version}
    assert not wrong, "; ".join(
        f"{name}: cell pins {want} but the image has {have or 'nothing installed'}"
        for name, (want, have) in sorted(wrong.items()))


def test_nvidia_runtime_variables(target, host):
    """A GPU image names what GPU runtimes must inject and the CUDA its driver must support
    (pyxis/enroot inject no GPU without them); a CPU image demands no CUDA driver. Read in the container
    (testinfra's `host`): the variables its processes really get."""
    env = host.environment()
    labels = target.get("labels") or {}
    if not target.get("needs_gpu"):
        assert "NVIDIA_REQUIRE_CUDA" not in env, (
            f"a CPU image sets NVIDIA_REQUIRE_CUDA={env['NVIDIA_REQUIRE_CUDA']}: GPU runtimes would refuse "
            "to start it on hosts without that driver")
        return
    cuda = target["cuda"]
    problems = []
    if env.get("NVIDIA_VISIBLE_DEVICES") in (None, "", "void", "none"):
        problems.append(f"NVIDIA_VISIBLE_DEVICES is {env.get('NVIDIA_VISIBLE_DEVICES')!r} (want all)")
    capabilities = set((env.get("NVIDIA_DRIVER_CAPABILITIES") or "").split(","))
    if not ({"compute", "utility"} <= capabilities or "all" in capabilities):
        problems.append(f"NVIDIA_DRIVER_CAPABILITIES is {env.get('NVIDIA_DRIVER_CAPABILITIES')!r} "
                        "(want compute,utility)")
    require = env.get("NVIDIA_REQUIRE_CUDA") or ""
    if not require.startswith(f"cuda>={cuda}"):
        problems.append(f"NVIDIA_REQUIRE_CUDA is {require!r}, not cuda>={cuda} "
                        f"(the cell's CUDA; drivers older than {gpu.min_driver(cuda)} must be refused)")
    if labels.get(label_keys.CUDA) != cuda:
        problems.append(f"label {label_keys.CUDA} is {labels.get(label_keys.CUDA)!r}, not the cell's {cuda}")
    assert not problems, "GPU image not ready for GPU runtimes: " + "; ".join(problems)


@pytest.mark.gpu(what="GPU visibility check (device count, nvidia-smi)")
def test_gpus_visible(contents, target, runner_gpus, require_gpu, main):
    require_gpu(f"GPU visibility check ({target['framework']} device count, nvidia-smi)")
    assert contents.get("gpu_count") == len(runner_gpus), (
        f"the runner has {len(runner_gpus)} GPUs but {target['framework']} in the image sees "
        f"{contents.get('gpu_count')} (is the container started with --gpus all?)")
    listed = main.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], step="nvidia-smi in the image")
    assert listed.ok, listed.cause()
    assert len([line for line in listed.out.splitlines() if line.strip().isdigit()]) == len(runner_gpus)
