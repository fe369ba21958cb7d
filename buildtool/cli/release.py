"""`buildtool release`: promote tested dev images of a commit to release tags."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Annotated

import typer

from buildtool.cli.options import JsonOption, MatrixOption, Project, emit_json, err, find_project, log, out
from buildtool.common.errors import FailedError, UserError

if TYPE_CHECKING:
    from buildtool.matrix.plan import Settings
    from buildtool.matrix.schema import Cell
    from buildtool.release.promote import ReleaseReport
    from buildtool.validate.keys import TrustedKeys


def _cells(project: Project, framework: list[str] | None) -> list[Cell]:
    """Cells of every --framework value (image, cell, framework or all), in matrix order, once."""
    loaded = project.load()
    names = [n.strip() for item in (framework or ["all"]) for n in item.split(",") if n.strip()]
    chosen, seen = [], set()
    for name in names or ["all"]:
        for cell in loaded.select(name):
            if cell.key not in seen:
                seen.add(cell.key)
                chosen.append(cell)
    return chosen


def print_report(report: ReleaseReport) -> None:
    from rich.table import Table
    from rich.text import Text

    title = f"Release {report.version} from {report.revision}".replace("[", "\\[")
    title += " (dry run: nothing written)" if report.dry_run else ""
    table = Table(title=title, show_lines=True)
    for column in ("cell", "status", "digest", "tags", "notes"):
        table.add_column(column, overflow="fold")
    for item in report.images:
        tags = "\n".join(f"{t.tag} ({t.action}{', moving' if t.moving else ''})" for t in item.tags)
        notes = "\n".join([*item.problems, *(f"{t.tag}: {t.note}" for t in item.tags if t.note)])
        # Text, not markup: test ids such as test_ulimit[memlock] must print as they are.
        table.add_row(*(Text(v) for v in (item.cell, item.status, item.digest or "-", tags or "-", notes)))
    out.print(table)


def register(app: typer.Typer) -> None:
    @app.command("release")
    def release_command(
        version: Annotated[str, typer.Option("--version", envvar="VERSION",
                                             help="Release version, e.g. 0.1.0 (tags <version>-<release>).")],
        from_sha: Annotated[str | None, typer.Option("--from", "--revision", envvar="REVISION",
                                                     help="Git sha (or the revision given to `build --revision`) "
                                                     "whose dev images to promote (default: HEAD, as `buildtool "
                                                     "build` names it).")] = None,
        framework: Annotated[list[str] | None, typer.Option(
            "--framework", "-f", help="An image, a cell, a framework or all (repeatable, or comma list).")] = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Check gates and show the tag plan; write nothing.")]
        = False,
        force: Annotated[bool, typer.Option("--force", help="Move the matrix's moving tags (e.g. latest) even to "
                                            "an older release. Never moves version tags.")] = False,
        accept_skip: Annotated[list[str] | None, typer.Option(
            "--accept-skip", help="Accept skipped tests whose skip reason matches this regex although the matrix "
            "expects them to run (a runner limit); recorded as a waiver in the release notes. Never covers GPU "
            "tests of GPU images.")] = None,
        trust_local_key: Annotated[bool, typer.Option(
            "--trust-local-key", help="Also trust verdicts signed by this machine's local dev key (made by "
            "validate when DL_IMAGES_SIGNING_KEY is unset); only for a loopback registry, never for real releases.")]
        = False,
        as_json: JsonOption = False,
        matrix: MatrixOption = None,
    ) -> None:
        """Promote the dev images of a commit to release tags, digest for digest, inside the registry."""
        from buildtool.matrix.plan import Settings, git_revision, resolve_revision
        from buildtool.release.gates import check_version
        from buildtool.release.promote import ReleaseOptions, release
        from buildtool.validate.keys import load_trusted

        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
        project = find_project(matrix)
        cells = _cells(project, framework)
        revision = resolve_revision(project.root, from_sha, git_revision, option="--from")
        if "-dirty." in revision:
            err.print(f"warning: releasing {revision}: built from uncommitted changes", markup=False)
        normal = check_version(version)
        if normal != version:
            log(f"note: --version {version} is release {normal} (PEP 440 normal form); its tags use {normal}")
        _check_release_files(project, normal)
        for pattern in accept_skip or []:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise UserError(f"--accept-skip {pattern!r} is not a regular expression ({exc})") from None
        settings = Settings.from_env()
        trusted = load_trusted(project.root)
        if trust_local_key:
            _trust_local_key(trusted, settings)
        tests_dir = project.root / "image-tests"
        options = ReleaseOptions(version=normal, revision=revision, force=force, dry_run=dry_run,
                                 accept_skips=tuple(accept_skip or ()), trusted=trusted,
                                 tests_dir=tests_dir if tests_dir.is_dir() else None)
        report = release(cells, settings, options, matrix_cells=project.load().cells)
        _finish(project, report, as_json, dry_run)


def _check_release_files(project: Project, version: str) -> None:
    """A version already released under another spelling (docs/releases/1.0.0.json for 1.0) is refused."""
    from packaging.version import InvalidVersion, Version

    from buildtool.contracts.releases import RELEASES_DIR
    from buildtool.release.gates import spelling_problems

    released = {}
    for path in (project.root / RELEASES_DIR).glob("*.json"):
        try:
            released[Version(path.stem)] = str(path.relative_to(project.root))
        except InvalidVersion:
            continue
    for problem in spelling_problems(version, released, "this project"):
        raise UserError(problem)


def _trust_local_key(trusted: TrustedKeys, settings: Settings) -> None:
    from buildtool.validate.keys import dev_public_key

    registry = settings.release_registry
    host = registry.split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    if not (host in ("localhost", "::1") or host.startswith("127.")):
        raise UserError(f"--trust-local-key is only for a loopback registry, not {registry}; for a real release "
                        "add the validating runner's public key to config/trusted-keys.yaml (see `buildtool keys`)")
    key = dev_public_key()
    if key is None:
        raise UserError("--trust-local-key: this machine has no local dev key (validate makes one when "
                        "DL_IMAGES_SIGNING_KEY is unset; or run `buildtool keys --dev`)")
    trusted.add_dev(key)


def _finish(project: Project, report: ReleaseReport, as_json: bool, dry_run: bool) -> None:
    from buildtool.release.notes import build_manifest, write_release_files
    from buildtool.render.catalogue import catalogue_outputs
    from buildtool.render.dockerfiles import Outputs, write_outputs

    version = report.version
    manifest = build_manifest(report)
    if as_json:
        emit_json({"ok": report.ok, "release": manifest,
                   "status": {i.cell: {"status": i.status, "problems": i.problems, "tags_made": i.tags_made,
                                       "repaired": i.repaired, "ignored_attestations": i.ignored}
                              for i in report.images}})
    else:
        print_report(report)
    promoted_any = any(i.tags_made for i in report.images)
    if report.refused and not promoted_any:
        raise FailedError(f"release {version} refused for {', '.join(i.cell for i in report.refused)}; "
                          "nothing was promoted (see the table)")
    if not report.ok:
        done = [f"{i.cell} ({', '.join(i.tags_made) or 'no new tags'})" for i in report.images
                if i.status in ("promoted", "unchanged") or i.tags_made]
        missing = [f"{i.cell}: {i.status}" for i in report.images if i.status not in ("promoted", "unchanged")]
        raise FailedError(f"release {version} incomplete. Promoted: {'; '.join(done) or 'none'}. "
                          f"Not promoted: {'; '.join(missing)}. Re-run the same command to complete it")
    if dry_run:
        err.print("dry run: no tags written, no release files written")
        return
    promoted = any(i.status == "promoted" for i in report.images)
    written = write_release_files(project.root, manifest, promoted)
    for path in written:
        err.print(f"wrote {path.relative_to(project.root)}")
    if written:
        # The catalogue lists each image's newest release tags (read from docs/releases/).
        for rel in write_outputs(project.root, Outputs(files=catalogue_outputs(project.load(), project.root))):
            err.print(f"wrote {rel}")
    if not written:
        err.print(f"release {version} was already complete: nothing written")
