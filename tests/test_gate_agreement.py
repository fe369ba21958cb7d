"""`release --dry-run` and `verify` agree on every fixture of the release gate's tests (issue 48; issue 50: "verify
and release --dry-run agree on the images of the test suite's fixtures"): the same outcome, for the same causes.

Each fixture is a dev image in an in-memory registry (tests/gate_scenarios.py: registered by the gate's tests,
tests/test_gate_*.py, and a few multi-platform ones here). Release runs as the command runs it (`release` with
`dry_run`: every read and every gate, the tag plan, no write); verify as `buildtool verify` runs it in the project
(`verify_reference` with a checkout). Before issue 48 verify refused every valid one-GPU pair that release took,
let a failure of another cell decide, and printed "verified" above "NOT verified"."""

from __future__ import annotations

import json

import pytest

import tests.test_gate_attacks
import tests.test_gate_binding
import tests.test_gate_pairing
import tests.test_gate_reading
import tests.test_gate_revision
import tests.test_gate_self_contradiction  # noqa: F401  (they register their fixtures)
from buildtool.registry.client import OCI_INDEX, OCI_MANIFEST
from buildtool.release.chain import verify_reference
from tests import signing
from tests.gate_scenarios import SCENARIOS, same_clock, scenario
from tests.test_gate_revision import release_dry_run
from tests.test_release_platforms import MULTI, Dev

# -- multi-platform fixtures (an index: each platform gated on its own evidence) --------------------------

@scenario("index/every-platform-validated")
def index_validated() -> Dev:
    dev = Dev(MULTI)
    dev.index([(dev.validated("amd64"), "linux/amd64"), (dev.validated("arm64"), "linux/arm64")])
    return dev


@scenario("index/arm64-without-a-verdict")
def index_arm64_unvalidated() -> Dev:
    dev = Dev(MULTI)
    arm = dev.image("arm64")
    dev.evidence(arm, "linux/arm64", verdict=False)
    dev.index([(dev.validated("amd64"), "linux/amd64"), (arm, "linux/arm64")])
    return dev


@scenario("index/arm64-failed")
def index_arm64_failed() -> Dev:
    dev = Dev(MULTI)
    failed = [signing.result("common/test_x.py::test_common"), signing.result("pytorch/test_ddp.py::test_ddp",
                                                                              "failed")]
    dev.index([(dev.validated("amd64"), "linux/amd64"), (dev.validated("arm64", "failed", tests=failed),
                                                         "linux/arm64")])
    return dev


@scenario("index/an-untested-image-disguised-as-an-attestation")
def index_disguised() -> Dev:
    dev = Dev(MULTI)
    amd, arm = dev.validated("amd64"), dev.validated("arm64")
    untested = dev.image("amd64", payload=b"not what was validated")
    entries = []
    for digest, arch, notes in ((amd, "amd64", {}), (arm, "arm64", {}),
                                (untested, "unknown", {"vnd.docker.reference.type": "attestation-manifest",
                                                       "vnd.docker.reference.digest": amd})):
        raw = dev.client.get_manifest(dev.repo, digest)[0]
        entry = {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw),
                 "platform": {"os": "linux" if arch != "unknown" else "unknown", "architecture": arch}}
        if notes:
            entry["annotations"] = notes
        entries.append(entry)
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
    dev.client.put_manifest(dev.repo, dev.plan.dev_tag, body, OCI_INDEX)
    return dev


@scenario("index/a-platform-missing")
def index_missing_arm64() -> Dev:
    dev = Dev(MULTI)
    dev.index([(dev.validated("amd64"), "linux/amd64")])
    return dev


# -- the walk --------------------------------------------------------------------------------------------------

def test_the_gate_has_fixtures_of_every_kind() -> None:
    kinds = {name.split("/", 1)[0] for name in SCENARIOS}
    assert kinds == {"reading", "pairing", "binding", "index"} and len(SCENARIOS) >= 30, sorted(SCENARIOS)
    assert any(n for n in SCENARIOS if n.endswith("valid") or n.endswith("validated")), "no fixture that releases"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_release_dry_run_and_verify_agree(name: str) -> None:
    from tests.test_verify_strict import checkout

    dev = SCENARIOS[name]()
    status, problems = release_dry_run(dev)
    found = verify_reference(dev.client, f"{dev.client.host}/{dev.repo}:{dev.plan.dev_tag}",   # type: ignore[arg-type]
                             signing.trusted(), checkout(dev.cell))
    assert status in ("dry-run", "refused"), (status, problems)
    assert (status == "dry-run") == found.ok, (status, problems, found.problem)
    assert sorted(same_clock(found.all_problems)) == sorted(same_clock(problems)), (problems, found.all_problems)
    assert found.gated and found.not_run == []
