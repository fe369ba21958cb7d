"""The SBOM gate of a release: the verdict must name the image's signed SBOM, and the registry must
still hold that very document, signed by a trusted builder, with the plain SBOM beside it the same.

What it stops: a verdict from before verdicts named SBOMs (schema 3) or one whose validate found no
signed SBOM; an SBOM attestation or plain SBOM rewritten after validation (anyone who may push can
attach another; only a builder key signs one, and the digest the tester signed names exactly one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from buildtool.contracts.verdict import Verdict
from buildtool.registry.client import RegistryClient
from buildtool.release.model import Evidence
from buildtool.sbom.signing import SbomFindings, find_sbom_attestation, plain_sbom_problem

if TYPE_CHECKING:
    from buildtool.attest.keys import TrustedKeys


def sbom_problems(digest: str, verdict: Verdict, findings: SbomFindings) -> list[str]:
    """Why the SBOM the verdict names is not the image's signed SBOM (empty: it is)."""
    if not verdict.sbom:
        why = verdict.sbom_problem or f"a schema-{verdict.schema_} verdict, from before verdicts named SBOMs"
        return [f"the verdict of {digest} names no SBOM ({why}); push the image again (push signs its SBOM), "
                "then validate it again"]
    chosen = findings.chosen
    if chosen is None:
        return [f"{digest} has no valid SBOM attestation ({findings.why_none()}), but its verdict names SBOM "
                f"{verdict.sbom}"]
    if chosen.digest != verdict.sbom:
        return [f"the signed SBOM of {digest} in the registry is {chosen.digest} (attestation {chosen.artifact}), "
                f"but the verdict names {verdict.sbom}: the SBOM was rewritten or re-signed after validation; "
                "find out who wrote it, then validate the image again"]
    return []


def gate_sbom(client: RegistryClient, item: Evidence, dev_repo: str, trusted: TrustedKeys) -> None:
    """Check the verdict's SBOM against the registry (`item.verdict` is the counting verdict of one platform
    manifest, `item.digest`); sets item.sbom_attestation (release copies it) or adds the problems."""
    if item.verdict is None:
        return
    findings = find_sbom_attestation(client, dev_repo, item.digest, trusted)
    item.ignored += [f"{artifact}: {why}" for artifact, why in findings.rejected]
    problems = sbom_problems(item.digest, item.verdict, findings)
    if not problems:
        plain = plain_sbom_problem(client, dev_repo, item.digest, findings.digest)
        problems = [plain] if plain else []
    if problems:
        item.problems += problems
        return
    item.sbom_attestation = findings.referrer
    dev = " (this machine's local dev key, --trust-local-key)" if findings.signer in trusted.dev else ""
    item.notes.append(f"SBOM {findings.digest} signed by {trusted.describe(findings.signer)}{dev}")
