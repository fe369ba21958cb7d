"""`buildtool build` against the real engine and the local registry (scripts/setup.sh starts both).

Images are built once per session and shared by the tests (CI time): the four real cells
go into a registry namespace of their own (`127.0.0.1:5000/t-build-<random>/...`), removed
at the end; a tiny two-cell project (one good cell, one broken) checks failure handling and
that a CA bundle and an index token leave no trace anywhere.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import re
import secrets
import shutil
import socketserver
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import docker
import pytest

from buildtool.common import docker_cli
from buildtool.common.refs import split_repo
from buildtool.contracts import label_keys, names
from buildtool.imagebuild import engine
from buildtool.imagebuild.builder import Builder, BuildOptions
from buildtool.imagebuild.pipconfig import HostPip
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.plan import Settings, full_revision, git_revision, plan_cell
from buildtool.registry.client import RegistryClient
from buildtool.registry.image_index import platform_manifest
from tests import signing

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]

ROOT = Path(__file__).resolve().parents[2]
LOCAL = "127.0.0.1:5000"
# Fixed for the session: other work in the tree must not change the dev tags mid-run.
REVISION = git_revision(ROOT)
# Single-platform cells: the NGC ones on their amd64 stand-ins. A multi-platform cell pushed as an index is
# tests/integration/test_multiarch.py (jax-cpu) and test_ngc_multiarch.py (jax-ngc); pytorch-ngc:25.10's arm64
# stand-in carries PyPI's CUDA torch (a 4.9 GB image, pushed and built on), which CI's disk does not hold beside
# the rest (a CI machine ran out of space building it).
CELLS = ("pytorch-cpu:2.13", "tensorflow-cpu:2.21", "pytorch-ngc:25.01", "tensorflow-ngc:25.02")


def _cleanup_namespace(namespace: str) -> None:
    """Remove this session's tags: local ones and the registry's manifests under the namespace."""
    client = docker.from_env(timeout=120)
    for image in client.images.list():
        for ref in image.tags:
            if ref.startswith(f"{LOCAL}/{namespace}/"):
                client.images.remove(ref, noprune=False)
    registry = RegistryClient(LOCAL)
    catalog = registry.request("GET", "_catalog?n=1000").json().get("repositories") or []
    for repo in catalog:
        if repo.startswith(f"{namespace}/"):
            for tag in registry.tags(repo):
                digest = registry.manifest_digest(repo, tag)
                if digest:
                    registry.request("DELETE", f"{repo}/manifests/{digest}", ok=(202, 404), repo=repo)


@pytest.fixture(scope="session")
def namespace():
    name = f"t-build-{secrets.token_hex(4)}"
    engine.sdk()  # a missing engine fails here with the one-line hint, never a skip
    RegistryClient(LOCAL).ping()
    yield name
    _cleanup_namespace(name)


@pytest.fixture(scope="session")
def matrix():
    return load_matrix(ROOT / "matrix.yaml", ROOT / "templates")


@pytest.fixture(scope="session")
def settings(namespace):
    return Settings(registry=f"{LOCAL}/{namespace}", release_registry=f"{LOCAL}/{namespace}", base_mirror=LOCAL)


@pytest.fixture(scope="session")
def built(matrix, settings, tmp_path_factory):
    """The four real cells built (or retagged from identical local images) and pushed once."""
    revision = REVISION
    plans = [plan_cell(next(c for c in matrix.cells if c.key == key), settings, revision) for key in CELLS]
    options = BuildOptions(push=True, jobs=2, log_dir=tmp_path_factory.mktemp("build-logs"),
                           builder_key=lambda: signing.KEY, matrix=ROOT / "matrix.yaml")
    results = Builder(ROOT, matrix.source, settings, revision, options, log=print).run(plans)
    return {p.cell.key: (p, r) for p, r in zip(plans, results, strict=True)}


def _cli(args: list[str], env: dict[str, str], cwd: Path = ROOT, timeout: int = 1800):
    return subprocess.run([sys.executable, "-m", "buildtool", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=timeout)


def _registry_config(ref: str) -> tuple[str, dict]:
    host, repo, tag = split_repo(ref)
    client = RegistryClient(host)
    body, _, digest = client.get_manifest(repo, tag)
    config = json.loads(client.get_blob(repo, json.loads(body)["config"]["digest"]))
    return digest, config


@pytest.mark.parametrize("key", CELLS)
def test_cell_is_tagged_labelled_and_pushed(built, key):
    plan, result = built[key]
    assert not plan.cell.multi_platform, key
    assert result.result in ("built", "retagged"), result.message
    assert result.ref == f"{plan.dev_repo}:{names.dev_tag(REVISION, plan.cell.version)}"
    digest, config = _registry_config(result.ref)
    assert digest == result.digest  # the pushed digest is what the registry serves
    _check_labels(plan, result, plan.cell.platforms[0], config["config"]["Labels"])


def _check_labels(plan, result, platform: str, labels: dict[str, str]) -> None:
    # A rebuilt image names this commit; a retagged one keeps the commit it was built at
    # (its bytes are that build's), while its dev tag names this commit.
    if result.result in ("built", "pushed"):
        assert labels[label_keys.OCI_REVISION] == full_revision(ROOT, REVISION)
    else:
        assert re.fullmatch(names.FULL_REVISION_RE, labels[label_keys.OCI_REVISION])
    assert labels[label_keys.OCI_VERSION] == plan.cell.version
    # The base as pulled (the mirror) and the digest of its image of this platform: a pair that resolves (the
    # tag's own manifest, or this platform's entry where the tag is an index over platforms).
    assert labels[label_keys.OCI_BASE_NAME] == plan.base and labels[label_keys.BASE_UPSTREAM] == plan.cell.base
    base_digest, _ = platform_manifest(RegistryClient(LOCAL), *split_repo(plan.base)[1:], platform)
    assert labels[label_keys.OCI_BASE_DIGEST] == base_digest
    assert labels[label_keys.CONTENT_KEY] == result.content_key
    run = json.loads(labels[label_keys.RUN_PROFILE])
    assert run["docker_flags"] == plan.cell.run.docker_flags() and run["shm_size"] == plan.cell.run.shm_size
    if plan.cell.key.startswith(("pytorch-ngc", "tensorflow-ngc")):
        assert labels[label_keys.STANDIN] == "true"
        assert labels[label_keys.STANDIN_FRAMEWORK] == ("2.21.0" if plan.cell.framework == "tensorflow" else
                                                        "2.13.0+cpu")
    else:
        assert label_keys.STANDIN not in labels


@pytest.mark.parametrize(("key", "code", "expected"), [
    ("pytorch-cpu:2.13", "import torch; print(torch.__version__)", "2.13.0+cpu"),
    ("tensorflow-cpu:2.21", "import tensorflow as tf, tensorboard_plugin_profile; print(tf.__version__)", "2.21.0"),
    ("pytorch-ngc:25.01", "import os, torch; print(os.getcwd(), torch.__version__)", "/workspace 2.13.0+cpu"),
])
def test_built_image_carries_its_framework(built, key, code, expected):
    _, result = built[key]
    output = docker.from_env(timeout=300).containers.run(result.ref, ["python", "-c", code], remove=True,
                                                         network_mode="none", environment={"TF_CPP_MIN_LOG_LEVEL": "3"})
    assert output.decode().strip().splitlines()[-1] == expected


def test_second_build_is_a_noop(built, settings):
    plan, first = built["pytorch-cpu:2.13"]
    # The same builder (its key) as the first build: its provenance is kept. Another key would have to state a
    # build it did not see (the record is in the first build's log folder): that is refused, naming the record.
    env = {"REGISTRY": settings.registry, "BASE_MIRROR": LOCAL, "DL_IMAGES_BUILDER_KEY": signing.KEY.pem.decode()}
    run = _cli(["build", "-f", "pytorch-cpu:2.13", "--push", "--json", "--revision", REVISION], env)
    assert run.returncode == 0, run.stderr
    [again] = json.loads(run.stdout)["results"]
    assert again["result"] == "up to date"
    assert again["digest"] == first.digest and again["ref"] == first.ref


def test_new_commit_retags_in_the_registry_without_building_or_pulling(built, matrix, settings, tmp_path):
    plan, first = built["tensorflow-ngc:25.02"]
    new = plan_cell(plan.cell, settings, "t-newcommit")
    options = BuildOptions(push=False, jobs=1, log_dir=tmp_path)
    [result] = Builder(ROOT, matrix.source, settings, "t-newcommit", options, log=print).run([new])
    assert result.result == "retagged", result.message
    assert result.digest == first.digest
    assert RegistryClient(LOCAL).manifest_digest(*split_repo(new.dev_ref)[1:]) == first.digest
    assert engine.image_attrs(new.dev_ref) is None  # nothing was pulled into the local store
    assert not list(tmp_path.glob("*.log"))  # and nothing was built


# -- a tiny project: one good cell, one broken cell, secrets in play ---------------------------

TINY_TEMPLATE = """\
{% extends "images/pip.Dockerfile.j2" %}
{% from "parts/uv.j2" import uv_install with context %}
{% block framework %}
# Per session, so BuildKit's cache never skips the install steps that must see the secrets.
ENV T_BUILD_SESSION={{ cell.name }}
{{ uv_install("framework") }}
BROKEN
{% endblock %}
"""


class _TokenIndex(http.server.BaseHTTPRequestHandler):
    """A package index that knows no package and records the credentials it is sent."""

    seen: list[tuple[str, str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        self.send_error(404)

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass

TINY_MATRIX = """\
schema: 1
source: https://example.invalid/t-build
defaults:
  python: "3.11"
  framework: tensorflow
  accelerator: cpu
  base: docker.io/library/debian:bookworm-slim
  tests: [common, tensorflow]
  use: test fixture
  framework_version: "1.17.0"
  framework_requirements: ["six==1.17.0"]
  packages: {idna: "3.10"}
  run: {shm_size: 1g, ipc: private, ulimits: {memlock: -1}, gpus: none}
  oci: {authors: t-build, url: "https://example.invalid/t-build", vendor: t-build, licenses: "MIT OR Apache-2.0"}
images:
  - name: NAME-ok
    template: images/ok.Dockerfile.j2
    versions: [{version: "1.0", default: true}]
  - name: NAME-broken
    template: images/broken.Dockerfile.j2
    versions: [{version: "1.0", default: true}]
  - name: NAME-leaky
    template: images/leaky.Dockerfile.j2
    versions: [{version: "1.0", default: true}]
"""


@pytest.fixture(scope="session")
def tiny(namespace, tmp_path_factory):
    """Build the tiny project once, with a marked CA bundle and a token-bearing extra index."""
    root = tmp_path_factory.mktemp("tiny")
    shutil.copytree(ROOT / "templates", root / "templates")
    shutil.copytree(ROOT / "image-tests", root / "image-tests",    # the test groups its cells name
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "templates/images/ok.Dockerfile.j2").write_text(TINY_TEMPLATE.replace("BROKEN\n", ""))
    (root / "templates/images/broken.Dockerfile.j2").write_text(
        TINY_TEMPLATE.replace("BROKEN", "RUN echo 'this cell is broken on purpose' && exit 3"))
    # Negative control: a cell that copies the secrets into a layer, so the leak check is
    # shown to find what it looks for.
    (root / "templates/images/leaky.Dockerfile.j2").write_text(TINY_TEMPLATE.replace(
        "BROKEN", "RUN --mount=type=secret,id=pip.conf --mount=type=secret,id=pip-ca "
                  "cat /run/secrets/pip.conf /run/secrets/pip-ca > /leaked.txt"))
    (root / "matrix.yaml").write_text(TINY_MATRIX.replace("NAME", namespace))
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-qm", "fixture"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, timeout=30)
    assert _cli(["render", "--matrix", str(root / "matrix.yaml")], {}, cwd=root).returncode == 0
    # The apt locks are resolved inside the base, which only the local mirror holds here.
    locked = _cli(["lock", "--matrix", str(root / "matrix.yaml")], {"BASE_MIRROR": LOCAL}, cwd=root, timeout=600)
    assert locked.returncode == 0, locked.stderr
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True, timeout=30)
    subprocess.run(["git", "-C", str(root), "-c", "user.email=t@example.org", "-c", "user.name=t", "commit",
                    "-qm", "render"], check=True, capture_output=True, timeout=30)

    token = f"tok-{secrets.token_hex(12)}"
    marker = f"t-build-ca-marker-{secrets.token_hex(12)}"
    host = HostPip.from_host()
    ca_source = Path(host.cert) if host.cert and Path(host.cert).is_file() \
        else Path("/etc/ssl/certs/ca-certificates.crt")
    ca = root.parent / "ca-bundle.pem"
    ca.write_text(ca_source.read_text() + f"\n# {marker}\n")
    index = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _TokenIndex)
    threading.Thread(target=index.serve_forever, daemon=True).start()
    extra = " ".join((*host.extra_index_urls, f"http://t-user:{token}@127.0.0.1:{index.server_address[1]}/simple"))
    env = {"REGISTRY": f"{LOCAL}/{namespace}", "BASE_MIRROR": LOCAL, "PIP_CERT": str(ca),
           "PIP_EXTRA_INDEX_URL": extra}
    log_dir = root.parent / "tiny-logs"
    try:
        run = _cli(["build", "-f", "all", "--push", "--json", "--no-fill-bases", "--log-dir", str(log_dir),
                    "--matrix", str(root / "matrix.yaml")], env, cwd=root)
    finally:
        index.shutdown()
        index.server_close()
    results = {r["cell"]: r for r in json.loads(run.stdout)["results"]} if run.stdout.strip() else {}
    return {"run": run, "results": results, "token": token, "marker": marker, "root": root, "log_dir": log_dir,
            "namespace": namespace, "index_saw": list(_TokenIndex.seen)}


def test_failing_cell_leaves_others_built_and_no_dev_tag(tiny):
    run, results, ns = tiny["run"], tiny["results"], tiny["namespace"]
    assert run.returncode == 1, run.stderr
    ok, broken = results[f"{ns}-ok:1.0"], results[f"{ns}-broken:1.0"]
    assert ok["result"] == "built", ok["message"]
    assert broken["result"] == "failed"
    # BuildKit's own line names the failing command and its exit status.
    assert "exit code: 3" in broken["message"] and "broken on purpose" in broken["message"], broken["message"]
    assert "broken on purpose" in Path(broken["log"]).read_text()
    revision = git_revision(tiny["root"])
    tag = names.dev_tag(revision, "1.0")
    broken_repo, ok_repo = names.dev_repo(ns, f"{ns}-broken"), names.dev_repo(ns, f"{ns}-ok")
    assert engine.image_attrs(f"{LOCAL}/{broken_repo}:{tag}") is None
    assert RegistryClient(LOCAL).manifest_digest(broken_repo, tag) is None
    assert RegistryClient(LOCAL).manifest_digest(ok_repo, tag) == ok["digest"]
    assert "1 of 3 cells failed" in run.stderr
    # Progress in a log (stderr is not a terminal): one line per change of each cell's state.
    for state in ("queued", "checking: content key and existing images", "building: starting BuildKit", "built"):
        assert re.search(rf"^\[{ns}-ok:1\.0\] +\d+s {re.escape(state)}", run.stderr, re.M), (state, run.stderr)
    assert re.search(rf"^\[{ns}-broken:1\.0\] +\d+s failed: .*exit code: 3", run.stderr, re.M), run.stderr


def test_labels_name_the_full_commit_a_base_pair_that_resolves_and_the_matrix_oci_keys(tiny):
    """Read from the pushed image's config: the revision is the whole commit, base.name is the mirror's
    reference the build pulled and base.digest what the registry serves for that name (asked with skopeo,
    a client this project did not write: the manifest itself, or its linux/amd64 entry when the name is an
    index over platforms), and the `oci:` values of the matrix are there."""
    ns = tiny["namespace"]
    ok = tiny["results"][f"{ns}-ok:1.0"]
    assert ok["result"] == "built", ok["message"]
    _, config = _registry_config(ok["ref"])
    labels = config["config"]["Labels"]
    head = subprocess.run(["git", "-C", str(tiny["root"]), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()
    assert labels[label_keys.OCI_REVISION] == head and len(head) == 40
    assert labels[label_keys.OCI_BASE_NAME] == f"{LOCAL}/library/debian:bookworm-slim"
    assert labels[label_keys.BASE_UPSTREAM] == "docker.io/library/debian:bookworm-slim"
    inspected = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw",
                                f"docker://{labels[label_keys.OCI_BASE_NAME]}"], capture_output=True, timeout=120)
    assert inspected.returncode == 0, inspected.stderr
    served = json.loads(inspected.stdout)
    if "manifests" in served:     # an index: the build pinned its linux/amd64 image, by that entry's digest
        [entry] = [m for m in served["manifests"]
                   if (m["platform"]["os"], m["platform"]["architecture"]) == ("linux", "amd64")]
        base = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw",
                               f"docker://{labels[label_keys.OCI_BASE_NAME].rsplit(':', 1)[0]}@{entry['digest']}"],
                              capture_output=True, timeout=120)
        assert base.returncode == 0, base.stderr
        inspected = base
    assert labels[label_keys.OCI_BASE_DIGEST] == "sha256:" + hashlib.sha256(inspected.stdout).hexdigest()
    assert {k: labels.get(k) for k in label_keys.OCI_FROM_MATRIX.values()} == {
        label_keys.OCI_AUTHORS: "t-build", label_keys.OCI_URL: "https://example.invalid/t-build",
        label_keys.OCI_DOCUMENTATION: None, label_keys.OCI_VENDOR: "t-build",
        label_keys.OCI_LICENSES: "MIT OR Apache-2.0"}


def _traces(ref: str, needles: list[bytes], extra: dict[str, bytes]) -> list[str]:
    """Where any needle occurs: the given texts, `docker history --no-trunc`, labels, and every
    file of every layer of `docker save`."""
    found = []
    history = docker_cli.docker("history", "--no-trunc", ref, timeout=120, check=True).stdout.encode()
    texts = {**extra, "history": history, "labels": json.dumps(engine.image_labels(ref)).encode()}
    found += [f"{name}" for name, blob in texts.items() for needle in needles if needle in blob]
    saved = io.BytesIO()
    for chunk in docker.from_env(timeout=300).images.get(ref).save(named=True):
        saved.write(chunk)
    saved.seek(0)
    with tarfile.open(fileobj=saved) as outer:
        for member in outer.getmembers():
            if not member.isfile():
                continue
            data = outer.extractfile(member).read()  # type: ignore[union-attr]
            found += [member.name for needle in needles if needle in data]
            if not member.name.endswith("layer.tar"):
                continue
            with tarfile.open(fileobj=io.BytesIO(data)) as layer:
                for item in layer.getmembers():
                    if item.isfile():
                        content = layer.extractfile(item).read()  # type: ignore[union-attr]
                        found += [f"{member.name}:{item.name}" for needle in needles if needle in content]
    return found


def test_ca_bundle_and_index_token_leave_no_trace(tiny):
    ns = tiny["namespace"]
    ok, leaky = tiny["results"][f"{ns}-ok:1.0"], tiny["results"][f"{ns}-leaky:1.0"]
    needles = [tiny["token"].encode(), tiny["marker"].encode()]
    log = Path(ok["log"]).read_bytes()
    # The token really reached the installers inside the build: a package page was asked with it
    # (buildtool's own reachability probe only sends HEAD /simple) ...
    sent = "Basic " + base64.b64encode(f"t-user:{tiny['token']}".encode()).decode()
    pages = [(path, auth) for method, path, auth in tiny["index_saw"]
             if method == "GET" and path.startswith("/simple/")]
    assert any(auth == sent for _, auth in pages), tiny["index_saw"][:5]
    # ... and is nowhere: not in the log, the CLI's output, history, labels or any layer.
    outputs = (tiny["run"].stdout + tiny["run"].stderr).encode()
    assert _traces(ok["ref"], needles, {"log": log, "cli output": outputs}) == []
    # The same check finds both secrets in the image that wrote them into a layer.
    leaked = _traces(leaky["ref"], needles, {})
    assert any(t.endswith(":leaked.txt") for t in leaked), leaked
    assert len(leaked) >= 2, leaked
