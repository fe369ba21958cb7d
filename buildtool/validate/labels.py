"""What each label of an image must say, and what inside the image proves it.

Two sources of truth: the matrix cell the image names (its rendered Dockerfile gives every
static label exactly as the template writes it), and the image's contents for the labels that
state a fact (label_keys.FACTS: Python, framework, framework version, accelerator, CUDA,
version). image-tests/common/test_labels.py compares them; this module only says what to compare.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from buildtool.common.errors import UserError
from buildtool.contracts import frameworks, label_keys
from buildtool.contracts.image_labels import LabelError, standin_flag
from buildtool.matrix.plan import run_profile
from buildtool.matrix.schema import Cell, Matrix
from buildtool.render.dockerfiles import render_cell_dockerfile


def dockerfile_labels(text: str) -> dict[str, str]:
    """Every `LABEL k=v ...` of a Dockerfile (continuation lines joined, values unquoted as Docker does)."""
    labels: dict[str, str] = {}
    instruction = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not instruction and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            instruction += line[:-1] + " "
            continue
        instruction += line
        word, _, rest = instruction.strip().partition(" ")
        if word.upper() == "LABEL":
            for token in shlex.split(rest):
                key, sep, value = token.partition("=")
                if sep:
                    labels[key] = value
        instruction = ""
    return labels


def template_labels(matrix: Matrix, cell: Cell, templates_dir: Path) -> dict[str, str]:
    """The static labels the cell's template writes (what the matrix says the image is)."""
    return dockerfile_labels(render_cell_dockerfile(matrix, cell, templates_dir))


def version_proof(cell: Cell) -> str:
    """How the image proves its version label: the framework's release (pip cells, 2.13 -> 2.13.x) or
    the NGC container's own version variable; '' when neither applies."""
    try:
        framework, version = Version(cell.framework_version).release, Version(cell.version).release
    except InvalidVersion:
        return ""
    if framework[:len(version)] == version:
        return "framework-release"
    env = frameworks.get(cell.framework).container_version_env
    return f"env:{env}" if env else ""


def _canonical(text: str) -> str:
    """A JSON label in one spelling (sorted keys, compact), or the text itself when it is not JSON."""
    try:
        return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return text


def image_standin(labels: dict[str, str]) -> bool:
    """The image's stand-in flag (image_labels.standin_flag); UserError naming the label for a value it refuses."""
    try:
        return standin_flag(labels)
    except LabelError as exc:
        raise UserError(f"the image's {exc}; rebuild it with `buildtool build`") from None


def label_checks(matrix: Matrix, cell: Cell, labels: dict[str, str], templates_dir: Path) -> list[dict[str, Any]]:
    """One entry per label to check: its value on the image, the cell's value, the fact to prove inside."""
    standin = image_standin(labels)
    stated = template_labels(matrix, cell, templates_dir)
    if label_keys.RUN_PROFILE in labels:  # a build-time label, but it states the cell's run profile
        stated[label_keys.RUN_PROFILE] = json.dumps(run_profile(cell.run), sort_keys=True, separators=(",", ":"))
        labels = {**labels, label_keys.RUN_PROFILE: _canonical(labels[label_keys.RUN_PROFILE])}
    checks: list[dict[str, Any]] = []
    for key in sorted(set(stated) | (set(label_keys.FACTS) & set(labels))):
        fact = label_keys.FACTS.get(key, "")
        note = ""
        if standin and key in label_keys.UPSTREAM_CLAIMS:
            fact, note = "", "stand-in: describes the upstream image; the stand-in's own labels are checked"
        expected = version_proof(cell) if fact == "version" else ""
        if fact == "version" and not expected:
            fact = ""
        checks.append({"key": key, "value": labels.get(key), "cell_value": stated.get(key), "fact": fact,
                       "expected": expected, "note": note})
    return checks
