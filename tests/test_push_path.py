"""Who pushes a built image (buildtool.imagebuild.push_path): the engine when the build took layers from the
registry (it skips them), skopeo otherwise (its gzip uses every core); and validation runs an image
pushed by skopeo from the engine's own copy when its id is the config the registry's manifest names."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from buildtool.common.errors import UserError
from buildtool.imagebuild import push_path
from buildtool.validate import containers as validate_engine

COLD = """\
#5 [base 1/2] FROM 127.0.0.1:5000/library/debian@sha256:aaaa
#5 pulling sha256:1111 0.1s done
#10 [stage-2 2/5] RUN --mount=type=tmpfs,target=/run uv pip install -r framework.lock
#10 DONE 11.4s
"""
FRESH = """\
#4 importing cache manifest from 127.0.0.1:5000/pytorch-cpu-dev@sha256:bbbb
#10 [stage-2 2/5] RUN --mount=type=tmpfs,target=/run uv pip install -r framework.lock
#10 pulling sha256:2765ccb80cd17dfd42f0d50a9fc20f1ffb5f66dd01b2498789036a1f09cb36f9
#10 pulling sha256:2765ccb80cd17dfd42f0d50a9fc20f1ffb5f66dd01b2498789036a1f09cb36f9 0.2s done
#10 CACHED
"""


@pytest.mark.parametrize(("log", "took", "via"), [(COLD, False, "skopeo"), (FRESH, True, "engine"),
                                                  ("", False, "skopeo")])
def test_auto_pushes_with_the_engine_only_what_took_layers_from_the_registry(log: str, took: bool, via: str) -> None:
    assert push_path.took_registry_layers(log) is took
    assert push_path.choose("auto", log) == via


def test_an_image_this_run_did_not_build_is_pushed_by_the_engine_and_a_setting_wins() -> None:
    assert push_path.choose("auto", None) == "engine"
    assert push_path.choose("skopeo", FRESH) == "skopeo" and push_path.choose("engine", COLD) == "engine"
    with pytest.raises(UserError, match="push path 'docker' is unknown; use one of auto, engine, skopeo"):
        push_path.choose("docker", COLD)


FAKE_SKOPEO = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
json.dump(args, open(os.environ["FAKE_SKOPEO_ARGV"], "w"))
if os.environ.get("FAKE_SKOPEO_FAIL"):
    print("time=... level=fatal msg=\\"writing blob: connection refused\\"", file=sys.stderr)
    sys.exit(1)
open(args[args.index("--digestfile") + 1], "w").write("sha256:" + "c" * 64)
"""


@pytest.fixture
def fake_skopeo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "skopeo"
    script.write_text(FAKE_SKOPEO)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SKOPEO_ARGV", str(tmp_path / "argv.json"))
    return tmp_path / "argv.json"


def test_skopeo_copies_from_the_engine_docker_host_names_and_returns_its_digest(
        fake_skopeo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/other.sock")
    ref = "127.0.0.1:5000/pytorch-cpu-dev:abc-2.13"
    assert push_path.skopeo_push(ref, insecure=True) == "sha256:" + "c" * 64
    argv = json.loads(fake_skopeo.read_text())
    assert argv[-2:] == [f"docker-daemon:{ref}", f"docker://{ref}"]
    assert argv[argv.index("--src-daemon-host") + 1] == "unix:///run/other.sock"
    assert "--dest-tls-verify=false" in argv
    monkeypatch.delenv("DOCKER_HOST")
    push_path.skopeo_push("registry.example/team/x-dev:abc-1", insecure=False)
    argv = json.loads(fake_skopeo.read_text())
    assert "--src-daemon-host" not in argv and "--dest-tls-verify=false" not in argv


def test_a_failed_skopeo_copy_names_its_cause(fake_skopeo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SKOPEO_FAIL", "1")
    with pytest.raises(RuntimeError, match=r"exited 1: .*writing blob: connection refused"):
        push_path.skopeo_push("127.0.0.1:5000/x-dev:abc-1", insecure=True)


def test_without_skopeo_the_push_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(push_path.shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="skopeo is not installed .* --push-with engine"):
        push_path.skopeo_push("127.0.0.1:5000/x-dev:abc-1", insecure=True)


class _Registry:
    def __init__(self, manifest: dict) -> None:
        self.manifest = manifest

    def get_manifest(self, repo: str, ref: str) -> tuple[bytes, str, str]:
        return json.dumps(self.manifest).encode(), "application/vnd.oci.image.manifest.v1+json", ref


@pytest.mark.parametrize(("held", "expected"), [("sha256:" + "d" * 64, True), ("sha256:" + "e" * 64, False),
                                                (None, False)])
def test_validation_runs_the_engines_image_only_when_its_id_is_the_manifests_config(
        monkeypatch: pytest.MonkeyPatch, held: str | None, expected: bool) -> None:
    config = "sha256:" + "d" * 64
    monkeypatch.setattr(validate_engine, "inspect_image", lambda ref: {"Id": held} if held and ref == config else None)
    found = validate_engine._same_image_here(_Registry({"config": {"digest": config}}), "r", "sha256:" + "1" * 64)  # type: ignore[arg-type]
    assert (found is not None) is expected
    index = {"manifests": [{"digest": "sha256:" + "2" * 64}]}
    assert validate_engine._same_image_here(_Registry(index), "r", "sha256:" + "1" * 64) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(("setting", "log", "via"), [("auto", COLD, "skopeo"), ("auto", FRESH, "engine"),
                                                     ("auto", None, "engine"), ("engine", COLD, "engine")])
def test_the_build_pushes_by_the_path_chosen_for_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, setting: str,
                                                    log: str | None, via: str) -> None:
    from types import SimpleNamespace

    from buildtool.imagebuild import builder

    calls: list[tuple[str, str]] = []
    monkeypatch.setattr("buildtool.imagebuild.publishing.push_verified",
                        lambda ref, log, via: calls.append((ref, via)) or "sha256:1")
    local: list[tuple[str, ...]] = []
    monkeypatch.setattr(builder.engine, "tag", lambda image, ref: local.append(("tag", image, ref)))
    monkeypatch.setattr(builder.engine, "untag", lambda ref: local.append(("untag", ref)))
    # The config normalised after the push (repro_config; tests/test_repro_config.py): here it names the same digest.
    fake = SimpleNamespace(options=builder.BuildOptions(push=True, push_with=setting), log=print,
                           progress=SimpleNamespace(update=lambda *args: None),
                           _normalised=lambda ref, build_log: "sha256:1")
    plan = SimpleNamespace(dev_ref="127.0.0.1:5000/x-dev:abc-1", dev_repo="127.0.0.1:5000/x-dev", dev_tag="abc-1",
                           cell=SimpleNamespace(key="x:1"))
    build_log = None
    if log is not None:
        build_log = tmp_path / "build.log"
        build_log.write_text(log)
    assert builder.Builder._push(fake, plan, build_log) == "sha256:1"   # type: ignore[arg-type]
    # Uploaded under the staging tag (the dev tag is written after the attestations), which is local only meanwhile.
    assert calls == [("127.0.0.1:5000/x-dev:abc-1__push", via)]
    assert local == [("tag", "127.0.0.1:5000/x-dev:abc-1", "127.0.0.1:5000/x-dev:abc-1__push"),
                     ("untag", "127.0.0.1:5000/x-dev:abc-1__push")]


def _image_with_config(client, config: dict) -> tuple[str, bytes]:  # noqa: ANN001
    """An image manifest in `client` whose config blob is `config` (written as a registry holds it)."""
    from buildtool.registry.client import OCI_MANIFEST

    raw = json.dumps(config, separators=(",", ":")).encode()
    digest = client.put_blob("r", raw)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest, "size": len(raw)},
                "layers": []}
    return client.put_manifest("r", "t", json.dumps(manifest).encode(), OCI_MANIFEST), raw


@pytest.mark.parametrize("loads", [True, False])
def test_an_image_whose_layers_the_engine_holds_is_made_from_its_config_not_pulled(
        monkeypatch: pytest.MonkeyPatch, loads: bool) -> None:
    """Built here, its config rewritten in the registry (repro_config): the registry's config bytes, unchanged, are
    `docker load`ed with no layer data; the engine takes the layers it holds by their digests, or refuses."""
    import io
    import subprocess
    import tarfile

    from tests.memregistry import MemRegistry

    client = MemRegistry()
    config = {"architecture": "amd64", "os": "linux", "config": {"Env": ["A=1"]},
              "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "a" * 64, "sha256:" + "b" * 64]}}
    digest, raw = _image_with_config(client, config)
    config_digest = json.loads(client.get_manifest("r", digest)[0])["config"]["digest"]
    loaded: dict[str, bytes] = {}

    def docker(*argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
        assert argv[:3] == ("load", "-q", "-i")
        with tarfile.open(argv[3]) as tar:
            loaded.update({m.name: tar.extractfile(m).read() for m in tar.getmembers()})  # type: ignore[union-attr]
        return subprocess.CompletedProcess(list(argv), 0 if loads else 1, "", "" if loads else "no such file")

    monkeypatch.setattr(validate_engine.docker_cli, "docker", docker)
    monkeypatch.setattr(validate_engine, "inspect_image",
                        lambda ref: {"Id": ref} if loads and ref == config_digest else None)
    found = validate_engine._from_layers_here(client, "r", digest)  # type: ignore[arg-type]
    assert (found is not None) is loads
    # The config exactly as the registry holds it (its digest is the image id), and no layer data at all.
    name = f"{config_digest.partition(':')[2]}.json"
    assert loaded[name] == raw
    assert json.load(io.BytesIO(loaded["manifest.json"])) == [
        {"Config": name, "RepoTags": None, "Layers": ["0/layer.tar", "1/layer.tar"]}]
    assert set(loaded) == {name, "manifest.json"}
