"""What the launch commands (k8s, slurm, bundle, scaling) take from the matrix, or a bundle's record,
about the image they launch: its /dev/shm size, its platform, its framework. An option given on the
command line wins; an image the matrix does not know must have it given, never a default."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from buildtool.cli.console import project_or_none
from buildtool.cli.options import find_project
from buildtool.common.errors import UserError

if TYPE_CHECKING:
    from buildtool.contracts import platforms as contracts_platforms
    from buildtool.contracts.frameworks import Framework


def shm_for(image: str, shm_size: str | None, matrix: Path | None, runtime: str = "") -> str:
    """The /dev/shm size to launch IMAGE with, unless given: the one its bundle was made with (its record; slurm's
    --runtime oci, where IMAGE is the bundle folder), else its cell's run profile's."""
    if shm_size:
        return shm_size
    if runtime == "oci":
        from buildtool.launch.bundle import META_FILE, read_meta

        meta = read_meta(Path(image))
        if meta is None or not isinstance(meta.get("shm_size"), str):
            raise UserError(f"no bundle record ({META_FILE}) in {image} on this machine, so the bundle's /dev/shm size "
                            "is unknown; pass --shm-size (the size it was made with)")
        return str(meta["shm_size"])
    from buildtool.launch.multinode import cell_for_image

    if image.startswith("/"):
        raise UserError(f"{image} is a file, not a registry image: the matrix has no run profile for it; "
                        "pass --shm-size")
    loaded = find_project(matrix).load()
    cell = cell_for_image(loaded, image)
    if cell is None:
        raise UserError(f"{image} is no image of the matrix ({', '.join(loaded.image_names)}), so it has no run "
                        "profile to take /dev/shm from; pass --shm-size")
    return cell.run.shm_size


def platform_for(image: str, platform: str | None, matrix: Path | None) -> contracts_platforms.Platform:
    """The platform to launch IMAGE on: --platform, else its matrix cell's only one (launch.arch)."""
    from buildtool.launch.arch import choose_platform, image_platforms
    from buildtool.launch.multinode import cell_for_image

    project = project_or_none(matrix)    # outside a checkout: nothing knows the image's platforms
    cell = None
    if project is not None and not image.startswith("/"):
        try:
            cell = cell_for_image(project.load(), image)
        except UserError:
            if platform is None:    # a matrix image whose tag names no cell: said so, never its default cell's
                raise
    return choose_platform(image, platform, cell, None if platform else image_platforms(image))


def framework_for(image: str, framework: str | None, matrix: Path | None) -> Framework:
    """The framework whose multi-node check runs in IMAGE: its matrix cell's, else --framework; never a default."""
    from buildtool.contracts import frameworks
    from buildtool.launch.multinode import cell_for_image

    try:
        project = find_project(matrix)
    except UserError:
        if framework is None:
            raise
        project = None     # outside a checkout: this checkout's framework table
    # Loading the matrix also makes its image-tests folders the framework table.
    loaded = project.load() if project is not None else None
    cell = None
    if loaded is not None and not image.startswith("/"):
        try:
            cell = cell_for_image(loaded, image)
        except UserError:
            if framework is None:   # a matrix image whose tag names no cell: said so, never its default cell's
                raise
            # ... unless --framework says it, as --shm-size does for its /dev/shm
    if cell is not None:
        if framework is not None and framework != cell.framework:
            raise UserError(f"--framework {framework}, but {image} is an image of {cell.framework} (the matrix cell "
                            f"{cell.key}); leave --framework out")
        name = cell.framework
    elif framework is None:
        what = "a file, not a registry image" if image.startswith("/") else "no image of the matrix"
        raise UserError(f"{image} is {what}, so its framework is unknown; pass --framework NAME "
                        f"({', '.join(frameworks.names())}) to say whose multi-node check runs in it")
    else:
        name = framework
    try:
        return frameworks.get(name)
    except KeyError:
        raise UserError(f"--framework {name!r} is no framework; one of {', '.join(frameworks.names())} (a framework "
                        "is a folder image-tests/<name>/ with its framework.yaml)") from None
