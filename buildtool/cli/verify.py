"""`buildtool verify IMAGE`: the signed chain of one image (provenance, SBOM, verdict), as anyone with
the registry and the trusted keys can check it. Exit 0 verified, 1 with one line naming the first link
that does not hold, 2 for bad input (a malformed reference or keys file, an unreachable registry)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildtool.cli.console import printable, project_or_none
from buildtool.cli.options import JsonOption, MatrixOption, emit_json, find_project, path_of, say
from buildtool.common.errors import FailedError, UserError
from buildtool.contracts.arguments import check_arguments

if TYPE_CHECKING:
    from buildtool.attest.keys import TrustedKeys
    from buildtool.release.chain import Checkout, Verification


ImageArgument = Annotated[str, typer.Argument(help="A registry reference, by tag or digest (an index: each platform).")]
TrustLocalKeyOption = Annotated[bool, typer.Option(
    "--trust-local-key", help="Also trust this machine's local dev key (as builder and tester); only for a "
                              "loopback registry.")]
KeysOption = Annotated[Path | None, typer.Option(
    "--keys", parser=path_of("--keys"),
    help="The trusted keys file (default: config/trusted-keys.yaml of the project).")]
AcceptSkipOption = Annotated[list[str] | None, typer.Option(
    "--accept-skip", help="As release's: skips of this waivable skip code (CODE or CODE:SUBJECT) count as "
                          "waived (repeatable).")]


def verify(
    image: ImageArgument,
    trust_local_key: TrustLocalKeyOption = False,
    keys: KeysOption = None,
    accept_skip: AcceptSkipOption = None,
    as_json: JsonOption = False,
    matrix: MatrixOption = None,
) -> None:
    """Fetch and verify IMAGE's provenance, SBOM attestation and verdict against the trusted keys, and
    print the chain: built by, from, sbom, tested by, result."""
    check_arguments("verify", locals())   # every argument first (issue 37)
    from buildtool.common import argcheck
    from buildtool.common.refs import is_loopback_host
    from buildtool.registry.client import RegistryClient
    from buildtool.release.chain import verify_reference

    parsed = argcheck.reference("IMAGE", image)   # cut, escaped, no password echoed (issue 37)
    if not parsed.domain:
        raise UserError(f"{image} names no registry: verify reads a pushed image (host/repository:tag or @digest)")
    if trust_local_key and not is_loopback_host(parsed.domain):
        raise UserError(f"--trust-local-key is only for a loopback registry, not {parsed.domain}")
    checkout = _checkout(matrix, keys)
    trusted = _trusted(checkout, keys, matrix, trust_local_key)
    if not trust_local_key and is_loopback_host(parsed.domain):
        from buildtool.attest.keys import dev_public_key

        trusted.offer_dev(dev_public_key())   # named, with the flag, in a refusal of what it signed
    found = verify_reference(RegistryClient(parsed.domain), image, trusted, checkout,
                             accept_skips=tuple(accept_skip or ()))
    if as_json:
        emit_json(found.to_json())
    else:
        _print(found)
    if not found.ok:
        raise FailedError(printable(found.problem))


def _trusted(checkout: Checkout | None, keys: Path | None, matrix: Path | None, trust_local_key: bool) -> TrustedKeys:
    """The trusted keys: --keys, else the project's file; with --trust-local-key, this machine's dev key too."""
    from buildtool.attest.keys import dev_public_key, load_trusted

    if keys is not None and (matrix is None or checkout is None):
        root = keys.resolve().parent
    else:
        assert checkout is not None   # _checkout raises without a project unless --keys is given
        root = checkout.root
    trusted = load_trusted(root, keys.resolve() if keys is not None else None)
    if trust_local_key:
        local = dev_public_key()
        if local is None:
            raise UserError("--trust-local-key: this machine has no local dev key")
        trusted.add_dev(local)
    return trusted


def _print(found: Verification) -> None:
    """What was read, each platform's chain; every problem; what could not be checked; then one result line,
    the answer release's gate reaches where it ran (a checkout at hand)."""
    # Each control character escaped: what is shown was read from the registry (anyone who may push writes there),
    # and an ANSI sequence or a line break in it must not forge a `result verified` line.
    for chain in found.chains:
        if chain.platform:
            say(printable(f"platform {chain.platform}"))
        for link, text in chain.lines:
            say(printable(f"{link:<7} {text}"))
    for problem in found.all_problems:
        say(printable(f"{'problem':<7} {problem}"))
    for why in found.not_run:
        say(printable(f"{'not run':<7} {why}"))
    say(printable(f"{'result':<7} " + ("verified" if found.ok else f"NOT verified: {found.problem}")
                  + ("" if found.gated or not found.ok else " (without release's gate: see `not run`)")))


def _checkout(matrix: Path | None, keys: Path | None) -> Checkout | None:
    """The project verify runs in (its matrix and git history), for release's cell checks; None when there is
    none at hand (`--keys` outside a project): verify then says which checks it could not run."""
    from buildtool.matrix.plan import Settings
    from buildtool.release.chain import Checkout

    project = find_project(matrix) if keys is None else project_or_none(matrix)
    if project is None:
        return None
    import os

    return Checkout(root=project.root, cells=project.load_fast().cells, settings=Settings.from_env(),
                    matrix_name=os.path.relpath(project.matrix_path, project.root))
