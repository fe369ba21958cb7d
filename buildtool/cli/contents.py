"""CLI commands about what images contain: `lock`, `sbom`, `diff`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildtool.cli.console import printable, project_or_none
from buildtool.cli.options import FrameworkOption, JsonOption, MatrixOption, find_project, log, say
from buildtool.common.errors import UserError
from buildtool.contracts.arguments import check_arguments

if TYPE_CHECKING:
    from buildtool.attest.keys import TrustedKeys


def lock(
    framework: FrameworkOption = None,
    package: Annotated[list[str] | None, typer.Option(
        "--package", "-p",
        help="Move only this Python package (repeatable, or a comma list); other pins are kept. "
             "Default: refresh every package.")] = None,
    matrix: MatrixOption = None,
) -> None:
    """Resolve FRAMEWORK's cells (default all) with uv and write their locks beside the Dockerfiles
    (hashes for every file; NGC cells resolved against their base's packages and PIP_CONSTRAINT), and
    (without --package) each pip cell's apt.lock, resolved inside its base, then re-render its Dockerfile.
    Needs the package index; NGC cells and apt locks also the engine, the base (BASE_MIRROR) and Debian's archive."""
    check_arguments("lock", locals())   # every argument first (issue 37)
    from buildtool.cli.generate import all_outputs
    from buildtool.common.files import write_changed
    from buildtool.imagebuild import aptlock
    from buildtool.imagebuild.bases import fill_bases, is_loopback_registry
    from buildtool.imagebuild.lock import is_ngc, lock_cells, write_uv_lock
    from buildtool.matrix.plan import Settings, mirror_base
    from buildtool.render.dockerfiles import write_outputs

    project = find_project(matrix)
    cells = project.load().select(framework or "all")
    settings = Settings.from_env()
    packages = tuple(p for item in (package or []) for p in item.replace(",", " ").split())
    if not packages:
        changed = write_uv_lock(project.templates)
        if changed:
            say(f"wrote {changed.relative_to(project.root)}")
    bases = {c.key: mirror_base(c.base, settings.base_mirror) for c in cells if is_ngc(c)}
    apt_keys = {c.key for c in cells if aptlock.has_apt_step(c)} if not packages else set()
    # As `build` does: the bases (NGC stand-ins, Debian) are made in a local mirror when missing.
    chosen = [c for c in cells if c.key in bases or c.key in apt_keys]
    if chosen and settings.base_mirror and is_loopback_registry(settings.base_mirror):
        fill_bases(chosen, settings.base_mirror, force=False, log=log, log_dir=project.root / "build-logs",
                   templates=project.templates)
    # All or nothing per cell: its Python and apt locks are all resolved before any file of it is written (a base
    # out of reach used to stop the apt lock after the Python locks were written, the Dockerfile not re-rendered).
    for result in lock_cells(project.root, cells, bases, packages, log, write=False):
        cell = next(c for c in cells if c.key == result.cell)
        texts = dict(result.texts)
        if cell.key in apt_keys:
            texts.update(aptlock.lock_texts(project.root, cell, mirror_base(cell.base, settings.base_mirror), log))
        written = write_changed(texts)
        for path in written:
            say(f"wrote {path.relative_to(project.root)}")
        if not written:
            log(f"[{result.cell}] lock up to date ({result.packages} packages)")
        if cell.key in apt_keys:   # the Dockerfiles pin what the apt locks say
            for rel in write_outputs(project.root, all_outputs(project, project.load())):
                say(f"wrote {rel}")
    log("run `make render` if you changed templates, then commit the locks with the matrix change")


def sbom_trust(host: str) -> TrustedKeys:
    """Whose signed SBOMs `sbom` and `diff` show: the builder keys of the project's trusted keys file, this
    machine's builder key, and its dev key on a loopback registry (as a build trusts cache sources)."""
    from buildtool.attest.keys import BUILDER, cache_trust, signing_key
    from buildtool.common.refs import is_loopback_host

    project = project_or_none(None)   # outside a project: no trusted keys file, only this machine's keys
    root = project.root if project is not None else Path.cwd()
    try:
        own = signing_key(log, create_dev=False, role=BUILDER).key.public()
    except UserError:
        own = None
    return cache_trust(root, own, is_loopback_host(host))


def sbom(
    image: Annotated[str, typer.Argument(help="An image in a registry: REPO:TAG or REPO@sha256:...")],
) -> None:
    """Print IMAGE's SBOM (CycloneDX JSON, attached to its digest in the registry) on stdout."""
    check_arguments("sbom", locals())   # every argument first (issue 37)
    from buildtool.common import argcheck
    from buildtool.common.errors import FailedError
    from buildtool.registry.client import RegistryClient, RegistryError
    from buildtool.sbom.signing import read_signed_sbom

    ref = argcheck.reference("IMAGE", image)   # cut, escaped, no password echoed (issue 37)
    if not ref.domain:
        raise UserError(f"{image!r} names no registry; SBOMs live in a registry, e.g. 127.0.0.1:5000/{ref.path}")
    trusted = sbom_trust(ref.domain)
    client = RegistryClient(ref.registry)
    digest = ref.digest or client.manifest_digest(ref.repository, ref.ref_in_repo)
    if not digest:
        raise UserError(f"{image}: no such tag in {ref.registry}/{ref.repository}")
    try:
        found = read_signed_sbom(client, ref.repository, digest, trusted)
    except RegistryError as exc:
        raise FailedError(str(exc)) from None
    if found is None:
        raise FailedError(f"{ref.name}@{digest} has no SBOM attached; `buildtool build --push` attaches one")
    document, artifact = found
    log(f"SBOM {artifact} of {digest}")
    say(json.dumps(document, indent=1, sort_keys=True))   # the document as it is (rich made `:ok:` an emoji)


def diff(
    image_a: Annotated[str, typer.Argument(help="The image before (REPO:TAG, REPO@sha256:... or a local image).")],
    image_b: Annotated[str, typer.Argument(help="The image after.")],
    as_json: JsonOption = False,
    probe_timeout: Annotated[int, typer.Option(
        "--probe-timeout", min=1, help="Seconds the package listing may take in an image without an SBOM.")] = 180,
) -> None:
    """Show what changed between two images: framework, Python, CUDA and base first, then removed,
    changed and added Python and Debian packages. Each image's packages come from the SBOM attached
    to its digest; an image without one (a base, an upstream image, a local image) is probed in a
    throw-away container without network (pulled first when needed), with the SBOM's own listing."""
    check_arguments("diff", locals())   # every argument first (issue 37)
    from buildtool.imagebuild.image_diff import compared, read_side

    project = project_or_none(None)   # outside a project: the toolkit's listing
    root = project.root if project is not None else None
    before = read_side(image_a, root, probe_timeout, trusted=_trust_of(image_a))
    after = read_side(image_b, root, probe_timeout, trusted=_trust_of(image_b))
    changes = compared(before, after)
    if as_json:
        say(json.dumps({"before": before.to_json(), "after": after.to_json(),   # as it is, as sbom prints
                        "changes": [c.to_json() for c in changes]}, indent=1))
        return
    # Each control character escaped: a probed image's package names and versions are the image's own text.
    log(printable(f"before: {before.describe()}"))
    log(printable(f"after: {after.describe()}"))
    for change in changes:
        say(printable(change.line()))
    counts = {k: sum(1 for c in changes if c.kind == k and c.scope != "fact") for k in ("added", "removed", "changed")}
    log(f"{counts['removed']} removed, {counts['changed']} changed, {counts['added']} added packages"
        if changes else "no differences in the packages")


def _trust_of(image: str) -> TrustedKeys:
    from buildtool.common.refs import parse_reference

    return sbom_trust(parse_reference(image).domain or "")   # a reference: check_arguments parsed it
