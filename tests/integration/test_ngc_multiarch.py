"""A multi-platform NGC cell end to end on an amd64 machine (issue 38): jax-ngc, on its stand-in, built for
linux/amd64 and linux/arm64 and pushed as one OCI index. The stand-in is itself an index (one image per
platform, made by `buildtool bases`); each platform's tools come from its own lock, installed by uv on the build
machine and copied in, so the arm64 image's tools are aarch64 builds that run there (under QEMU here).

    buildtool build -f jax-ngc:25.10 --push     (REGISTRY=127.0.0.1:5000/t-ngc-multiarch-<random>, BASE_MIRROR)
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from buildtool.common import docker_cli
from buildtool.common.refs import split_repo
from buildtool.contracts import label_keys, locks, platforms
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.plan import Settings, git_revision, mirror_base, plan_cell
from buildtool.registry.client import RegistryClient
from buildtool.registry.image_index import read_index
from tests.integration import fixture_images

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]

ROOT = Path(__file__).resolve().parents[2]
CELL = "jax-ngc:25.10"
BOTH = ["linux/amd64", "linux/arm64"]
LOCAL = "127.0.0.1:5000"
# Every locked tool's installed version and, for each of its files, the ELF machine of those that are ELF.
PROBE = r"""
import importlib.metadata as md, json, platform, sys
names = sys.argv[1:]
found = {}
for name in names:
    dist = md.distribution(name)
    machines = set()
    for f in dist.files or ():
        path = f.locate()
        try:
            head = open(path, "rb").read(20)
        except OSError:
            continue
        if head[:4] == b"\x7fELF":
            machines.add(int.from_bytes(head[18:20], "little"))
    found[name] = [dist.version, sorted(machines)]
print(json.dumps({"machine": platform.machine(), "tools": found}))
"""


@pytest.fixture(scope="module")
def pushed() -> dict[str, Any]:
    registry = f"{LOCAL}/t-ngc-multiarch-{secrets.token_hex(4)}"
    env = {**os.environ, "REGISTRY": registry, "BASE_MIRROR": LOCAL}
    env.pop("RELEASE_REGISTRY", None)
    # The shared mirror's bases (the Debian index, the stand-in index) are made once, not beside another build.
    with fixture_images.one_builder():
        build = subprocess.run([sys.executable, "-m", "buildtool", "build", "-f", CELL, "--push", "--json"], cwd=ROOT,
                               env=env, capture_output=True, text=True, timeout=3600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    [result] = json.loads(build.stdout)["results"]
    cell = next(c for c in load_matrix(ROOT / "matrix.yaml").cells if c.key == CELL)
    plan = plan_cell(cell, Settings.from_env(env), git_revision(ROOT))
    return {"result": result, "plan": plan, "cell": cell,
            "children": {p["platform"]: p["digest"] for p in result["platforms"]}}


def test_the_stand_in_is_an_index_of_one_labelled_image_per_platform(pushed: dict[str, Any]) -> None:
    _, repo, tag = split_repo(mirror_base(pushed["cell"].base, LOCAL))
    children = read_index(RegistryClient(LOCAL), repo, tag)
    assert children is not None and list(children) == BOTH
    for platform, child in children.items():
        assert child.labels[label_keys.STANDIN] == "true", platform
        assert child.labels[label_keys.STANDIN_FOR] == pushed["cell"].base


def test_the_dev_tag_is_an_index_of_both_platforms(pushed: dict[str, Any]) -> None:
    assert pushed["result"]["result"] in ("pushed", "retagged", "up to date"), pushed["result"]
    _, repo, tag = split_repo(pushed["plan"].dev_ref)
    children = read_index(RegistryClient(LOCAL), repo, tag)
    assert children is not None and list(children) == BOTH
    assert {p: c.digest for p, c in children.items()} == pushed["children"]


@pytest.mark.parametrize("platform", BOTH)
def test_each_image_holds_its_own_locks_tools_built_for_its_machine(pushed: dict[str, Any], platform: str) -> None:
    """The versions each platform's pylock.tools.toml names, every ELF file of them for that platform's machine (the
    arm64 image run under QEMU), and the framework the stand-in brought still importable beside them."""
    target = platforms.get(platform)
    folder = ROOT / Path(pushed["cell"].dockerfile).parent / target.architecture
    locked = locks.parse_lock((folder / locks.TOOLS_LOCK).read_text()).versions()
    run = docker_cli.docker("run", "--rm", "--platform", platform, pushed["plan"].dev_ref, "python", "-c",
                            PROBE + "\nimport jax, tensorboard", *sorted(locked), timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["machine"] == target.machine
    assert {name: v for name, (v, _) in found["tools"].items()} == locked
    machines = {m for _, ms in found["tools"].values() for m in ms}
    assert machines == {target.elf_machine}, found["tools"]
