"""`buildtool bundle IMAGE DEST`: an OCI bundle of the image for SLURM's own containers (`srun --container`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildtool.cli.console import project_or_none
from buildtool.cli.options import JsonOption, MatrixOption, log, path_of, say
from buildtool.contracts.arguments import check_arguments

if TYPE_CHECKING:
    from buildtool.launch.bundle import Bundle

ImageArgument = Annotated[str, typer.Argument(help="The image, as a registry reference (a dev or release tag).")]
DestArgument = Annotated[Path, typer.Argument(parser=path_of("DEST"),
    help="The bundle folder to create, where the cluster's nodes will "
         "find it (a shared file system).")]
ShmSizeOption = Annotated[str | None, typer.Option(help="/dev/shm size (default: the run profile's).")]
UlimitOption = Annotated[list[str] | None, typer.Option(help="NAME=SOFT[:HARD] over the run profile's ulimits, for "
                                                             "nodes that cannot grant one (e.g. memlock=8388608; "
                                                             "-1: unlimited).")]
HostsOption = Annotated[Path | None, typer.Option(parser=path_of("--hosts"),
    help="A hosts file to bind at /etc/hosts (default: the node's "
         "/etc/hosts and /etc/resolv.conf).")]
JobsDirOption = Annotated[Path | None, typer.Option(parser=path_of("--jobs-dir"),
    help="Where jobs write their scripts, seen read-only inside "
         "(default: DEST/jobs, writable by everyone).")]
WritableOption = Annotated[bool, typer.Option(help="A writable root file system (default: read-only).")]
ForceOption = Annotated[bool, typer.Option(help="Replace DEST when it is a bundle (or an empty folder).")]
PlatformOption = Annotated[str | None, typer.Option(
    help="The platform to bundle (os/arch, e.g. linux/arm64: that manifest of an image index), the nodes' "
         "architecture. Default: the cell's only platform; a multi-platform cell's must be named.")]


def bundle(
    image: ImageArgument,
    dest: DestArgument,
    shm_size: ShmSizeOption = None,
    ulimit: UlimitOption = None,
    hosts: HostsOption = None,
    jobs_dir: JobsDirOption = None,
    writable: WritableOption = False,
    force: ForceOption = False,
    platform: PlatformOption = None,
    json_out: JsonOption = False,
    matrix: MatrixOption = None,
) -> None:
    """An OCI bundle of IMAGE for `srun --container` (`buildtool slurm --runtime oci`), run-profile ready."""
    check_arguments("bundle", locals())   # every argument first (issue 37)
    from buildtool.launch.arch import choose_platform, image_platforms
    from buildtool.launch.bundle import BundleRequest, Profile, make_bundle, parse_ulimits
    from buildtool.launch.multinode import cell_for_image

    project = project_or_none(matrix)   # outside a checkout: the image's own label is the profile
    # A matrix that does not load, or a tag that names no cell of a matrix image, stops here.
    cell = cell_for_image(project.load(), image) if project is not None else None
    fallback = None
    if cell is not None:   # its run profile, which the bundle takes unless the image's label says more
        run = cell.run
        fallback = Profile(shm_size=run.shm_size, ulimits=run.ulimits, gpus=run.gpus != "none",
                           ipc_host=run.ipc == "host", source=f"the matrix cell {cell.key}")
    overrides = parse_ulimits(ulimit or [])
    chosen = choose_platform(image, platform, cell, None if platform else image_platforms(image))
    made = make_bundle(BundleRequest(image, dest, chosen, fallback=fallback, shm_size=shm_size, ulimits=overrides,
                                     hosts=hosts, jobs_dir=jobs_dir, read_only=not writable, force=force), log=log)
    _print_bundle(made, json_out)


def _print_bundle(made: Bundle, json_out: bool) -> None:
    if json_out:
        from dataclasses import asdict

        say(json.dumps(asdict(made), indent=1))
        return
    from buildtool.launch.bundle import limit_text

    limits = ", ".join(f"{k}={limit_text(v)}" for k, v in made.ulimits.items()) or "none"
    say(f"{made.path}: {made.image}@{made.digest} ({made.platform})")
    say(f"  /dev/shm {made.shm_size}, ulimits {limits}, root {'read-only' if made.read_only else 'writable'}, "
        f"hosts {made.hosts}, jobs in {made.jobs_dir} (profile: {made.profile_source}; {made.seconds:.0f} s)")
