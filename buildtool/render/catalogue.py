"""docs/images.md: which images we offer, what each is for, and how to run it; and the frameworks.

Generated from the matrix, its framework folders (image-tests/<name>/, the framework table) and the
committed release manifests (docs/releases/*.json, written by `buildtool release`); no registry, no
engine, so it is deterministic and drift-checked like the Dockerfiles. Stand-in bases are test
fixtures and never appear. The frameworks section is where the documents list the frameworks (a
framework added is a folder and its cells, and this list follows), with the kinds their rows choose
from and what each means (contracts.frameworks LAUNCHERS and SHM_WORKERS, contracts.versions SCHEMES).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildtool.common.documents import render_document
from buildtool.contracts import frameworks
from buildtool.contracts.driver_rules import forward_compat_summary
from buildtool.contracts.gpu import min_driver
from buildtool.contracts.names import expand_tag
from buildtool.contracts.releases import RELEASES_DIR, latest_by_cell
from buildtool.contracts.versions import SCHEMES, ngc_release

if TYPE_CHECKING:
    from buildtool.matrix.schema import Cell, Matrix

CATALOGUE_PATH = "docs/images.md"


def _platforms_line(cell: Cell) -> str:
    """The cell's platforms and where each is validated: natively, under emulation (a CPU cell's other
    platforms on the amd64 runners), or on native GPU runners of that architecture (a GPU cell's)."""
    if not cell.multi_platform:
        return ", ".join(cell.platforms)
    how = ("each on native GPU runners of its architecture" if cell.needs_gpu else
           "linux/amd64 natively, the others under emulation (QEMU) on amd64 runners")
    return f"{', '.join(cell.platforms)} (one image index, one manifest per platform; validated {how})"


def _cell_view(cell: Cell, released: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the catalogue says about one cell; the words and layout are in templates/catalogue.md.j2."""
    latest = released.get(cell.key)
    gpu = None
    if cell.needs_gpu and cell.cuda:
        # NGC bases admit some older data-center drivers through CUDA forward compatibility: the text is
        # the one validate's refusals quote (contracts.driver_rules), so the page and the check agree.
        release = ngc_release(cell.base)
        gpu = {"cuda": cell.cuda, "min_driver": min_driver(cell.cuda),
               "forward_compat": forward_compat_summary(release) if release else ""}
    return {
        "cell": cell,
        "platforms": _platforms_line(cell),
        "tags": [f"{cell.name}:{expand_tag(t, cell.version, '<release>')}"
                 for t in [*cell.release_tags, *cell.moving_tags]],
        "released": None if not latest else {
            **latest,
            "tags": [f"{cell.name}:{t}" for t in latest["tags"]],
            "notes": f"{Path(RELEASES_DIR).relative_to('docs')}/{latest['release']}.md",
            "sbom": latest.get("sbom"),
            "repository": str(latest["pinned"]).rsplit("@", 1)[0],   # an index's SBOMs are on its platform digests
            "platforms": latest.get("platforms") or [],
        },
        "packages": [f"{n}=={v}" for n, v in cell.packages],
        "gpu": gpu,
        "run_command": f"docker run --rm -it {' '.join(cell.run.docker_flags())} <registry>/{cell.name}:{cell.version}",
    }


def _framework_views(matrix: Matrix) -> list[dict[str, Any]]:
    """Every framework of the matrix's table (its image-tests folders), in the table's order, with its images."""
    return [{"row": frameworks.get(name), "folder": f"image-tests/{name}/",
             "images": list(dict.fromkeys(c.name for c in matrix.cells if c.framework == name))}
            for name in frameworks.names()]


def _kinds() -> list[dict[str, Any]]:
    """The kinds a framework's row chooses from, each with what it means (the tables' own words)."""
    tables = [
        ("multinode.launcher", frameworks.LAUNCHERS, lambda row: row.multinode.launcher if row.multinode else None),
        ("local_versions", {name: scheme.description for name, scheme in SCHEMES.items()},
         lambda row: row.local_versions),
        ("shm_workers", frameworks.SHM_WORKERS, lambda row: row.shm_workers),
    ]
    rows = [frameworks.get(name) for name in frameworks.names()]
    return [{"key": key, "name": name, "description": description,
             "used_by": [row.title for row in rows if kind_of(row) == name]}
            for key, table, kind_of in tables for name, description in table.items()]


def render_catalogue(matrix: Matrix, released: dict[str, dict[str, Any]] | None = None) -> str:
    views = {cell.key: _cell_view(cell, released or {}) for cell in matrix.cells}
    images = []
    for name in matrix.image_names:
        cells = [views[c.key] for c in matrix.cells if c.name == name]
        images.append({"name": name, "use": cells[0]["cell"].use, "cells": cells})
    text = render_document("buildtool.render", "catalogue.md.j2", cells=list(views.values()), images=images,
                           frameworks=_framework_views(matrix), kinds=_kinds())
    return text.rstrip("\n") + "\n"


def catalogue_outputs(matrix: Matrix, root: Path | None = None) -> dict[str, bytes]:
    """The catalogue; with `root`, each cell also lists its newest release from docs/releases/."""
    released = latest_by_cell(root) if root is not None else {}
    return {CATALOGUE_PATH: render_catalogue(matrix, released).encode()}
