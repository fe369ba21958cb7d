"""A new user's first hour (issue 50): the README's commands, read from the README and run in its order, in a fresh
copy of the project, as a user runs them:

    bash scripts/setup.sh && make push validate FRAMEWORK=pytorch-cpu BASE_MIRROR=127.0.0.1:5000   (the main job)
    make verify FRAMEWORK=pytorch-cpu VERIFY_FLAGS="..."                                           (result verified)
    make release VERSION=0.1.0 FRAMEWORK=pytorch-cpu RELEASE_FLAGS="..."                           (promoted)
    make validate FRAMEWORK=pytorch-cpu                                (the verdict of the main job reused, by name)

then one image test changed: validating the same image runs the tests again and says why. setup.sh makes the copy's
own .venv with uv (engine and registry are found running). Runs in its own registry namespace
(REGISTRY=127.0.0.1:5000/t-first-<random>), removed at the end; the image is built from BuildKit's cache when
another test built the same content. Nothing here asserts on time; the seconds are printed.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from buildtool.common.refs import split_repo
from buildtool.registry.client import RegistryClient
from tests.integration.test_build import _cleanup_namespace
from tests.integration.test_pipeline import copy_project
from tests.test_readme_commands import readme_commands

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]

LOCAL = "127.0.0.1:5000"
DIGEST = r"sha256:[0-9a-f]{64}"


@pytest.fixture
def space(tmp_path: Path):  # noqa: ANN201
    namespace = f"t-first-{secrets.token_hex(4)}"
    yield namespace
    _cleanup_namespace(namespace)


def test_the_readmes_commands_in_order_on_a_fresh_copy(tmp_path: Path, space: str) -> None:
    main, (verify, release), (again,) = readme_commands()
    project = copy_project(tmp_path / "project")
    env = {k: v for k, v in os.environ.items() if k not in ("RELEASE_REGISTRY", "FRAMEWORK", "PLATFORM", "PYTHON",
                                                              "DL_IMAGES_SIGNING_KEY", "DL_IMAGES_BUILDER_KEY")}
    env["REGISTRY"] = f"{LOCAL}/{space}"
    seconds: dict[str, float] = {}

    def sh(line: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        proc = subprocess.run(["bash", "-c", line], cwd=project, env=env, capture_output=True, text=True,
                              timeout=timeout)
        seconds[line[:40]] = time.monotonic() - started
        assert proc.returncode == 0, f"{line}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    # The set-up and the main job: the copy's own .venv (uv, from the lock), a verdict stored by digest.
    job = sh(main[0])
    assert (project / ".venv/bin/uv").is_file() and "setup: done in" in job.stderr
    stored = re.search(rf"verdict for ({DIGEST}) stored as ({DIGEST})", job.stderr)
    assert stored, job.stderr[-3000:]
    digest, artifact = stored.groups()
    # The image the build left in the engine is run, its config (rewritten in the registry) loaded over its layers:
    # nothing pulled.
    assert "this engine holds every layer of it" in job.stderr and "pulling" not in job.stderr, job.stderr[-3000:]

    # verify says yes in one result line, and release promotes that digest.
    checked = sh(verify)
    results = [line for line in checked.stdout.splitlines() if line.startswith("result")]
    assert results == ["result  verified"], checked.stdout
    released = sh(release)
    assert "promoted" in released.stdout, released.stdout
    client = RegistryClient(LOCAL)
    assert {tag: client.manifest_digest(f"{space}/pytorch-cpu", tag) for tag in ("2.13-0.1.0", "2.13", "latest")} \
        == dict.fromkeys(("2.13-0.1.0", "2.13", "latest"), digest)

    # Validating again answers with the main job's verdict, by name, and stores nothing.
    dev_repo = f"{space}/pytorch-cpu-dev"
    tags = sorted(client.tags(dev_repo))
    reused = sh(again)
    assert f"reused verdict {artifact} of " in reused.stdout and f"({digest}, linux/amd64): passed" in reused.stdout
    assert "stored as" not in reused.stderr and sorted(client.tags(dev_repo)) == tags

    # A change to any image test: the same image is validated again, and the log says why.
    dev_ref = re.search(rf"of ({re.escape(LOCAL)}/\S+) \(", reused.stdout).group(1)   # type: ignore[union-attr]
    assert split_repo(dev_ref)[1] == dev_repo
    test = project / "image-tests/common/test_ca_certs.py"
    test.write_text(test.read_text() + "\n# changed by the first-hour test\n")
    ran = sh(f".venv/bin/python -m buildtool validate {dev_ref}")
    assert f"no verdict of {digest} to reuse (the verdict that counts, {artifact}, it ran image tests " in ran.stderr
    assert "reused verdict" not in ran.stdout and re.search(rf"stored as (?!{artifact}){DIGEST}", ran.stderr)
    print(f"first hour: {', '.join(f'{k!r} {v:.0f} s' for k, v in seconds.items())}", file=sys.stderr)
