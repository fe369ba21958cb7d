"""CLI commands about what images contain: `lock`, `sbom`, `diff`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from buildtool.cli.options import FrameworkOption, JsonOption, MatrixOption, find_project, log, say
from buildtool.cli.options import out as stdout

if TYPE_CHECKING:
    from buildtool.registry.sbom import Contents


def register(app: typer.Typer) -> None:
    app.command()(lock)
    app.command()(sbom)
    app.command()(diff)


def lock(
    framework: FrameworkOption = None,
    package: Annotated[list[str] | None, typer.Option(
        "--package", "-p",
        help="Move only this package (repeatable); other pins are kept. Default: refresh every package.")] = None,
    matrix: MatrixOption = None,
) -> None:
    """Resolve FRAMEWORK's cells (default all) with uv and write their locks beside the Dockerfiles
    (hashes for every file; NGC cells resolved against their base's packages and PIP_CONSTRAINT).
    Needs the package index; NGC cells also the engine and their base (BASE_MIRROR)."""
    from buildtool.build.bases import fill_bases, is_loopback_registry
    from buildtool.build.lock import is_ngc, lock_cells, write_uv_lock
    from buildtool.matrix.plan import Settings, mirror_base

    project = find_project(matrix)
    cells = project.load().select(framework or "all")
    settings = Settings.from_env()
    packages = tuple(p for item in (package or []) for p in item.replace(",", " ").split())
    if not packages:
        changed = write_uv_lock(project.templates)
        if changed:
            say(f"wrote {changed.relative_to(project.root)}")
    bases = {c.key: mirror_base(c.base, settings.base_mirror) for c in cells if is_ngc(c)}
    if bases and settings.base_mirror and is_loopback_registry(settings.base_mirror):
        # As `build` does: stand-ins for NGC bases are made in a local mirror when missing.
        fill_bases([c for c in cells if c.key in bases], settings.base_mirror, force=False, log=log,
                   log_dir=project.root / "build-logs")
    for result in lock_cells(project.root, cells, bases, packages, log):
        for rel in result.changed:
            say(f"wrote {rel}")
        if not result.changed:
            log(f"[{result.cell}] lock up to date ({result.packages} packages)")
    log("run `make render` if you changed templates, then commit the locks with the matrix change")


def _image_sbom(image: str) -> tuple[dict, str, str]:
    """(document, artifact digest, image digest) of IMAGE's SBOM; exit 1 when it has none."""
    from buildtool.common.errors import FailedError, UserError
    from buildtool.common.refs import ReferenceError, parse_reference
    from buildtool.registry.client import RegistryClient
    from buildtool.registry.sbom import load_sbom

    try:
        ref = parse_reference(image)
    except ReferenceError as exc:
        raise UserError(f"{image!r} is not an image reference ({exc}); name one like "
                        "127.0.0.1:5000/pytorch-cpu:2.13 or REPO@sha256:...") from None
    if not ref.domain:
        raise UserError(f"{image!r} names no registry; SBOMs live in a registry, e.g. 127.0.0.1:5000/{ref.path}")
    client = RegistryClient(ref.registry)
    digest = ref.digest or client.manifest_digest(ref.repository, ref.ref_in_repo)
    if not digest:
        raise UserError(f"{image}: no such tag in {ref.registry}/{ref.repository}")
    found = load_sbom(client, ref.repository, digest)
    if found is None:
        raise FailedError(f"{ref.name}@{digest} has no SBOM attached; `buildtool build --push` attaches one")
    return found[0], found[1], digest


def sbom(
    image: Annotated[str, typer.Argument(help="An image in a registry: REPO:TAG or REPO@sha256:...")],
) -> None:
    """Print IMAGE's SBOM (CycloneDX JSON, attached to its digest in the registry) on stdout."""
    document, artifact, digest = _image_sbom(image)
    log(f"SBOM {artifact} of {digest}")
    stdout.print(json.dumps(document, indent=1, sort_keys=True), markup=False, highlight=False)


def _summary(contents: Contents) -> str:
    return f"{len(contents.python)} Python and {len(contents.apt)} Debian packages"


def diff(
    image_a: Annotated[str, typer.Argument(help="The image before (REPO:TAG or REPO@sha256:...).")],
    image_b: Annotated[str, typer.Argument(help="The image after.")],
    as_json: JsonOption = False,
) -> None:
    """Show what changed between two images' SBOMs: framework, Python, CUDA and base first, then
    added, removed and changed Python and Debian packages."""
    from buildtool.registry.sbom import contents, diff

    before_doc, _, before_digest = _image_sbom(image_a)
    after_doc, _, after_digest = _image_sbom(image_b)
    before, after = contents(before_doc), contents(after_doc)
    changes = diff(before, after)
    if as_json:
        stdout.print(json.dumps({"before": {"image": image_a, "digest": before_digest},
                                 "after": {"image": image_b, "digest": after_digest},
                                 "changes": [c.to_json() for c in changes]}, indent=1),
                     markup=False, highlight=False)
        return
    log(f"{image_a} ({_summary(before)}) -> {image_b} ({_summary(after)})")
    for change in changes:
        say(change.line())
    counts = {k: sum(1 for c in changes if c.kind == k and c.scope != "fact") for k in ("added", "removed", "changed")}
    log(f"{counts['added']} added, {counts['removed']} removed, {counts['changed']} changed packages"
        if changes else "no differences in the packages")
