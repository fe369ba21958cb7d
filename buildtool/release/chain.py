"""`buildtool verify`: the chain of signed statements about one image, checked as release checks them.

For each platform manifest: the provenance, the SBOM attestation and the verdict that counts, each verified
against the trusted keys, and the links between them (docs/release-trust.md, "The SBOM as a signed attestation,
and `buildtool verify`"). With a checkout at hand (`Checkout`) verify then runs release's own gate
(buildtool.release.gather.gather, the very code release runs) on the image as the cell the verdict names;
without one it says which checks it could not run, and why (`Verification.not_run`). Nothing is waived.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

from buildtool.attest.keys import TESTER, TrustedKeys
from buildtool.attest.provenance_model import pinned_reference
from buildtool.attest.provenance_store import find_provenance
from buildtool.common.errors import UserError
from buildtool.common.refs import Reference, parse_reference
from buildtool.contracts import label_keys
from buildtool.contracts.names import DEV_SUFFIX, image_of_repo_path, parse_dev_tag
from buildtool.contracts.verdict import gpu_pass_problem, recorded_failure
from buildtool.registry.client import INDEX_TYPES, NotFound, RegistryClient
from buildtool.release.gates import entry_problems, index_entries, known_platform, provenance_problems, served_index
from buildtool.release.gather import unproven_attestations
from buildtool.release.read import read_child, read_platforms
from buildtool.sbom.signing import find_sbom_attestation, plain_sbom_problem
from buildtool.validate.verdicts import find_verdicts

if TYPE_CHECKING:
    from buildtool.attest.provenance_model import Provenance
    from buildtool.contracts.verdict import Verdict
    from buildtool.matrix.plan import Settings
    from buildtool.matrix.schema import Cell
    from buildtool.release.testcode import CodeBook, KnownCode


@dataclass(frozen=True)
class Checkout:
    """What verify needs to run release's cell checks: the project root (git), the matrix's cells, the settings
    (the stand-in mirror)."""

    root: Path
    cells: Sequence[Cell]
    settings: Settings
    # Read from git at `root` when None (what the command does); given by tests that have no such history.
    known_code: CodeBook | KnownCode | None = None
    source_check: Callable[[Provenance], list[str]] | None = None
    matrix_name: str = "matrix.yaml"     # the matrix file, relative to `root` (what verdicts are bound to)


@dataclass
class Chain:
    """What verify found about one platform manifest: one line per link, the first problem."""

    image: str                   # repository@digest
    platform: str = ""
    cell: str = ""               # the cell its signed provenance names ("" without one)
    lines: list[tuple[str, str]] = field(default_factory=list)   # (link, text) in chain order
    facts: dict[str, Any] = field(default_factory=dict)          # the same, for --json
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem

    def fail(self, problem: str) -> Chain:
        self.problem = self.problem or problem
        return self

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "platform": self.platform, "verified": self.ok, "problem": self.problem,
                **self.facts}


def in_role(trusted: TrustedKeys, role: str) -> TrustedKeys:
    """The trusted keys with only those trusted in `role` (what a verdict is opened against)."""
    keys = trusted.for_role(role)
    return TrustedKeys(keys=keys, names={k: v for k, v in trusted.names.items() if k in keys}, source=trusted.source,
                       dev={k for k in trusted.dev if k in keys}, roles={k: trusted.roles[k] for k in keys},
                       offered_dev=trusted.offered_dev)


@dataclass
class Verification:
    """What verify found about one reference: each platform manifest's chain, the image's own problems (its
    index entries; with a checkout, release's gate), and the checks it could not run and why."""

    image: str
    chains: list[Chain] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)
    cell: str = ""
    # True when release's own gate ran (a checkout was at hand): its problems alone decide, as they decide
    # release; the chains only show what was read.
    gated: bool = False

    @property
    def problem(self) -> str:
        if found := self.all_problems:
            return found[0]
        return "" if self.gated or self.chains else f"{self.image} names an index with no platform manifest"

    @property
    def all_problems(self) -> list[str]:
        """Every reason the image is not verified: release's gate's, or without it the chains' and the index's."""
        if self.gated:
            return list(self.problems)
        return [c.problem for c in self.chains if not c.ok] + self.problems

    @property
    def ok(self) -> bool:
        return not self.problem

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "verified": self.ok, "problem": self.problem, "cell": self.cell,
                "gated": self.gated, "problems": self.all_problems, "not_run": self.not_run,
                "manifests": [c.to_json() for c in self.chains]}


def manifests(client: RegistryClient, repo: str, ref: str) -> tuple[list[tuple[str, str]], list[str], str]:
    """(digest, platform) of each platform manifest `ref` names ("" platform for a single one), the problems
    of its index entries (release's checks: every entry a known platform, once, no index in an index, and
    an entry left out as an attestation only when it is proven one), and the digest `ref` names."""
    try:
        raw, media_type, digest = client.get_manifest(repo, ref)
    except NotFound:
        raise UserError(f"{client.host}/{repo}{'@' if ref.startswith('sha256:') else ':'}{ref} is not in the registry; "
                        "build and push it first (make push), or name an image it holds") from None
    if media_type not in INDEX_TYPES:
        return [(digest, "")], [], digest
    manifest = json.loads(raw)
    entries = index_entries(manifest)
    known = tuple(dict.fromkeys(n for e in entries if (n := known_platform(e.platform)) is not None and not e.broken))
    # No cell here: the platforms the index declares stand in for the cell's (checked against the matrix's
    # cell by release's gate when a checkout is at hand); unknown, missing, doubled and nested entries are not.
    loose = cast("Cell", SimpleNamespace(key=f"{repo}@{digest}", platforms=known))
    problems = entry_problems(loose, entries) + unproven_attestations(client, repo, manifest)
    return ([(e.digest, name) for e in entries
             if (name := known_platform(e.platform)) is not None and e.digest and not e.broken],
            problems, digest)


def verify_reference(client: RegistryClient, reference: str, trusted: TrustedKeys,
                     checkout: Checkout | None = None, now: dt.datetime | None = None,
                     accept_skips: tuple[str, ...] = ()) -> Verification:
    """The signed chain of every platform manifest REFERENCE names and, with a checkout, release's own gate on
    it; `accept_skips`: release's --accept-skip waivers, so an image released with one verifies with the same."""
    parsed = parse_reference(reference)
    found, problems, digest = manifests(client, parsed.path, parsed.digest or parsed.tag or "latest")
    result = Verification(image=reference, problems=problems)
    for child, platform in found:
        # A platform is named only for an index's entry: a single manifest is no index's child.
        result.chains.append(verify_digest(client, parsed.path, child, trusted, platform, now,
                                           index=digest if platform else ""))
    # The cell each platform is checked as (its label, else its signed provenance's): verdicts are read for that
    # cell only, as release reads them for the cell it releases.
    cells = sorted({c.cell for c in result.chains if c.cell})
    result.cell = cells[0] if len(cells) == 1 else ""
    if len(cells) > 1:
        result.problems.append(f"the platforms are of different cells ({', '.join(cells)})")
    if checkout is None:
        result.not_run += [
            "the cell's checks (its test groups and every test they define, skip codes, GPU tests, the matrix "
            "cell's platforms and upstream base, the mirror's stand-ins): no checkout (run verify in the project, "
            "or pass --matrix)",
            "the provenance's revision (committed, known to git, HEAD or its ancestor): no git checkout",
            "the verdict's test code (image-tests as committed at the image's revision): no git checkout"]
        return result
    named = _tag_cell(parsed, checkout.cells, result.cell)
    if named:   # release of that cell reads this very tag: the image is gated as it, whatever cell it says it is
        result.cell = named
    if not result.cell:
        # Platforms that each name a cell, but not the same one, disagree: checking the image as either is a guess.
        why = (f"the platforms disagree on the cell: their cell labels, else their signed provenances, name "
               f"{' and '.join(cells)}, so there is no one cell to check the image as; name the image by the dev tag "
               "of the cell to check it as" if len(cells) > 1
               else "neither a cell label nor a signed provenance names the cell to check the image as")
        result.not_run.append(f"release's gate: {why}")
        return result
    result.problems = _release_gate(client, parsed, digest, result, trusted, checkout, accept_skips)
    result.gated = True
    return result


def _tag_cell(parsed: Reference, cells: Sequence[Cell], labelled: str) -> str:
    """The cell whose dev tag `parsed` is (`<name>-dev:<revision>-<version>`: the one release of that cell reads),
    `labelled` (the cell the image says it is) where it is one of them; "" when it is no cell's dev tag."""
    tag, repo = parsed.tag, parsed.path
    if not tag or not repo.endswith(DEV_SUFFIX):
        return ""
    named = [c.key for c in cells if c.name == image_of_repo_path(repo) and parse_dev_tag(tag, c.version)]
    return labelled if labelled in named else next(iter(named), "")


def _release_gate(client: RegistryClient, parsed: Reference, digest: str, result: Verification,
                  trusted: TrustedKeys, checkout: Checkout, accept_skips: tuple[str, ...]) -> list[str]:
    """Release's gate (gather and finish_gate: the same code, the same problems) on the image (`parsed`, read as
    `digest`) as the cell its signed provenance names, read-only. Where `parsed` names a dev tag of the cell, the
    provenance must name its revision, or the image be `buildtool build`'s retag there, as release checks it."""
    from functools import partial

    from buildtool.matrix.plan import CellPlan
    from buildtool.release.ancestry import retag_problem, source_problems
    from buildtool.release.gather import finish_gate, gather
    from buildtool.release.model import ReleaseOptions
    from buildtool.release.read import read_standins
    from buildtool.release.testcode import CodeBook

    cell = next((c for c in checkout.cells if c.key == result.cell), None)
    if cell is None:
        return [f"the image is of cell {result.cell!r} (its {label_keys.CELL} label, else its provenance), which the "
                f"matrix of {checkout.root} does not have"]
    # Release's rule: image-tests at the revision each platform's signed provenance names, or at HEAD (the
    # release commit), asked for by the gate per platform.
    known = checkout.known_code or CodeBook(checkout.root, checkout.matrix_name,
                                            (cell.extra_tests,) if cell.extra_tests else ())
    options = ReleaseOptions(version="", revision="HEAD", trusted=trusted, known_code=known, accept_skips=accept_skips,
                             source_check=checkout.source_check or partial(source_problems, checkout.root,
                                                                           matrix_name=checkout.matrix_name),
                             retag_check=partial(retag_problem, checkout.root))
    host, repo, tag = parsed.domain or client.host, parsed.path, parsed.tag
    dev_tag = parse_dev_tag(tag, cell.version) if tag and repo.endswith(DEV_SUFFIX) else None
    if dev_tag is None:
        result.not_run.append("the dev tag's revision against the provenance's: the image was not named by a dev tag "
                              f"of {cell.key} (<name>-dev:<revision>-{cell.version}), so it claims no commit")
    # Read by digest (the tag may move meanwhile); the tag's revision is compared with the provenance's all the same.
    plan = CellPlan(cell=cell, revision=dev_tag.revision if dev_tag else "", dev_repo=f"{host}/{repo}", dev_tag=digest,
                    release_repo="", release_tags=(), moving_tags=(), base=cell.base)
    standins, standin_problems = read_standins(client, checkout.settings, checkout.cells)
    item = gather(client, plan, options, standins, image_gate=False)
    finish_gate(item, plan, standins, standin_problems)
    return item.problems


def verify_digest(client: RegistryClient, repo: str, digest: str, trusted: TrustedKeys, platform: str = "",
                  now: dt.datetime | None = None, index: str = "") -> Chain:
    """The chain of one platform manifest (`platform`: its index entry's os/arch, "" for a single manifest; `index`:
    the digest of the index that names it, "" for none)."""
    chain = Chain(image=f"{client.host}/{repo}@{digest}", platform=platform)
    chain.lines.append(("image", chain.image))
    raw, media_type, _ = (read_child(client, repo, index, digest, platform) if index
                          else client.get_manifest(repo, digest))
    if index and media_type in INDEX_TYPES:      # an index in an index: refused as release refuses it, not read through
        return chain.fail(served_index(platform, digest))
    images = read_platforms(client, repo, raw, media_type)
    labelled = sorted({c for p in images if (c := p.labels.get(label_keys.CELL))})
    prov = find_provenance(client, repo, digest, trusted, now)
    # The cell the image is checked as: its label (in the image config, so fixed by the digest), else what the
    # builder signed. Release checks an image as the cell it releases, and that the two agree.
    chain.cell = labelled[0] if len(labelled) == 1 else ""
    if prov.provenance is None:
        return chain.fail(f"{digest} has no valid provenance ({prov.why_none()})")
    chain.lines.append(("built", _built(prov.provenance, trusted.describe(prov.keyid))))
    chain.facts["provenance"] = {"artifact": prov.artifact, "signer": prov.keyid, **prov.provenance.to_json()}
    chain.cell = chain.cell or prov.provenance.buildDefinition.externalParameters.cell
    sbom = find_sbom_attestation(client, repo, digest, trusted)
    if sbom.chosen is None:
        return chain.fail(f"{digest} has no valid SBOM attestation ({sbom.why_none()})")
    components = len((sbom.document or {}).get("components") or [])
    chain.lines.append(("sbom", f"{components} components, {sbom.digest} signed by {trusted.describe(sbom.signer)}"))
    chain.facts["sbom"] = {"digest": sbom.digest, "artifact": sbom.artifact, "signer": sbom.signer,
                           "components": components}
    verdict = _tested(chain, client, repo, digest, trusted, sbom.digest, prov.keyid, now)
    if verdict is None:
        return chain
    plain = plain_sbom_problem(client, repo, digest, sbom.digest)
    if plain:
        return chain.fail(plain)
    # What the provenance must say, as release checks it (gates.provenance_problems): the verdict's cell, no
    # stand-in base, the base the image's labels name.
    own = provenance_problems(verdict.cell, digest, prov.provenance, images)
    own += [f"{digest} is labelled {label_keys.CELL}={c}, not {verdict.cell}, the cell of its verdict"
            for c in labelled if c != verdict.cell]
    return chain.fail(own[0]) if own else chain


def _tested(chain: Chain, client: RegistryClient, repo: str, digest: str, trusted: TrustedKeys, sbom: str,
            builder: str, now: dt.datetime | None) -> Verdict | None:
    """The verdict link: the verdicts of the chain's cell, read and chosen exactly as release reads and chooses
    them, the one that counts shown; it, or None when the chain failed on it (`sbom`: the signed SBOM's digest,
    `builder`: the provenance's key)."""
    testers = in_role(trusted, TESTER)
    findings = find_verdicts(client, repo, digest, testers, chain.cell, now=now)
    if findings.blocking:
        chain.fail(f"a verdict of {digest} cannot be read or typed: {findings.blocking[0]}")
        return None
    if findings.overwritten:
        chain.fail(f"a verdict of {digest} was overwritten in the registry ({'; '.join(findings.overwritten)})")
        return None
    decision = findings.decision()
    chosen = decision.counted
    if chosen is None:
        chain.fail(f"{digest} has no valid verdict: {findings.why_none(testers)} (verdicts count only when "
                   f"signed by a key {trusted.source} trusts as {TESTER})")
        return None
    v = chosen.verdict
    counts = v.counts()
    chain.facts["verdict"] = {"artifact": chosen.artifact, "signer": chosen.keyid, "result": v.result,
                              "runner": v.runner.hostname, "test_code": v.test_code, "sbom": v.sbom, "cell": v.cell,
                              "started": v.started, "platform": v.platform, "emulated": v.emulated, **counts}
    matches = "matches" if v.sbom and v.sbom == sbom else "does not match"
    chain.lines.append(("tested", f"by {v.runner.hostname} (key {trusted.describe(chosen.keyid)}), {v.result}, "
                                  f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, "
                                  f"test code {v.test_code}, "
                                  + (f"ran {v.platform}{' under emulation' if v.emulated else ''}, " if v.platform
                                     else "") + f"names sbom {v.sbom or '(none)'} ({matches})"))
    result: str = v.result
    if decision.covered:
        from buildtool.release.gates import with_covered

        result = with_covered(v, decision.covered)[0]
        chain.lines.append(("paired", f"multi-GPU checks from: {decision.companion_note}"))
        chain.facts["verdict"]["companion"] = decision.companion.artifact if decision.companion else ""
    if decision.note:
        chain.lines.append(("order", decision.note))
    if builder == chosen.keyid:
        chain.lines.append(("note", f"builder and tester are the same key {trusted.describe(chosen.keyid)}: one "
                                    "party built the image and vouched for its tests"))
        chain.facts["same_key"] = True
    why = _verdict_link_problem(v, digest, chain.platform, result, sbom, decision.note)
    if why:
        chain.fail(why)
        return None
    return v


def _verdict_link_problem(v: Verdict, digest: str, platform: str, result: str, sbom: str, note: str) -> str:
    """Why the counting verdict does not carry the chain ("" when it does)."""
    if platform and v.platform != platform:
        # Its subject is this digest, yet it says it ran another platform (or, schema 4, none).
        return (f"the verdict of {digest} records platform {v.platform or '(none: schema 4)'}, not {platform}, the "
                "index entry it is attached to")
    if result != "passed":
        failed = [t.id for t in v.tests if t.result == "failed"]
        return (f"the verdict of {digest} is {result!r}" + (f" (failed: {', '.join(failed[:3])})" if failed else "")
                + (f"; {note}" if note else ""))
    contradiction = recorded_failure(v)
    if contradiction:
        return f"the verdict of {digest} contradicts itself: {contradiction}"
    gpu = gpu_pass_problem(v)
    if gpu:   # what the verdict records of its own GPU tests (release's gate checks them against the matrix cell)
        return f"the verdict of {digest} says passed, but {gpu}"
    if not v.sbom:
        return f"the verdict of {digest} names no SBOM ({v.sbom_problem or f'schema {v.schema_}'})"
    if v.sbom != sbom:
        return f"the verdict of {digest} names SBOM {v.sbom}, but the signed SBOM attached is {sbom}"
    return ""


def _built(provenance: Provenance, signer: str) -> str:
    params = provenance.buildDefinition.externalParameters
    base = provenance.base
    base_text = pinned_reference(base) if base else "(none)"
    if base is not None and base.annotations.get("standin"):
        base_text += " (a stand-in)"
    locks = ", ".join(f"{d.name.removeprefix('lock:')} sha256:{d.digest.get('sha256', '?')[:12]}"
                      for d in provenance.locks) or "(none)"
    return (f"by {provenance.runDetails.builder.id} (key {signer}), from {params.revision}, base {base_text}, "
            f"locks {locks}")

