"""Gating one image, read-only: resolve its dev tag, choose and check its verdict and the SBOM it names
(buildtool.release.sbomgate), read its configs, apply the gates (buildtool.release.gates).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from buildtool.common.refs import split_repo_path
from buildtool.matrix.plan import CellPlan
from buildtool.registry.client import NotFound, RegistryClient
from buildtool.release.gates import (
    StandIns,
    image_problems,
    provenance_problems,
    skip_allowed,
    verdict_problems,
    waiver_for,
)
from buildtool.release.model import ImageRelease, ReleaseOptions
from buildtool.release.read import read_platforms
from buildtool.release.sbomgate import gate_sbom


def _gate_verdict(client: RegistryClient, item: ImageRelease, plan: CellPlan, dev_repo: str,
                  options: ReleaseOptions) -> None:
    from buildtool.validate.verdicts import find_verdicts

    trusted = options.trusted_keys()
    findings = find_verdicts(client, dev_repo, item.digest, trusted, plan.cell.key)
    item.ignored = [f"{r.artifact}: {r.reason}" for r in findings.rejected]
    if findings.overwritten:
        item.problems.append(f"a verdict of {item.digest} was overwritten in the registry "
                             f"({'; '.join(findings.overwritten)}): the registry was tampered with; find out who "
                             "wrote it, then validate the image again")
    chosen = findings.chosen
    if chosen is None:
        if findings.rejected or findings.legacy:
            item.problems.append(f"{item.digest} has no valid verdict: {findings.why_none(trusted)}")
        else:
            item.problems.append(f"{item.digest} has no verdict in the registry; run `make validate "
                                 f"FRAMEWORK={plan.cell.key}` first")
        return
    item.verdict, item.attestation = chosen.verdict, chosen.referrer
    item.verdict_ref = f"{plan.dev_repo}@{chosen.artifact}"
    item.signer = trusted.describe(chosen.keyid)
    if chosen.keyid in trusted.dev:
        item.notes.append(f"verdict signed by this machine's local dev key {item.signer} (--trust-local-key)")
    local = None
    known, code = options.test_code(), chosen.verdict.test_code
    if known is None:
        item.problems.append("no image-tests code to compare the verdict's with (release reads image-tests from "
                             "the git checkout it runs in)")
    elif code not in known.codes:
        item.problems.append(f"the verdict ran image-tests {code or '(none)'}, which is neither image-tests at the "
                             f"image's revision nor at the release commit ({known.describe()}); test code that git "
                             "does not hold at either proves nothing: validate again with committed image-tests")
    else:
        where, folder = known.codes[code]
        item.notes.append(f"verdict ran {where} ({code})")
        if folder is not None:
            from buildtool.validate.collect import defined_tests, missing_groups

            # The gate compares with the cell's groups, all of them: a folder that lacks one is a refusal.
            missing = missing_groups(plan.cell, folder)
            for group in missing:
                item.problems.append(f"{where} has no folder {folder / group}/ for the group {group} of "
                                     f"{plan.cell.key}: no verdict of that test code can have run it")
            if not missing:
                local = defined_tests(plan.cell, folder, code)
    item.problems += verdict_problems(plan.cell, item.digest, chosen.verdict, options.accept_skips, local)
    for t in chosen.verdict.tests:
        if t.result == "skipped":
            pattern = None if skip_allowed(plan.cell, t, local) else waiver_for(plan.cell, t, options.accept_skips,
                                                                                 local)
            item.skips.append({"id": t.id, "reason": t.skip_reason,
                               "accepted_by": "matrix" if pattern is None else f"--accept-skip {pattern}"})


def _gate_provenance(client: RegistryClient, item: ImageRelease, plan: CellPlan, dev_repo: str,
                     options: ReleaseOptions) -> None:
    """The digest's signed provenance from a trusted builder key, built from a revision release may take
    (the release commit or its ancestor); what it must say is checked with the image (provenance_problems)."""
    from buildtool.registry.provenance import find_provenance

    trusted = options.trusted_keys()
    found = find_provenance(client, dev_repo, item.digest, trusted)
    item.ignored += [f"{artifact}: {reason}" for artifact, reason in found.rejected]
    if found.provenance is None:
        item.problems.append(f"{item.digest} has no valid provenance: {found.why_none()}; release needs one signed "
                             f"by a key trusted as builder in {trusted.source}")
        return
    revision = found.provenance.buildDefinition.externalParameters.revision
    if options.revision_check is None:
        item.problems.append(f"no git checkout to check the provenance's revision {revision} against: release "
                             "runs in the clone of the release commit")
        return
    why = options.revision_check(revision)
    if why:
        item.problems.append(f"{item.digest}: {why}")
        return
    item.provenance, item.provenance_artifact, item.builder_signer = found.provenance, found.referrer, found.signer
    if found.keyid in trusted.dev:
        item.notes.append(f"provenance signed by this machine's local dev key {found.signer} (--trust-local-key)")


def gather(client: RegistryClient, plan: CellPlan, options: ReleaseOptions,
           standins: StandIns | None = None, image_gate: bool = True) -> ImageRelease:
    """Read-only: resolve the dev tag, verify the verdict, read the configs, apply the gates
    (the image's provenance gate too, unless the caller applies it: `image_gate=False`)."""
    _, dev_repo = split_repo_path(plan.dev_repo)
    item = ImageRelease(cell=plan.cell.key, image=plan.cell.name, source=plan.dev_ref, release_repo=plan.release_repo)
    try:
        raw, media_type, digest = client.get_manifest(dev_repo, plan.dev_tag)
    except NotFound:
        item.status = "refused"
        item.problems.append(f"no dev image {plan.dev_ref}; build and push it first "
                             f"(make push FRAMEWORK={plan.cell.key}) or pass --from <sha> of a built commit")
        return item
    item.digest, item.media_type, item._raw = digest, media_type, raw
    with ThreadPoolExecutor(max_workers=1) as side:    # configs and the verdict are read side by side
        platforms = side.submit(read_platforms, client, dev_repo, raw, media_type)
        _gate_verdict(client, item, plan, dev_repo, options)
        _gate_provenance(client, item, plan, dev_repo, options)
        gate_sbom(client, item, dev_repo, options.trusted_keys())    # the SBOM the counting verdict names
        item.platforms = platforms.result()
    if image_gate:
        item.problems += image_problems(plan.cell, item.platforms, standins)
        item.problems += provenance_problems(plan.cell, item.digest, item.provenance, item.platforms, standins)
    item.status = "refused" if item.problems else "ready"
    return item
