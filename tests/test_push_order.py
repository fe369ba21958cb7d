"""`build --push` of a single-platform cell (pytorch-cpu in the real matrix) against an in-memory registry, with
BuildKit, the engine and the upload stood in for: the image goes up under its staging tag (`<dev tag>__push`),
the SBOM and provenance are attached to its digest, and only then is the dev tag written, naming the same
digest. A registry that refuses the attestations leaves no dev tag at all (issue 36)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from buildtool.attest import referrers
from buildtool.common.refs import split_repo
from buildtool.contracts import names
from buildtool.contracts.names import SBOM_TYPE
from buildtool.imagebuild import builder as builder_mod
from buildtool.imagebuild import engine
from buildtool.imagebuild.builder import BaseInfo, Builder, BuildOptions, CellResult
from buildtool.imagebuild.pipconfig import HostPip
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.plan import CellPlan, Settings, git_revision, plan_cell
from buildtool.registry.client import RegistryError
from tests import signing
from tests.conftest import REPO
from tests.memregistry import MemRegistry

HOST = "127.0.0.1:5999"
BASE = BaseInfo(ref="127.0.0.1:5000/library/debian:bookworm-slim", digest="sha256:" + "b" * 64)
REFUSED = "HTTP 403 DENIED: requested access to the resource is denied"


class RefusingRegistry(MemRegistry):
    """Takes images, refuses every artifact that names a subject (a referrer), as a registry whose policy
    forbids them would."""

    refuse = True

    def put_manifest(self, repo: str, ref: str, body: bytes, media_type: str) -> str:
        if self.refuse and "subject" in json.loads(body):
            raise RegistryError(f"PUT https://{self.host}/v2/{repo}/manifests/{ref}: {REFUSED}")
        return super().put_manifest(repo, ref, body, media_type)


class Fakes:
    """The engine's store (tags -> image), BuildKit (an image id with the build's labels) and the upload
    (a one-layer image with those labels, under the tag the upload was given)."""

    def __init__(self, registry: MemRegistry) -> None:
        self.registry = registry
        self.local: dict[str, str] = {}            # ref -> image id
        self.labels: dict[str, dict[str, str]] = {}
        self.uploaded: list[str] = []
        self.attached_while: list[list[str]] = []   # the dev repository's tags when each attestation went up

    def build(self, client: Any, request: engine.BuildRequest) -> str:
        request.log_path.parent.mkdir(parents=True, exist_ok=True)
        request.log_path.write_text("#1 [1/1] FROM base\n")
        self.labels["image-1"] = dict(request.labels)
        return "image-1"

    def tag(self, image: str, ref: str) -> None:
        self.local[ref] = self.local.get(image, image)

    def untag(self, ref: str) -> None:
        self.local.pop(ref, None)

    def attrs(self, ref: str) -> dict[str, Any] | None:
        image = self.local.get(ref)
        return None if image is None else {"Id": image, "Size": 1, "Config": {"Labels": self.labels[image]}}

    def push(self, ref: str) -> str:
        _, repo, tag = split_repo(ref)
        assert ref in self.local, f"{ref} is not in the local store"
        self.uploaded.append(tag)
        return self.registry.push_image(repo, tag, payload=b"the image", labels=self.labels[self.local[ref]])

    def attach(self, builder: Builder, plan: CellPlan, artifact: str, digest: str) -> str:
        _, repo, _ = split_repo(plan.dev_ref)
        self.attached_while.append(self.registry.tags(repo))
        payload = referrers.Payload("application/json", json.dumps({"kind": artifact}).encode())
        return referrers.attach(builder.registry, repo, digest, SBOM_TYPE, [payload]).digest


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # noqa: ANN201
    matrix = load_matrix(REPO / "matrix.yaml")
    [cell] = [c for c in matrix.cells if c.key == "pytorch-cpu:2.13"]
    assert cell.platforms == ("linux/amd64",)
    registry = RefusingRegistry(HOST)
    fakes = Fakes(registry)
    monkeypatch.setattr(engine, "build", fakes.build)
    monkeypatch.setattr(engine, "tag", fakes.tag)
    monkeypatch.setattr(engine, "untag", fakes.untag)
    monkeypatch.setattr(engine, "image_attrs", fakes.attrs)
    monkeypatch.setattr(engine, "image_labels", lambda ref: (fakes.attrs(ref) or {}).get("Config", {}).get("Labels"))
    monkeypatch.setattr(engine, "find_by_label", lambda key, value: [])
    monkeypatch.setattr("buildtool.imagebuild.publishing.push_verified", lambda ref, log, via="": fakes.push(ref))
    monkeypatch.setattr(Builder, "_build_env", lambda self: (
        None, type("S", (), {"files": {}, "uv_config": lambda self, urls: Path("/dev/null")})(), HostPip()))
    monkeypatch.setattr(builder_mod, "scrub_log", lambda path, secrets: None)
    monkeypatch.setattr(builder_mod, "secret_strings", lambda host: [])
    monkeypatch.setattr(Builder, "_ensure_sbom", lambda self, plan, ref, digest, platform: fakes.attach(
        self, plan, "sbom", digest))
    monkeypatch.setattr(Builder, "_ensure_provenance", lambda self, plan, ref, digest, began, finished: fakes.attach(
        self, plan, "provenance", digest))

    def start(revision: str | None = None) -> tuple[Builder, CellPlan]:
        revision = revision or git_revision(REPO)
        settings = Settings(registry=HOST)
        build = Builder(REPO, matrix.source, settings, revision,
                        BuildOptions(push=True, builder_key=lambda: signing.KEY, push_with="engine",
                                     log_dir=tmp_path / "build-logs", registry_cache=False), print)
        build.registry = registry   # type: ignore[assignment]
        build._key = signing.KEY
        return build, plan_cell(cell, settings, revision)

    return registry, fakes, start


def _commit(name: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", name], capture_output=True, text=True,
                          check=True).stdout.strip()


def _cell(build: Builder, plan: CellPlan) -> CellResult:
    return build.run_cell(plan, BASE)


def test_the_dev_tag_is_written_last_naming_the_digest_its_attestations_are_attached_to(run) -> None:  # noqa: ANN001
    registry, fakes, start = run
    registry.refuse = False
    build, plan = start()
    _, repo, _ = split_repo(plan.dev_ref)
    staging = names.push_staging_tag(plan.dev_tag)
    result = _cell(build, plan)
    assert result.result == "built", result.message
    assert fakes.uploaded == [staging]                                 # never the dev tag itself
    # Both attestations went up while the dev tag did not exist yet.
    assert len(fakes.attached_while) == 2 and all(plan.dev_tag not in tags for tags in fakes.attached_while)
    assert registry.manifest_digest(repo, plan.dev_tag) == registry.manifest_digest(repo, staging) == result.digest
    assert result.sbom and result.provenance
    assert names.parse_dev_tag(staging, plan.cell.version) is None and names.parse_dev_tag(staging) is None
    assert staging not in fakes.local and fakes.local[plan.dev_ref] == "image-1"   # the local tag: the dev tag
    # A second run finds the dev tag by its content key and neither uploads nor tags again. (Not every manifest
    # is unchanged: the stand-in attach attaches again, and its artifact's creation time is in the manifest.)
    again, plan = start()
    tags = {t: registry.manifest_digest(repo, t) for t in registry.tags(repo)}
    assert _cell(again, plan).result == "up to date"
    assert fakes.uploaded == [staging] and {t: registry.manifest_digest(repo, t) for t in registry.tags(repo)
                                            if not t.startswith("sha256-")} == {
        t: d for t, d in tags.items() if not t.startswith("sha256-")}


def test_attestations_the_registry_refuses_leave_no_dev_tag_and_the_error_says_so(run) -> None:  # noqa: ANN001
    registry, fakes, start = run
    build, plan = start()
    _, repo, _ = split_repo(plan.dev_ref)
    staging = names.push_staging_tag(plan.dev_tag)
    result = _cell(build, plan)
    assert result.result == "failed" and result.digest == ""
    assert plan.dev_tag not in registry.tags(repo)
    # Beside the staging tag, the image as built, its inline cache kept apart (repro_config), never a dev tag.
    assert registry.tags(repo) == [f"{plan.dev_tag}__cache", staging]
    assert names.parse_dev_tag(f"{plan.dev_tag}__cache") is None
    message = result.message
    assert message.startswith(f"dev tag {plan.dev_ref} not written: attaching the SBOM and provenance of sha256:")
    assert f"the image is only at {staging}" in message and "re-run build --push" in message
    assert message.endswith(REFUSED)
    # The staging tag is never taken for a dev tag: not by the next build's lookup, which uploads again ...
    registry.refuse = False
    again, plan = start()
    result = _cell(again, plan)
    assert result.result == "pushed", result.message      # the local image, same content key: uploaded again
    assert fakes.uploaded == [staging, staging]
    assert registry.manifest_digest(repo, plan.dev_tag) == result.digest


def test_a_registry_retag_is_written_after_the_attestations_are_there(run) -> None:  # noqa: ANN001
    registry, fakes, start = run
    registry.refuse = False
    first, plan = start(revision=_commit("HEAD~1"))
    assert _cell(first, plan).result == "built"
    fakes.local.clear()                                   # another machine: nothing local
    fakes.attached_while.clear()
    registry.refuse = True
    later, second = start(revision=_commit("HEAD"))
    _, repo, _ = split_repo(second.dev_ref)
    result = _cell(later, second)
    assert result.result == "failed" and second.dev_tag not in registry.tags(repo), result.message
    registry.refuse = False
    result = _cell(later, second)
    assert result.result == "retagged", result.message
    assert fakes.uploaded == [names.push_staging_tag(plan.dev_tag)]          # no layer moved for the retag
    assert registry.manifest_digest(repo, second.dev_tag) == registry.manifest_digest(repo, plan.dev_tag)
    assert fakes.attached_while and all(second.dev_tag not in tags for tags in fakes.attached_while)


@pytest.mark.parametrize("revision", ["nightly__push", "a__amd64"])
def test_a_revision_cannot_make_a_tag_that_is_not_a_dev_tag(revision: str) -> None:
    with pytest.raises(ValueError, match="marks tags that are not dev tags"):
        names.check_revision(revision)


def test_the_staging_tag_is_refused_as_a_dev_tag() -> None:
    tag = names.dev_tag("0123456789ab", "2.13")
    assert names.parse_dev_tag(tag, "2.13") is not None
    assert names.parse_dev_tag(names.push_staging_tag(tag), "2.13") is None
    assert names.parse_dev_tag(names.push_staging_tag(tag)) is None
