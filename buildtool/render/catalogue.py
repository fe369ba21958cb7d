"""docs/images.md: which images we offer, what each is for, and how to run it.

Generated from the matrix and the committed release manifests (docs/releases/*.json,
written by `buildtool release`); no registry, no engine, so it is deterministic and
drift-checked like the Dockerfiles. Stand-in bases are test fixtures and never appear.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildtool.contracts.gpu import min_driver
from buildtool.contracts.releases import RELEASES_DIR, latest_by_cell
from buildtool.contracts.versions import ngc_release
from buildtool.matrix.plan import expand_tag

if TYPE_CHECKING:
    from buildtool.matrix.schema import Cell, Matrix

CATALOGUE_PATH = "docs/images.md"


def _tags(cell: Cell) -> str:
    immutable = [expand_tag(t, cell, "<release>") for t in cell.release_tags]
    moving = [expand_tag(t, cell, "<release>") for t in cell.moving_tags]
    return ", ".join(f"`{cell.name}:{t}`" for t in [*immutable, *moving])


def _run_command(cell: Cell) -> str:
    flags = " ".join(cell.run.docker_flags())
    return f"docker run --rm -it {flags} <registry>/{cell.name}:{cell.version}"


def _released(cell: Cell, released: dict[str, dict[str, Any]]) -> str:
    latest = released.get(cell.key)
    if not latest:
        return "- Released: not yet"
    tags = ", ".join(f"`{cell.name}:{t}`" for t in latest["tags"])
    return (f"- Released: {tags} in release {latest['release']}, digest `{latest['digest']}` "
            f"([notes]({Path(RELEASES_DIR).relative_to('docs')}/{latest['release']}.md))" + _sbom(latest))


def _sbom(latest: dict[str, Any]) -> str:
    """Where the released image's SBOM is: a referrer of its digest, readable by any OCI client."""
    if not latest.get("sbom"):
        return "\n- SBOM: none recorded for this release"
    return (f"\n- SBOM (CycloneDX JSON, attached to the digest): `{latest['sbom']}`; print it with "
            f"`buildtool sbom {latest['pinned']}` or fetch it with `oras pull` / `skopeo copy`")


def _gpu_lines(cell: Cell) -> list[str]:
    """A GPU image's CUDA and the host driver it needs (what `docker run --gpus` refuses without)."""
    if not cell.needs_gpu or not cell.cuda:
        return []
    note = (" (NGC's own requirement also admits some older datacenter drivers through CUDA forward "
            "compatibility)" if ngc_release(cell.base) else "")
    return [f"- CUDA: {cell.cuda}; host NVIDIA driver {min_driver(cell.cuda)} or newer{note}, "
            "and the NVIDIA Container Toolkit for `--gpus`"]


def render_catalogue(matrix: Matrix, released: dict[str, dict[str, Any]] | None = None) -> str:
    released = released or {}
    lines = [
        "<!-- GENERATED FILE - DO NOT EDIT. Rendered from matrix.yaml by `buildtool catalogue`"
        " (also `make render`); `make check` fails when it drifts. -->",
        "",
        "# Image catalogue",
        "",
        "Every image this project builds, one row per image version. Release tags follow",
        "`<name>:<version>-<release>` (never moved) and `<name>:<version>` (moves to the newest",
        "release of that version); the default version of each image also gets `latest`.",
        "",
        "| Image | Version | Framework | Python | Accelerator | Base | Use |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in matrix.cells:
        default = " (default)" if cell.default else ""
        lines.append(
            f"| `{cell.name}` | {cell.version}{default} | {cell.framework} {cell.framework_version} | "
            f"{cell.python} | {cell.accelerator} | `{cell.base}` | {cell.use} |")
    for name in matrix.image_names:
        cells = [c for c in matrix.cells if c.name == name]
        lines += ["", f"## {name}", "", cells[0].use, ""]
        for cell in cells:
            packages = ", ".join(f"{n}=={v}" for n, v in cell.packages) or "none"
            lines += [
                f"### {cell.key}",
                "",
                f"- Tags: {_tags(cell)}",
                _released(cell, released),
                f"- Base: `{cell.base}`",
                f"- Framework: {cell.framework} {cell.framework_version}; Python {cell.python}",
                f"- Extra packages: {packages}",
                f"- Image tests: {', '.join(cell.tests)}",
                f"- Needs a GPU: {'yes' if cell.needs_gpu else 'no'}",
                *_gpu_lines(cell),
                "- Run it with the flags it is validated with:",
                "",
                "  ```sh",
                f"  {_run_command(cell)}",
                "  ```",
                "",
            ]
    return "\n".join(lines).rstrip("\n") + "\n"


def catalogue_outputs(matrix: Matrix, root: Path | None = None) -> dict[str, bytes]:
    """The catalogue; with `root`, each cell also lists its newest release from docs/releases/."""
    released = latest_by_cell(root) if root is not None else {}
    return {CATALOGUE_PATH: render_catalogue(matrix, released).encode()}
