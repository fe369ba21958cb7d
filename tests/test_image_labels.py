"""An image's labels as a typed object (buildtool.contracts.image_labels): what the templates and the
builder write parses and writes back unchanged; a value that does not parse is an error naming its key."""

from __future__ import annotations

import json

import pytest

from buildtool.contracts import label_keys
from buildtool.contracts.image_labels import ImageLabels, LabelError, RunProfile
from buildtool.imagebuild.builder import BaseInfo, build_labels
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.plan import Settings, mirror_base, plan_cell
from buildtool.matrix.schema import Cell, Matrix
from buildtool.validate.labels import template_labels
from tests.conftest import REPO

MATRIX = load_matrix(REPO / "matrix.yaml", REPO / "templates", display="matrix.yaml")
# A pip cell and an NGC cell (on a stand-in base here): the two kinds of template.
CELLS = [next(c for c in MATRIX.cells if c.standin is None), next(c for c in MATRIX.cells if c.standin is not None)]


FULL = "0123456789abcdef0123456789abcdef01234567"


def _image_labels(matrix: Matrix, c: Cell, base_labels: dict[str, str] | None = None) -> dict[str, str]:
    """Every label a built image of the cell carries: its template's and the builder's."""
    plan = plan_cell(c, Settings(base_mirror="127.0.0.1:5000"), "abc123")
    base = BaseInfo(ref=plan.base, digest="sha256:" + "3" * 64, labels=base_labels or {})
    return {**template_labels(matrix, c, REPO / "templates"),
            **build_labels(plan, base, "sha256:key", FULL, matrix.source, locked={"tensorboard": "2.21.0"})}


@pytest.mark.parametrize("c", CELLS, ids=lambda c: c.key)
def test_what_templates_and_builder_write_round_trips(c: Cell) -> None:
    raw = _image_labels(MATRIX, c, {label_keys.STANDIN: "true", label_keys.STANDIN_FRAMEWORK: "2.13.0+cpu"})
    parsed = ImageLabels.parse(raw)
    assert parsed.to_dict() == raw
    assert (parsed.cell, parsed.framework, parsed.python, parsed.base_upstream) == (c.key, c.framework, c.python,
                                                                                     c.base)
    assert parsed.base_name == mirror_base(c.base, "127.0.0.1:5000")      # what the build pulled
    assert parsed.revision == FULL
    assert parsed.authors and parsed.url and parsed.documentation and parsed.vendor
    assert parsed.licenses == ""     # the real matrix sets none (tests/test_licenses_label.py)
    assert parsed.tests == tuple(c.tests) and parsed.packages == {"tensorboard": "2.21.0"}
    assert parsed.run_profile is not None and parsed.run_profile.shm_size == c.run.shm_size
    assert parsed.run_profile.docker_flags == tuple(c.run.docker_flags())
    assert parsed.standin is True and parsed.standin_keys == [label_keys.STANDIN, label_keys.STANDIN_FRAMEWORK]
    assert parsed.other == {} and parsed.emptied == ()


def test_unknown_and_emptied_labels_are_kept() -> None:
    raw = {"maintainer": "x", f"{label_keys.PACKAGE_PREFIX}torch-tb-profiler": "0.4.3", label_keys.STANDIN_FOR: "",
           label_keys.PACKAGES: ""}
    parsed = ImageLabels.parse(raw)
    assert parsed.other == {"maintainer": "x"} and parsed.package_labels == {"torch-tb-profiler": "0.4.3"}
    assert parsed.packages is None and parsed.standin_for == "" and parsed.standin is None
    assert parsed.emptied == tuple(sorted([label_keys.STANDIN_FOR, label_keys.PACKAGES]))
    assert parsed.standin_keys == [label_keys.STANDIN_FOR]     # an emptied stand-in key still marks a stand-in
    assert parsed.to_dict() == dict(sorted(raw.items()))


PROFILE = {"shm_size": "8g", "ipc": "private", "ulimits": {"stack": 67108864}, "gpus": "none",
           "docker_flags": ["--shm-size=8g"]}


@pytest.mark.parametrize(("key", "value", "message"), [
    (label_keys.RUN_PROFILE, "not json", "is not a JSON object"),
    (label_keys.RUN_PROFILE, "[1]", "is not a JSON object"),
    (label_keys.RUN_PROFILE, json.dumps({**PROFILE, "shm": "8g"}), "unknown field 'shm'"),
    (label_keys.RUN_PROFILE, json.dumps({**PROFILE, "shm_size": "8gb"}), "shm_size '8gb' is not a size"),
    (label_keys.RUN_PROFILE, json.dumps({"ipc": "host"}), "shm_size None is not a size"),
    (label_keys.RUN_PROFILE, json.dumps({**PROFILE, "ulimits": {"stack": True}}), "is not an object of whole"),
    (label_keys.RUN_PROFILE, json.dumps({**PROFILE, "ulimits": {"stack": "big"}}), "is not an object of whole"),
    (label_keys.RUN_PROFILE, json.dumps({**PROFILE, "gpus": 1}), "gpus 1 is not text"),
    (label_keys.RUN_PROFILE, json.dumps({**PROFILE, "docker_flags": "--shm-size=8g"}), "is not a list of text"),
    (label_keys.PACKAGES, "{", "is not a JSON object"),
    (label_keys.PACKAGES, json.dumps({"torch": 2}), "every version must be text"),
    (label_keys.STANDIN, "yes", "is neither true nor false"),
    (label_keys.STANDIN, "True", "is neither true nor false"),
    (label_keys.TESTS, "common,,pytorch", "is not a comma list"),
    (label_keys.TESTS, "common, pytorch", "is not a comma list"),
])
def test_a_value_that_does_not_parse_is_an_error_naming_its_key(key: str, value: str, message: str) -> None:
    with pytest.raises(LabelError, match=message) as caught:
        ImageLabels.parse({key: value})
    assert key in str(caught.value)


def test_a_run_profile_writes_the_builders_spelling() -> None:
    profile = RunProfile.from_json(json.dumps(PROFILE))
    assert profile.ulimits == (("stack", 67108864),) and profile.gpus == "none"
    assert profile.to_json() == json.dumps(PROFILE, sort_keys=True, separators=(",", ":"))
    assert RunProfile.from_json('{"shm_size": "64m"}').to_json() == '{"shm_size":"64m"}'


def test_release_refuses_an_image_whose_labels_do_not_parse() -> None:
    """The gate reads the labels through the type: a broken one is a refusal naming it, before any write."""
    from buildtool.release.gates import Platform, image_problems

    c = CELLS[0]
    good = {label_keys.CELL: c.key, label_keys.OCI_BASE_NAME: c.base}
    digest = "sha256:" + "1" * 64
    assert image_problems(c, [Platform("", digest, 1, good)]) == []
    [problem] = image_problems(c, [Platform("", digest, 1, {**good, label_keys.PACKAGES: "{"})])
    assert problem == (f"{digest}: label {label_keys.PACKAGES}='{{' is not a JSON object; "
                       "rebuild it with `buildtool build`")


def test_the_builder_refuses_a_base_whose_labels_do_not_parse() -> None:
    from buildtool.common.errors import UserError

    with pytest.raises(UserError, match=f"base .*: label {label_keys.STANDIN}='yes' is neither true nor false"):
        _image_labels(MATRIX, CELLS[1], {label_keys.STANDIN: "yes"})
