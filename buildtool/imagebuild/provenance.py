"""The SLSA provenance a push signs for each dev image (buildtool.contracts.provenance is the model).

What it states comes from what the build used, not from what it meant to use: the base name, digest and
stand-in flag from the pushed image's own labels (the ones release compares with), the revision and source
from its revision label, each lock file of the cell by its sha256 as committed now (the content key covers
the build context, so an image reused by content key was built from the same bytes), the docker client
and engine, buildtool and the uv the Dockerfiles install. Anything missing is an error naming it: a
provenance with a gap would be a signed guess.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from buildtool.common import docker_cli
from buildtool.common.errors import FailedError, UserError
from buildtool.contracts import label_keys
from buildtool.contracts.image_labels import ImageLabels, LabelError
from buildtool.contracts.names import check_full_revision
from buildtool.contracts.provenance import (
    BASE,
    BUILD_TYPE,
    BUILDER_ID_ENV,
    LOCK_PREFIX,
    TOOL_PREFIX,
    Provenance,
    parse_provenance,
)
from buildtool.imagebuild import aptlock
from buildtool.imagebuild.lock import lock_paths
from buildtool.matrix.plan import CellPlan

DOCKER_VERSION_TIMEOUT_S = 30


@dataclass(frozen=True)
class Built:
    """The pushed image as the registry serves it: its config's labels and platform."""

    labels: dict[str, str]
    platform: str          # os/architecture[/variant]


def builder_id() -> str:
    """DL_IMAGES_BUILDER_ID (a CI run's URL), else `local:<user>@<host>`."""
    named = os.environ.get(BUILDER_ID_ENV, "").strip()
    return named or f"local:{getpass.getuser()}@{socket.gethostname()}"


def rfc3339(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@lru_cache(maxsize=1)
def docker_versions() -> tuple[str, str]:
    """(client version, engine version) of the docker the builds run with; FailedError when unknown."""
    proc = docker_cli.docker("version", "--format", "{{json .}}", timeout=DOCKER_VERSION_TIMEOUT_S)
    try:
        data = json.loads(proc.stdout)
        client, server = str(data["Client"]["Version"]), str(data["Server"]["Version"])
    except (ValueError, KeyError, TypeError):
        raise FailedError(f"cannot read the docker client and engine versions from `docker version` "
                          f"({(proc.stderr or proc.stdout).strip()[:200]!r})") from None
    return client, server


def tools(root: Path) -> list[dict[str, Any]]:
    """The tools of the build as resolved dependencies: docker client and engine, buildtool, uv."""
    from importlib.metadata import PackageNotFoundError, version

    from buildtool.contracts.locks import UV_LOCK
    from buildtool.render.dockerfiles import TemplateError, uv_pin

    client, server = docker_versions()
    try:
        ours = version("dl-images-buildtool")
    except PackageNotFoundError:
        raise FailedError("buildtool's own version is unknown (dl-images-buildtool is not installed: run "
                          "`bash scripts/setup.sh`)") from None
    uv_lock = root / "templates" / UV_LOCK
    try:
        uv = uv_pin(root / "templates")["version"]
    except TemplateError as exc:
        raise FailedError(str(exc)) from None
    return [
        {"name": f"{TOOL_PREFIX}docker-client", "annotations": {"version": client}},
        {"name": f"{TOOL_PREFIX}docker-engine", "annotations": {"version": server}},
        {"name": f"{TOOL_PREFIX}buildtool", "annotations": {"version": ours}},
        {"name": f"{TOOL_PREFIX}uv", "digest": {"sha256": sha256_file(uv_lock)},
         "annotations": {"version": uv, "lock": f"templates/{UV_LOCK}"}},
    ]


def make_provenance(root: Path, matrix_path: Path, plan: CellPlan, built: Built, started: datetime,
                    finished: datetime, tool_list: list[dict[str, Any]]) -> Provenance:
    """The provenance of `plan`'s pushed image; FailedError naming what is missing or malformed."""
    cell = plan.cell
    try:
        labels = ImageLabels.parse(built.labels)
    except LabelError as exc:
        raise FailedError(f"{plan.dev_ref}: {exc}") from None
    try:
        revision = check_full_revision(labels.revision)
    except ValueError as exc:
        raise FailedError(f"{plan.dev_ref}: {label_keys.OCI_REVISION}: {exc}") from None
    algorithm, _, base_hex = labels.base_digest.partition(":")
    if algorithm != "sha256" or len(base_hex) != 64 or not labels.base_name:
        raise FailedError(f"{plan.dev_ref} names no base by name and sha256 digest ({label_keys.OCI_BASE_NAME}="
                          f"{labels.base_name!r}, {label_keys.OCI_BASE_DIGEST}={labels.base_digest!r}); rebuild it "
                          "with `buildtool build --force --push`")
    if labels.cell and labels.cell != cell.key:
        raise FailedError(f"{plan.dev_ref} is labelled {label_keys.CELL}={labels.cell}, not {cell.key}")
    locks = []
    # The Python locks, and for a cell with an apt step its apt lock, the base's package list it sits on and
    # the .debs' hashes (a multi-platform cell: the built platform's).
    platform = built.platform if cell.multi_platform else None
    apt = ((*aptlock.paths(root, cell, platform), aptlock.hashes_path(root, cell, platform))
           if aptlock.has_apt_step(cell) else ())
    files = [*lock_paths(root, cell, platform).values(), *apt]
    try:
        for path in files:
            locks.append({"name": f"{LOCK_PREFIX}{path.relative_to(root)}", "digest": {"sha256": sha256_file(path)}})
    except OSError as exc:
        raise UserError(f"{exc.filename}: cannot be read ({exc.strerror}); run `make lock FRAMEWORK={cell.key}`") \
            from None
    try:
        matrix_digest = "sha256:" + sha256_file(matrix_path)
    except OSError as exc:
        raise UserError(f"the matrix {matrix_path} cannot be read ({exc.strerror})") from None
    base = {"name": BASE, "uri": f"oci://{labels.base_name}", "digest": {"sha256": base_hex},
            "annotations": {"standin": bool(labels.standin_keys), "upstream": labels.base_upstream or cell.base}}
    predicate = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"cell": cell.key, "matrix_digest": matrix_digest, "revision": revision,
                                   "source": labels.source, "dockerfile": cell.dockerfile,
                                   "platform": built.platform},
            "internalParameters": {},
            "resolvedDependencies": [base, *locks, *tool_list],
        },
        "runDetails": {
            "builder": {"id": builder_id(), "version": {t["name"].removeprefix(TOOL_PREFIX): t["annotations"]["version"]
                                                        for t in tool_list if t["name"] == f"{TOOL_PREFIX}buildtool"}},
            "metadata": {"invocationId": f"urn:uuid:{uuid.uuid4()}", "startedOn": rfc3339(started),
                         "finishedOn": rfc3339(finished)},
        },
    }
    return parse_provenance(predicate, f"the provenance made for {plan.dev_ref}")
