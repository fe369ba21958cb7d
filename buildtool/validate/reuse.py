"""Verdict reuse: `validate` answers with a verdict the registry already holds, instead of running the image tests
again, when a trusted tester signed that this very run passed (content-addressed, issue 50).

Only the verdict that counts for the digest and cell (Findings.decision(): the reading release and `verify` use)
is reused, only when it passed and was bound to what this run would be bound to (`Wanted`; `problem` names what
differs), and only when nothing blocks the reading: a failure is always run again, and an older pass is never
reused over a newer failure. Nothing is stored or written: release reads the original verdict as it did before.
The conditions and whose verdicts: docs/release-trust.md, "Validate reuses the verdict that counts".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from buildtool.attest.keys import SigningKey, TrustedKeys
from buildtool.contracts import skips
from buildtool.contracts.verdict import SCHEMA, Gpu, Verdict, gpu_pass_problem, recorded_failure
from buildtool.registry.client import RegistryClient
from buildtool.validate.sbomref import validate_trust
from buildtool.validate.verdict_choice import whole_run
from buildtool.validate.verdicts import Found, find_verdicts


def runner_class(gpus: list[Gpu], driver: str, cuda_driver: str) -> str:
    """What a verdict may be reused across: CPU, or the GPUs' count of each model (`8x H100`; `1x A100 + 2x H100`:
    a mixed host is not the same class as one with the counts swapped), the driver's branch (its major version: 550 of
    550.54.15) and the CUDA version the driver supports."""
    if not gpus:
        return "CPU"
    names = [g.name for g in gpus]
    models = " + ".join(f"{names.count(name)}x {name}" for name in sorted(set(names)))
    branch = driver.split(".", 1)[0] or "(unknown)"
    return f"{models}, driver branch {branch}, CUDA {cuda_driver or '(unknown)'}"


@dataclass(frozen=True)
class Wanted:
    """What a run of the image here would be bound to: a verdict is reused only when it was bound to the same."""

    digest: str
    cell: str
    platform: str
    emulated: bool
    test_code: str
    matrix_digest: str
    libraries: dict[str, str]
    sbom: str                  # the signed SBOM attached now ("" when none verifies)
    runner_class: str
    has_peer: bool             # an image of another framework is at hand for the cross-framework checks


def problem(verdict: Verdict, want: Wanted) -> str:
    """Why `verdict` does not answer for a run bound to `want` ("" when it does)."""
    if verdict.result != "passed":
        return f"it {verdict.result}" if verdict.result == "failed" else f"it is {verdict.result}"
    contradiction = recorded_failure(verdict)
    if not contradiction and (gpu := gpu_pass_problem(verdict)):   # as release, verify and the report read it
        contradiction = f"it says passed, but {gpu}"
    if contradiction:
        return f"{contradiction} (it contradicts itself)"
    if verdict.schema_ != SCHEMA:
        return f"it is a schema-{verdict.schema_} verdict, not schema {SCHEMA}"
    if verdict.digest != want.digest or verdict.cell != want.cell:
        return f"it is about {verdict.cell} {verdict.digest}, not {want.cell} {want.digest}"
    if not whole_run(verdict):
        return "it ran a selection of the tests, not the whole suite"
    if verdict.platform != want.platform or verdict.emulated != want.emulated:
        def run(platform: str, emulated: bool) -> str:
            return f"{platform}{' under emulation' if emulated else ''}"
        return f"it ran {run(verdict.platform, verdict.emulated)}, this run is {run(want.platform, want.emulated)}"
    if verdict.test_code != want.test_code:
        return f"it ran image tests {verdict.test_code}, this checkout's are {want.test_code}"
    if verdict.matrix_digest != want.matrix_digest:
        return f"it read the matrix {verdict.matrix_digest}, this one is {want.matrix_digest}"
    if verdict.libraries != want.libraries:
        return f"it checked the library promises {verdict.libraries}, the matrix promises {want.libraries} now"
    if not verdict.sbom or verdict.sbom != want.sbom:
        return (f"it names the SBOM {verdict.sbom or '(none)'}, the signed SBOM attached now is "
                f"{want.sbom or '(none that verifies)'}")
    theirs = runner_class(verdict.runner.gpus, verdict.runner.driver, verdict.runner.cuda_driver)
    if theirs != want.runner_class:
        return f"it ran on a runner of class {theirs}, this runner is {want.runner_class}"
    if want.has_peer and any(t.result == "skipped" and t.skip_code == skips.NO_PEER_IMAGE.code for t in verdict.tests):
        return "it skipped the cross-framework checks for want of a peer image, and this run has one"
    return ""


def find_reusable(client: RegistryClient, repo: str, want: Wanted, trusted: TrustedKeys) -> tuple[Found | None, str]:
    """(the verdict in the registry that answers for a run bound to `want`, "") or (None, why none is): only the
    verdict that counts, and only when it passes `problem` and nothing blocks the reading."""
    findings = find_verdicts(client, repo, want.digest, trusted, want.cell)
    if findings.blocking:
        return None, f"a verdict of {want.digest} cannot be read or typed ({findings.blocking[0]})"
    if findings.overwritten:
        return None, f"a verdict pin of {want.digest} was overwritten ({findings.overwritten[0]})"
    counted = findings.decision().counted
    if counted is None:
        return None, findings.why_none(trusted)
    why = problem(counted.verdict, want)
    if why:
        return None, f"the verdict that counts, {counted.artifact}, {why}"
    return counted, ""


def reuse_trust(root: Path, host: str, key: SigningKey) -> TrustedKeys:
    """Whose verdicts may be reused: the trusted keys file, and this machine's dev key only when it is the key
    this run signs with and the registry is a loopback one."""
    return validate_trust(root, host, key.dev)
