"""`buildtool validate IMAGE... | --framework X | --all`: run image-tests, store verdicts by digest.

Exit 0 when no image failed (a verdict may be `incomplete`: a selection removed tests, or a GPU
cell had no usable GPU; it is stored as such, said on stderr, and can never release the image),
1 when a test failed or the runner's GPUs are broken (listed but unusable, a driver too old,
or none on a declared GPU runner: --require-gpu / DL_IMAGES_REQUIRE_GPU), 2 for bad input
(unknown image or cell, registry or engine unreachable).
"""

from __future__ import annotations

import errno
import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from buildtool.cli.console import printable
from buildtool.cli.options import (
    JsonOption,
    MatrixOption,
    Project,
    RevisionOption,
    TsaOption,
    find_project,
    log,
    out,
    path_of,
    say,
)
from buildtool.common.errors import FailedError, UserError
from buildtool.common.tsa import check_writer, using
from buildtool.contracts import frameworks
from buildtool.contracts.arguments import check_arguments
from buildtool.validate.options import DEFAULT_JOBS, DEFAULT_JOIN_TIMEOUT_S

if TYPE_CHECKING:
    from buildtool.matrix.schema import Matrix


def _peers(values: list[str]) -> dict[str, str]:
    peers: dict[str, str] = {}
    known = frameworks.names()
    for value in values:
        framework, sep, image = value.partition("=")
        if not sep or framework not in known or not image:
            raise UserError(f"--peer {value!r} must be FRAMEWORK=IMAGE with FRAMEWORK one of {', '.join(known)}")
        if framework in peers:   # the last one silently won: the cross tests ran against an image not meant
            raise UserError(f"--peer {framework}= is given twice ({peers[framework]} and {image}); give one image "
                            "for each framework")
        peers[framework] = image
    return peers


ImagesArgument = Annotated[list[str] | None, typer.Argument(help="Image references to validate.")]
# Not options.FrameworkOption: no $FRAMEWORK here (validate names its images on the command line).
FrameworkOption = Annotated[str | None, typer.Option(
    "--framework", "-f", help="Validate this commit's dev images of an image, cell or framework.")]
AllOption = Annotated[bool, typer.Option("--all", help="Validate the dev images of every cell.")]
StoreOption = Annotated[bool, typer.Option(
    "--store/--no-store", help="Store the verdict in the image's registry repository.")]
SelectOption = Annotated[str | None, typer.Option("-k", help="Only tests matching this pytest expression.")]
PeerOption = Annotated[list[str] | None, typer.Option(
    help="framework=IMAGE of the other framework, for the cross-framework TensorBoard tests.")]
CellOption = Annotated[str | None, typer.Option(help="Cell to test against when the image has no cell label.")]
JoinTimeoutOption = Annotated[float, typer.Option(
    envvar="DL_IMAGES_RDZV_JOIN_TIMEOUT", help="torchrun rendezvous join timeout, seconds.")]
DeadlineOption = Annotated[float | None, typer.Option(
    min=1, help="Seconds the tests of one image may take in all (default: the cell's validate.deadline_s).")]
ReportsOption = Annotated[Path | None, typer.Option(
    parser=path_of("--reports"), help="Where JUnit XML and verdicts go (default: the project's reports/).")]
RequireGpuOption = Annotated[bool, typer.Option(
    "--require-gpu", help="This is a GPU runner: exit 1 unless its GPUs are seen and usable "
                          "(also set by DL_IMAGES_REQUIRE_GPU=1).")]
BaselineOption = Annotated[list[Path] | None, typer.Option(
    parser=path_of("--baseline"), envvar="DL_IMAGES_BASELINE",
    help="Folder of earlier verdicts to compare the bus bandwidth with (same cell and GPUs); "
         "the reports folder is always searched.")]
BusbwWindowOption = Annotated[int, typer.Option(
    min=1, envvar="DL_IMAGES_BUSBW_WINDOW",
    help="Compare the bus bandwidth with the median of this many earlier nights.")]
JobsOption = Annotated[int, typer.Option(
    min=1, envvar="DL_IMAGES_VALIDATE_JOBS",
    help="Run the image tests on this many workers at once, each test declaring what it may run beside "
         "(image-tests/lanes.py); 1: one after another.")]
RerunOption = Annotated[bool, typer.Option(
    "--rerun", help="Run the image tests even when the registry holds a trusted passing verdict of the same image "
                    "digest, image tests, matrix and runner class (which validate otherwise reuses, storing nothing).")]
PlatformOption = Annotated[list[str] | None, typer.Option(
    "--platform",
    help="Only this platform's manifest of an image index (os/arch, repeatable or a comma list; e.g. "
         "linux/arm64 on a native arm64 GPU runner). Default: every platform of the index.")]

ExtraTestsOption = Annotated[Path | None, typer.Option(
    "--extra-tests", parser=path_of("--extra-tests"),
    help="A folder of the site's own checks (test_*.py), run as one more test group named after the folder "
         "(default: the matrix's validate.extra_tests). Release takes only verdicts of the committed one.")]


def validate(
    images: ImagesArgument = None,
    framework: FrameworkOption = None,
    all_cells: AllOption = False,
    store: StoreOption = True,
    select: SelectOption = None,
    peer: PeerOption = None,
    cell: CellOption = None,
    rdzv_join_timeout: JoinTimeoutOption = DEFAULT_JOIN_TIMEOUT_S,
    deadline: DeadlineOption = None,
    reports: ReportsOption = None,
    require_gpu: RequireGpuOption = False,
    baseline: BaselineOption = None,
    busbw_window: BusbwWindowOption = 7,
    jobs: JobsOption = DEFAULT_JOBS,
    platform: PlatformOption = None,
    extra_tests: ExtraTestsOption = None,
    rerun: RerunOption = False,
    tsa: TsaOption = None,
    revision: RevisionOption = None,
    as_json: JsonOption = False,
    matrix: MatrixOption = None,
) -> None:
    """Run image-tests inside images and store a verdict per digest (JUnit + JSON under reports/)."""
    check_arguments("validate", locals())   # every argument first (issue 37)
    check_writer(tsa)                       # and DL_IMAGES_TSA_URL with them
    from buildtool.contracts.gpu import require_gpu_from_env
    from buildtool.validate.runner import Options, gpu_inventory, matrix_digest, require_gpus, validate_image

    wanted = [p.strip() for item in platform or [] for p in item.split(",") if p.strip()]   # known (check_arguments)
    chosen = sum((bool(images), framework is not None, all_cells))
    if chosen != 1:
        raise UserError("name the images to validate: IMAGE..., --framework X or --all (exactly one)")
    project = find_project(matrix)
    loaded = project.load()
    # As loaded: every image's verdict names this matrix, however long the runs take.
    bound = matrix_digest(loaded, project.root)
    peers = _peers(peer or [])
    refs = list(images or [])
    _tags_name_cells(loaded, refs)
    if not refs:
        refs = _dev_refs(project, loaded, framework, revision, peers)
    # SIGTERM (CI cancelling a job) unwinds like Ctrl-C, so containers are removed.
    signal.signal(signal.SIGTERM, _interrupt)
    # A --reports given is the current folder's, as every path option; left out, the project's reports/.
    folder = project.root / "reports" if reports is None else reports.absolute()
    options = Options(store=store, select=select, join_timeout_s=rdzv_join_timeout, peers=peers,
                      reports=folder, cell=cell, deadline_s=deadline,
                      require_gpu=require_gpu or require_gpu_from_env(), baselines=list(baseline or []),
                      busbw_window=busbw_window, jobs=jobs, extra_tests=extra_tests, rerun=rerun,
                      matrix_digest=bound)
    if options.require_gpu:
        # A declared GPU runner without GPUs stops before the registry is asked (for an image index).
        require_gpus(gpu_inventory())
    # one verdict per image, or per platform manifest of an image index (foreign ones under QEMU)
    with using(tsa), _writing_reports(folder):
        verdicts = [validate_image(ref, loaded, project.root, options, log, one)
                    for ref in refs for one in _ref_platforms(ref, wanted)]
    _report(verdicts, as_json, folder)


@contextmanager
def _writing_reports(folder: Path) -> Iterator[None]:
    """A run's reports that cannot be written (--reports through a file, no permission, a full disk) are one line
    naming the folder and why (exit 2), never a traceback; an OSError of anything else is not about --reports."""
    folder = folder.resolve()   # as the run names its files (runner.run_folder)
    try:
        yield
    except OSError as exc:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        if not full and not (exc.filename is not None and Path(exc.filename).is_relative_to(folder)):
            raise
        where = f" ({exc.filename})" if exc.filename is not None and Path(exc.filename) != folder else ""
        raise UserError(f"--reports {folder}: cannot write the run's reports there{where}: {exc.strerror or exc}; "
                        "free space there or give a --reports folder this user can write") from None


def _report(verdicts: list[dict[str, Any]], as_json: bool, reports: Path) -> None:
    """The verdicts as a table (or JSON), what was incomplete, and exit 1 naming the images that failed."""
    if as_json:
        # Straight to the stream: rich made an emoji code in a test's message (`:ok:`) an emoji, even with markup off.
        say(json.dumps(verdicts, indent=1))
    else:
        _print_verdicts(verdicts)
    _say_incomplete(verdicts)
    failed = [v["image"] for v in verdicts if v["result"] == "failed"]
    if failed:
        raise FailedError(f"image tests failed for {', '.join(failed)}; see reports under {reports}/")


def _tags_name_cells(loaded: Matrix, refs: list[str]) -> None:
    """A matrix image's tag must name one of its cells (`:garbage` is exit 2 naming the tag, before the registry
    is asked whether it exists); a foreign image, or one named by digest, is the engine's and registry's to find."""
    from buildtool.launch.multinode import cell_for_image

    for ref in refs:
        if "@" not in ref.rpartition("/")[2]:
            cell_for_image(loaded, ref)


def _dev_refs(project: Project, loaded: Matrix, framework: str | None, revision: str | None,
              peers: dict[str, str]) -> list[str]:
    """This commit's dev images of --framework X (or --all); PEERS gains, for each framework that has none
    from --peer, the other framework's dev image of the same commit, for the cross-framework tests."""
    from buildtool.matrix.plan import Settings, plan_cell

    rev = project.revision(revision)
    plans = [plan_cell(c, Settings.from_env(), rev) for c in loaded.select(framework)]
    everything = [plan_cell(c, Settings.from_env(), rev) for c in loaded.cells]
    for p in plans:
        for other in frameworks.others(p.cell.framework):
            if other.name not in peers:
                twin = next((q for q in everything if q.cell.framework == other.name
                             and q.cell.accelerator == p.cell.accelerator), None)
                if twin and _exists(twin.dev_ref):
                    peers[other.name] = twin.dev_ref
    return [p.dev_ref for p in plans]


def _ref_platforms(ref: str, wanted: list[str]) -> list[str | None]:
    """The platforms of REF to validate: every one of its index ([None] for a single image), or the --platform
    ones, each of which the index must have."""
    from buildtool.validate.containers import index_platforms

    per_platform: list[str | None] = list(index_platforms(ref)) or [None]
    if not wanted:
        return per_platform
    # The nightly validates each platform of a GPU cell on a native runner of it (render.workflows).
    missing = [p for p in wanted if p not in per_platform]
    if missing:
        raise UserError(f"--platform {', '.join(missing)}: {ref} is "
                        + (f"an index of {', '.join(str(p) for p in per_platform)}"
                           if per_platform != [None] else "a single image, not an index") + " only")
    return [p for p in per_platform if p in wanted]


def _print_verdicts(verdicts: list[dict[str, Any]]) -> None:
    """One line for each verdict reused (validate.reuse); a table of the others on stdout, then each failed and
    skipped test; where each verdict is stored."""
    from rich.table import Table

    for v in verdicts:
        if v.get("reused"):
            say(printable(reused_line(v)))
    verdicts = [v for v in verdicts if not v.get("reused")]
    if not verdicts:
        return
    table = Table(title="Validation")
    for column in ("image", "cell", "platform", "digest", "result", "passed", "failed", "skipped", "seconds"):
        table.add_column(column, overflow="fold")
    for v in verdicts:
        counts = {k: sum(t["result"] == k for t in v["tests"]) for k in ("passed", "failed", "skipped")}
        table.add_row(v["image"], v["cell"], v["platform"] + (" (emulated)" if v["emulated"] else ""),
                      v["digest"][:19], v["result"], str(counts["passed"]),
                      str(counts["failed"]), str(counts["skipped"]), f"{v['duration_s']:.1f}")
    out.print(table)
    # Verbatim, each control character escaped: a test's message is the image's text (printable).
    for v in verdicts:
        if v.get("problem"):
            say(printable(f"FAILED {v['image']}: {v['problem']}"))
        for t in v["tests"]:
            if t["result"] == "failed":
                say(printable(f"FAILED {t['id']}: {t['message'].splitlines()[0] if t['message'] else ''}"))
            elif t["result"] == "skipped":
                say(printable(f"SKIPPED {t['id']}: {t['skip_reason']}"))
        if v.get("stored"):
            log(printable(f"verdict for {v['digest']} stored as {v['stored']}"))


def reused_line(v: dict[str, Any]) -> str:
    """The one line that says a verdict was reused, naming it (validate.reuse)."""
    counts = {k: sum(t["result"] == k for t in v["tests"]) for k in ("passed", "failed", "skipped")}
    return (f"reused verdict {v['reused']} of {v['image']} ({v['digest']}, {v['platform']}): {v['result']}, "
            f"{counts['passed']} passed, {counts['skipped']} skipped, started {v['started']}, signed by "
            f"{v['signed_by']}; same image tests, matrix and runner class ({v['runner_class']}): nothing run, nothing "
            "stored (--rerun runs the tests again)")


def _say_incomplete(verdicts: list[dict[str, Any]]) -> None:
    """On stderr, each incomplete verdict: why, and what would complete it."""
    for v in verdicts:
        if v["result"] == "incomplete":
            reasons = v["incomplete"]
            hint = ("validate it on a runner with usable GPUs" if any("GPU" in r for r in reasons) else
                    "validate without -k" if any("deselected" in r for r in reasons) else "validate it again")
            log(printable(f"INCOMPLETE {v['cell']} ({v['image']}): {'; '.join(reasons)}. The verdict is "
                          f"{'stored ' if v.get('stored') else ''}incomplete and cannot release this image; {hint}"))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _exists(ref: str) -> bool:
    """Whether a dev image is in its registry (a quick check; any failure means no)."""
    from buildtool.common.refs import split_repo
    from buildtool.registry.client import RegistryClient, RetryPolicy

    try:
        host, repo, tag = split_repo(ref)
        return RegistryClient(host, retry=RetryPolicy(attempts=1, timeout=5)).manifest_digest(repo, tag) is not None
    except Exception:  # noqa: BLE001 - a missing twin only means the cross tests skip
        return False
