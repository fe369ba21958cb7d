"""`buildtool release`: promote tested dev images of a commit to release tags (the typer command:
help and usage; the work is in buildtool.cli.release_run, which also parses the common case itself)."""

from __future__ import annotations

from typing import Annotated

import typer

from buildtool.cli.options import JsonOption, MatrixOption
from buildtool.cli.release_run import print_report  # noqa: F401 - the table, for callers of this module

VersionOption = Annotated[str, typer.Option("--version", envvar="VERSION",
                                            help="Release version, e.g. 0.1.0 (tags <version>-<release>).")]
FromOption = Annotated[str | None, typer.Option("--from", "--revision", envvar="REVISION",
                                                help="Git sha (or the revision given to `build --revision`) "
                                                "whose dev images to promote (default: HEAD, as `buildtool "
                                                "build` names it).")]
FrameworkOption = Annotated[list[str] | None, typer.Option(
    "--framework", "-f", help="An image, a cell, a framework or all (repeatable, or comma list).")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Check gates and show the tag plan; write nothing.")]
ForceOption = Annotated[bool, typer.Option("--force", help="Move the matrix's moving tags (e.g. latest) even to "
                                           "an older release. Never moves version tags.")]
AcceptSkipOption = Annotated[list[str] | None, typer.Option(
    "--accept-skip", help="Accept skipped tests of this skip code (CODE, or CODE:SUBJECT for one subject, "
    "e.g. ulimit-not-granted:memlock) although the matrix expects them to run; only codes marked waivable (a "
    "runner's limits). Recorded as a waiver in the release notes. Never covers GPU tests of GPU images.")]
TrustLocalKeyOption = Annotated[bool, typer.Option(
    "--trust-local-key", help="Also trust verdicts signed by this machine's local dev key (made by "
    "validate when DL_IMAGES_SIGNING_KEY is unset); only for a loopback registry, never for real releases.")]


def register(app: typer.Typer) -> None:
    app.command("release")(release_command)


def release_command(
    version: VersionOption,
    from_sha: FromOption = None,
    framework: FrameworkOption = None,
    dry_run: DryRunOption = False,
    force: ForceOption = False,
    accept_skip: AcceptSkipOption = None,
    trust_local_key: TrustLocalKeyOption = False,
    as_json: JsonOption = False,
    matrix: MatrixOption = None,
) -> None:
    """Promote the dev images of a commit to release tags, digest for digest, inside the registry."""
    from buildtool.cli.release_run import run_release

    run_release(version=version, from_sha=from_sha, framework=framework, dry_run=dry_run, force=force,
                accept_skip=accept_skip, trust_local_key=trust_local_key, as_json=as_json, matrix=matrix)
