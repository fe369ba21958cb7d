"""image-tests' pip check on arm64 (issue 38): NVIDIA's nvidia-cusparselt-cu13 0.8.1 aarch64 wheel says
`Tag: py3-none-manylinux2014_sbsa` in its WHEEL metadata, so `pip check` calls it "not supported on this
platform" on every arm64 machine (found validating pytorch-cuda's arm64 image under QEMU). Only that exact
mislabel on aarch64 is a note; every other finding, or the same line elsewhere, stays a problem."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import REPO

SCRIPTS = REPO / "image-tests" / "scripts"
LINE = "nvidia-cusparselt-cu13 0.8.1 is not supported on this platform"


@pytest.fixture(scope="module")
def pip_check():  # noqa: ANN201
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location("pip_check_under_test", SCRIPTS / "pip_check.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(SCRIPTS))


def test_nvidias_sbsa_mislabel_on_aarch64_is_a_note_naming_the_tag(pip_check) -> None:  # noqa: ANN001
    problems, notes = pip_check.classify([LINE], lambda name: ["py3-none-manylinux2014_sbsa"], "aarch64")
    assert problems == []
    assert notes == [f"{LINE} (its WHEEL metadata says py3-none-manylinux2014_sbsa: NVIDIA's name for arm64 "
                     "servers)"]


@pytest.mark.parametrize(("line", "tags", "machine"), [
    (LINE, ["py3-none-manylinux2014_sbsa"], "x86_64"),                       # not an arm64 machine
    (LINE, ["py3-none-linux_riscv64"], "aarch64"),                           # really another platform
    (LINE, ["py3-none-manylinux2014_sbsa", "py3-none-linux_x86_64"], "aarch64"),  # not only the mislabel
    (LINE, [], "aarch64"),                                                   # no WHEEL tags to tell
    ("sympy 1.14.0 requires mpmath<1.4,>=1.1.0, which is not installed.", ["py3-none-any"], "aarch64"),
])
def test_every_other_unsupported_or_broken_finding_stays_a_problem(pip_check, line: str, tags: list[str],
                                                                   machine: str) -> None:  # noqa: ANN001
    problems, notes = pip_check.classify([line], lambda name: tags, machine)
    assert problems == [line] and notes == []
