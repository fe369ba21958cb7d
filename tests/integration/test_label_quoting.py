"""BuildKit itself reads the rendered LABEL values back as exactly the matrix's text.

The unit tests (tests/test_render_quoting.py) read LABELs by BuildKit's quoting rules as
written there; this builds the rendered LABEL instruction on `FROM scratch` with the real
engine (about a second, no layers, no registry) and compares what `docker inspect` shows.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from buildtool.contracts import label_keys
from buildtool.imagebuild import engine
from tests.test_render_quoting import MATRIX, TEMPLATES, _instructions, _render, _unquoted_templates

pytestmark = [pytest.mark.integration, pytest.mark.engine]  # FROM scratch: no registry

HOSTILE_TEXT = [
    'say "hi" to $HOME and ${PATH} and `id`',
    "back\\slash\\",
    "it's $(id); ok && done",
    "tab-free but 'quoted' \\\"twice\\\"",
]


@pytest.mark.parametrize("text", HOSTILE_TEXT)
def test_buildkit_reads_label_values_as_written(text: str, tmp_path: Path):
    engine.sdk()  # a missing engine fails here with the one-line hint, never a skip
    base = next(c for c in MATRIX.cells if c.key == "pytorch-cpu:2.13")
    cell = dataclasses.replace(base, use=text, framework_version=text, python=text)
    rendered = _render(TEMPLATES, cell)
    label_lines = [line for keyword, line in _instructions(rendered) if keyword == "LABEL"]
    assert len(label_lines) == 1
    start = rendered.index("LABEL ")
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM scratch\n" + rendered[start:])
    image = engine.build(engine.resolve_build_client(), engine.BuildRequest(
        tmp_path, dockerfile, build_args={}, labels={},
                         secrets={}, log_path=tmp_path / "build.log", timeout=300, network_host=False))
    try:
        labels = engine.image_labels(image)
    finally:
        engine.sdk().api.remove_image(image, force=True)
    for key in (label_keys.OCI_DESCRIPTION, label_keys.FRAMEWORK_VERSION, label_keys.PYTHON):
        assert labels[key] == text, key
    assert labels[label_keys.CELL] == cell.key


def test_buildkit_would_misread_them_without_the_label_filter(tmp_path: Path):
    """The control: with LABEL values in plain double quotes (the templates before), BuildKit
    substitutes `$HOME` (or refuses the file), so the test above is able to fail."""
    engine.sdk()
    unquoted = _unquoted_templates(tmp_path, "double")
    base = next(c for c in MATRIX.cells if c.key == "pytorch-cpu:2.13")
    cell = dataclasses.replace(base, use=HOSTILE_TEXT[0])
    rendered = _render(unquoted, cell)
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n" + rendered[rendered.index("LABEL "):])
    try:
        image = engine.build(engine.resolve_build_client(), engine.BuildRequest(
        context, context / "Dockerfile", build_args={},
                             labels={}, secrets={}, log_path=tmp_path / "build.log", timeout=300,
                             network_host=False))
    except engine.BuildFailed:
        return
    try:
        labels = engine.image_labels(image)
    finally:
        engine.sdk().api.remove_image(image, force=True)
    assert labels.get(label_keys.OCI_DESCRIPTION) != HOSTILE_TEXT[0]
