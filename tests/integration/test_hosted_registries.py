"""The commands users run (release, verify, sbom, diff, report --fetch, build --push) against the local registry
made to behave like a hosted one in one respect at a time (tests/hosted_registry.py, tests/referrers_api.py),
issue 53: tag lists paged by 20 with `Link` (Docker Hub, GHCR, ECR, Quay); cross-repository mounts declined with
an upload session (ECR, GHCR across owners); referrers endpoints that answer neither 404 nor an index (Harbor 2.7,
GHCR, a 5xx page); a registry that indexes subjects without saying `OCI-Subject`; an HTTPS blob host that resets
connections part way through blobs; a repository that is not found or not yours (401 insufficient_scope, as
Docker Hub answers); 429 with and without Retry-After.

Images are test_release's small synthetic ones with signed SBOMs, provenance and verdicts, so release and verify
judge real evidence; every command that reads blobs through the resetting host is a subprocess, so a traceback
would be seen as users see it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from buildtool.attest.referrers import referrers
from buildtool.contracts.names import ATTESTATION_TYPE, PROVENANCE_TYPE, SBOM_ATTESTATION_TYPE, referrers_tag
from buildtool.imagebuild.engine import BuildRequest
from buildtool.registry.client import OCI_INDEX, RegistryClient
from tests import signing
from tests.hosted_registry import BlobHost, HostedRegistry
from tests.integration.test_release import CPU, HOST, TF_CPU, Space, commit_image_tests, git, trust
from tests.referrers_api import ReferrersApi

pytestmark = [pytest.mark.integration, pytest.mark.registry]

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Project:
    """A fixture project whose commit `first` has dev images of pytorch-cpu (and tensorflow-cpu) in the local
    registry under `space.prefix`, with the SBOM, provenance and verdict release trusts."""

    root: Path
    space: Space
    first: str
    cpu: str
    tf: str
    code: str

    @property
    def matrix(self) -> str:
        return str(self.root / "matrix.yaml")

    def release_direct(self, version: str, revision: str | None = None) -> None:
        """A release written straight into the registry (not through the proxy under test)."""
        from functools import partial

        from buildtool.release.ancestry import source_problems

        known = signing.known_code(self.code, matrix=signing.committed_matrix(self.root))
        report = self.space.release([CPU], revision or self.first, version, known_code=known,
                                    source_check=partial(source_problems, self.root))
        assert report.ok, [i.problems for i in report.images]


def _project(project: Path, monkeypatch: pytest.MonkeyPatch, with_tf: bool = False, via: str = "") -> Project:
    """`via`: the images and their artifacts are pushed through the registry at that address."""
    space = Space(project)
    if via:
        space.client = RegistryClient(via, retry=space.client.retry)
    trust(project)
    code = commit_image_tests(project)
    monkeypatch.delenv("RELEASE_REGISTRY", raising=False)
    monkeypatch.chdir(project)
    first = git(project, "rev-parse", "--short=12", "HEAD")
    cpu = space.build(CPU, first, verdict_changes={"test_code": code})
    tf = space.build(TF_CPU, first, verdict_changes={"test_code": code}) if with_tf else ""
    return Project(project, space, first, cpu, tf, code)


def point_at(monkeypatch: pytest.MonkeyPatch, address: str, space: Space) -> None:
    """REGISTRY and RELEASE_REGISTRY as Space has them (dev images under the prefix, releases under rel/), on
    the registry at `address`."""
    monkeypatch.setenv("REGISTRY", f"{address}/{space.prefix}")
    monkeypatch.setenv("RELEASE_REGISTRY", f"{address}/{space.prefix}/rel")


def cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m buildtool ARGS` as users run it: a traceback would be on its stderr."""
    return subprocess.run([sys.executable, "-m", "buildtool", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=300)


def no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]


def keys(folder: Path) -> Path:
    """config/trusted-keys.yaml in `folder` (where sbom and diff read it; verify is given it), trusting the test key
    as builder and tester."""
    from buildtool.attest.keys import trusted_entry

    path = folder / "config/trusted-keys.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("keys:\n" + trusted_entry("ci", signing.KEY.public(), ("builder", "tester")))
    return path


def fillers(client: RegistryClient, repo: str, digest: str, names: list[str]) -> None:
    """More tags on an image already in `repo`: what pushes the tags that matter to a later page."""
    raw, media_type, _ = client.get_manifest(repo, digest)
    for name in names:
        client.put_manifest(repo, name, raw, media_type)


# -- tag lists paged by 20 -------------------------------------------------------------------------

def test_release_on_a_registry_paging_tags_by_20_keeps_moving_tags_and_refuses_a_second_spelling(
        project: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """2.0.0 (a second commit) holds 2.13 and latest; 1.0.0 exists; 20 tags of older cells (2.12-...) sort before
    them, so all of them are on the second page. Through the proxy: the dry run of 1.5.0 plans to keep 2.13 and
    latest on 2.0.0, the release writes only 2.13-1.5.0, and --version 1.0 is refused as a second spelling of
    1.0.0 (the first page alone: 2.13/latest planned as new, then "changed during the release"; 1.0 written)."""
    p = _project(project, monkeypatch)
    (project / "CHANGE").write_text("x")
    git(project, "add", "CHANGE")
    git(project, "commit", "-qm", "change")
    second = git(project, "rev-parse", "--short=12", "HEAD")
    cpu2 = p.space.build(CPU, second, payload_size=128 * 1024, verdict_changes={"test_code": p.code})
    p.release_direct("1.0.0")
    p.release_direct("2.0.0", second)
    rel = p.space.rel_repo(CPU)
    fillers(p.space.client, rel, p.cpu, [f"2.12-0.0.{n}" for n in range(20)])
    with HostedRegistry(tag_page=20) as proxy:
        point_at(monkeypatch, proxy.address, p.space)
        first_page = RegistryClient(proxy.address).request("GET", f"{rel}/tags/list").json()["tags"]
        assert len(first_page) == 20 and "2.13" not in first_page and "latest" not in first_page

        code, out, err = run_cli("release", "--version", "1.5.0", "--from", p.first, "-f", "pytorch-cpu", "--dry-run",
                                 "--json", "--matrix", p.matrix)
        assert code == 0, (out, err)
        [planned] = json.loads(out)["release"]["images"]
        assert planned["tags"] == ["2.13-1.5.0"]
        assert {k["tag"]: k["note"] for k in planned["not_moved"]} == {
            "2.13": "stays on release 2.0.0 (newer); --force moves it back",
            "latest": "stays on release 2.0.0 (newer); --force moves it back"}

        code, out, err = run_cli("release", "--version", "1.5.0", "--from", p.first, "-f", "pytorch-cpu",
                                 "--matrix", p.matrix)
        assert code == 0, (out, err)
        direct = p.space.client
        assert direct.manifest_digest(rel, "2.13-1.5.0") == p.cpu
        assert direct.manifest_digest(rel, "2.13") == direct.manifest_digest(rel, "latest") == cpu2

        code, out, err = run_cli("release", "--version", "1.0", "--from", p.first, "-f", "pytorch-cpu", "--json",
                                 "--matrix", p.matrix)
        assert code == 1, (out, err)
        [problem] = json.loads(out)["status"][CPU.key]["problems"]
        assert problem.startswith(f"release 1.0 of {CPU.key} already exists as {proxy.address}/{rel}:2.13-1.0.0 "
                                  "(the same PEP 440 version, spelt otherwise)"), problem
        assert direct.manifest_digest(rel, "2.13-1.0") is None
        # Every page was read, each from the Link of the one before.
        assert proxy.requests(rf"GET /v2/{rel}/tags/list\?last=2\.12-0\.0\.9&n=20")


def test_verify_sees_a_verdict_pin_tag_on_any_page(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    """A released image's newer failed verdict, dropped from the `sha256-<hex>` index by someone who may push,
    is still found by its pin tag; 25 more tags put that tag on the second page of a registry paging by 20.
    verify through the paging proxy says what verify of the registry itself says: not verified."""
    p = _project(project, monkeypatch)
    p.release_direct("0.1.0")
    rel, client = p.space.rel_repo(CPU), p.space.client
    before, _, _ = client.get_manifest(rel, referrers_tag(p.cpu))
    failed = signing.attest(client, rel, p.cpu, signing.verdict(CPU, p.cpu, "failed",
                                                                started="2026-02-01T00:00:00.000+00:00"))
    client.put_manifest(rel, referrers_tag(p.cpu), before, OCI_INDEX)      # the verdict and its bundle dropped
    fillers(client, rel, p.cpu, [f"0-build-{n:02d}" for n in range(25)])
    ordered = sorted(client.tags(rel))
    [pin] = [t for t in ordered if t.startswith(referrers_tag(p.cpu) + ".v-") and t.endswith(failed.digest[7:39])]
    assert ordered.index(pin) >= 20, ordered          # not on the first page
    trusted = keys(tmp_path / "keys")
    unpaged = cli("verify", f"{HOST}/{rel}:2.13-0.1.0", "--keys", str(trusted), cwd=tmp_path)
    assert unpaged.returncode == 1 and "result  verified" not in unpaged.stdout, unpaged.stdout + unpaged.stderr
    with HostedRegistry(tag_page=20) as proxy:
        paged = cli("verify", f"{proxy.address}/{rel}:2.13-0.1.0", "--keys", str(trusted), cwd=tmp_path)
        later_pages = proxy.requests(r"GET .*/tags/list\?last=")
    assert paged.returncode == 1, paged.stdout + paged.stderr
    result = [ln for ln in paged.stdout.splitlines() if ln.startswith("result")]
    assert result == [ln for ln in unpaged.stdout.splitlines() if ln.startswith("result")], paged.stdout
    assert paged.stderr.strip() == unpaged.stderr.strip() == f"failed: the verdict of {p.cpu} is 'failed'", paged.stderr
    assert later_pages            # the pin tag came from a page after the first
    no_traceback(paged)


# -- cross-repository mounts declined --------------------------------------------------------------

def test_a_release_into_a_registry_that_declines_mounts_completes_and_the_dry_run_says_so(
        project: Path, run_cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # noqa: ANN001
    """ECR and GHCR (across owners) answer a mount 202 with an upload session: release uploads each blob into it
    (read from the dev repository) instead of failing "registry declined to mount ... re-run", which no re-run
    cures. The release repository is in another namespace, so the dry run says the blobs may be uploaded."""
    p = _project(project, monkeypatch)
    other = f"{p.space.prefix}-published"
    with HostedRegistry(decline_mounts=True) as proxy:
        monkeypatch.setenv("REGISTRY", f"{proxy.address}/{p.space.prefix}")
        monkeypatch.setenv("RELEASE_REGISTRY", f"{proxy.address}/{other}")
        code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu", "--dry-run", "--json",
                                 "--matrix", p.matrix)
        assert code == 0, (out, err)
        [note] = json.loads(out)["status"][CPU.key]["transfer"]
        assert note.startswith(f"the release repository is in another namespace ({p.space.prefix} -> {other}): "
                               "where the registry declines to mount"), note
        assert "uploaded through this machine" in note
        assert not proxy.requests("^POST ")                    # a dry run: nothing written, not even a mount

        code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu", "--json",
                                 "--matrix", p.matrix)
        assert code == 0, (out, err)
        status = json.loads(out)["status"][CPU.key]
        assert status["status"] == "promoted", status
        [uploaded] = status["transfer"]
        assert uploaded.startswith(f"the registry declined to mount 2 blob(s) from {p.space.prefix}/pytorch-cpu-dev: "
                                   "uploaded "), uploaded
        declined = proxy.requests(r"^POST .*\?mount=")
        assert declined and all(status == 202 for _, _, status in declined)
        verified = cli("verify", f"{proxy.address}/{other}/pytorch-cpu:2.13-0.1.0", "--keys", str(keys(tmp_path)),
                       cwd=tmp_path)
    direct = p.space.client
    released = f"{other}/pytorch-cpu"
    assert direct.manifest_digest(released, "2.13-0.1.0") == direct.manifest_digest(released, "latest") == p.cpu
    manifest = json.loads(direct.get_manifest(released, p.cpu)[0])
    assert all(direct.has_blob(released, b["digest"]) for b in [manifest["config"], *manifest["layers"]])
    assert verified.returncode == 0 and "result  verified" in verified.stdout, verified.stdout + verified.stderr


# -- referrers endpoints that answer neither 404 nor an index --------------------------------------

@pytest.mark.parametrize("behaviour", ["harbor-401", "ghcr-303", "html-500"])
def test_a_referrers_endpoint_answering_no_index_is_no_referrers_api(
        project: Path, run_cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, behaviour: str) -> None:  # noqa: ANN001
    """Harbor 2.7 answers the referrers API 401 without a challenge (pulls work), GHCR a 303 to a web page that
    answers 429, others an HTML 5xx page: each means "no referrers API here". release, verify and sbom read the
    `sha256-<hex>` index instead, and release writes it in the release repository (no OCI-Subject came back)."""
    p = _project(project, monkeypatch)
    with HostedRegistry(referrers=behaviour) as proxy:
        point_at(monkeypatch, proxy.address, p.space)
        code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu", "--matrix", p.matrix)
        assert code == 0, (out, err)
        released = f"{proxy.address}/{p.space.rel_repo(CPU)}:2.13-0.1.0"
        verified = cli("verify", released, "--keys", str(keys(tmp_path)), cwd=tmp_path)
        sbom = cli("sbom", released, cwd=tmp_path)
        asked = proxy.requests("GET .*/referrers/")
    assert verified.returncode == 0 and "result  verified" in verified.stdout, verified.stdout + verified.stderr
    assert sbom.returncode == 0 and "components" in sbom.stdout.lower(), sbom.stdout + sbom.stderr
    assert asked and all(status != 200 for _, _, status in asked)
    listed = referrers(p.space.client, p.space.rel_repo(CPU), p.cpu, SBOM_ATTESTATION_TYPE)
    assert listed, "release wrote no fallback index in the release repository"


def test_a_registry_that_indexes_subjects_without_saying_so_gets_the_fallback_tag(
        project: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """A registry with the referrers API that answers a manifest PUT with a `subject` without `OCI-Subject`: the
    spec asks the client to write the `sha256-<hex>` index then. Beside it, one that says OCI-Subject gets none."""
    with ReferrersApi(HOST, subject_header=False) as quiet:
        p = _project(project, monkeypatch, via=quiet.address)     # its API lists what is pushed through it
        point_at(monkeypatch, quiet.address, p.space)
        code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu", "--json", "--matrix", p.matrix)
        assert code == 0, (json.loads(out)["status"], err)
    direct = RegistryClient(HOST)
    raw, _, _ = direct.get_manifest(p.space.rel_repo(CPU), referrers_tag(p.cpu))
    listed = {d["artifactType"] for d in json.loads(raw)["manifests"]}
    assert {ATTESTATION_TYPE, SBOM_ATTESTATION_TYPE, PROVENANCE_TYPE} <= listed, listed

    with ReferrersApi(HOST) as says:
        other = Space(project)
        other.client = RegistryClient(says.address, retry=other.client.retry)
        other_cpu = other.build(CPU, p.first, verdict_changes={"test_code": p.code})
        point_at(monkeypatch, says.address, other)
        code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu", "--json", "--matrix", p.matrix)
        assert code == 0, (json.loads(out)["status"], err)
    assert direct.manifest_digest(other.rel_repo(CPU), referrers_tag(other_cpu)) is None
    assert direct.manifest_digest(other.dev_repo(CPU), referrers_tag(other_cpu)) is None


# -- connection resets on an HTTPS blob host -------------------------------------------------------

def test_every_command_survives_resets_on_an_https_blob_host(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    """Blob GETs redirect to an HTTPS host whose first two answers per blob stop half way with a reset. release,
    verify, sbom, diff and report --fetch resume each blob from where it stopped (Range) and succeed, with no
    traceback; the Authorization header never reaches the blob host. Over plain HTTP this always worked; over
    HTTPS it ended in requests' ChunkedEncodingError."""
    p = _project(project, monkeypatch, with_tf=True)
    with BlobHost(tmp_path / "blob-host", cut=2) as blobs, HostedRegistry(blob_host=blobs) as proxy:
        env = {"DL_IMAGES_CERTS_D": str(blobs.certs_d), "REGISTRY": f"{proxy.address}/{p.space.prefix}",
               "RELEASE_REGISTRY": f"{proxy.address}/{p.space.prefix}/rel"}
        runs = {"release": cli("release", "--version", "0.1.0", "-f", "pytorch-cpu,tensorflow-cpu",
                               "--matrix", p.matrix, cwd=project, **env)}
        released = f"{proxy.address}/{p.space.rel_repo(CPU)}:2.13-0.1.0"
        runs["verify"] = cli("verify", released, "--keys", str(keys(tmp_path)), cwd=tmp_path, **env)
        runs["sbom"] = cli("sbom", released, cwd=tmp_path, **env)
        dev = f"{proxy.address}/{p.space.dev_repo(CPU)}@{p.cpu}"
        runs["diff"] = cli("diff", dev, f"{proxy.address}/{p.space.dev_repo(TF_CPU)}@{p.tf}", cwd=tmp_path, **env)
        runs["report"] = cli("report", "--fetch", "-f", "pytorch-cpu", "--revision", p.first, "--verdicts",
                             str(tmp_path / "verdicts"), "--out", str(tmp_path / "report"), "--matrix", p.matrix,
                             cwd=project, **env)
        # validate's own registry read before its tests run (the command then needs the engine to run image-tests
        # in the image, which these synthetic images cannot): the signed SBOM its verdict will name.
        from buildtool.validate.containers import Resolved
        from buildtool.validate.sbomref import verdict_sbom

        monkeypatch.setenv("DL_IMAGES_CERTS_D", str(blobs.certs_d))
        image = Resolved(dev, dev, p.cpu, proxy.address, p.space.dev_repo(CPU), {})
        named, problem = verdict_sbom(image, keys(tmp_path).parent.parent, print)
        cuts, seen = blobs.cuts(), list(blobs.seen)
    assert problem == "" and named.startswith("sha256:"), problem
    for name, done in runs.items():
        assert done.returncode == 0, (name, done.stdout[-2000:], done.stderr[-3000:])
        no_traceback(done)
    assert "result  verified" in runs["verify"].stdout
    assert "1 image, 0 failed" in runs["report"].stdout, runs["report"].stdout   # one cell: the singular
    assert len(cuts) >= 10, cuts
    # Resumed from where each read stopped, not read again from the start.
    resumed = [asked for _, asked, cut in seen if asked.startswith("bytes=") and asked != "bytes=0-"]
    assert resumed, seen
    assert not blobs.authorization_seen


def test_a_blob_host_that_always_resets_is_one_line_and_exit_1(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    """A host that resets every answer before its first byte: the bounded retries end in one line naming why."""
    p = _project(project, monkeypatch)
    keys(tmp_path)
    with BlobHost(tmp_path / "blob-host", cut=1000, cut_at=0.0) as blobs, HostedRegistry(blob_host=blobs) as proxy:
        done = cli("sbom", f"{proxy.address}/{p.space.dev_repo(CPU)}@{p.cpu}", cwd=tmp_path,
                   DL_IMAGES_CERTS_D=str(blobs.certs_d))
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("failed: ") and "the connection broke part way through the answer" in last, last
    no_traceback(done)


# -- a repository that is not found or not yours; rate limits ---------------------------------------

def test_insufficient_scope_on_a_repository_says_not_found_or_not_yours(tmp_path: Path) -> None:
    """Docker Hub answers a repository that does not exist, or that is private and not the caller's, with 401
    insufficient_scope to an anonymous token: the message names both, not only `docker login`."""
    with HostedRegistry(hidden={"team/secret"}) as proxy:
        done = cli("sbom", f"{proxy.address}/team/secret:latest", cwd=tmp_path, DOCKER_CONFIG=str(tmp_path / "none"))
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert "team/secret is not found or not yours" in line and "insufficient_scope" in line, line
    assert f"docker login {proxy.address}" in line
    no_traceback(done)


@pytest.mark.parametrize("retry_after", ["", "3600"])
def test_429_says_rate_limited_by_the_host_in_its_own_words(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path, retry_after: str) -> None:
    p = _project(project, monkeypatch)
    with HostedRegistry(rate_limit=r"^GET /v2/.*/manifests/", rate_limit_retry_after=retry_after) as proxy:
        done = cli("sbom", f"{proxy.address}/{p.space.dev_repo(CPU)}@{p.cpu}", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("failed:")]
    assert line.startswith(f"failed: rate limited by {proxy.address}: TOOMANYREQUESTS: You have reached your "
                           "unauthenticated pull rate limit. https://www.docker.com/increase-rate-limit"), line
    assert ("Retry-After 3600 s, longer than the 60 s this command waits" in line) == bool(retry_after), line
    no_traceback(done)


# -- build --push, twice --------------------------------------------------------------------------

class EngineStandIn:
    """`build --push` with the engine and BuildKit stood in (as tests/test_push_order.py does): the build is an
    image id with the build's labels, the engine's upload a one-layer image with those labels written straight
    into the local registry (the engine talks to the registry, not through the toolkit's client). Everything
    else (the dev repository's tags, the content-key lookup, attaching, the dev tag) is the command's own,
    through the registry under test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from buildtool.imagebuild import builder as builder_mod
        from buildtool.imagebuild import engine
        from buildtool.imagebuild.builder import BaseInfo, Builder
        from buildtool.imagebuild.pipconfig import HostPip

        self.local: dict[str, str] = {}
        self.labels: dict[str, dict[str, str]] = {}
        self.uploads: list[str] = []
        base = BaseInfo(ref="127.0.0.1:5000/library/debian:bookworm-slim", digest="sha256:" + "b" * 64)
        for name, stand_in in {"sdk": lambda: None, "build": self.build, "tag": self.tag, "untag": self.untag,
                               "image_attrs": self.attrs, "find_by_label": lambda key, value: [],
                               "image_labels": lambda ref: ((self.attrs(ref) or {}).get("Config") or {}).get(
                                   "Labels")}.items():
            monkeypatch.setattr(engine, name, stand_in)
        monkeypatch.setattr("buildtool.imagebuild.publishing.push_verified", lambda ref, log, via="": self.push(ref))
        monkeypatch.setattr(builder_mod, "resolve_base", lambda plan, platform=None: base)
        monkeypatch.setattr(builder_mod, "scrub_log", lambda path, secrets: None)
        monkeypatch.setattr(builder_mod, "secret_strings", lambda host: [])
        monkeypatch.setattr(Builder, "_build_env", lambda self: (
            None, type("S", (), {"files": {}, "uv_config": lambda self, urls: Path("/dev/null")})(), HostPip()))
        monkeypatch.setattr(Builder, "_ensure_sbom", lambda self, plan, ref, digest, platform: self_attach(
            self, plan, digest, "sbom"))
        monkeypatch.setattr(Builder, "_ensure_provenance", lambda self, plan, ref, digest, began, finished: self_attach(
            self, plan, digest, "provenance"))

    def build(self, client: object, request: BuildRequest) -> str:
        request.log_path.parent.mkdir(parents=True, exist_ok=True)
        request.log_path.write_text("#1 [1/1] FROM base\n")
        self.labels["image-1"] = dict(request.labels)
        return "image-1"

    def tag(self, image: str, ref: str) -> None:
        self.local[ref] = self.local.get(image, image)

    def untag(self, ref: str) -> None:
        self.local.pop(ref, None)

    def attrs(self, ref: str) -> dict[str, object] | None:
        image = self.local.get(ref)
        return None if image is None else {"Id": image, "Size": 1, "Config": {"Labels": self.labels[image]}}

    def push(self, ref: str) -> str:
        from buildtool.common.refs import split_repo
        from tests.integration.test_release import push_single

        _, repo, tag = split_repo(ref)
        self.uploads.append(tag)
        return push_single(RegistryClient(HOST), repo, tag, self.labels[self.local[ref]], 4096)[0]


def self_attach(builder: object, plan: object, digest: str, kind: str) -> str:
    from buildtool.attest.referrers import Payload, attach
    from buildtool.common.refs import split_repo

    _, repo, _ = split_repo(plan.dev_ref)  # type: ignore[attr-defined]
    payload = Payload("application/json", json.dumps({"kind": kind}).encode())
    return attach(builder.registry, repo, digest, SBOM_ATTESTATION_TYPE, [payload]).digest  # type: ignore[attr-defined]


@pytest.mark.parametrize("hosted", ["tags paged by 20", "resets on an https blob host"])
def test_a_second_build_push_says_up_to_date(run_cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,  # noqa: ANN001
                                             hosted: str) -> None:
    """`build --push -f pytorch-cpu` twice: the second finds its dev tag by the content key and says "up to date".
    Paged by 20 with 25 older commits' dev tags before it, the dev tag is on the second page (the first page alone:
    "pushed" again); with the blob host resetting every first answer, reading the dev images' configs resumes
    (before: a ChunkedEncodingError, the cell "failed")."""
    from buildtool.common.refs import split_repo
    from buildtool.contracts import label_keys, names
    from tests.integration.test_release import labels_for, push_single

    stand_in = EngineStandIn(monkeypatch)
    prefix = f"t-push-{os.urandom(5).hex()}"
    revision = git(ROOT, "rev-parse", "--short=12", "HEAD")
    key = tmp_path / "builder.key"
    key.write_bytes(signing.KEY.pem)
    key.chmod(0o600)
    monkeypatch.setenv("DL_IMAGES_BUILDER_KEY", str(key))
    for name in ("BASE_MIRROR", "RELEASE_REGISTRY", "REVISION"):
        monkeypatch.delenv(name, raising=False)
    repo = f"{prefix}/pytorch-cpu-dev"
    blobs = BlobHost(tmp_path / "blob-host", cut=1) if hosted.startswith("resets") else None
    if blobs is None:     # 25 earlier commits' dev images (another content key) sort before this commit's tag
        older = push_single(RegistryClient(HOST), repo, None, labels_for(CPU, **{label_keys.CONTENT_KEY: "x"}))
        fillers(RegistryClient(HOST), repo, older[0], [names.dev_tag(f"{n:012x}", CPU.version) for n in range(25)])
    with contextlib.ExitStack() as stack:
        if blobs is not None:
            stack.enter_context(blobs)
            monkeypatch.setenv("DL_IMAGES_CERTS_D", str(blobs.certs_d))
        proxy = stack.enter_context(HostedRegistry(tag_page=20 if blobs is None else 0, blob_host=blobs))
        monkeypatch.setenv("REGISTRY", f"{proxy.address}/{prefix}")
        results = []
        for _ in range(2):
            code, out, err = run_cli("build", "--push", "-f", "pytorch-cpu", "--push-with", "engine", "--json",
                                     "--no-registry-cache", "--revision", revision, "--log-dir", str(tmp_path / "logs"),
                                     "--matrix", str(ROOT / "matrix.yaml"))
            assert code == 0, (out[-2000:], err[-3000:])
            [result] = json.loads(out)["results"]
            results.append(result)
    first, second = results
    assert first["result"] == "built" and second["result"] == "up to date", (first, second)
    assert second["digest"] == first["digest"] and len(stand_in.uploads) == 1
    dev_tag = split_repo(first["ref"])[2]
    assert RegistryClient(HOST).manifest_digest(repo, dev_tag) == first["digest"]
    if blobs is not None:
        assert blobs.cuts() and not blobs.authorization_seen
