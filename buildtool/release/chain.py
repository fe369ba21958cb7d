"""`buildtool verify`: the chain of signed statements about one image, checked as release checks them.

For each platform manifest of IMAGE (the manifest itself for a single-platform image): the SLSA
provenance (builder key), the SBOM attestation (builder key) and the newest verdict (tester key), each
verified against the trusted keys, and the links between them: the verdict passed and names the SBOM
that is attached. The first link that does not hold is the one-line answer; nothing is waived.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from buildtool.common.refs import parse_reference
from buildtool.registry.client import INDEX_TYPES, RegistryClient
from buildtool.registry.provenance import find_provenance
from buildtool.registry.sbom_attestation import find_sbom_attestation
from buildtool.validate.keys import TESTER, TrustedKeys
from buildtool.validate.verdicts import find_verdicts

if TYPE_CHECKING:
    from buildtool.contracts.provenance import Provenance


@dataclass
class Chain:
    """What verify found about one platform manifest: one line per link, the first problem."""

    image: str                   # repository@digest
    platform: str = ""
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
                       dev={k for k in trusted.dev if k in keys}, roles={k: trusted.roles[k] for k in keys})


def manifests(client: RegistryClient, repo: str, ref: str) -> list[tuple[str, str]]:
    """(digest, platform) of each platform manifest `ref` names ("" platform for a single one)."""
    raw, media_type, digest = client.get_manifest(repo, ref)
    if media_type not in INDEX_TYPES:
        return [(digest, "")]
    found = []
    for child in json.loads(raw).get("manifests", []):
        platform = child.get("platform") or {}
        name = "/".join(p for p in (platform.get("os"), platform.get("architecture"), platform.get("variant")) if p)
        if name in ("", "unknown/unknown"):    # BuildKit's attestation manifests
            continue
        found.append((str(child["digest"]), name))
    return found


def verify_reference(client: RegistryClient, reference: str, trusted: TrustedKeys) -> list[Chain]:
    parsed = parse_reference(reference)
    chains = []
    for digest, platform in manifests(client, parsed.path, parsed.digest or parsed.tag or "latest"):
        chain = verify_digest(client, parsed.path, digest, trusted, platform)
        chains.append(chain)
    return chains


def verify_digest(client: RegistryClient, repo: str, digest: str, trusted: TrustedKeys, platform: str = "") -> Chain:
    """The chain of one platform manifest (`platform`: its index entry's os/arch, "" for a single manifest)."""
    chain = Chain(image=f"{client.host}/{repo}@{digest}", platform=platform)
    chain.lines.append(("image", chain.image))
    prov = find_provenance(client, repo, digest, trusted)
    if prov.provenance is None:
        return chain.fail(f"{digest} has no valid provenance ({prov.why_none()})")
    chain.lines.append(("built", _built(prov.provenance, trusted.describe(prov.keyid))))
    chain.facts["provenance"] = {"artifact": prov.artifact, "signer": prov.keyid, **prov.provenance.to_json()}
    sbom = find_sbom_attestation(client, repo, digest, trusted)
    if sbom.chosen is None:
        return chain.fail(f"{digest} has no valid SBOM attestation ({sbom.why_none()})")
    components = len((sbom.document or {}).get("components") or [])
    chain.lines.append(("sbom", f"{components} components, {sbom.digest} signed by {trusted.describe(sbom.signer)}"))
    chain.facts["sbom"] = {"digest": sbom.digest, "artifact": sbom.artifact, "signer": sbom.signer,
                           "components": components}
    testers = in_role(trusted, TESTER)
    findings = find_verdicts(client, repo, digest, testers)
    chosen = findings.chosen
    if chosen is None:
        return chain.fail(f"{digest} has no valid verdict: {findings.why_none(testers)} (verdicts count only when "
                          f"signed by a key {trusted.source} trusts as {TESTER})")
    v = chosen.verdict
    counts = v.counts()
    chain.facts["verdict"] = {"artifact": chosen.artifact, "signer": chosen.keyid, "result": v.result,
                              "runner": v.runner.hostname, "test_code": v.test_code, "sbom": v.sbom, **counts}
    matches = "matches" if v.sbom and v.sbom == sbom.digest else "does not match"
    chain.lines.append(("tested", f"by {v.runner.hostname} (key {trusted.describe(chosen.keyid)}), {v.result}, "
                                  f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, "
                                  f"test code {v.test_code}, "
                                  + (f"ran {v.platform}{' under emulation' if v.emulated else ''}, " if v.platform
                                     else "") + f"names sbom {v.sbom or '(none)'} ({matches})"))
    chain.facts["verdict"].update(platform=v.platform, emulated=v.emulated)
    if platform and v.platform != platform:
        # Its subject is this digest, yet it says it ran another platform (or, schema 4, none).
        return chain.fail(f"the verdict of {digest} records platform {v.platform or '(none: schema 4)'}, not "
                          f"{platform}, the index entry it is attached to")
    if v.result != "passed":
        failed = [t.id for t in v.tests if t.result == "failed"]
        return chain.fail(f"the verdict of {digest} is {v.result!r}"
                          + (f" (failed: {', '.join(failed[:3])})" if failed else ""))
    if not v.sbom:
        return chain.fail(f"the verdict of {digest} names no SBOM ({v.sbom_problem or f'schema {v.schema_}'})")
    if v.sbom != sbom.digest:
        return chain.fail(f"the verdict of {digest} names SBOM {v.sbom}, but the signed SBOM attached is {sbom.digest}")
    chain.lines.append(("result", "verified"))
    return chain


def _built(provenance: Provenance, signer: str) -> str:
    params = provenance.buildDefinition.externalParameters
    base = provenance.base
    base_text = f"{base.uri.removeprefix('oci://')}@sha256:{base.digest.get('sha256', '?')}" if base else "(none)"
    if base is not None and base.annotations.get("standin"):
        base_text += " (a stand-in)"
    locks = ", ".join(f"{d.name.removeprefix('lock:')} sha256:{d.digest.get('sha256', '?')[:12]}"
                      for d in provenance.locks) or "(none)"
    return (f"by {provenance.runDetails.builder.id} (key {signer}), from {params.revision}, base {base_text}, "
            f"locks {locks}")

