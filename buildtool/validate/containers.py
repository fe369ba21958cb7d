"""The Docker engine side of validation: the image pinned to a digest (pulled so the engine runs
exactly that digest) with its labels and env, and the removal of a run's containers. The docker
client is the one DOCKER_CLIENT chooses (buildtool.common.docker_cli).
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildtool.common import docker_cli
from buildtool.common.docker_cli import inspect_image
from buildtool.common.errors import UserError
from buildtool.common.refs import has_registry, split_repo
from buildtool.contracts import label_keys, platforms
from buildtool.registry.client import INDEX_TYPES, NotFound, RegistryClient
from buildtool.registry.image_index import MAX_CONFIG_BYTES

PULL_TIMEOUT_S = 1800

Log = Callable[[str], None]


@dataclass(frozen=True)
class Resolved:
    """An image reference pinned to a digest, with its labels."""

    ref: str             # what the user named
    run_ref: str         # what containers are started from (repo@digest when in a registry)
    digest: str          # registry manifest digest, or the local image id when not in a registry
    host: str | None     # registry host; None for a local-only image
    repo: str | None
    labels: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)   # the image config's Env
    platform: str = platforms.DEFAULT[0]                # os/arch of the image config (contracts.platforms)

    @property
    def emulated(self) -> bool:
        """Whether its containers run under QEMU here (another architecture than this machine's)."""
        return platforms.emulated(self.platform)


def _platform(attrs: dict[str, Any], ref: str) -> str:
    """The image's platform from its config; one the platform table does not know is refused by name."""
    try:
        return platforms.from_descriptor({"os": attrs.get("Os"), "architecture": attrs.get("Architecture"),
                                          "variant": attrs.get("Variant")}).name
    except platforms.UnknownPlatform as exc:
        raise UserError(f"image {ref}: {exc}") from None


def _resolved(ref: str, run_ref: str, digest: str, host: str | None, repo: str | None, attrs: dict[str, Any],
              platform: str | None = None) -> Resolved:
    """The image as inspected (its labels and env); where an index entry said `platform`, its own config must say
    the same."""
    config = attrs.get("Config") or {}
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    image = Resolved(ref, run_ref, digest, host, repo, config.get("Labels") or {}, env, platform=_platform(attrs, ref))
    if platform is not None and image.platform != platform:
        raise UserError(f"image {image.ref}: its {platform} entry {image.digest} is a {image.platform} image")
    return image


def _index_entries(client: RegistryClient, host: str, repo: str, tag_or_digest: str,
                   ref: str) -> list[tuple[str, dict[str, Any]]]:
    """(platform, entry) of each image of the index `ref` names, in index order; [] for a single image. An entry
    the platform table does not know is refused by name, never skipped (it would release unvalidated)."""
    try:
        body = client.get_manifest(repo, tag_or_digest)[0]
    except NotFound:
        raise UserError(f"image {ref} not found in registry {host}; build and push it first (make push)") from None
    entries: list[tuple[str, dict[str, Any]]] = []
    for child in json.loads(body).get("manifests") or []:
        if not isinstance(child, dict) or not isinstance(child.get("digest"), str):
            raise UserError(f"image {ref}: index entry {str(child)[:60]!r} is no descriptor with a digest")
        if platforms.is_attestation(child):
            continue    # buildx's attestation entry: about the images, not one of them
        try:
            name = platforms.from_descriptor(child.get("platform")).name
        except platforms.UnknownPlatform as exc:
            raise UserError(f"image {ref}: entry {child.get('digest')}: {exc}") from None
        if (twin := next((c for n, c in entries if n == name), None)) is not None:
            raise UserError(f"image {ref}: index lists {name} twice ({twin.get('digest')}, {child.get('digest')}); "
                            "push it again with one image per platform")
        entries.append((name, child))
    return entries


def index_platforms(ref: str) -> list[str]:
    """The platforms of the image index `ref` names, in index order; [] for a single image (or a local one).
    Each is validated on its own: an entry the platform table does not know is refused by name."""
    if not has_registry(ref):
        return []
    host, repo, tag_or_digest = split_repo(ref)
    client = RegistryClient(host)
    client.ping()
    return [name for name, _ in _index_entries(client, host, repo, tag_or_digest, ref)]


def _pinned(ref: str, platform: str | None) -> tuple[RegistryClient, str, str, str]:
    """(client, host, repo, digest): the registry digest REF names; of an image index, its `platform` manifest's
    (which must then be named)."""
    host, repo, tag_or_digest = split_repo(ref)
    client = RegistryClient(host)
    client.ping()  # RegistryUnreachable (exit 2) when nothing answers
    digest = tag_or_digest if tag_or_digest.startswith("sha256:") else client.manifest_digest(repo, tag_or_digest)
    if digest is None:
        raise UserError(f"image {ref} not found in registry {host}; build and push it first (make push)")
    entries = _index_entries(client, host, repo, digest, f"{host}/{repo}@{digest}")
    if entries:
        if platform is None:
            raise UserError(f"image {ref} is an image index: validate each of its platforms "
                            f"({', '.join(name for name, _ in entries)})")
        digest = next((str(child["digest"]) for name, child in entries if name == platform), None)
        if digest is None:
            raise UserError(f"image {ref} has no {platform} image")
        body, media_type, _ = client.get_manifest(repo, digest)
        if media_type in INDEX_TYPES or "manifests" in json.loads(body):
            raise UserError(f"image {ref}: its {platform} entry {digest} is itself an index, not one platform's image; "
                            "push it again")
    return client, host, repo, digest


def pin(ref: str, platform: str | None = None) -> Resolved:
    """REF (in a registry) pinned to its digest, with the labels, env and platform its config declares, read from
    the registry alone: nothing is pulled (what a verdict about the digest is looked up with, validate.reuse)."""
    client, host, repo, digest = _pinned(ref, platform)
    config_digest = _config_digest(client, repo, digest)
    if config_digest is None:
        raise UserError(f"image {ref}: the manifest {digest} names no image config")
    config = _image_config(client.get_blob(repo, config_digest, limit=MAX_CONFIG_BYTES))
    if config is None:
        # Anyone who may push can write one; its labels and env could not be read as the image's.
        raise UserError(f"image {ref}: its config {config_digest} is not an image config (a JSON object whose "
                        "config.Labels, where present, maps names to strings and config.Env lists strings)")
    attrs = {"Config": config.get("config") or {}, "Os": config.get("os"), "Architecture": config.get("architecture"),
             "Variant": config.get("variant")}
    return _resolved(ref, f"{host}/{repo}@{digest}", digest, host, repo, attrs, platform)


def resolve(ref: str, log: Log, platform: str | None = None) -> Resolved:
    """Pin `ref` to a digest and make sure the engine holds exactly that image. An image index is
    pinned to the manifest of `platform`, which must then be named (one verdict per platform manifest)."""
    if not has_registry(ref):
        attrs = inspect_image(ref)
        if attrs is None:
            raise UserError(f"image {ref!r} not found locally; build it or name it with its registry")
        return _resolved(ref, ref, attrs["Id"], None, None, attrs)
    client, host, repo, digest = _pinned(ref, platform)
    run_ref = f"{host}/{repo}@{digest}"
    attrs = inspect_image(run_ref)
    if attrs is None and (attrs := _same_image_here(client, repo, digest)) is not None:
        # Pushed from this engine by skopeo, which leaves the engine no record of the registry's digest.
        log(f"{run_ref} names the config {attrs['Id']}, which this engine holds: running that image")
        run_ref = str(attrs["Id"])
    if attrs is None and (attrs := _from_layers_here(client, repo, digest)) is not None:
        # Built here, its config then rewritten in the registry (imagebuild.repro_config): nothing to pull.
        log(f"{run_ref}: this engine holds every layer of it; its config {attrs['Id']} loaded over them from the "
            "registry: running that image")
        run_ref = str(attrs["Id"])
    if attrs is None:
        log(f"pulling {run_ref}")
        proc = docker_cli.docker("pull", run_ref, timeout=PULL_TIMEOUT_S)
        if proc.returncode != 0:
            raise UserError(f"cannot pull {run_ref}: {proc.stderr.strip()[-300:]}")
        attrs = inspect_image(run_ref)
        if attrs is None:
            raise UserError(f"pulled {run_ref} but the engine does not show it")
    return _resolved(ref, run_ref, digest, host, repo, attrs, platform)


def _config_digest(client: RegistryClient, repo: str, digest: str) -> str | None:
    """The digest of the image config the manifest `digest` names; None for an index."""
    manifest = json.loads(client.get_manifest(repo, digest)[0])
    config = (manifest.get("config") or {}).get("digest") if isinstance(manifest, dict) else None
    return config if isinstance(config, str) else None


def _image_config(raw: bytes) -> dict[str, Any] | None:
    """The image config `raw` holds, None when it is no image config: not a JSON object, or its config's Labels
    or Env of another shape than the image spec's (a map of strings, a list of strings)."""
    try:
        config = json.loads(raw)
    except ValueError:      # not JSON, not UTF-8
        return None
    if not isinstance(config, dict):
        return None
    inner = {} if config.get("config") is None else config["config"]      # null: none given
    if not isinstance(inner, dict):
        return None
    labels = {} if inner.get("Labels") is None else inner["Labels"]
    env = [] if inner.get("Env") is None else inner["Env"]
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        return None
    return config if isinstance(env, list) and all(isinstance(e, str) for e in env) else None


def _held(config: str) -> dict[str, Any] | None:
    """The engine's image whose id is the config digest `config`, None when the engine holds none."""
    attrs = inspect_image(config)
    return attrs if attrs is not None and attrs.get("Id") == config else None


def _same_image_here(client: RegistryClient, repo: str, digest: str) -> dict[str, Any] | None:
    """The engine's image whose id is the config digest the manifest names: exactly the image the digest
    pins (the config names every layer by the digest of its content), so nothing needs pulling. None for
    an index or an image the engine does not hold."""
    config = _config_digest(client, repo, digest)
    return _held(config) if config is not None and config.startswith("sha256:") else None


def _from_layers_here(client: RegistryClient, repo: str, digest: str) -> dict[str, Any] | None:
    """The image `digest` pins, made in this engine from layers it already holds: the registry's config (read by
    its digest) `docker load`ed with no layer data. The engine takes each layer it holds by its content's digest
    (the config's rootfs.diff_ids) and refuses the load when one is missing, so the image it then has, whose id is
    the config's digest, is exactly the one the registry's digest pins (as _same_image_here finds it). What a
    build here has and the registry's normalised config (imagebuild.repro_config) would otherwise cost a pull of
    every layer. None when a layer is not here (or anything else fails): the image is pulled."""
    config = _config_digest(client, repo, digest)
    if config is None or not config.startswith("sha256:"):
        return None
    raw = client.get_blob(repo, config, limit=MAX_CONFIG_BYTES)          # checked against its digest
    parsed = _image_config(raw)
    rootfs = parsed.get("rootfs") if parsed is not None else None
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list) or not diff_ids or not all(isinstance(d, str) for d in diff_ids):
        return None
    name = f"{config.partition(':')[2]}.json"
    index = [{"Config": name, "RepoTags": None, "Layers": [f"{i}/layer.tar" for i in range(len(diff_ids))]}]
    with tempfile.TemporaryDirectory(prefix="buildtool-config-") as tmp:
        archive = Path(tmp) / "image.tar"
        with tarfile.open(archive, "w") as tar:
            for member, data in ((name, raw), ("manifest.json", json.dumps(index).encode())):
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        proc = docker_cli.docker("load", "-q", "-i", str(archive), timeout=120)
    return _held(config) if proc.returncode == 0 else None


def remove_run_containers(run_id: str, log: Log | None = None) -> None:
    """Remove every container a test run started (a safety net behind the fixtures). What cannot be listed or
    removed is a DockerError naming the run's label; with `log` (validate's clean-up after its run: the run's
    result, or the error that ended it, stays what is shown) it is a warning on the log instead."""
    try:
        docker_cli.remove_labelled(label_keys.IMAGETEST_RUN, run_id)
    except docker_cli.DockerError as exc:
        if log is None:
            raise
        log(f"warning: {exc}")
