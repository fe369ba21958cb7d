"""`buildtool verify IMAGE`: the signed chain of one image (provenance, SBOM, verdict), as anyone with
the registry and the trusted keys can check it. Exit 0 verified, 1 with one line naming the first link
that does not hold, 2 for bad input (a malformed reference or keys file, an unreachable registry)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from buildtool.cli.options import JsonOption, MatrixOption, emit_json, find_project, say
from buildtool.common.errors import FailedError, UserError


def register(app: typer.Typer) -> None:
    @app.command()
    def verify(
        image: Annotated[str, typer.Argument(help="A registry reference, by tag or digest (an index: each platform).")],
        trust_local_key: Annotated[bool, typer.Option(
            "--trust-local-key", help="Also trust this machine's local dev key (as builder and tester); only for a "
                                      "loopback registry.")] = False,
        keys: Annotated[Path | None, typer.Option(
            "--keys", help="The trusted keys file (default: config/trusted-keys.yaml of the project).")] = None,
        as_json: JsonOption = False,
        matrix: MatrixOption = None,
    ) -> None:
        """Fetch and verify IMAGE's provenance, SBOM attestation and verdict against the trusted keys, and
        print the chain: built by, from, sbom, tested by, result."""
        from buildtool.common.refs import ReferenceError, is_loopback_host, parse_reference
        from buildtool.registry.client import RegistryClient
        from buildtool.release.chain import verify_reference
        from buildtool.validate.keys import dev_public_key, load_trusted

        try:
            parsed = parse_reference(image)
        except ReferenceError as exc:
            raise UserError(f"{image}: {exc}") from None
        if not parsed.domain:
            raise UserError(f"{image} names no registry: verify reads a pushed image (host/repository:tag or @digest)")
        root = keys.resolve().parent if keys is not None and matrix is None else find_project(matrix).root
        trusted = load_trusted(root, keys.resolve() if keys is not None else None)
        if trust_local_key:
            if not is_loopback_host(parsed.domain):
                raise UserError(f"--trust-local-key is only for a loopback registry, not {parsed.domain}")
            local = dev_public_key()
            if local is None:
                raise UserError("--trust-local-key: this machine has no local dev key")
            trusted.add_dev(local)
        chains = verify_reference(RegistryClient(parsed.domain), image, trusted)
        failed = [c for c in chains if not c.ok]
        if as_json:
            emit_json({"image": image, "verified": not failed and bool(chains),
                       "problem": failed[0].problem if failed else "", "manifests": [c.to_json() for c in chains]})
        else:
            for chain in chains:
                if chain.platform:
                    say(f"platform {chain.platform}")
                for link, text in chain.lines:
                    say(f"{link:<7} {text}")
                if not chain.ok:
                    say(f"{'result':<7} NOT verified: {chain.problem}")
        if not chains:
            raise FailedError(f"{image} names an index with no platform manifest")
        if failed:
            raise FailedError(failed[0].problem)
