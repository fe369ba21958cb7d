"""`buildtool release`, the part that runs: parse (fast path), gate, promote, report, write the notes.

Kept free of typer: `buildtool release ...` is parsed here with argparse (buildtool.cli.main takes
this path), because typer builds a pydantic validator per option on every call, which costs more
than releasing one image to a loopback registry. `buildtool release --help`, and anything this
parser does not understand, go to the typer command (buildtool.cli.release). Both are made from one
declaration, buildtool.contracts.arguments.RELEASE_OPTIONS.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildtool.cli.console import Project, emit_json, find_project, log, path_of, printable
from buildtool.common.errors import FailedError, UserError
from buildtool.contracts.arguments import check_arguments

if TYPE_CHECKING:
    from buildtool.attest.keys import TrustedKeys
    from buildtool.matrix.plan import Settings
    from buildtool.matrix.schema import Cell, Matrix
    from buildtool.release.promote import ReleaseReport
    from buildtool.release.testcode import CodeBook

def fast_release(args: list[str]) -> bool:
    """Run `release ARGS` without typer; False when ARGS are for typer to answer (help, usage errors)."""
    if any(a in ("--help", "-h") for a in args):
        return False
    from buildtool.contracts.arguments import RELEASE_OPTIONS

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    given: dict[str, tuple[str, str]] = {}
    for option in RELEASE_OPTIONS:     # the one declaration of release's options (the typer command's too)
        if option.kind == "flag":
            parser.add_argument(*option.flags, dest=option.dest, action="store_true")
        else:
            default = os.environ.get(option.envvar) if option.envvar else None
            how: dict[str, Any] = {"action": "append"} if option.kind == "append" else {"action": _Once, "given": given}
            parser.add_argument(*option.flags, dest=option.dest, default=default or None, **how)
    try:
        parsed, unknown = parser.parse_known_args(args)
    except argparse.ArgumentError:
        return False
    if unknown or not parsed.version:
        return False   # typer says what is wrong, as it does for every other command
    run_release(**{**vars(parsed), "matrix": None if parsed.matrix is None else path_of("--matrix")(parsed.matrix)})
    return True


class _Once(argparse.Action):
    """A value option given twice with two values (`--from X --revision Y`: one option under two names) is refused
    naming both; argparse kept the last without a word. The environment's default is not a value given."""

    def __init__(self, *args: Any, given: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.given = given

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from buildtool.common.refs import shown

        flag = option_string or self.dest
        first = self.given.setdefault(self.dest, (flag, values))
        if first[1] != values:
            raise UserError(f"{first[0]} {shown(first[1])} and {flag} {shown(values)} name the same option with two "
                            "values; give one")
        setattr(namespace, self.dest, values)


def _cells(loaded: Matrix, framework: list[str] | None) -> list[Cell]:
    """Cells of every --framework value (image, cell, framework or all), in matrix order, once."""
    names = [n.strip() for item in (framework or ["all"]) for n in item.split(",") if n.strip()]
    chosen = {cell.key: cell for name in names or ["all"] for cell in loaded.select(name)}   # first place kept
    return list(chosen.values())


def print_report(report: ReleaseReport) -> None:
    """The release as a plain-text table (rich's tables cost more to import than a release takes)."""
    title = f"Release {report.version} from {report.revision}"
    title += " (dry run: nothing written)" if report.dry_run else ""
    rows: list[tuple[str, ...]] = [("cell", "status", "digest", "tags", "notes")]
    for item in report.images:
        tags = "\n".join(f"{t.tag} ({t.action}{', moving' if t.moving else ''})" for t in item.tags)
        notes = "\n".join([*item.problems, *(f"{t.tag}: {t.note}" for t in item.tags if t.note), *item.transfer])
        rows.append((item.cell, item.status, item.digest or "-", tags or "-", notes))
    sys.stdout.write(f"{title}\n{text_table(rows)}\n")


def text_table(rows: list[tuple[str, ...]], max_width: int = 72) -> str:
    """Columns padded to their widest line (cells may hold several lines; long lines are folded)."""
    import itertools
    import textwrap

    def lines(value: str) -> list[str]:
        # Each control character escaped: a note may quote the registry (an ANSI sequence must not reach the log).
        return [part for line in (value or "").splitlines() or [""]
                for part in (textwrap.wrap(printable(line), max_width) or [""])]

    cells = [[lines(value) for value in row] for row in rows]
    widths = [max(len(line) for row in cells for line in row[i]) for i in range(len(rows[0]))]
    rule = "+".join("-" * (w + 2) for w in widths)
    out_lines = []
    for n, row in enumerate(cells):
        for line in itertools.zip_longest(*row, fillvalue=""):
            out_lines.append(" | ".join(part.ljust(w) for part, w in zip(line, widths, strict=True)).rstrip())
        if n == 0 or n < len(cells) - 1:
            out_lines.append(rule)
    return "\n".join(out_lines)


def run_release(*, version: str, from_sha: str | None, framework: list[str] | None, dry_run: bool, force: bool,
                accept_skip: list[str] | None, trust_local_key: bool, as_json: bool, matrix: Path | None) -> None:
    """Promote the dev images of a commit to release tags, digest for digest, inside the registry."""
    check_arguments("release", locals())   # every argument first (issue 37)
    from concurrent.futures import ThreadPoolExecutor

    from buildtool.matrix.plan import Settings, git_revision, resolve_revision
    from buildtool.release.gates import check_version
    from buildtool.release.promote import ReleaseOptions, release

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    project = find_project(matrix)
    loaded = project.load_fast()
    settings = Settings.from_env()
    # What only the verdict check and the notes need (the trusted keys: YAML and cryptography; the
    # notes: Jinja2 and its templates) is read in a thread while this one waits on git and the
    # registry, instead of before them. A short switch interval hands the interpreter back to a
    # thread whose response has arrived within 1 ms rather than the default 5.
    sys.setswitchinterval(0.001)
    loopback = _loopback(settings, trust_local_key)
    background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="release-prefetch")
    trusted = background.submit(_trusted_keys, project.root, trust_local_key, loopback)
    if not dry_run:
        background.submit(_preload_documents)
    background.shutdown(wait=False)
    cells = _cells(loaded, framework)
    revision = resolve_revision(project.root, from_sha, git_revision, option="--from")
    if "-dirty." in revision:
        log(f"warning: releasing {revision}: built from uncommitted changes")
    normal = check_version(version)
    if normal != version:
        log(f"note: --version {version} is release {normal} (PEP 440 normal form); its tags use {normal}")
    _check_release_files(project, normal, writes=not dry_run)
    # The image-tests a verdict may have run: as committed at the revision the image's signed provenance names
    # and at the release commit (git archive, hashed as validate hashes them; the release commit's read while the
    # registry answers, each image's revision when its provenance is read): the rule verify applies too.
    matrix_name = os.path.relpath(project.matrix_path, project.root)
    code_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="release-testcode")
    known = code_reader.submit(_code_book, project.root, matrix_name,
                               tuple(sorted({c.extra_tests for c in loaded.cells if c.extra_tests})))
    code_reader.shutdown(wait=False)
    from functools import partial

    from buildtool.release.ancestry import retag_problem, source_problems

    options = ReleaseOptions(version=normal, revision=revision, force=force, dry_run=dry_run,
                             accept_skips=tuple(accept_skip or ()), trusted=trusted, known_code=known,
                             source_check=partial(source_problems, project.root, matrix_name=matrix_name),
                             retag_check=partial(retag_problem, project.root))
    report = release(cells, settings, options, matrix_cells=loaded.cells)
    trusted.result()   # a malformed keys file is bad input even when no image got as far as its verdict
    known.result()
    _finish(project, loaded, report, as_json, dry_run)


def _code_book(root: Path, matrix_name: str, sites: tuple[str, ...]) -> CodeBook:
    from buildtool.release.testcode import CodeBook

    book = CodeBook(root, matrix_name, sites)
    book.release_commit()
    return book


def _check_release_files(project: Project, version: str, writes: bool = False) -> None:
    """A version already released under another spelling (docs/releases/1.0.0.json for 1.0) is refused, and (`writes`)
    a checkout where the release files cannot be written (read-only, a file in the way): before any tag moves."""
    from packaging.version import InvalidVersion, Version

    from buildtool.contracts.releases import RELEASES_DIR, latest_by_cell
    from buildtool.release.gates import spelling_problems
    from buildtool.release.notes import check_mergeable

    folder = project.root / RELEASES_DIR
    released = {}
    for path in folder.glob("*.json"):
        try:
            released[Version(path.stem)] = str(path.relative_to(project.root))
        except InvalidVersion:
            continue
    for problem in spelling_problems(version, released, "this project"):
        raise UserError(problem)
    latest_by_cell(project.root)   # the catalogue reads every release manifest: one it cannot is refused before any tag
    check_mergeable(project.root, version)   # an earlier part of this release that this one cannot merge into
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if writes and not (existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)):
        raise UserError(f"cannot write the release files into {folder} ({existing} is "
                        f"{'not writable' if existing.is_dir() else 'no folder'}); nothing was promoted: release from "
                        "a checkout this user can write, or use --dry-run")


def _trusted_keys(root: Path, trust_local_key: bool, loopback: bool = False) -> TrustedKeys:
    """config/trusted-keys.yaml, and this machine's dev key with --trust-local-key; without it, on a loopback
    registry, the dev key is named in the refusals of what it signed (with the flag that would trust it)."""
    from buildtool.attest.keys import dev_public_key, load_trusted

    trusted = load_trusted(root)
    if trust_local_key:   # the registry was checked to be a loopback one before this ran
        key = dev_public_key()
        if key is None:
            raise UserError("--trust-local-key: this machine has no local dev key (validate makes one when "
                            "DL_IMAGES_SIGNING_KEY is unset; or run `buildtool keys --dev`)")
        trusted.add_dev(key)
    elif loopback:
        trusted.offer_dev(dev_public_key())
    return trusted


def _preload_documents() -> None:
    from buildtool.common.documents import preload

    preload("buildtool.release", "notes.md.j2", "packages.md.j2")
    preload("buildtool.render", "catalogue.md.j2")


def _loopback(settings: Settings, trust_local_key: bool) -> bool:
    """Whether both registries (dev images are read from REGISTRY, tags written to RELEASE_REGISTRY) are this
    machine by address (buildtool.common.refs.is_loopback_host), never by a name's spelling: with
    --trust-local-key they must be."""
    from buildtool.common.refs import is_loopback_host

    for variable, registry in (("REGISTRY", settings.registry), ("RELEASE_REGISTRY", settings.release_registry)):
        host = registry.split("/", 1)[0]
        if is_loopback_host(host):
            continue
        if trust_local_key:
            raise UserError(f"--trust-local-key is only for a loopback registry (127.0.0.0/8, ::1 or localhost), not "
                            f"{variable}={registry} ({host} is not a loopback address); for a real release add the "
                            "validating runner's public key to config/trusted-keys.yaml (see `buildtool keys`)")
        return False
    return True


def _finish(project: Project, loaded: Matrix, report: ReleaseReport, as_json: bool, dry_run: bool) -> None:
    from buildtool.release.notes import build_manifest

    version = report.version
    manifest = build_manifest(report)
    if as_json:
        emit_json({"ok": report.ok, "release": manifest,
                   "status": {i.cell: {"status": i.status, "problems": i.problems, "tags_made": i.tags_made,
                                       "tags_unknown": i.tags_unknown,
                                       "repaired": i.repaired, "ignored_attestations": i.ignored,
                                       "transfer": i.transfer}
                              for i in report.images}})
    else:
        print_report(report)
    if report.refused and not any(i.tags_made for i in report.images):
        raise FailedError(f"release {version} refused for {', '.join(i.cell for i in report.refused)}; "
                          "nothing was promoted (see the table)")
    if not report.ok:
        done = [f"{i.cell} ({', '.join(i.tags_made) or 'no new tags'}"
                + (f"; unknown: {', '.join(i.tags_unknown)}" if i.tags_unknown else "") + ")"
                for i in report.images if i.status in ("promoted", "unchanged") or i.tags_made or i.tags_unknown]
        missing = [f"{i.cell}: {i.status}" for i in report.images if i.status not in ("promoted", "unchanged")]
        raise FailedError(f"release {version} incomplete. Promoted: {'; '.join(done) or 'none'}. "
                          f"Not promoted: {'; '.join(missing)}. Re-run the same command to complete it")
    if dry_run:
        log("dry run: no tags written, no release files written")
        return
    promoted = any(i.status == "promoted" for i in report.images)
    try:
        written = _write_files(project, loaded, manifest, promoted)
    except OSError as exc:   # a disk that filled: the tags have moved, the files are what is missing
        where = f" ({exc.filename})" if exc.filename else ""
        raise FailedError(f"release {version}: the tags are promoted but its files could not be written{where}: "
                          f"{exc.strerror or exc}; free space there and run the same command again (it moves no tag "
                          "and writes them)") from None
    if not written:
        log(f"release {version} was already complete: nothing written")


def _write_files(project: Project, loaded: Matrix, manifest: dict[str, Any], promoted: bool) -> list[Path]:
    """docs/releases/<version>.{json,md} and the catalogue; the release files written (none: already complete)."""
    from buildtool.release.notes import write_release_files

    written = write_release_files(project.root, manifest, promoted)
    for path in written:
        log(f"wrote {path.relative_to(project.root)}")
    if written:
        from buildtool.common.files import write_atomic
        from buildtool.render.catalogue import catalogue_outputs

        # The catalogue lists each image's newest release tags (read from docs/releases/); one file,
        # written atomically (the Dockerfile renderer, and Jinja with it, is not needed for it).
        for rel, data in catalogue_outputs(loaded, project.root).items():
            target = project.root / rel
            if not target.is_file() or target.read_bytes() != data:
                try:
                    write_atomic(target, data)
                except OSError as exc:   # the release files are written: only the catalogue is missing
                    raise FailedError(f"release {manifest['version']}: the tags are promoted and its files written, "
                                      f"but {rel} could not be ({exc.strerror or exc}); free space there and run "
                                      "`buildtool catalogue`") from None
                log(f"wrote {rel}")
    return written
