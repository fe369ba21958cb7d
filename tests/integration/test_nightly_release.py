"""The nightly and the release as a site runs them (issue 55), in a copy of the project with the site's own keys:

    make push FRAMEWORK=tensorflow-cpu                                   # the peer image of the commit
    make nightly FRAMEWORK=pytorch-cpu NIGHTLY_OUT=<a new folder>        # the first night
    make nightly FRAMEWORK=pytorch-cpu NIGHTLY_OUT=<the same folder>     # the second night
    then the generated release workflow's steps, in order, with its inputs (version, framework, from)

The site made a builder key and a tester key with `buildtool keys` and trusts them in config/trusted-keys.yaml
(a commit, as docs/release-trust.md says); the jobs get the private halves as DL_IMAGES_BUILDER_KEY and
DL_IMAGES_SIGNING_KEY, as the nightly workflow gives them. Nothing here passes --trust-local-key or --accept-skip:
the release is what the workflow runs. The tensorflow image is the peer the pytorch image's cross-framework checks
exchange event files with (without one they skip, and release refuses a skip the matrix does not expect).

Runs in its own registry namespace (REGISTRY=127.0.0.1:5000/t-site-<random>), removed at the end; images are built
from BuildKit's cache when test_build or the fixture images built the same content.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from buildtool.common.refs import split_repo
from buildtool.registry.client import RegistryClient
from buildtool.render.workflows import CHECKOUT, RELEASE_PATH, RELEASE_PLAN_FILE, UPLOAD
from buildtool.report.nightly import NO_TREND, SCALING_PLOTS
from tests.integration.test_build import _cleanup_namespace
from tests.integration.test_pipeline import copy_project

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]

LOCAL = "127.0.0.1:5000"
CELL = "pytorch-cpu:2.13"
VERSION = "0.55.0"
PNG = b"\x89PNG\r\n\x1a\n"


@dataclass
class Site:
    root: Path
    project: Path
    registry: str
    env: dict[str, str]
    seconds: dict[str, float] = field(default_factory=dict)

    def run(self, *argv: str, timeout: int = 3000, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        started = time.monotonic()
        proc = subprocess.run(list(argv), cwd=self.project, env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout)
        print(f"{' '.join(argv)[:120]}: exit {proc.returncode} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        return proc


def _trust(project: Path, keys: Path) -> dict[str, str]:
    """The site's builder and tester keys, made and trusted as the docs say; their private halves as the jobs'
    secrets."""
    entries, secrets_ = [], {}
    for name, role, secret in (("t-site-builders", "builder", "DL_IMAGES_BUILDER_KEY"),
                               ("t-site-runners", "tester", "DL_IMAGES_SIGNING_KEY")):
        made = subprocess.run([sys.executable, "-m", "buildtool", "keys", "--name", name, "--role", role, "--out",
                               str(keys)], cwd=project, capture_output=True, text=True, timeout=60, check=True)
        entries.append(made.stdout.split("in a reviewed commit:\n", 1)[1].rstrip("\n"))
        secrets_[secret] = (keys / f"{name}.key").read_text()
    trusted = project / "config" / "trusted-keys.yaml"
    text = trusted.read_text()
    assert text.rstrip().endswith("keys: []"), "the shipped trusted-keys.yaml is expected to trust no key"
    trusted.write_text(text.rstrip()[: -len("[]")].rstrip() + "\n" + "\n".join(entries) + "\n")
    subprocess.run(["git", "-C", str(project), "-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-qam",
                    "trust the site's keys"], check=True, capture_output=True, timeout=60)
    return secrets_


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("site")
    project = copy_project(root / "project")
    namespace = f"t-site-{secrets.token_hex(4)}"
    env = {k: v for k, v in os.environ.items() if k not in ("RELEASE_REGISTRY", "PLATFORM", "FRAMEWORK")}
    env |= {"REGISTRY": f"{LOCAL}/{namespace}", "BASE_MIRROR": LOCAL, **_trust(project, root / "keys")}
    # The runner's venv: the workflow's `.venv/bin/python` and the Makefile's default PYTHON.
    (project / ".venv").symlink_to(Path(sys.executable).parent.parent)
    yield Site(root, project, f"{LOCAL}/{namespace}", env)
    _cleanup_namespace(namespace)


@dataclass
class Night:
    proc: subprocess.CompletedProcess
    md: str
    html: str
    history: list[str]
    verdicts: list[dict]


@pytest.fixture(scope="module")
def nights(site: Site) -> list[Night]:
    peer = site.run("make", "push", "FRAMEWORK=tensorflow-cpu")
    assert peer.returncode == 0, peer.stdout[-3000:] + peer.stderr[-3000:]
    out = site.root / "nightly"
    assert not out.exists()
    found = []
    for night in ("first", "second"):
        started = time.monotonic()
        proc = site.run("make", "nightly", "FRAMEWORK=pytorch-cpu", f"NIGHTLY_OUT={out}")
        site.seconds[f"{night} night"] = time.monotonic() - started
        found.append(Night(proc, (out / "report.md").read_text() if (out / "report.md").exists() else "",
                           (out / "report.html").read_text() if (out / "report.html").exists() else "",
                           sorted(p.name for p in (out / "history").iterdir()) if (out / "history").is_dir() else [],
                           [json.loads(p.read_text()) for p in sorted((out / "verdicts").rglob("*verdict.json"))]))
    return found


def _dev_digest(site: Site, cell: str) -> str:
    plan = json.loads(subprocess.run([sys.executable, "-m", "buildtool", "plan", "--framework", cell, "--json"],
                                     cwd=site.project, env=site.env, capture_output=True, text=True, timeout=120,
                                     check=True).stdout)["include"][0]
    _, repo, tag = split_repo(plan["dev_image"])
    digest = RegistryClient(LOCAL).manifest_digest(repo, tag)
    assert digest, f"{plan['dev_image']} is not in the registry"
    return digest


def test_make_nightly_into_a_fresh_folder_first_night_then_a_trend(site: Site, nights: list[Night]) -> None:
    first, second = nights
    out = site.root / "nightly"
    digest = _dev_digest(site, CELL)
    for night in nights:
        assert night.proc.returncode == 0, night.proc.stdout[-3000:] + night.proc.stderr[-4000:]
        # Tonight's verdict of the image the night pushed, passed, signed by the site's runners.
        [verdict] = night.verdicts
        assert verdict["cell"] == CELL and verdict["digest"] == digest and verdict["result"] == "passed", verdict
        assert re.search(rf"^\| `{CELL}` \|( linux/amd64 \|)? ✅ pass \|", night.md, re.M), night.md
        # The scaling comparison and its plots, in the report and beside it.
        assert "### Scaling: strategies side by side" in night.md and "| DDP |" in night.md
        for plot in SCALING_PLOTS:
            assert (out / "scaling" / plot).read_bytes().startswith(PNG), plot
            assert f'src="scaling/{plot}"' in night.html, plot
        assert "the scaling in jax-cpu:0.10 is not run: FRAMEWORK=pytorch-cpu does not build it" in night.proc.stderr
    # The first night says it has no earlier night, in the report and on the way.
    assert "(the first night): the report shows no trend" in first.proc.stderr
    assert NO_TREND in first.md and NO_TREND.replace("'", "&#39;") in first.html
    assert "Since the previous night" not in first.html and len(first.history) == 1
    # The second night's trend is against the first (nothing changed), with the bus-bandwidth baseline passed.
    assert "no earlier night" not in second.proc.stderr
    assert NO_TREND not in second.md and "No change since the previous night." in second.md
    assert "Since the previous night" in second.html
    assert second.history[0] == first.history[0] and len(second.history) == 2
    print(f"nightly times: {', '.join(f'{k} {v:.0f} s' for k, v in site.seconds.items())}", file=sys.stderr)


def _expand(text: str, values: dict[str, str]) -> str:
    """The workflow's `${{ ... }}` expressions, each one this test gives a value; any other is an error."""
    def one(match: re.Match[str]) -> str:
        expression = match.group(1).strip()
        assert expression in values, f"the release workflow uses ${{{{ {expression} }}}}, which this test does not set"
        return values[expression]
    return re.sub(r"\$\{\{(.*?)\}\}", one, text)


def test_the_release_workflows_steps_promote_the_validated_digest(site: Site, nights: list[Night]) -> None:
    """The release as the generated workflow runs it on the site's runner: its steps in order, its env and the
    dispatch inputs (version, framework pytorch-cpu, from empty), against the local registry. The release tags
    name the digest the nightly validated."""
    assert all(n.proc.returncode == 0 for n in nights)
    validated = nights[-1].verdicts[0]["digest"]
    doc = yaml.safe_load((site.project / RELEASE_PATH).read_text())
    values = {"inputs.version": VERSION, "inputs.framework": "pytorch-cpu", "inputs.from": "",
              "vars.REGISTRY || '127.0.0.1:5000'": site.registry,
              "vars.RELEASE_REGISTRY || vars.REGISTRY || '127.0.0.1:5000'": site.registry}
    env = {**site.env, **{k: _expand(v, values) for k, v in doc["env"].items()}}
    assert env["REGISTRY"] == env["RELEASE_REGISTRY"] == site.registry
    [job] = doc["jobs"].values()
    ran = []
    for step in job["steps"]:
        name = step.get("name") or step["uses"]
        if "uses" in step:
            if step["uses"].startswith("actions/upload-artifact"):   # what it uploads was written (a path a line)
                for path in step["with"]["path"].split():
                    written = site.project / path
                    assert written.is_file() or path.endswith("/") and written.is_dir(), step
            ran.append(name)
            continue
        if name == "Install the toolkit":
            # The runner's venv is the test's own (the fixture's .venv); the step is these two commands only.
            assert step["run"].split("\n")[:2] == ["python3 -m venv .venv",
                                                   ".venv/bin/python -m pip install -e '.[dev]'"], step["run"]
            ran.append(name)
            continue
        step_env = {k: _expand(v, values) for k, v in step.get("env", {}).items()}
        proc = site.run("bash", "-e", "-c", _expand(step["run"], values), env={**env, **step_env})
        if proc.returncode != 0:
            print(proc.stdout, proc.stderr, file=sys.stderr)
        assert proc.returncode == 0, (name, proc.stdout[-3000:] + proc.stderr[-3000:])
        ran.append(name)
    assert ran == [CHECKOUT, "Install the toolkit", "Check the version", "Retag the validated dev images",
                   UPLOAD, "Keep the release manifest, notes and catalogue"]
    [planned] = json.loads((site.project / RELEASE_PLAN_FILE).read_text())["include"]
    assert planned["cell"] == CELL
    tags = [*planned["release_tags"], *planned["moving_tags"]]
    assert tags == [f"2.13-{VERSION}", "2.13", "latest"]
    _, repo, _ = split_repo(f"{planned['release_repo']}:x")
    assert planned["release_repo"] == f"{site.registry}/pytorch-cpu"
    client = RegistryClient(LOCAL)
    assert {tag: client.manifest_digest(repo, tag) for tag in tags} == {tag: validated for tag in tags}
    manifest = json.loads((site.project / "docs" / "releases" / f"{VERSION}.json").read_text())
    [image] = manifest["images"]
    assert image["cell"] == CELL and validated in json.dumps(image)
