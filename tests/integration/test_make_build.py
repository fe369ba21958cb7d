"""The seed's own command, as the README and docs/commands.md give it, with a user's defaults (issue 55):

    make build FRAMEWORK=pytorch-ngc BASE_MIRROR=127.0.0.1:5000

in a copy of the project (its own commit, so its own dev tags), with the default REGISTRY. It builds every cell of
the image on its NGC stand-in for this machine's platform: pytorch-ngc:25.10 (an amd64 and arm64 cell: its amd64
image only, on the amd64 child of its stand-in index; the arm64 stand-in carries PyPI's CUDA torch, 4.9 GB, which a
local build does not make) and pytorch-ngc:25.01. Asserted: the dev tags and image ids it prints are this commit's
and the engine's, each image is what its cell says, and a second run is a no-op. The dev tags it made are removed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.common import docker_cli
from buildtool.contracts import label_keys, names, platforms
from buildtool.imagebuild import engine, multiplatform
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.plan import Settings, git_revision, plan_cell
from tests.integration.test_pipeline import copy_project

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]

CELLS = ("pytorch-ngc:25.10", "pytorch-ngc:25.01")


def test_make_build_pytorch_ngc_tags_each_cell_for_this_machine(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "project")
    env = {k: v for k, v in os.environ.items() if k not in ("REGISTRY", "RELEASE_REGISTRY", "PLATFORM", "FRAMEWORK")}

    def make_build() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["make", f"PYTHON={sys.executable}", "build", "FRAMEWORK=pytorch-ngc",
                               "BASE_MIRROR=127.0.0.1:5000"], cwd=project, env=env, capture_output=True, text=True,
                              timeout=3000)

    matrix = load_matrix(project / "matrix.yaml")
    revision = git_revision(project)
    plans = {key: plan_cell(next(c for c in matrix.cells if c.key == key), Settings.from_env(env), revision)
             for key in CELLS}
    assert [c.key for c in matrix.select("pytorch-ngc")] == list(CELLS)   # what FRAMEWORK=pytorch-ngc names
    native = platforms.host().name
    made = [p.dev_ref for p in plans.values()] + [f"{p.dev_repo}:{multiplatform.platform_tag(p.dev_tag, native)}"
                                                  for p in plans.values() if p.cell.multi_platform]
    try:
        run = make_build()
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        # The build prints `<reference> <digest>` for each image it made: this commit's dev tags (the default
        # registry), each naming the engine's image.
        printed = dict(re.findall(r"^(\S+-dev:\S+) (sha256:[0-9a-f]{64})$", run.stdout, re.M))
        assert set(printed) == {p.dev_ref for p in plans.values()}, run.stdout
        for key, plan in plans.items():
            assert plan.dev_ref.startswith("127.0.0.1:5000/pytorch-ngc-dev:")
            assert names.parse_dev_tag(plan.dev_tag, plan.cell.version) is not None
            attrs = engine.image_attrs(plan.dev_ref)
            assert attrs is not None and attrs["Id"] == printed[plan.dev_ref], key
            assert f"{attrs['Os']}/{attrs['Architecture']}" == native, key
            labels = attrs["Config"]["Labels"]
            assert labels[label_keys.OCI_VERSION] == plan.cell.version
            assert labels[label_keys.STANDIN] == "true" and labels[label_keys.BASE_UPSTREAM] == plan.cell.base
            assert labels[label_keys.CONTENT_KEY]
        # pytorch-ngc:25.10 is built for linux/amd64 and linux/arm64: this machine's image only, nothing else.
        ten = plans["pytorch-ngc:25.10"]
        assert ten.cell.platforms == ("linux/amd64", "linux/arm64")
        for other in (p for p in ten.cell.platforms if p != native):
            assert engine.image_attrs(f"{ten.dev_repo}:{multiplatform.platform_tag(ten.dev_tag, other)}") is None
        works = docker_cli.docker("run", "--rm", "--network=none", ten.dev_ref, "python", "-c",
                                  "import os, torch; print(os.getcwd(), torch.__version__)", timeout=600)
        assert works.stdout.strip().splitlines()[-1:] == ["/workspace 2.13.0+cpu"], works.stderr[-2000:]
        # Nothing changed: the same command again builds nothing and prints the same images.
        again = make_build()
        assert again.returncode == 0, again.stderr[-3000:]
        assert dict(re.findall(r"^(\S+-dev:\S+) (sha256:[0-9a-f]{64})$", again.stdout, re.M)) == printed
        assert again.stdout.count("up to date") >= len(CELLS), again.stdout
    finally:
        for ref in made:
            if engine.image_attrs(ref) is not None:
                engine.untag(ref)
