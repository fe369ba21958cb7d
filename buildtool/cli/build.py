"""CLI commands `build` and `bases`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from buildtool.attest.dsse import PrivateKey
    from buildtool.imagebuild.builder import CellResult

from buildtool.cli.console import printable
from buildtool.cli.options import (
    FrameworkOption,
    JsonOption,
    MatrixOption,
    RevisionOption,
    TsaOption,
    err,
    find_project,
    log,
    out,
    path_of,
    say,
)
from buildtool.contracts.arguments import check_arguments


def _builder_key() -> PrivateKey:
    """The key a push signs provenance and SBOMs with: DL_IMAGES_BUILDER_KEY, else the local dev key."""
    from buildtool.attest.keys import BUILDER, signing_key

    found = signing_key(log, role=BUILDER)
    if found.dev:
        log(f"signing provenance and SBOMs with the {found.source}: release trusts it only with --trust-local-key")
    return found.key


PushOption = Annotated[bool, typer.Option("--push", help="Push dev tags and verify the registry's digest.")]
ForceOption = Annotated[bool, typer.Option("--force", help="Rebuild even when the content key is unchanged.")]
JobsOption = Annotated[int, typer.Option("--jobs", "-j", min=1, max=16, envvar="BUILD_JOBS",
                                        help="Cells built at once.")]
FillBasesOption = Annotated[bool, typer.Option("--fill-bases/--no-fill-bases",
                                               help="When BASE_MIRROR is a loopback registry, create missing bases "
                                                    "there first (as `buildtool bases`).")]
LogDirOption = Annotated[Path | None, typer.Option(
    "--log-dir", parser=path_of("--log-dir"), help="Per-cell build logs (default: the project's build-logs/).")]
RegistryCacheOption = Annotated[bool, typer.Option(
    "--registry-cache/--no-registry-cache", envvar="REGISTRY_CACHE",
    help="Take unchanged layers from the newest earlier dev images of each cell in the registry (only "
         "those whose provenance a trusted builder key signed).")]
PushWithOption = Annotated[str, typer.Option(
    "--push-with", envvar="PUSH_WITH",
    help="Who uploads a built image: auto (the engine when the build took layers from the registry, "
         "else skopeo, whose compression uses every core), engine or skopeo.")]
BasesForceOption = Annotated[bool, typer.Option("--force", help="Rebuild stand-ins that exist (Debian bases are kept: "
                                                                "a new one changes every image's content key).")]
PlatformOption = Annotated[list[str] | None, typer.Option(
    "--platform", help="Only these platforms of a multi-platform cell (os/arch, repeatable or a comma list). Default "
                       "without --push: this machine's; with --push every platform (the dev tag names the index "
                       "over all), which --platform cannot narrow.")]
MirrorOption = Annotated[str | None, typer.Option("--mirror", help="Registry to fill (default: BASE_MIRROR, "
                                                                   "else 127.0.0.1:5000).")]


def build(
    framework: FrameworkOption = None,
    push: PushOption = False,
    force: ForceOption = False,
    jobs: JobsOption = 2,
    fill: FillBasesOption = True,
    log_dir: LogDirOption = None,
    registry_cache: RegistryCacheOption = True,
    push_with: PushWithOption = "auto",
    platform: PlatformOption = None,
    tsa: TsaOption = None,
    revision: RevisionOption = None,
    as_json: JsonOption = False,
    matrix: MatrixOption = None,
) -> None:
    """Build FRAMEWORK's cells with BuildKit, tag them <registry>/<name>-dev:<sha>-<version>, and skip or
    retag what is already built (content key). A multi-platform cell: without --push this machine's platform
    (--platform names others), with --push every platform and the index over them. Exit 1 when any cell failed."""
    check_arguments("build", locals())   # every argument first (issue 37)
    from buildtool.attest.keys import cache_trust
    from buildtool.common import tsa as timestamps
    from buildtool.common.documents import plural
    from buildtool.common.errors import FailedError
    from buildtool.contracts import platforms
    from buildtool.imagebuild.bases import is_loopback_registry
    from buildtool.imagebuild.builder import Builder, BuildOptions
    from buildtool.matrix.plan import Settings, plan_matrix

    timestamps.check_writer(tsa, writes=push)   # DL_IMAGES_TSA_*, with the arguments: not after the build
    project = find_project(matrix)
    loaded = project.load()
    cells = loaded.select(framework)
    settings = Settings.from_env()
    revision = project.revision(revision)
    plans = plan_matrix(cells, settings, revision)
    # A --log-dir given is the current folder's, as every path option; left out, the project's build-logs/.
    log_dir = project.root / "build-logs" if log_dir is None else log_dir.absolute()
    named = tuple(dict.fromkeys(p.strip() for item in platform or [] for p in item.split(",") if p.strip()))
    # A local build makes what this machine runs (a foreign platform's stand-in can be GBs: pytorch-ngc:25.10's arm64
    # one carries PyPI's CUDA torch); a push makes the whole index.
    chosen = named or (() if push else (platforms.host().name,))
    options = BuildOptions(push=push, force=force, jobs=jobs, log_dir=log_dir, fill_bases=fill, platforms=chosen,
                           builder_key=_builder_key, matrix=project.matrix_path, registry_cache=registry_cache,
                           push_with=push_with,
                           # the keys whose provenance lets a build take layers from an earlier dev image
                           cache_trust=lambda own: cache_trust(project.root, own,
                                                               is_loopback_registry(settings.registry)))
    with build_progress([p.cell.key for p in plans]) as progress, timestamps.using(tsa):
        results = Builder(project.root, loaded.source, settings, revision, options, log, progress).run(plans)
    if as_json:
        # Straight to the stream: rich made an emoji code in a message (`:ok:`) an emoji, and JSON is not text to style.
        say(json.dumps({"results": [r.to_json() for r in results]}, indent=2))
    else:
        _print_results(results, revision)
    failed = [r.cell for r in results if r.result == "failed"]
    if failed:
        raise FailedError(f"{len(failed)} of {plural(len(results), 'cell')} failed: {', '.join(failed)}")


def _print_results(results: list[CellResult], revision: str) -> None:
    """The build as a table, each image built as `reference digest`, and why a cell failed or was skipped."""
    from rich.table import Table

    from buildtool.common.units import human_size, short_digest

    table = Table(title=f"build {revision}")
    for column in ("cell", "result", "tag", "digest", "size", "seconds"):
        table.add_column(column, overflow="fold")
    for r in results:
        table.add_row(r.cell, r.result, r.ref if r.result != "failed" else "-", short_digest(r.digest) or "-",
                      human_size(r.size), f"{r.seconds:.1f}")
    out.print(table)
    for r in results:
        if r.ok and r.result != "skipped" and r.digest:
            # Full reference and digest, one per line, for people and scripts alike.
            out.print(f"{r.ref} {r.digest}", markup=False, highlight=False)
    for r in results:
        if r.result in ("failed", "skipped"):
            # Verbatim, each control character escaped: the message may quote the build's or the registry's text.
            log(printable(f"{r.cell}: {r.result}: {r.message}" + (f" (log: {r.log})" if r.log else "")))


def bases(
    framework: FrameworkOption = None,
    force: BasesForceOption = False,
    mirror: MirrorOption = None,
    matrix: MatrixOption = None,
) -> None:
    """Fill the mirror registry with FRAMEWORK's bases: Debian from mmdebstrap (DEBIAN_ARCHIVE), NGC stand-ins (test
    fixtures, labelled as such) built on it."""
    check_arguments("bases", locals())   # every argument first (issue 37)
    from rich.table import Table

    from buildtool.imagebuild.bases import fill_bases, local_mirror
    from buildtool.matrix.plan import Settings

    project = find_project(matrix)
    cells = project.load().select(framework)
    target = local_mirror(mirror or Settings.from_env().base_mirror)
    results = fill_bases(cells, target, force=force, log=log, log_dir=project.root / "build-logs",
                         templates=project.templates)
    table = Table(title=f"bases in {target}")
    for column in ("base", "platform", "action", "digest", "seconds"):
        table.add_column(column, overflow="fold")
    for r in results:
        table.add_row(r.ref, r.platform, r.action, r.digest, f"{r.seconds:.1f}")
    out.print(table)


class LiveProgress:
    """A live table on the terminal: per cell, its state, elapsed time and current build step."""

    def __init__(self, cells: list[str]) -> None:
        import threading
        import time

        from rich.live import Live

        self._time = time.monotonic
        self._rows: dict[str, list] = {cell: ["queued", "", None, None] for cell in cells}
        self._lock = threading.Lock()
        self._live = Live(self._table(), console=err, refresh_per_second=4, transient=True,
                          get_renderable=self._table)

    def update(self, cell: str, state: str, step: str = "") -> None:
        with self._lock:
            row = self._rows.setdefault(cell, ["queued", "", None, None])
            if state != "queued" and row[2] is None:
                row[2] = self._time()
            if state not in ("queued", "checking", "building", "pushing"):
                row[3] = self._time()
            row[0], row[1] = state, step

    def _table(self):  # noqa: ANN202 - a rich renderable
        from rich.table import Table

        table = Table(title="build", expand=True)
        for column, opts in (("cell", {"no_wrap": True}), ("state", {"no_wrap": True}),
                             ("elapsed", {"justify": "right"}), ("step", {"overflow": "ellipsis", "no_wrap": True})):
            table.add_column(column, **opts)
        now = self._time()
        with self._lock:
            for cell, (state, step, started, ended) in self._rows.items():
                elapsed = "" if started is None else f"{(ended or now) - started:.0f}s"
                table.add_row(cell, state, elapsed, step)
        return table

    def __enter__(self) -> LiveProgress:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(None, None, None)


def build_progress(cells: list[str]):  # noqa: ANN201 - a context manager giving a Progress
    """The live table when stderr is a terminal; one line per change otherwise (CI logs)."""
    import contextlib

    from buildtool.imagebuild.progress import LogProgress

    if err.is_terminal:
        return LiveProgress(cells)
    return contextlib.nullcontext(LogProgress(log))
