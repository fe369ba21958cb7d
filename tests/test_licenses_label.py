"""The image's OCI licenses label (label_keys.OCI_LICENSES, issue 40): an image ships its framework beside
Debian's (or Ubuntu's) GPL and LGPL packages, so a label naming the framework's license alone
(`BSD-3-Clause` on pytorch-cpu) misstates it. The real matrix sets none; the SBOM names each package's
license (docs/contents.md#sboms). The fixture matrix still sets them (it tests the label's grammar), which is
how this check is shown to catch one."""

from __future__ import annotations

from pathlib import Path

from buildtool.contracts import label_keys
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.schema import Matrix
from tests.conftest import fixture_matrix

ROOT = Path(__file__).resolve().parents[1]


def licenses_labelled(matrix: Matrix) -> list[str]:
    """The cells whose images would carry a licenses label, each with its value."""
    found = []
    for cell in matrix.cells:
        value = dict(cell.oci).get("licenses")
        if value:
            found.append(f"{cell.key}: {label_keys.OCI_LICENSES}={value}")
    return found


def test_real_project_images_carry_no_licenses_label_that_names_only_their_framework() -> None:
    assert licenses_labelled(load_matrix(ROOT / "matrix.yaml")) == []


def test_a_matrix_that_sets_one_is_caught_naming_the_cell() -> None:
    found = licenses_labelled(fixture_matrix())
    assert any(line.startswith(f"pytorch-cpu:2.13: {label_keys.OCI_LICENSES}=") for line in found), found
