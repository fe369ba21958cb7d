"""Labels are contents: the catalogue, release notes and users read an image's labels, so each
one that states something must be true. Every label the template writes must say what the
matrix cell the image names says, and every label stating a fact about the image (Python,
framework, accelerator, CUDA, version; buildtool.contracts.label_keys.FACTS) must match what is
really inside. `buildtool validate` works out what to compare (buildtool/validate/labels.py)."""

from __future__ import annotations

import pytest
from packaging.version import InvalidVersion, Version

pytestmark = pytest.mark.shared(why="compares labels with the contents")


def _mm(text: str) -> tuple[int, ...]:
    try:
        return Version(text).release[:2]
    except InvalidVersion:
        return ()


def test_labels_state_the_matrix_cell(target):
    wrong = []
    for check in target["expect"].get("labels", []):
        want = check.get("cell_value")
        if want is None or check["value"] == want:
            continue
        if check["value"] is None:
            wrong.append(f"label {check['key']} is missing (matrix cell {target['cell']} says {want!r})")
        else:
            wrong.append(f"label {check['key']}={check['value']!r}, but matrix cell {target['cell']} says {want!r}")
    assert target["expect"].get("labels"), "validate listed no labels to check"
    assert not wrong, "; ".join(wrong)


def _content_mismatch(check: dict, contents: dict, target: dict) -> str:
    key, value, fact = check["key"], check["value"], check["fact"]
    module = target["framework_info"]["module"]
    if fact == "python":
        actual = contents["python"]
        if not (actual == value or actual.startswith(value + ".")):
            return f"label {key} says Python {value}, but the image's python3 is {actual}"
    elif fact == "framework":
        if value != target["framework"]:
            return f"label {key} says {value}, but the image is tested as {target['framework']}"
        if contents.get("import_error"):
            return f"label {key} says {value}, but `import {module}` fails: {contents['import_error']}"
    elif fact == "accelerator":
        cuda = contents.get("cuda_build", "")
        if value == "cpu" and cuda:
            return f"label {key} says cpu, but {module} in the image is built with CUDA {cuda}"
        if value == "cuda" and not cuda:
            return f"label {key} says cuda, but {module} in the image is built without CUDA"
        if value not in ("cpu", "cuda"):
            return f"label {key} says {value!r}, which is neither cpu nor cuda"
    elif fact == "cuda":
        cuda = contents.get("cuda_build", "")
        if _mm(cuda) != _mm(value) or not cuda:
            return f"label {key} says CUDA {value}, but {module} in the image is built with CUDA {cuda or 'none'}"
    elif fact == "version":
        expected = check.get("expected", "")
        if expected == "framework-release":
            have = contents.get("framework_version") or ""
            try:
                ok = Version(have).release[:len(Version(value).release)] == Version(value).release
            except InvalidVersion:
                ok = False
            if not ok:
                return f"label {key} says version {value}, but the image contains {module} {have or '(none)'}"
        elif expected.startswith("env:"):
            name = expected[4:]
            have = (contents.get("env") or {}).get(name) or ""
            if have.split("-")[0] != value:
                return f"label {key} says version {value}, but the image's {name} is {have or 'unset'}"
    return ""


def test_labels_state_the_image_contents(target, contents, host):
    contents = {**contents, "env": host.environment()}   # a version variable's label is checked against it
    checks = [c for c in target["expect"].get("labels", [])
              if c.get("fact") and c["fact"] != "framework-version" and c["value"] is not None]
    assert checks, "validate listed no label that states a fact about the image"
    wrong = [msg for msg in (_content_mismatch(c, contents, target) for c in checks) if msg]
    assert not wrong, "; ".join(wrong)
