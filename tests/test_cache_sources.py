"""Registry cache sources (buildtool.imagebuild.cache_sources): a build takes layers only from earlier dev
images of its cell whose provenance a trusted builder key signed, named by digest, newest first; every
image passed over is logged with why. The build command carries them (`--cache-from`) and always
exports the inline cache."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from buildtool.attest import keys as keys_module
from buildtool.contracts import label_keys
from buildtool.imagebuild import cache_sources, engine
from buildtool.imagebuild.cache_sources import Candidate
from buildtool.imagebuild.pipconfig import HostPip
from tests import provenance_fixture, signing
from tests.memregistry import MemRegistry

REPO = "pytorch-cpu-dev"


def made(client: MemRegistry, tag: str, created: str, key=signing.KEY) -> Candidate:  # noqa: ANN001
    """A dev image in the registry, its provenance signed by `key` (None: no provenance)."""
    digest = client.push_image(REPO, tag, payload=tag.encode())
    if key is not None:
        provenance_fixture.attest_provenance(client, REPO, digest, key)   # type: ignore[arg-type]
    return Candidate(tag, digest, {label_keys.OCI_CREATED: created})


def test_only_images_a_trusted_builder_signed_are_taken_newest_first_by_digest() -> None:
    client = MemRegistry()
    old = made(client, "a" * 12 + "-2.13", "2026-11-01T00:00:00Z")
    newest = made(client, "b" * 12 + "-2.13", "2026-11-30T00:00:00Z")
    middle = made(client, "c" * 12 + "-2.13", "2026-11-15T00:00:00Z")
    logged: list[str] = []
    chosen = cache_sources.choose(client, client.host, REPO, [old, newest, middle],  # type: ignore[arg-type]
                                  signing.trusted(roles=("builder",)), logged.append)
    assert chosen == [f"{client.host}/{REPO}@{newest.digest}", f"{client.host}/{REPO}@{middle.digest}"]
    assert logged == []


@pytest.mark.parametrize(("key", "cause"), [
    (signing.ATTACKER, "which is not a trusted key"),
    (None, "no provenance attached"),
])
def test_an_image_pushed_by_someone_else_is_never_a_cache_source_and_the_log_says_why(key, cause: str) -> None:  # noqa: ANN001
    """Cache poisoning: whoever can push a tag must not get layers into the next build."""
    client = MemRegistry()
    poisoned = made(client, "d" * 12 + "-2.13", "2026-12-01T00:00:00Z", key=key)
    trusted_one = made(client, "e" * 12 + "-2.13", "2026-11-01T00:00:00Z")
    logged: list[str] = []
    chosen = cache_sources.choose(client, client.host, REPO, [poisoned, trusted_one],  # type: ignore[arg-type]
                                  signing.trusted(roles=("builder",)), logged.append)
    assert chosen == [f"{client.host}/{REPO}@{trusted_one.digest}"]
    assert len(logged) == 1
    assert logged[0].startswith(f"not a cache source: {REPO}:{poisoned.tag}") and cause in logged[0]


def test_dev_tags_naming_one_image_fill_one_place_and_the_next_image_the_other() -> None:
    """Commits that leave a cell unchanged tag the same image again: the build named one image twice as its two
    cache sources and never the earlier one, built perhaps on another base, that the second place is for."""
    client = MemRegistry()
    newest = made(client, "b" * 12 + "-2.13", "2026-11-30T00:00:00Z")
    again = Candidate("c" * 12 + "-2.13", newest.digest, newest.labels)
    older = made(client, "a" * 12 + "-2.13", "2026-11-01T00:00:00Z")
    logged: list[str] = []
    chosen = cache_sources.choose(client, client.host, REPO, [newest, again, older],  # type: ignore[arg-type]
                                  signing.trusted(roles=("builder",)), logged.append)
    assert chosen == [f"{client.host}/{REPO}@{newest.digest}", f"{client.host}/{REPO}@{older.digest}"]
    assert logged == []


def test_a_key_trusted_only_as_tester_does_not_vouch_for_layers() -> None:
    client = MemRegistry()
    tested = made(client, "f" * 12 + "-2.13", "2026-12-01T00:00:00Z")
    logged: list[str] = []
    chosen = cache_sources.choose(client, client.host, REPO, [tested], signing.trusted(roles=("tester",)),  # type: ignore[arg-type]
                                  logged.append)
    assert chosen == []
    assert "not as builder" in logged[0]


def test_the_order_is_by_created_label_then_tag_and_an_image_without_one_comes_last() -> None:
    a = Candidate("a-1", "sha256:1", {label_keys.OCI_CREATED: "2026-01-02T00:00:00Z"})
    b = Candidate("b-1", "sha256:2", {})
    c = Candidate("c-1", "sha256:3", {label_keys.OCI_CREATED: "2026-01-02T00:00:00Z"})
    d = Candidate("d-1", "sha256:4", {label_keys.OCI_CREATED: "2026-01-03T00:00:00Z"})
    assert [x.tag for x in cache_sources.newest_first([b, c, a, d])] == ["d-1", "a-1", "c-1", "b-1"]


def test_the_cache_trust_holds_builders_and_this_builds_key_and_the_dev_key_only_on_loopback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builder, tester, own = signing.generate(), signing.generate(), signing.generate()
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "trusted-keys.yaml").write_text(
        "keys:\n" + keys_module.trusted_entry("ci-builder", builder.public(), ("builder",))
        + keys_module.trusted_entry("ci-tester", tester.public(), ("tester",)))
    dev = signing.generate().public()
    monkeypatch.setattr(keys_module, "dev_public_key", lambda: dev)
    trust = keys_module.cache_trust(tmp_path, own.public(), loopback=False)
    assert set(trust.for_role("builder")) == {builder.public().keyid, own.public().keyid}
    assert tester.public().keyid not in trust.keys and dev.keyid not in trust.keys
    assert dev.keyid in keys_module.cache_trust(tmp_path, None, loopback=True).for_role("builder")


FAKE_DOCKER = """
import json, sys
args = sys.argv[1:]
open(args[args.index("--iidfile") + 1], "w").write("sha256:" + "9" * 64)
json.dump(args, open({out!r}, "w"))
"""


def test_every_build_exports_the_inline_cache_and_imports_the_sources_it_is_given(tmp_path: Path) -> None:
    out = tmp_path / "argv.json"
    script = tmp_path / "docker.py"
    script.write_text(FAKE_DOCKER.format(out=str(out)))
    client = engine.BuildClient((sys.executable, str(script), "build"), (), "classic")
    sources = ["127.0.0.1:5000/pytorch-cpu-dev@sha256:" + "1" * 64, "127.0.0.1:5000/pytorch-cpu-dev@sha256:" + "2" * 64]
    engine.build(client, engine.BuildRequest(
        tmp_path, tmp_path / "Dockerfile", build_args={"BASE_IMAGE": "b"}, labels={}, secrets={},
        log_path=tmp_path / "build.log", cache_from=sources))
    argv = json.loads(out.read_text())
    pairs = list(zip(argv, argv[1:], strict=False))
    assert ("--build-arg", "BUILDKIT_INLINE_CACHE=1") in pairs
    assert [b for a, b in pairs if a == "--cache-from"] == sources
    engine.build(client, engine.BuildRequest(tmp_path, tmp_path / "Dockerfile", build_args={}, labels={}, secrets={},
                 log_path=tmp_path / "build.log"))
    assert "--cache-from" not in json.loads(out.read_text())


# -- the build: what the content-key scan passed over is what it may take layers from ---------------

def _builder(monkeypatch: pytest.MonkeyPatch, **options: object):  # noqa: ANN202
    """A Builder on the real matrix whose registry is in memory and whose engine records the build."""
    from buildtool.imagebuild import builder
    from buildtool.matrix.loader import load_matrix
    from buildtool.matrix.plan import Settings, plan_cell

    root = Path(__file__).resolve().parents[1]
    cell = next(c for c in load_matrix(root / "matrix.yaml").cells if c.key == "pytorch-cpu:2.13")
    settings = Settings(registry="127.0.0.1:5999/team")
    plan = plan_cell(cell, settings, "nightly-1")
    run = builder.Builder(root, "matrix.yaml", settings, "nightly-1",
                          builder.BuildOptions(cache_trust=lambda own: signing.trusted(roles=("builder",)),
                                               **options), print)   # type: ignore[arg-type]
    run.registry = MemRegistry()   # type: ignore[assignment]
    seen: dict[str, object] = {}

    def build(client: object, request: engine.BuildRequest) -> str:
        seen.update(vars(request))
        raise engine.BuildFailed("recorded")

    monkeypatch.setattr(builder.engine, "build", build)
    monkeypatch.setattr(builder.engine, "image_attrs", lambda ref: None)
    monkeypatch.setattr(builder.engine, "find_by_label", lambda key, value: [])
    monkeypatch.setattr(builder.Builder, "_build_env", lambda self: (None, SimpleNamespace(files={}, uv_config=lambda
                                                                                                  urls: Path("/x")),
                                                                    HostPip()))
    monkeypatch.setattr(builder, "reachable", lambda urls, log: urls)
    monkeypatch.setattr(builder, "scrub_log", lambda path, secrets: None)
    monkeypatch.setattr(builder, "build_labels", lambda *args: {})
    monkeypatch.setattr(builder, "secret_strings", lambda host: [])
    return run, plan, seen


def _earlier(client: MemRegistry, repo: str, tag: str, key=signing.KEY) -> str:  # noqa: ANN001
    """An earlier dev image of the cell, labelled as a build labels it, with another content key."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": {
        label_keys.CONTENT_KEY: "sha256:" + "e" * 64, label_keys.OCI_CREATED: "2026-11-30T00:00:00Z"}}}).encode()
    config_digest, layer = client.put_blob(repo, config), client.put_blob(repo, tag.encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                           "size": len(config)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": 1}]}
    digest = client.put_manifest(repo, tag, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    if key is not None:
        provenance_fixture.attest_provenance(client, repo, digest, key)   # type: ignore[arg-type]
    return digest


@pytest.mark.parametrize(("options", "taken"), [({}, True), ({"registry_cache": False}, False),
                                                 ({"force": True}, False)])
def test_a_build_takes_layers_from_the_earlier_signed_dev_image_unless_told_not_to(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, options: dict, taken: bool) -> None:
    from buildtool.common.refs import split_repo
    from buildtool.imagebuild.builder import CellResult

    run, plan, seen = _builder(monkeypatch, log_dir=tmp_path, **options)
    host, repo, _ = split_repo(plan.dev_ref)
    signed = _earlier(run.registry, repo, "aaaaaaaaaaaa-2.13")   # type: ignore[arg-type]
    _earlier(run.registry, repo, "bbbbbbbbbbbb-2.13", key=signing.ATTACKER)   # type: ignore[arg-type]
    base = SimpleNamespace(ref="127.0.0.1:5000/library/debian:bookworm-slim", pinned="b@sha256:" + "b" * 64,
                           digest="sha256:" + "b" * 64)
    result = CellResult(cell=plan.cell.key, result="failed")
    assert run.options.force or run._reuse(plan, "sha256:" + "f" * 64, result) is False
    with pytest.raises(engine.BuildFailed):
        run._build(plan, base, "sha256:" + "f" * 64, tmp_path / "b.log", result)   # type: ignore[arg-type]
    assert seen["cache_from"] == ([f"{host}/{repo}@{signed}"] if taken else [])
