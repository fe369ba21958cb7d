"""The contents check proves every locked package inside the image with one probe, and fails,
naming each one, on an image where a locked package was removed or changed after the build.

Images are thin `docker commit` layers over the good PyTorch fixture of fixture_images (built
once, shared with the fault corpus): the good one gets the lock label a build would write (its
own package set), the broken one additionally loses torch-tb-profiler (as the release whose
notes only said "size: 406.2 MB -> 406.2 MB" did) and reports another numpy. Validation runs
only this check (-k): about 15 s after the fixture exists.
"""

from __future__ import annotations

import json
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
PROBE = REPO / "image-tests" / "scripts" / "packages.py"
TEST = "test_locked_packages_installed_at_their_versions"


def _docker(*args: str, timeout: float = 300) -> str:
    return docker_cli.docker(*args, timeout=timeout, check=True).stdout


def _commit(parent: str, script: str, labels: dict[str, str]) -> str:
    ref, name = f"t-imgtest-locked:{uuid.uuid4().hex[:8]}", f"t-imgtest-locked-{uuid.uuid4().hex[:8]}"
    try:
        _docker("run", "--name", name, "--network", "none", parent, "bash", "-c", script or "true")
        changes = [a for k, v in labels.items() for a in ("--change", f"LABEL {k}={json.dumps(v)}")]
        _docker("commit", *changes, name, ref)
    finally:
        docker_cli.remove(name, timeout=120)
    return ref


@pytest.fixture(scope="module")
def images():
    parent = fixture_images.ensure("pytorch")
    found = json.loads(_docker("run", "--rm", "--network", "none", parent, "python3", "-c", PROBE.read_text()))
    locked = json.dumps(found["python_packages"], sort_keys=True)
    assert "torch-tb-profiler" in found["python_packages"] and "numpy" in found["python_packages"]
    # A new content key too: `buildtool build` must never take these for the real image.
    good = _commit(parent, "", {label_keys.PACKAGES: locked, label_keys.CONTENT_KEY: "fixture:locked"})
    numpy = found["python_packages"]["numpy"]
    # Another numpy as an install leaves it: its METADATA and its .dist-info folder's name (which pip list reads
    # first) both say 1.0.0.
    broken = _commit(good, "set -e; /opt/venv/bin/python -m pip uninstall -y -q torch-tb-profiler; "
                           f"info=$(ls -d /opt/venv/lib/python3*/site-packages/numpy-{numpy}.dist-info); "
                           f"sed -i 's/^Version: {numpy}$/Version: 1.0.0/' \"$info/METADATA\"; "
                           f"mv \"$info\" \"${{info%-{numpy}.dist-info}}-1.0.0.dist-info\"", {})
    yield {"good": good, "broken": broken, "numpy": numpy}
    docker_cli.docker("rmi", broken, good, timeout=300)


def _run(image: str, tmp_path: Path) -> dict:
    matrix = load_matrix(REPO / "matrix.yaml", REPO / "templates")
    options = Options(store=False, reports=tmp_path, select=TEST)
    verdict = validate_image(image, matrix, REPO, options, log=lambda line: None)
    return {t["id"].split("::")[-1]: t for t in verdict["tests"]}[TEST]


def test_every_locked_package_is_proven_and_each_change_is_named(images, tmp_path: Path):
    assert _run(images["good"], tmp_path / "good")["result"] == "passed"
    outcome = _run(images["broken"], tmp_path / "broken")
    assert outcome["result"] == "failed", outcome
    message = outcome["message"]
    print(message.splitlines()[0])
    assert "torch-tb-profiler: locked 0.4.3, image has nothing installed" in message
    assert f"numpy: locked {images['numpy']}, image has 1.0.0" in message
    assert "2 of " in message


def test_an_image_without_the_lock_label_is_a_skip_the_release_refuses(tmp_path: Path):
    from buildtool.contracts import skips

    outcome = _run(fixture_images.ensure("pytorch-nolock"), tmp_path)
    assert outcome["result"] == "skipped" and outcome["skip_code"] == skips.NO_LOCK_LABEL.code, outcome
    cell = next(c for c in load_matrix(REPO / "matrix.yaml").cells if c.key == "pytorch-cpu:2.13")
    assert skips.judge(cell, skips.NO_LOCK_LABEL.code) == "refused"
