"""The Docker engine side of validation: the image pinned to a digest (pulled so the engine runs
exactly that digest) with its labels and env, and the removal of a run's containers. The docker
client is the one DOCKER_CLIENT chooses (buildtool.common.docker_cli).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from buildtool.common import docker_cli
from buildtool.common.errors import UserError
from buildtool.common.refs import has_registry, split_repo
from buildtool.contracts import label_keys
from buildtool.registry.client import RegistryClient

PULL_TIMEOUT_S = 1800

Log = Callable[[str], None]


def _inspect(ref: str) -> dict[str, Any] | None:
    proc = docker_cli.docker("image", "inspect", ref, timeout=60)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)[0]


def _config(attrs: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, env) of an inspected image."""
    config = attrs.get("Config") or {}
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    return config.get("Labels") or {}, env


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


def resolve(ref: str, log: Log) -> Resolved:
    """Pin `ref` to a digest and make sure the engine holds exactly that image."""
    if not has_registry(ref):
        attrs = _inspect(ref)
        if attrs is None:
            raise UserError(f"image {ref!r} not found locally; build it or name it with its registry")
        return Resolved(ref, ref, attrs["Id"], None, None, *_config(attrs))
    host, repo, tag_or_digest = split_repo(ref)
    client = RegistryClient(host)
    client.ping()  # RegistryUnreachable (exit 2) when nothing answers
    digest = tag_or_digest if tag_or_digest.startswith("sha256:") else client.manifest_digest(repo, tag_or_digest)
    if digest is None:
        raise UserError(f"image {ref} not found in registry {host}; build and push it first (make push)")
    run_ref = f"{host}/{repo}@{digest}"
    attrs = _inspect(run_ref)
    if attrs is None:
        attrs = _same_image_here(client, repo, digest)
        if attrs is not None:
            # Pushed from this engine by skopeo, which leaves the engine no record of the registry's digest.
            log(f"{run_ref} names the config {attrs['Id']}, which this engine holds: running that image")
            return Resolved(ref, str(attrs["Id"]), digest, host, repo, *_config(attrs))
        log(f"pulling {run_ref}")
        proc = docker_cli.docker("pull", run_ref, timeout=PULL_TIMEOUT_S)
        if proc.returncode != 0:
            raise UserError(f"cannot pull {run_ref}: {proc.stderr.strip()[-300:]}")
        attrs = _inspect(run_ref)
        if attrs is None:
            raise UserError(f"pulled {run_ref} but the engine does not show it")
    return Resolved(ref, run_ref, digest, host, repo, *_config(attrs))


def _same_image_here(client: RegistryClient, repo: str, digest: str) -> dict[str, Any] | None:
    """The engine's image whose id is the config digest the manifest names: exactly the image the digest
    pins (the config names every layer by the digest of its content), so nothing needs pulling. None for
    an index or an image the engine does not hold."""
    manifest = json.loads(client.get_manifest(repo, digest)[0])
    config = (manifest.get("config") or {}).get("digest") if isinstance(manifest, dict) else None
    if not isinstance(config, str) or not config.startswith("sha256:"):
        return None
    attrs = _inspect(config)
    return attrs if attrs is not None and attrs.get("Id") == config else None


def remove_run_containers(run_id: str) -> None:
    """Remove every container a test run started (a safety net behind the fixtures)."""
    docker_cli.remove_labelled(label_keys.IMAGETEST_RUN, run_id)
