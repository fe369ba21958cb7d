"""Small, reusable test images for the image-test layer: one good PyTorch CPU image, one good
TensorFlow CPU image, and broken ones derived from them with thin layers.

Each image is tagged `t-imgtest-<name>:<hash of its recipe and its parent's tag>`, so a second
run finds it and reuses it (idempotent, cheap in CI after the first build). Layers are made
with `docker run` + `docker commit`: host wheel folders and the CA bundle are bind mounts
(never part of a layer), package installs need the host network, and the engine's BuildKit
cannot use local images as bases anyway. These are test fixtures, labelled as such, never
released.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

DOCKER = os.environ.get("IMAGETEST_DOCKER", "docker")
PREFIX = "t-imgtest"
BASE_TIMEOUT_S = 900
STEP_TIMEOUT_S = 1800
CA_BUNDLE = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
# Host wheel folders and local indexes handed to pip inside the build container, read-only.
LOCAL_PIP_DIRS = [Path(p) for p in ("/opt/wheels", "/opt/pypi", "/opt/pypi-more")]

PYTORCH_PROFILE = {"shm_size": "8g", "ipc": "private", "ulimits": {"memlock": -1, "stack": 67108864},
                   "gpus": "none"}


def _labels(cell: str, framework: str, version: str, tests: str) -> dict[str, str]:
    return {
        "io.dl-images.cell": cell,
        "io.dl-images.framework": framework,
        "io.dl-images.framework-version": version,
        "io.dl-images.python": "3.11",
        "io.dl-images.accelerator": "cpu",
        "io.dl-images.tests": tests,
        "io.dl-images.run-profile": json.dumps(PYTORCH_PROFILE, sort_keys=True),
        "io.dl-images.fixture": "true",
    }


@dataclass(frozen=True)
class Recipe:
    name: str
    parent: str  # a recipe name, or "" for the debootstrap base
    script: str = ""
    labels: dict[str, str] = field(default_factory=dict)


_VENV = ("apt-get update && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv "
         "&& rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv && mkdir -p /workspace")
_PIP = "/opt/venv/bin/python -m pip install --no-cache-dir --progress-bar off"

RECIPES: dict[str, Recipe] = {r.name: r for r in [
    Recipe("debian", ""),
    Recipe("python", "debian", _VENV),
    Recipe("pytorch", "python",
           f"{_PIP} torch==2.13.0+cpu tensorboard==2.21.0 torch-tb-profiler==0.4.3",
           _labels("pytorch-cpu:2.13", "pytorch", "2.13.0+cpu", "common,pytorch")),
    Recipe("tensorflow", "python",
           f"{_PIP} tensorflow-cpu==2.21.0 tensorboard==2.21.0 tensorboard-plugin-profile==2.21.6",
           _labels("tensorflow-cpu:2.21", "tensorflow", "2.21.0", "common,tensorflow")),
    # Faults, each a thin layer on a good image.
    Recipe("pytorch-noprofiler", "pytorch", "/opt/venv/bin/python -m pip uninstall -y torch-tb-profiler"),
    # tensorboard 2.20 imports pkg_resources on start; setuptools 82 dropped it.
    Recipe("tensorflow-setuptools82", "tensorflow",
           f"{_PIP} --no-deps tensorboard==2.20.0 'setuptools>=82'"),
    Recipe("pytorch-mislabelled", "pytorch", "",
           {"io.dl-images.framework-version": "2.12.0+cpu"}),
]}


def _docker(*args: str, timeout: float = 120, check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout, check=check, **kw)


def image_exists(ref: str) -> bool:
    return _docker("image", "inspect", ref, check=False, timeout=60).returncode == 0


def recipe_ref(name: str) -> str:
    """The content-addressed tag of a recipe: its own fields plus its parent's tag."""
    recipe = RECIPES[name]
    parent = recipe_ref(recipe.parent) if recipe.parent else "debootstrap:bookworm:minbase"
    body = json.dumps([parent, recipe.script, sorted(recipe.labels.items())]).encode()
    return f"{PREFIX}-{name}:{hashlib.sha256(body).hexdigest()[:12]}"


def _build_debian(ref: str) -> None:
    root = Path(tempfile.mkdtemp(prefix="t-imgtest-rootfs-"))
    try:
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(root / "fs")], check=True,
                       capture_output=True, timeout=BASE_TIMEOUT_S)
        tar = subprocess.Popen(["tar", "-C", str(root / "fs"), "-c", "."], stdout=subprocess.PIPE)
        try:
            subprocess.run([DOCKER, "import", "--change", 'CMD ["bash"]', "-", ref], stdin=tar.stdout, check=True,
                           capture_output=True, timeout=BASE_TIMEOUT_S)
        finally:
            tar.wait(timeout=60)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _pip_mounts_and_env() -> tuple[list[str], str]:
    mounts, env = [], []
    if CA_BUNDLE.is_file():
        mounts += ["-v", f"{CA_BUNDLE}:/run/imgtest-ca.pem:ro"]
        env.append("PIP_CERT=/run/imgtest-ca.pem")
    links = [p for p in LOCAL_PIP_DIRS[:1] if p.is_dir()]
    indexes = [p for p in LOCAL_PIP_DIRS[1:3] if (p / "simple").is_dir()]
    for path in {*links, *indexes}:
        mounts += ["-v", f"{path}:{path}:ro"]
    if links:
        env.append(f"PIP_FIND_LINKS={links[0]}")
    if indexes:
        env.append("PIP_EXTRA_INDEX_URL='" + " ".join(f"file://{p}/simple" for p in indexes) + "'")
    return mounts, " ".join(env)


def _build_step(recipe: Recipe, parent: str, ref: str) -> None:
    name = f"{PREFIX}-build-{uuid.uuid4().hex[:8]}"
    changes = ["ENV VIRTUAL_ENV=/opt/venv", "ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
               "/usr/bin:/sbin:/bin", "ENV PYTHONDONTWRITEBYTECODE=1", "WORKDIR /workspace", 'CMD ["bash"]']
    changes += [f"LABEL {k}={json.dumps(v)}" for k, v in sorted(recipe.labels.items())]
    try:
        mounts, env = _pip_mounts_and_env()
        script = f"set -e; export {env}; {recipe.script}" if env else f"set -e; {recipe.script}"
        _docker("run", "--name", name, "--network", "host", *mounts, parent, "bash", "-c",
                script if recipe.script else "true", timeout=STEP_TIMEOUT_S)
        args = [arg for change in changes for arg in ("--change", change)]
        _docker("commit", *args, name, ref, timeout=600)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"building fixture {ref} failed: {exc.stderr[-2000:]}") from None
    finally:
        _docker("rm", "-f", name, check=False, timeout=120)


def ensure(name: str) -> str:
    """Build (or reuse) the fixture image `name` and its parents; returns its reference."""
    ref = recipe_ref(name)
    if image_exists(ref):
        return ref
    recipe = RECIPES[name]
    if not recipe.parent:
        _build_debian(ref)
    else:
        _build_step(recipe, ensure(recipe.parent), ref)
    return ref


if __name__ == "__main__":  # build every fixture once: python tests/integration/fixture_images.py
    for key in RECIPES:
        print(key, ensure(key), flush=True)
