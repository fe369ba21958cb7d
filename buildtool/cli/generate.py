"""Commands that generate files from the matrix and show its plan: render, check, plan, catalogue."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from buildtool.cli.console import log, printable, say
from buildtool.cli.options import FrameworkOption, JsonOption, MatrixOption, Project, RevisionOption, err, find_project
from buildtool.cli.options import out as stdout
from buildtool.contracts.arguments import check_arguments

if TYPE_CHECKING:
    from buildtool.matrix.plan import CellPlan
    from buildtool.matrix.schema import Matrix
    from buildtool.render.dockerfiles import Outputs


def all_outputs(project: Project, matrix: Matrix) -> Outputs:
    """Every generated file: Dockerfiles, the catalogue and the CI workflows."""
    from functools import partial

    from buildtool.render.catalogue import catalogue_outputs
    from buildtool.render.dockerfiles import render_outputs
    from buildtool.render.workflows import render_workflows

    catalogue = partial(catalogue_outputs, root=project.root)
    return render_outputs(matrix, project.templates, extras=(catalogue, render_workflows), root=project.root)


def render(
    matrix: MatrixOption = None,
    prune_stale: Annotated[bool, typer.Option("--prune", help="Delete Dockerfiles of cells no longer in the matrix, "
                                              "and workflows marked generated that no render writes any more.")]
    = False,
) -> None:
    """Render every cell's Dockerfile under dockerfiles/, the catalogue and the CI workflows, atomically."""
    check_arguments("render", locals())   # every argument first (issue 37)
    from buildtool.render.dockerfiles import prune, write_outputs

    project = find_project(matrix)
    outputs = all_outputs(project, project.load())
    with _writing(project, "nothing was written (the tree is as it was)"):
        changed = write_outputs(project.root, outputs)
    # Verbatim (a stale file's name is whatever is on disk: rich read `[/]` in it as markup, a traceback).
    for rel in changed:
        say(printable(f"wrote {rel}"))
    stale = outputs.stale(project.root)
    if stale and prune_stale:
        with _writing(project, "the files above were written; run `buildtool render --prune` again"):
            prune(project.root, stale)
        for rel in stale:
            say(printable(f"deleted {rel} (its cell is gone from the matrix)"))
    elif stale:
        for rel in stale:
            log(printable(f"stale: {rel} belongs to no cell; delete it or run `buildtool render --prune`"))
    if not changed:
        err.print(f"{len(outputs.files)} generated files already up to date")


@contextmanager
def _writing(project: Project, state: str) -> Iterator[None]:
    """An OSError while writing or deleting generated files (no permission, a folder where a file goes, a full disk)
    is one line naming the file and why, and what state the tree is in (UserError, exit 2), not a traceback."""
    try:
        yield
    except OSError as exc:
        from buildtool.common.errors import UserError

        # os.replace names the staged file first and the target second: the target is the file the user can fix.
        path = exc.filename2 if exc.filename2 is not None else exc.filename
        where = str(path).removeprefix(f"{project.root}/") if path is not None else "a generated file"
        raise UserError(f"cannot write {where} ({exc.strerror or exc}); {state}: make it a file this user can "
                        "write (remove what is in its place) and render again") from None


def check(
    matrix: MatrixOption = None,
    offline: Annotated[bool, typer.Option(
        "--offline", help="Skip re-resolving the locks (no index needed): only their matrix fingerprints, pins "
        "and build are checked, so a hand edit below the matrix pins passes.")] = False,
) -> None:
    """Fail (exit 1, printing a unified diff) when committed generated files differ from the matrix,
    or a cell's lock is missing, broken, stale (made from other matrix values) or edited by hand
    (re-resolved with uv and compared entry by entry; needs the package index unless --offline)."""
    check_arguments("check", locals())   # every argument first (issue 37)
    from buildtool.common.documents import plural
    from buildtool.common.errors import FailedError
    from buildtool.imagebuild import aptlock
    from buildtool.imagebuild.lock import check_cell, uv_pin_problems
    from buildtool.render.dockerfiles import Outputs, TemplateError, drift

    project = find_project(matrix)
    loaded = project.load()
    try:
        outputs, unrendered = all_outputs(project, loaded), None
    except TemplateError as exc:   # e.g. a hand-edited apt.lock render refuses: named below as a lock problem
        outputs, unrendered = Outputs(files={}), exc
    diff, stale = drift(project.root, outputs) if unrendered is None else ("", [])
    if diff:
        stdout.file.write(diff)   # as difflib made it: rich turned tabs into spaces and `:ok:` into an emoji
    for rel in stale:
        log(printable(f"stale: {rel} belongs to no cell in the matrix; delete it or run `buildtool render --prune`"))
    # Each cell's locks (beside its Dockerfile) against the matrix values they were made from.
    lock_problems = [problem for cell in loaded.cells for problem in check_cell(project.root, cell)]
    lock_problems += [problem for cell in loaded.cells for problem in aptlock.check_cell(project.root, cell)]
    if (project.root / "requirements.lock").is_file():
        lock_problems += uv_pin_problems(project.root)
    drift_problems, not_resolved, apt_not_resolved = (_re_resolve(project, loaded) if not offline and not lock_problems
                                                      else ([], [], []))
    lock_problems += drift_problems
    for problem in lock_problems:
        err.print(f"lock: {problem}", markup=False, highlight=False)
    # Locks first: a hand-edited apt.lock also drifts its Dockerfile, and `make lock` re-renders it.
    if lock_problems:
        raise FailedError(f"{len(lock_problems)} lock problem(s); run `make lock` (FRAMEWORK=<cell> PACKAGE=<name> "
                          "for one package) and commit the locks")
    if unrendered is not None:
        raise unrendered
    if diff or stale:
        raise FailedError("generated files drifted from matrix.yaml; run `make render` and commit the result")
    how = ("not re-resolved: --offline" if offline else
           _resolved_note(len(loaded.cells) - len(not_resolved), not_resolved, apt_not_resolved))
    err.print(f"{plural(len(outputs.files), 'generated file')} match matrix.yaml; the locks of "
              f"{plural(len(loaded.cells), 'cell')} too "
              f"({how})")


def _re_resolve(project: Project, loaded: Matrix) -> tuple[list[str], list[str], list[str]]:
    """Every cell's locks re-resolved and compared with the committed ones: (problems, NGC cells not
    re-resolved, cells whose apt lock was not re-resolved), the last two for want of BASE_MIRROR."""
    from functools import partial

    from buildtool.imagebuild import aptlock
    from buildtool.imagebuild.lock import is_ngc
    from buildtool.imagebuild.lockdrift import check_cells
    from buildtool.matrix.plan import Settings, mirror_base

    settings = Settings.from_env()
    log = partial(err.print, markup=False, highlight=False)
    # NGC cells: asked as `make lock` asks them, through BASE_MIRROR; without it they are named, not checked.
    bases = ({c.key: mirror_base(c.base, settings.base_mirror) for c in loaded.cells if is_ngc(c)}
             if settings.base_mirror else {})
    problems, not_resolved = check_cells(project.root, loaded.cells, log=log, base_refs=bases)
    apt_not_resolved = []
    # apt locks: re-resolved in the cell's base, which the engine reaches through BASE_MIRROR.
    for cell in (c for c in loaded.cells if aptlock.has_apt_step(c)):
        if not settings.base_mirror:
            apt_not_resolved.append(cell.key)
            continue
        problems += aptlock.cell_drift(project.root, cell, mirror_base(cell.base, settings.base_mirror), log=log)
    return problems, not_resolved, apt_not_resolved


def _resolved_note(resolved: int, not_resolved: list[str], apt_not_resolved: list[str]) -> str:
    return (f"{resolved} re-resolved with uv" + (f"; not re-resolved, NGC cells whose base's packages only a "
                                                 f"container of the base can tell (set BASE_MIRROR as for `make "
                                                 f"lock`): {', '.join(not_resolved)}" if not_resolved else "")
            + (f"; apt locks not re-resolved (set BASE_MIRROR to ask their bases): {', '.join(apt_not_resolved)}"
               if apt_not_resolved else ""))


def plan(
    framework: FrameworkOption = None,
    as_json: JsonOption = False,
    release: Annotated[str, typer.Option(help="Release version to fill into release tags.")] = "{release}",
    revision: RevisionOption = None,
    matrix: MatrixOption = None,
) -> None:
    """Show, per cell, the dev and release images, base, build args, tests and run profile."""
    check_arguments("plan", locals())   # every argument first (issue 37)
    from rich.table import Table

    from buildtool.matrix.plan import Settings, plan_matrix

    project = find_project(matrix)
    cells = project.load().select(framework)
    settings, revision = Settings.from_env(), project.revision(revision)
    plans = plan_matrix(cells, settings, revision, release)
    if release != "{release}":
        from buildtool.common.errors import UserError

        _check_release_tags(plans, release)
        # The release's tags are what `buildtool release --version` makes of it (the release workflow uploads this
        # plan as its record): the same reader, so `v1.0` is 1.0 here too, and a word that is no version is refused.
        from buildtool.release.gates import check_version

        try:
            normal = check_version(release)
        except UserError as exc:
            raise UserError(f"{str(exc).replace('--version', '--release', 1)} (what `buildtool release --version` "
                            "takes)") from None
        if normal != release:
            plans = plan_matrix(cells, settings, revision, normal)
            _check_release_tags(plans, release, f" (as {normal}, its PEP 440 normal form)")
            err.print(f"note: --release {release} is release {normal} (PEP 440 normal form, as `buildtool release` "
                      f"writes it); its tags use {normal}", markup=False, highlight=False)
    if as_json:
        # Straight to the stream: rich's rendering of a big matrix's JSON takes seconds.
        stdout.file.write(json.dumps({"include": [p.to_json() for p in plans]}, indent=2) + "\n")
        return
    table = Table(title="Build plan", show_lines=True)
    for column in ("cell", "dev image", "release tags", "base", "tests", "run flags"):
        table.add_column(column, overflow="fold")
    for p in plans:
        tags = "\n".join(f"{p.release_repo}:{t}" for t in (*p.release_tags, *p.moving_tags))
        table.add_row(p.cell.key, p.dev_ref, tags, p.base, ",".join(p.cell.tests), " ".join(p.cell.run.docker_flags()))
    stdout.print(table)


def _check_release_tags(plans: list[CellPlan], release: str, spelt: str = "") -> None:
    """Every tag of the plan a Docker tag (the normal form of --release may be longer than as given)."""
    from buildtool.common.errors import UserError
    from buildtool.contracts.names import TAG_RE

    bad = next((t for p in plans for t in (*p.release_tags, *p.moving_tags) if not TAG_RE.match(t)), None)
    if bad is not None:
        raise UserError(f"--release {release!r}{spelt} gives the tag {bad!r}, which is not a Docker tag; use a "
                        "version like 0.1.0")


def catalogue(matrix: MatrixOption = None) -> None:
    """Write docs/images.md, the catalogue of every image (also done by `render`)."""
    check_arguments("catalogue", locals())   # every argument first (issue 37)
    from buildtool.render.catalogue import CATALOGUE_PATH, catalogue_outputs
    from buildtool.render.dockerfiles import Outputs, write_outputs

    project = find_project(matrix)
    outputs = Outputs(files=catalogue_outputs(project.load(), project.root))
    with _writing(project, "nothing was written (the tree is as it was)"):
        changed = write_outputs(project.root, outputs)
    stdout.print(f"wrote {CATALOGUE_PATH}" if changed else f"{CATALOGUE_PATH} already up to date")
