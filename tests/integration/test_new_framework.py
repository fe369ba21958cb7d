"""Adding an image of a new framework is one folder (image-tests/<name>/: its framework.yaml row,
template part, scripts and test group) and its matrix entry. Shown with a fixture framework
(`fixturefw`, tests/fixtures/frameworks/fixturefw, never shipped) whose "module" is the standard
library's json: rendered with the shared pip template, planned, and validated in a real container,
with the version probe, its own script run from /imagetests and the results keyed by its group."""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_images  # noqa: E402

from buildtool.common import docker_cli  # noqa: E402
from buildtool.contracts import label_keys  # noqa: E402
from buildtool.matrix.loader import load_matrix  # noqa: E402
from buildtool.validate.runner import Options, validate_image  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]
REPO = Path(__file__).resolve().parents[2]
FIXTURE_FW = REPO / "tests" / "fixtures" / "frameworks" / "fixturefw"
MATRIX_ENTRY = "\n" + (FIXTURE_FW.parent / "fixturefw.matrix.yaml").read_text()


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


def test_a_new_framework_is_one_folder_and_a_matrix_entry(project: Path, run_cli, tmp_path: Path) -> None:
    (project / "matrix.yaml").write_text((project / "matrix.yaml").read_text() + MATRIX_ENTRY)
    # Without its folder the framework is unknown: nothing is skipped or released untested.
    code, out, err = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and "unknown framework 'fixturefw'" in err and "a new one is a folder image-tests/<name>/" in err
    shutil.copytree(FIXTURE_FW, project / "image-tests" / "fixturefw")

    code, out, err = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 0, err
    dockerfile = (project / "dockerfiles/fixturefw/fixturefw-img/1.0/Dockerfile").read_text()
    assert f'{label_keys.FRAMEWORK}="fixturefw"' in dockerfile and "ENV FIXTUREFW_HOME=/opt/fixturefw" in dockerfile
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
    # Its own script, from its folder's scripts/, ran in the image beside the common ones.
    assert by_id["fixturefw/test_fixturefw.py::test_fixture_framework_script_runs_from_its_folder"]["result"] \
        == "passed", by_id
    assert by_id["common/test_contents.py::test_framework_version"]["result"] == "passed", by_id
    assert all(t["result"] == "passed" for t in verdict["tests"]), verdict["tests"]
    assert verdict["groups"] == ["common", "fixturefw"]
