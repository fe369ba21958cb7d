"""Which platform (os/arch) a launcher runs an image on: named by --platform, or the cell's only one.

A multi-platform cell's image is an index with one validated manifest per platform; a multi-node job runs
one of them on every node (collectives across architectures are neither validated nor what users run), so
the platform of such a cell must be named: never chosen by default, never left to the scheduler to mix.
An image the matrix does not know has no known platforms: it must be named too (fail closed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from buildtool.common.errors import UserError
from buildtool.contracts import platforms

if TYPE_CHECKING:
    from buildtool.matrix.schema import Cell

ARCH_LABEL = "kubernetes.io/arch"     # well-known node labels (the kubelet sets them from GOOS/GOARCH)
OS_LABEL = "kubernetes.io/os"


def image_platforms(image: str) -> list[str] | None:
    """The platforms IMAGE holds in its registry: one for a single image (its config's), each entry's for an
    index; None when that cannot be read (no registry in the reference, or none answers), which leaves the
    choice to --platform."""
    from buildtool.common.refs import has_registry, split_repo
    from buildtool.registry.client import RegistryClient, RegistryError, RetryPolicy
    from buildtool.registry.image_index import read_children

    if not has_registry(image):
        return None
    try:
        host, repo, ref = split_repo(image)
        return list(read_children(RegistryClient(host, retry=RetryPolicy(attempts=2, timeout=15)), repo, ref,
                                  strict=True))
    except (RegistryError, UserError, OSError, ValueError):
        return None


def choose_platform(image: str, requested: str | None, cell: Cell | None,
                    held: list[str] | None = None) -> platforms.Platform:
    """The platform to launch IMAGE on (its matrix `cell`, None when the matrix does not know it; `held`: the
    platforms the image itself holds, image_platforms). A single image has one platform: it is the one, and it
    must be one of its cell's."""
    if not requested and held is not None and len(held) == 1:
        single = platforms.get(held[0])
        if cell is not None and single.name not in cell.platforms:
            raise UserError(f"{image} is a {single.name} image, and {cell.key} is built for "
                            f"{', '.join(cell.platforms)} only")
        return single
    if requested:
        try:
            chosen = platforms.get(requested)
        except platforms.UnknownPlatform as exc:
            raise UserError(f"--platform: {exc}") from None
        if cell is not None and chosen.name not in cell.platforms:
            raise UserError(f"--platform {chosen.name}: {cell.key} is built for {', '.join(cell.platforms)} only")
        return chosen
    if cell is None:
        raise UserError(f"{image} is no image of the matrix, so its platforms are unknown: pass --platform "
                        f"(one of {', '.join(platforms.KNOWN)})")
    if len(cell.platforms) > 1:
        raise UserError(f"{cell.key} is built for {', '.join(cell.platforms)}: pass --platform to say which "
                        "nodes run it (every node of a multi-node job runs the same platform's image)")
    return platforms.get(cell.platforms[0])


def node_selector(platform: platforms.Platform, given: dict[str, str]) -> dict[str, str]:
    """The pod's nodeSelector: the user's, and the platform's os and arch labels; a user's selector that
    names another arch or os is refused (the pods would land on nodes that cannot run the image)."""
    wanted = {ARCH_LABEL: platform.architecture, OS_LABEL: platform.os}
    for key, value in wanted.items():
        if key in given and given[key] != value:
            raise UserError(f"--node-selector {key}={given[key]} contradicts --platform {platform.name} "
                            f"({key}={value}); drop it or launch the {given[key]} platform")
    return {**given, **wanted}
