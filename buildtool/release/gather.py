"""Gating one image, read-only: resolve its dev tag, and for each platform manifest (the manifest itself
for a single-platform image) choose and check its verdict and the SBOM it names (buildtool.release.sbomgate)
and its provenance, read its configs, apply the gates (buildtool.release.gates).

An image index is released only when every one of its platform manifests passes on its own evidence: a
platform with no verdict, a failed one or one that does not verify refuses the whole index, naming it.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from buildtool.common.refs import split_repo_path
from buildtool.matrix.plan import CellPlan
from buildtool.registry.client import INDEX_TYPES, NotFound, RegistryClient, RegistryError
from buildtool.release.gates import (
    StandIns,
    attestation_problems,
    binding_problems,
    claimed_attestations,
    config_platform_problems,
    entry_problems,
    image_problems,
    index_entries,
    known_platform,
    provenance_problems,
    recorded_platform_problems,
    skip_allowed,
    verdict_problems,
    waiver_for,
)
from buildtool.release.model import Evidence, ImageRelease, ReleaseOptions
from buildtool.release.read import read_platforms
from buildtool.release.sbomgate import gate_sbom
from buildtool.validate.verdict_choice import Found, has_failure

if TYPE_CHECKING:
    from buildtool.attest.provenance_store import ProvenanceFindings


def _gate_verdict(client: RegistryClient, item: Evidence, plan: CellPlan, dev_repo: str,
                    options: ReleaseOptions, in_index: bool, revision: str | None = None) -> None:
    """The verdict that counts, checked; `revision`: what the digest's signed provenance names (None: no valid
    one), the image's revision whose committed image-tests the verdict may have run (testcode.CodeBook)."""
    from buildtool.validate.verdicts import find_verdicts

    trusted = options.trusted_keys()
    findings = find_verdicts(client, dev_repo, item.digest, trusted, plan.cell.key)
    item.ignored += [f"{r.artifact}: {r.reason}" for r in findings.rejected]
    item.problems += [f"a verdict of {item.digest} cannot be read or typed: {why}" for why in findings.blocking]
    decision = findings.decision()
    if decision.note:
        # The verdict that counts is not the newest whole run by the signer's clock alone: say why, in the refusal.
        counted = decision.counted
        (item.problems if counted is not None and (counted.verdict.result != "passed" or has_failure(counted.verdict))
         else item.notes).append(decision.note)
    if findings.overwritten:
        item.problems.append(findings.tampered(item.digest))
    chosen = decision.counted
    if chosen is None:
        if findings.rejected or findings.legacy:
            item.problems.append(f"{item.digest} has no valid verdict: {findings.why_none(trusted)}")
        elif not findings.blocking:
            item.problems.append(f"{item.digest} has no verdict in the registry; run `make validate "
                                 f"FRAMEWORK={plan.cell.key}` first")
        return
    # One-GPU runners (issue 39): the one-GPU verdict is judged, its multi-GPU skips covered by a trusted
    # multi-GPU verdict of the same digest that passes every check alone (verdict_choice.pair_problem).
    if decision.covered:
        item.notes.append(f"one-GPU runner's verdict {chosen.artifact[:19]}…, multi-GPU checks from: "
                          f"{decision.companion_note}")
    item.verdict, item.attestation = chosen.verdict, chosen.referrer
    item.verdict_ref = f"{plan.dev_repo}@{chosen.artifact}"
    item.signer = trusted.describe(chosen.keyid)
    if chosen.keyid in trusted.dev:
        item.notes.append(f"verdict signed by this machine's local dev key {item.signer} (--trust-local-key)")
    local = None
    known, code = options.test_code(revision), chosen.verdict.test_code
    codes = known.for_cell(plan.cell) if known is not None else {}
    site = f" with the site folder {plan.cell.extra_tests}" if plan.cell.extra_tests else ""
    if known is None:
        item.problems.append("no image-tests code to compare the verdict's with (release reads image-tests from "
                             "the git checkout it runs in)")
    elif code not in codes:
        dropped = (f"; {plan.cell.key}'s site checks ({plan.cell.site_group}) are part of its test code, so a "
                   "verdict that did not run them is of other test code" if site else "")
        item.problems.append(f"the verdict ran image-tests {code or '(none)'}, which is neither image-tests{site} at "
                             f"the image's revision nor at the release commit ({known.describe()}); test code that git "
                             f"does not hold at either proves nothing{dropped}: validate again with committed "
                             f"image-tests{site}")
    else:
        item.problems += binding_problems(plan.cell, chosen.verdict, known.matrices)
        item.problems += _companion_binding(plan, decision.companion, known.matrices)
        where, folder = codes[code]
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
    item.problems += verdict_problems(plan.cell, item.digest, chosen.verdict, options.accept_skips, local,
                                      decision.covered, tuple(decision.why_not))
    item.problems += recorded_platform_problems(plan.cell, item.platform or plan.cell.platforms[0], chosen.verdict,
                                                in_index)
    for t in chosen.verdict.tests:
        if t.result == "skipped":
            if t.id in decision.covered:
                item.skips.append({"id": t.id, "reason": t.skip_reason, "accepted_by": decision.covered[t.id]})
                continue
            pattern = None if skip_allowed(plan.cell, t, local) else waiver_for(plan.cell, t, options.accept_skips,
                                                                                 local)
            item.skips.append({"id": t.id, "reason": t.skip_reason,
                               "accepted_by": "matrix" if pattern is None else f"--accept-skip {pattern}"})


def _companion_binding(plan: CellPlan, companion: Found | None, matrices: dict[str, str]) -> list[str]:
    """The multi-GPU verdict that completes a one-GPU runner's decides the tests it covers: it must be bound to a
    committed matrix and the cell's library promises as the verdict it completes is (binding_problems)."""
    if companion is None:
        return []
    return [f"the multi-GPU verdict {companion.artifact[:19]}… that completes the one-GPU runner's verdict does not "
            f"count: {why}" for why in binding_problems(plan.cell, companion.verdict, matrices)]


def _tag_problem(client: RegistryClient, item: Evidence, plan: CellPlan, dev_repo: str, options: ReleaseOptions,
                 revision: str) -> str:
    """Why the image built at `revision` may not stand at the dev tag of plan.revision; "" when it is that commit's,
    or `buildtool build`'s retag of an unchanged cell there (options.retag_check: its content key is the cell's at
    the tag's commit)."""
    from buildtool.release.ancestry import tag_revision_problem

    why = tag_revision_problem(plan.revision, revision)
    if not why:
        return ""
    if options.retag_check is None:
        return f"{why}; no checkout to compare the cell's content key at {plan.revision} with the image's"
    raw, media_type, _ = client.get_manifest(dev_repo, item.digest)
    [image] = read_platforms(client, dev_repo, raw, media_type)
    platform = (item.platform or plan.cell.platforms[0]) if plan.cell.multi_platform else None
    retag = options.retag_check(plan, revision, image.labels, platform)
    return f"{why}; not the image `buildtool build` retags for an unchanged cell: {retag}" if retag else ""


def _gate_provenance(client: RegistryClient, item: Evidence, plan: CellPlan, dev_repo: str, options: ReleaseOptions,
                     found: ProvenanceFindings) -> None:
    """The digest's signed provenance from a trusted builder key (`found`), built from the revision its dev tag names
    (plan.revision, "" when the image was named by digest) or `buildtool build`'s retag of it, and one release may
    take (the release commit or its ancestor); what it must say is checked with the image (provenance_problems)."""
    trusted = options.trusted_keys()
    item.ignored += [f"{artifact}: {reason}" for artifact, reason in found.rejected]
    if found.provenance is None:
        item.problems.append(f"{item.digest} has no valid provenance: {found.why_none()}; release needs one signed "
                             f"by a key trusted as builder in {trusted.source}")
        return
    revision = found.provenance.buildDefinition.externalParameters.revision
    if options.source_check is None:
        item.problems.append(f"no git checkout to check the provenance's revision {revision} against: release "
                             "runs in the clone of the release commit")
        return
    why = options.source_check(found.provenance)
    if not why:
        # Anyone with push rights can put an older commit's signed image at this commit's dev tag.
        why = [w for w in [_tag_problem(client, item, plan, dev_repo, options, revision)] if w]
    if why:
        item.problems += [f"{item.digest}: {w}" for w in why]
        return
    item.provenance, item.provenance_artifact, item.builder_signer = found.provenance, found.referrer, found.signer
    if found.keyid in trusted.dev:
        item.notes.append(f"provenance signed by this machine's local dev key {found.signer} (--trust-local-key)")


def _subjects(client: RegistryClient, item: ImageRelease, plan: CellPlan) -> list[str]:
    """One Evidence per platform manifest of the dev image (item.evidence), and the problems of the index's
    platforms against the cell's (gates.entry_problems). A single manifest is the cell's only platform."""
    if item.media_type not in INDEX_TYPES:
        item.evidence = [Evidence(item.digest)]
        if plan.cell.multi_platform:
            return [f"{item.digest} is a single image manifest, but the matrix gives {plan.cell.key} the platforms "
                    f"{', '.join(plan.cell.platforms)}: its dev tag must be an image index; push the cell again"]
        return []
    manifest = json.loads(item._raw)
    entries = index_entries(manifest)
    # Only entries of a platform the cell has are gated one by one; any other is refused by entry_problems.
    item.evidence = [Evidence(e.digest, name) for e in entries
                     if (name := known_platform(e.platform)) in plan.cell.platforms and e.digest and not e.broken]
    return entry_problems(plan.cell, entries) + unproven_attestations(client, split_repo_path(plan.dev_repo)[1],
                                                                      manifest)


def unproven_attestations(client: RegistryClient, repo: str, manifest: dict[str, object]) -> list[str]:
    """Every index entry that claims to be an attestation manifest, read by its digest and proven one
    (gates.attestation_problems), or refused: release and verify leave out only what is proven."""
    others = {e.digest for e in index_entries(manifest)}
    problems = []
    for entry in claimed_attestations(manifest):
        digest = str(entry["digest"]) if "digest" in entry else ""   # noqa: SIM401 (a descriptor, not a verdict)
        try:
            raw, _, got = client.get_manifest(repo, digest)
            body = json.loads(raw) if got == digest else None
        except (NotFound, RegistryError, ValueError):
            body = None
        problems += attestation_problems(entry, body if isinstance(body, dict) else None, others)
    return problems


def _gate_platform(client: RegistryClient, ev: Evidence, plan: CellPlan, dev_repo: str, options: ReleaseOptions,
                   in_index: bool) -> None:
    from buildtool.attest.provenance_store import find_provenance

    # Read first, checked after the verdict as ever: the revision it names is where the verdict's test code may
    # come from (for release and verify alike, never the dev tag's or --from's revision).
    found = find_provenance(client, dev_repo, ev.digest, options.trusted_keys())
    signed = found.provenance.buildDefinition.externalParameters.revision if found.provenance is not None else None
    _gate_verdict(client, ev, plan, dev_repo, options, in_index, signed)
    _gate_provenance(client, ev, plan, dev_repo, options, found)
    gate_sbom(client, ev, dev_repo, options.trusted_keys())    # the SBOM the counting verdict names


def gather(client: RegistryClient, plan: CellPlan, options: ReleaseOptions,
           standins: StandIns | None = None, image_gate: bool = True) -> ImageRelease:
    """Read-only: resolve the dev tag, verify each platform's verdict, read the configs, apply the gates
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
    item.problems += _subjects(client, item, plan)
    in_index = media_type in INDEX_TYPES
    with ThreadPoolExecutor(max_workers=1 + len(item.evidence)) as side:    # configs and platforms side by side
        platforms = side.submit(read_platforms, client, dev_repo, raw, media_type)
        jobs = [side.submit(_gate_platform, client, ev, plan, dev_repo, options, in_index) for ev in item.evidence]
        for job in jobs:
            job.result()
        item.platforms = platforms.result()
    item.ignored += [f"{ev.platform}: {i}" if ev.platform else i for ev in item.evidence for i in ev.ignored]
    item.problems += [f"{ev.platform}: {p}" if ev.platform else p for ev in item.evidence for p in ev.problems]
    expected = {ev.digest: ev.platform or plan.cell.platforms[0] for ev in item.evidence}
    item.problems += config_platform_problems(item.platforms, expected)
    item.status = "refused" if item.problems else "ready"
    if image_gate:
        finish_gate(item, plan, standins, [])
    return item


def finish_gate(item: ImageRelease, plan: CellPlan, standins: StandIns | None, standin_problems: list[str]) -> None:
    """The image's own gate, once the mirror's stand-ins are read (`standin_problems`: why they could not be):
    its labels and base, each platform's provenance against its image. Release and verify both end with it."""
    if not item.digest:
        return
    item.problems += image_problems(plan.cell, item.platforms, standins) + standin_problems
    item.problems += evidence_provenance_problems(plan, item, standins)
    item.status = "refused" if item.problems else "ready"


def evidence_provenance_problems(plan: CellPlan, item: ImageRelease, standins: StandIns | None) -> list[str]:
    """What each platform's provenance must say, checked against that platform's image (labels, base) only:
    each platform is built on its own platform's base manifest, and for its platform."""
    problems = []
    by_digest = {p.digest: p for p in item.platforms}
    for ev in item.evidence:
        found = [by_digest[ev.digest]] if ev.digest in by_digest else []
        own = provenance_problems(plan.cell, ev.digest, ev.provenance, found, standins)
        want = ev.platform or plan.cell.platforms[0]
        if ev.provenance is not None and ev.provenance.buildDefinition.externalParameters.platform != want:
            own.append(f"the provenance of {ev.digest} says it was built for "
                       f"{ev.provenance.buildDefinition.externalParameters.platform!r}, not {want}")
        problems += [f"{ev.platform}: {p}" if ev.platform else p for p in own]
    return problems
