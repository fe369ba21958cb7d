"""Adding an image of a new framework is: its matrix entry, a template, one row of the framework
table and its image-tests group. Shown with a fixture framework (`fixturefw`, never shipped) whose
"module" is the standard library's json: rendered, planned, and validated in a real container,
with the version probe, the framework's own test group and the results keyed by that group."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_images  # noqa: E402

from buildtool.common import docker_cli  # noqa: E402
from buildtool.contracts import frameworks, label_keys  # noqa: E402
from buildtool.matrix.schema import load_matrix  # noqa: E402
from buildtool.validate.runner import Options, validate_image  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]
REPO = Path(__file__).resolve().parents[2]
ROW = frameworks.Framework(name="fixturefw", module="json", distributions=(), gpu_count_expr="0",
                           events_writer=("torch_events.py",))
MATRIX_ENTRY = """
  - name: fixturefw-img
    framework: fixturefw
    accelerator: cpu
    template: images/fixturefw.Dockerfile.j2
    base: docker.io/library/debian:bookworm-slim
    tests: [common, fixturefw]
    use: A fixture framework that proves a new framework is one matrix entry, template, table row and test group.
    run:
      gpus: none
    versions:
      - version: "1.0"
        default: true
        framework_version: "2.0.9"
"""
TEMPLATE = """{% extends "parts/image.j2" %}
{% block python %}
{% include "parts/python.j2" %}
{% endblock %}
{% block framework %}
# fixturefw {{ cell.framework_version }}: the standard library's json.
{% endblock %}
"""
GROUP_TEST = '''
def test_fixture_framework_module_answers(main, target):
    result = main.exec(["python3", "-c", "import json; print(json.__version__)"])
    assert result.rc == 0 and result.out.strip() == target["expect"]["framework_claims"][0]["value"], result.text
'''


@pytest.fixture
def fixture_framework():
    frameworks.register(ROW)
    try:
        yield ROW
    finally:
        frameworks.unregister(ROW.name)


def _image() -> str:
    """The fixture python image with the labels a build of the fixturefw cell would give it."""
    parent = fixture_images.ensure("python")
    ref = f"t-imgtest-fixturefw:{uuid.uuid4().hex[:8]}"
    name = f"t-imgtest-fixturefw-{uuid.uuid4().hex[:8]}"
    labels = {label_keys.CELL: "fixturefw-img:1.0", label_keys.FRAMEWORK: "fixturefw",
              label_keys.FRAMEWORK_VERSION: "2.0.9", label_keys.PYTHON: "3.11",
              label_keys.ACCELERATOR: "cpu", label_keys.FIXTURE: "true"}
    try:
        docker_cli.docker("create", "--name", name, parent, "true", check=True, timeout=120)
        changes = [arg for k, v in labels.items() for arg in ("--change", f"LABEL {k}={json.dumps(v)}")]
        docker_cli.docker("commit", *changes, name, ref, check=True, timeout=300)
    finally:
        docker_cli.remove(name, timeout=120)
    return ref


def test_a_new_framework_is_a_matrix_entry_a_template_a_table_row_and_a_test_group(
        project: Path, run_cli, fixture_framework, tmp_path: Path) -> None:
    (project / "matrix.yaml").write_text((project / "matrix.yaml").read_text() + MATRIX_ENTRY)
    (project / "templates/images/fixturefw.Dockerfile.j2").write_text(TEMPLATE)
    # Without its image-tests group the new cell does not load: nothing is skipped or released untested.
    code, out, err = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and "test group 'fixturefw' has no folder image-tests/fixturefw/" in err, err
    (project / "image-tests/fixturefw").mkdir()
    (project / "image-tests/fixturefw/test_fixturefw.py").write_text(GROUP_TEST)

    code, out, err = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 0, err
    dockerfile = project / "dockerfiles/fixturefw/fixturefw-img/1.0/Dockerfile"
    assert f'{label_keys.FRAMEWORK}="fixturefw"' in dockerfile.read_text()
    code, out, err = run_cli("plan", "--json", "-f", "fixturefw", "--matrix", str(project / "matrix.yaml"))
    assert code == 0, err
    [planned] = json.loads(out)["include"]
    assert planned["framework"] == "fixturefw" and planned["tests"] == ["common", "fixturefw"]

    image = _image()
    try:
        matrix = load_matrix(project / "matrix.yaml", project / "templates")
        options = Options(store=False, reports=tmp_path / "reports",
                          select="test_framework_version or test_python_version or fixturefw")
        verdict = validate_image(image, matrix, project, options, log=print)
    finally:
        docker_cli.docker("rmi", image, timeout=120)
    by_id = {t["id"]: t for t in verdict["tests"]}
    assert by_id["fixturefw/test_fixturefw.py::test_fixture_framework_module_answers"]["group"] == "fixturefw"
    assert by_id["common/test_contents.py::test_framework_version"]["result"] == "passed", by_id
    assert all(t["result"] == "passed" for t in verdict["tests"]), verdict["tests"]
    assert verdict["groups"] == ["common", "fixturefw"]
