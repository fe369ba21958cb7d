"""The build of a multi-platform cell (jax-cpu, on linux/amd64 and linux/arm64 in the real matrix) against an
in-memory registry, with BuildKit and the pushes stood in for: what goes to the registry, and what does not
when a platform fails."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from buildtool.contracts import label_keys, names
from buildtool.imagebuild import builder as builder_mod
from buildtool.imagebuild import engine, multiplatform
from buildtool.imagebuild.builder import BaseInfo, Builder, BuildOptions
from buildtool.imagebuild.pipconfig import HostPip
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.plan import Settings, git_revision, plan_cell
from tests import provenance_fixture, signing
from tests.conftest import REPO
from tests.memregistry import MemRegistry

HOST = "127.0.0.1:5999"


class Fakes:
    """BuildKit and the pushes: a build returns an image id and remembers its labels; a push writes a one-layer
    image of the platform with those labels to the in-memory registry."""

    def __init__(self, registry: MemRegistry, fail: str = "") -> None:
        self.registry, self.fail = registry, fail
        self.builds: list[str] = []
        self.labels: dict[str, dict[str, str]] = {}
        self.cache_from: dict[str, list[str]] = {}

    def build(self, client: Any, request: engine.BuildRequest) -> str:
        platform, labels, log_path, cache_from = request.platform, request.labels, request.log_path, request.cache_from
        assert platform is not None, "a multi-platform cell always names the platform it builds"
        self.builds.append(platform)
        # As engine.build does: the platform's full log, which the push path is chosen from.
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(f"#1 building {platform}\n")
        self.cache_from[platform] = list(cache_from)
        if platform == self.fail:
            raise engine.BuildFailed("docker build exited 1: apt-get: Illegal instruction (under QEMU)")
        self.labels[f"image-{platform}"] = dict(labels)
        return f"image-{platform}"

    def push(self, ref: str) -> str:
        repo_tag = ref.split("/", 1)[1]
        repo, _, tag = repo_tag.rpartition(":")
        arch = tag.rsplit(names.PLATFORM_TAG_SEP, 1)[1]
        return self.registry.push_image(repo, tag, payload=tag.encode(), architecture=arch,
                                        labels=self.labels[f"image-linux/{arch}"])


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # noqa: ANN201
    matrix = load_matrix(REPO / "matrix.yaml")
    [cell] = [c for c in matrix.cells if c.name == "jax-cpu"]
    assert cell.platforms == ("linux/amd64", "linux/arm64")
    registry = MemRegistry(HOST)

    def start(fail: str = "", revision: str | None = None, base_digests: str = "ab", push: bool = True,
              platforms: tuple[str, ...] = ()) -> tuple[Builder, Any, Fakes]:
        fakes = Fakes(registry, fail)
        revision = revision or git_revision(REPO)
        plan = plan_cell(cell, Settings(registry=HOST), revision)
        bases = {p: BaseInfo(ref="127.0.0.1:5000/library/debian:bookworm-slim", digest="sha256:" + c * 64)
                 for p, c in zip(("linux/amd64", "linux/arm64"), base_digests, strict=True)}
        monkeypatch.setattr(builder_mod, "resolve_base", lambda plan, platform=None: bases[platform])
        monkeypatch.setattr(builder_mod.platforms, "binfmt_problem", lambda platform: None)
        monkeypatch.setattr(engine, "build", fakes.build)
        monkeypatch.setattr(engine, "tag", lambda image, ref: None)
        monkeypatch.setattr(engine, "image_labels", lambda ref: None)
        monkeypatch.setattr("buildtool.imagebuild.publishing.push_verified", lambda ref, log, via="": fakes.push(ref))
        monkeypatch.setattr(Builder, "_build_env", lambda self: (
            None, type("S", (), {"files": {}, "uv_config": lambda self, urls: Path("/dev/null")})(), HostPip()))
        monkeypatch.setattr(builder_mod, "scrub_log", lambda path, secrets: None)
        monkeypatch.setattr(builder_mod, "secret_strings", lambda host: [])
        monkeypatch.setattr(Builder, "_attach_platform", lambda self, plan, platform, digest, key, began: {
            "platform": platform, "digest": digest, "content_key": key, "sbom": "", "provenance": ""})
        build = Builder(REPO, matrix.source, Settings(registry=HOST), revision,
                        BuildOptions(push=push, platforms=platforms, builder_key=lambda: signing.KEY,
                                     push_with="engine", log_dir=tmp_path / "build-logs",
                                     cache_trust=lambda own: signing.trusted(roles=("builder",))), print)
        build.registry = registry   # type: ignore[assignment]
        build._key = signing.KEY
        return build, plan, fakes

    return registry, start


def _commit(name: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", name], capture_output=True, text=True,
                          check=True).stdout.strip()


def _index(registry: MemRegistry, repo: str, tag: str) -> dict[str, Any]:
    return json.loads(registry.get_manifest(repo, tag)[0])


def test_each_platform_is_built_with_its_own_content_key_and_the_index_goes_up_last(run) -> None:  # noqa: ANN001
    registry, start = run
    build, plan, fakes = start()
    result = build.run_cell(plan, BaseInfo("unused", "sha256:" + "0" * 64))
    assert result.result == "pushed", result.message
    assert fakes.builds == ["linux/amd64", "linux/arm64"]
    repo = plan.dev_repo.split("/", 1)[1]
    index = _index(registry, repo, plan.dev_tag)
    assert [m["platform"] for m in index["manifests"]] == [{"architecture": "amd64", "os": "linux"},
                                                           {"architecture": "arm64", "os": "linux"}]
    assert result.digest == registry.manifest_digest(repo, plan.dev_tag)
    keys = {p["platform"]: p["content_key"] for p in result.platforms}
    assert keys["linux/amd64"] != keys["linux/arm64"]     # another base and platform: another content key
    for platform, key in keys.items():
        assert fakes.labels[f"image-{platform}"][label_keys.CONTENT_KEY] == key
    # Nothing changed: the next run builds nothing and finds its index.
    again, plan, fakes = start()
    assert again.run_cell(plan, BaseInfo("unused", "sha256:" + "0" * 64)).result == "up to date"
    assert fakes.builds == []


def test_another_commits_index_with_the_same_content_keys_is_retagged_not_rebuilt(run) -> None:  # noqa: ANN001
    registry, start = run
    build, first, _ = start(revision=_commit("HEAD~1"))
    assert build.run_cell(first, BaseInfo("unused", "sha256:" + "0" * 64)).result == "pushed"
    later, second, fakes = start(revision=_commit("HEAD"))
    result = later.run_cell(second, BaseInfo("unused", "sha256:" + "0" * 64))
    assert result.result == "retagged" and fakes.builds == []
    repo = second.dev_repo.split("/", 1)[1]
    assert registry.get_manifest(repo, second.dev_tag)[0] == registry.get_manifest(repo, first.dev_tag)[0]


def test_a_platform_that_fails_fails_the_cell_naming_it_and_leaves_no_index(run) -> None:  # noqa: ANN001
    registry, start = run
    build, plan, fakes = start(fail="linux/arm64")
    result = build.run_cell(plan, BaseInfo("unused", "sha256:" + "0" * 64))
    assert result.result == "failed"
    assert result.message.startswith("linux/arm64: docker build exited 1: apt-get: Illegal instruction"), \
        result.message
    repo = plan.dev_repo.split("/", 1)[1]
    assert registry.manifest_digest(repo, plan.dev_tag) is None          # no half index at the dev tag
    assert plan.dev_tag not in registry.tags(repo)
    assert registry.manifest_digest(repo, names.platform_tag(plan.dev_tag, "amd64")) is not None
    assert result.digest == "" and result.platforms == []



def test_a_failed_build_without_push_drops_a_local_dev_tag_of_other_content(run, monkeypatch) -> None:  # noqa: ANN001
    """The bases moved and the other platform's build failed: the local dev tag still named the earlier build's
    image of this machine's platform (another content key), which the image tests then ran as this commit's. A
    single-platform cell drops such a tag; a dev tag with this build's content key is kept."""
    _, start = run
    native = builder_mod.platforms.host().name
    foreign = next(p for p in ("linux/amd64", "linux/arm64") if p != native)
    build, plan, _ = start(fail=foreign, push=False, base_digests="cd")
    earlier = {label_keys.CONTENT_KEY: "sha256:" + "9" * 64}
    monkeypatch.setattr(engine, "image_labels", lambda ref: earlier if ref == plan.dev_ref else None)
    untagged: list[str] = []
    monkeypatch.setattr(engine, "untag", untagged.append)
    keys: dict[str | None, str] = {}
    content_key = builder_mod.cell_content_key
    monkeypatch.setattr(builder_mod, "cell_content_key", lambda plan, root, base, platform=None: keys.setdefault(
        platform, content_key(plan, root, base, platform)))
    result = build.run_cell(plan, BaseInfo("unused", "sha256:" + "0" * 64))
    assert result.result == "failed" and result.message.startswith(f"{foreign}: "), result.message
    assert untagged == [plan.dev_ref]
    current = {label_keys.CONTENT_KEY: keys[native]}
    monkeypatch.setattr(engine, "image_labels", lambda ref: current if ref == plan.dev_ref else None)
    untagged.clear()
    assert build.run_cell(plan, BaseInfo("unused", "sha256:" + "0" * 64)).result == "failed"
    assert untagged == []


def test_each_platform_takes_layers_from_its_own_signed_image_of_an_earlier_index(run) -> None:  # noqa: ANN001
    """The registry cache per platform: a fresh runner's arm64 build imports BuildKit's inline cache from the
    earlier index's arm64 image (by digest, its provenance signed by a trusted builder), never from the amd64
    one; an earlier platform image whose provenance an untrusted key signed is passed over."""
    registry, start = run
    build, first, _ = start(revision=_commit("HEAD~1"))
    assert build.run_cell(first, BaseInfo("unused", "sha256:" + "0" * 64)).result == "pushed"
    repo = first.dev_repo.split("/", 1)[1]
    earlier = {p: c.digest for p, c in multiplatform.index_children(registry, repo, first.dev_tag).items()}
    provenance_fixture.attest_provenance(registry, repo, earlier["linux/arm64"], signing.KEY)
    provenance_fixture.attest_provenance(registry, repo, earlier["linux/amd64"], signing.ATTACKER)
    # The bases moved (a new base digest per platform): new content keys, so both platforms are built.
    later, second, fakes = start(revision=_commit("HEAD"), base_digests="cd")
    assert later.run_cell(second, BaseInfo("unused", "sha256:" + "0" * 64)).result == "pushed"
    assert fakes.builds == ["linux/amd64", "linux/arm64"]
    assert fakes.cache_from == {"linux/amd64": [], "linux/arm64": [f"{HOST}/{repo}@{earlier['linux/arm64']}"]}


def test_a_build_without_push_makes_only_the_platforms_asked_and_tags_this_machines(run, monkeypatch) -> None:  # noqa: ANN001
    """Issue 55: `make build` makes what this machine runs (buildtool build's default without --push); a push makes
    every platform. Nothing goes to the registry without push."""
    registry, start = run
    native = builder_mod.platforms.host().name
    build, plan, fakes = start(push=False, platforms=(native,))
    result = build.run_cell(plan, BaseInfo("unused", "sha256:" + "0" * 64))
    assert result.result == "built", result.message
    assert fakes.builds == [native] and result.digest == f"image-{native}"
    assert [p["platform"] for p in result.platforms] == [native]
    # Again with nothing changed: the image this machine holds has the content key, nothing is built.
    labels = fakes.labels[f"image-{native}"]
    again, plan, fakes = start(push=False, platforms=(native,))
    monkeypatch.setattr(engine, "image_labels", lambda ref: labels)
    monkeypatch.setattr(engine, "image_attrs", lambda ref: {"Id": f"image-{native}"})
    result = again.run_cell(plan, BaseInfo("unused", "sha256:" + "0" * 64))
    assert result.result == "up to date" and fakes.builds == [] and result.digest == f"image-{native}"
    monkeypatch.setattr(engine, "image_labels", lambda ref: None)
    foreign = next(p for p in plan.cell.platforms if p != native)
    build, plan, fakes = start(push=False, platforms=(foreign,))
    result = build.run_cell(plan, BaseInfo("unused", "sha256:" + "0" * 64))
    assert fakes.builds == [foreign] and result.digest == ""   # the dev tag names this machine's image only
    build, plan, fakes = start(push=False)
    assert build.run_cell(plan, BaseInfo("unused", "sha256:" + "0" * 64)).result == "built"
    assert fakes.builds == list(plan.cell.platforms)          # none named: every platform
    assert registry.manifest_digest(plan.dev_repo.split("/", 1)[1], plan.dev_tag) is None


def test_a_cell_built_for_none_of_the_platforms_asked_fails_naming_them(run) -> None:  # noqa: ANN001
    _, start = run
    build, plan, fakes = start(push=False, platforms=("linux/riscv64",))
    result = build.run_cell(plan, BaseInfo("unused", "sha256:" + "0" * 64))
    assert result.result == "failed" and fakes.builds == []
    assert "jax-cpu:0.10 is built for linux/amd64, linux/arm64, none of linux/riscv64" in result.message


def test_a_push_of_some_platforms_is_refused_before_the_engine_is_asked(run, monkeypatch) -> None:  # noqa: ANN001
    from buildtool.common.errors import UserError

    _, start = run
    build, plan, _ = start(platforms=("linux/amd64",))
    monkeypatch.setattr(engine, "sdk", lambda: pytest.fail("the engine was asked"))
    with pytest.raises(UserError, match="--platform: a push writes each cell's image index over every platform"):
        build.run([plan])


@pytest.mark.parametrize(("args", "expected"), [
    ([], "host"), (["--push"], ()), (["--platform", "linux/arm64,linux/amd64"], ("linux/arm64", "linux/amd64")),
])
def test_build_without_push_defaults_to_this_machines_platform(run_cli, monkeypatch, args, expected) -> None:
    """What `buildtool build` asks the Builder for: this machine's platform without --push, every one with it."""
    seen = []

    def capture(self, plans):  # noqa: ANN001, ANN202
        seen.append(self.options.platforms)
        return []

    monkeypatch.setattr(Builder, "run", capture)
    code, _, err = run_cli("build", "-f", "jax-cpu", *args, "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    assert seen == [(builder_mod.platforms.host().name,) if expected == "host" else expected]
    code, _, err = run_cli("build", "-f", "jax-cpu", "--platform", "linux/sparc", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and "--platform: unknown platform" in err, err


def test_a_single_platform_cell_whose_lock_is_missing_fails_alone(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """A UserError (a missing lock) left run_cell for a one-platform cell: the whole build stopped, the other
    cells' results were lost and the stale dev tag stayed. A multi-platform cell already failed alone."""
    from buildtool.common.errors import UserError

    matrix = load_matrix(REPO / "matrix.yaml")
    [cell] = [c for c in matrix.cells if c.key == "pytorch-cpu:2.13"]
    revision = git_revision(REPO)
    plan = plan_cell(cell, Settings(registry=HOST), revision)
    missing = "dockerfiles/pytorch/pytorch-cpu/2.13/pylock.framework.toml is missing; run make lock"

    def no_lock(*args: Any) -> str:
        raise UserError(missing)

    dropped: list[str] = []
    monkeypatch.setattr(builder_mod, "cell_content_key", no_lock)
    monkeypatch.setattr(Builder, "_drop_stale_dev_tag", lambda self, plan, key: dropped.append(plan.dev_ref))
    build = Builder(REPO, matrix.source, Settings(registry=HOST), revision,
                    BuildOptions(push=False, log_dir=tmp_path / "build-logs"), print)
    result = build.run_cell(plan, BaseInfo("unused", "sha256:" + "0" * 64))
    assert (result.result, result.message, result.digest) == ("failed", missing, "")
    assert dropped == [plan.dev_ref]


def build_with_attachments_refused(start, monkeypatch, answer: str):  # noqa: ANN001, ANN201
    """Build a cell whose registry refuses each platform's provenance with `answer`: (plan, fakes, result)."""
    from buildtool.common.errors import FailedError

    build, plan, fakes = start()

    def refused(self, plan, platform, digest, key, began):  # noqa: ANN001, ANN202
        raise FailedError(f"provenance of {platform}: {answer}")

    monkeypatch.setattr(Builder, "_attach_platform", refused)
    return plan, fakes, build.run_cell(plan, BaseInfo("unused", "sha256:" + "0" * 64))


def test_attestations_that_fail_leave_no_index_at_the_dev_tag(run, monkeypatch) -> None:  # noqa: ANN001
    """The index went up at the dev tag before each platform's SBOM and provenance were attached: a registry
    refusing them left a dev tag naming an index without its attestations (docs/registries.md says the
    multi-platform push writes the dev tag last, as the single-platform one does)."""
    registry, start = run
    plan, fakes, result = build_with_attachments_refused(start, monkeypatch, "HTTP 403 DENIED")
    assert result.result == "failed" and "HTTP 403 DENIED" in result.message, result.message
    repo = plan.dev_repo.split("/", 1)[1]
    assert plan.dev_tag not in registry.tags(repo)
    assert registry.manifest_digest(repo, plan.dev_tag) is None
    assert fakes.builds == ["linux/amd64", "linux/arm64"]


def test_attestations_that_fail_say_the_dev_tag_was_not_written(run, monkeypatch) -> None:  # noqa: ANN001
    """As for a single-platform cell (docs/registries.md): the one line says the dev tag was not written and why."""
    _, start = run
    plan, _, result = build_with_attachments_refused(
        start, monkeypatch, "HTTP 403 DENIED: requested access to the resource is denied")
    assert result.message.startswith(f"dev tag {plan.dev_ref} not written: attaching the SBOMs and provenance"), \
        result.message
    assert "re-run build --push" in result.message
    assert result.message.endswith("HTTP 403 DENIED: requested access to the resource is denied")
