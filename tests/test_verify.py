"""`buildtool verify IMAGE`: the provenance, the SBOM attestation and the verdict of a digest, each verified
against the trusted keys in its role, and the links between them (in-memory registry)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from buildtool.attest.dsse import generate
from buildtool.attest.keys import trusted_entry
from buildtool.cli import main
from buildtool.contracts import label_keys
from buildtool.registry.client import OCI_INDEX, OCI_MANIFEST
from buildtool.release.chain import verify_digest
from tests import provenance_fixture, signing
from tests.conftest import fixture_matrix
from tests.memregistry import MemRegistry

REPO = "team/pytorch-cpu"
CPU = next(c for c in fixture_matrix().cells if c.key == "pytorch-cpu:2.13")
BUILDER_ONLY = generate()
# What push labels an image with, as far as verify reads it: the base its provenance names.
LABELS = {label_keys.OCI_BASE_DIGEST: "sha256:" + "7" * 64}


def chained(client: MemRegistry, digest: str, *, provenance: bool = True, sbom: bool = True,
            result: str = "passed", named: str | None = None, verdict_key=signing.KEY) -> str:  # noqa: ANN001
    """Attach what push and validate attach; returns the SBOM digest."""
    if provenance:
        provenance_fixture.attest_provenance(client, REPO, digest)   # type: ignore[arg-type]
    digest_of_sbom = signing.attest_sbom(client, REPO, digest) if sbom else ""   # type: ignore[arg-type]
    failed = [signing.result(f"{g}/test_x.py::test_{g}", "failed") for g in CPU.tests] if result == "failed" else None
    body = signing.verdict(CPU, digest, result, tests=failed, sbom=named or digest_of_sbom or signing.SBOM)
    signing.attest(client, REPO, digest, body, key=verdict_key)   # type: ignore[arg-type]
    return digest_of_sbom


@pytest.fixture
def client() -> MemRegistry:
    return MemRegistry()


def test_a_whole_chain_verifies_and_says_each_link(client: MemRegistry) -> None:
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    named = chained(client, digest)
    chain = verify_digest(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    assert chain.ok, chain.problem
    lines = dict(chain.lines)
    # No "result" line per chain: verify prints one result line for the image, release's answer (issue 50).
    assert [link for link, _ in chain.lines] == ["image", "built", "sbom", "tested", "note"]
    assert lines["note"] == (f"builder and tester are the same key {signing.KEY.keyid[:16]} (test runner): one party "
                             "built the image and vouched for its tests")
    assert lines["image"] == f"{client.host}/{REPO}@{digest}"
    assert lines["built"] == (f"by https://ci.example/runs/1 (key {signing.KEY.keyid[:16]} (test runner)), from "
                              f"{'a' * 40}, base 127.0.0.1:5000/debian:bookworm-slim@sha256:{'7' * 64}, "
                              f"locks locks/pytorch-cpu-2.13.txt sha256:{'8' * 12}")
    assert lines["sbom"] == f"2 components, {named} signed by {signing.KEY.keyid[:16]} (test runner)"
    assert lines["tested"].startswith(f"by ci (key {signing.KEY.keyid[:16]} (test runner)), passed, 2 passed, "
                                      "0 failed, 0 skipped, test code ")
    assert lines["tested"].endswith(f"names sbom {named} (matches)")


@pytest.mark.parametrize(("setup", "cause"), [
    ({"provenance": False}, "has no valid provenance (no provenance attached"),
    ({"sbom": False}, "has no valid SBOM attestation (no SBOM attestation is attached"),
    ({"result": "failed"}, "is 'failed' (failed: common/test_x.py::test_common"),
    ({"named": "sha256:" + "9" * 64}, f"names SBOM sha256:{'9' * 64}, but the signed SBOM attached is sha256:"),
    ({"verdict_key": BUILDER_ONLY}, "has no valid verdict: no verdict verifies against config/trusted-keys.yaml: "),
    ({"verdict_key": signing.ATTACKER}, "untrusted key"),
])
def test_each_broken_link_fails_the_chain_naming_it(client: MemRegistry, setup: dict, cause: str) -> None:
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    chained(client, digest, **setup)
    trusted = signing.trusted()
    trusted.keys[BUILDER_ONLY.keyid] = BUILDER_ONLY.public()
    trusted.roles[BUILDER_ONLY.keyid] = frozenset({"builder"})
    chain = verify_digest(client, REPO, digest, trusted)   # type: ignore[arg-type]
    assert not chain.ok and cause in chain.problem, chain.problem
    assert chain.problem.count(digest) >= 1


def test_a_provenance_or_sbom_signed_by_a_tester_only_key_does_not_count(client: MemRegistry) -> None:
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    chained(client, digest)
    chain = verify_digest(client, REPO, digest, signing.trusted(roles=("tester",)))   # type: ignore[arg-type]
    assert not chain.ok and "has no valid provenance" in chain.problem
    assert "trusted as tester, not as builder" in chain.problem


# -- the command ---------------------------------------------------------------------------------------

@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "trusted-keys.yaml"
    path.write_text("keys:\n" + trusted_entry("ci", signing.KEY.public(), ("builder", "tester")))
    return path


@pytest.fixture
def cli(client: MemRegistry, monkeypatch: pytest.MonkeyPatch, keys_file: Path, capsys: pytest.CaptureFixture):  # noqa: ANN201
    monkeypatch.setattr("buildtool.registry.client.RegistryClient", lambda host, **kw: client)
    monkeypatch.chdir(keys_file.parent)     # no checkout: the chain only (the cell's checks: tests below)

    def run(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exit_info:
            main(["verify", *args, "--keys", str(keys_file)])
            raise SystemExit(0)
        out = capsys.readouterr()
        return int(exit_info.value.code or 0), out.out, out.err
    return run


def test_verify_prints_the_chain_and_json(client: MemRegistry, cli) -> None:  # noqa: ANN001
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    named = chained(client, digest)
    code, out, _ = cli(f"{client.host}/{REPO}:2.13-0.1.0")
    assert code == 0, out
    assert out.splitlines()[0] == f"image   {client.host}/{REPO}@{digest}"
    # One result line, last, after what could not be checked (issue 50: no "verified" above a "NOT verified").
    assert [line.split()[0] for line in out.splitlines()] == ["image", "built", "sbom", "tested", "note",
                                                              "not", "not", "not", "result"]
    assert out.splitlines()[-1] == "result  verified (without release's gate: see `not run`)"
    assert "not run the cell's checks" in out
    code, out, _ = cli(f"{client.host}/{REPO}@{digest}", "--json")
    found = json.loads(out)
    assert code == 0 and found["verified"] is True and found["problem"] == ""
    (one,) = found["manifests"]
    assert one["sbom"]["digest"] == named and one["verdict"]["sbom"] == named and one["verdict"]["result"] == "passed"
    assert one["provenance"]["buildDefinition"]["externalParameters"]["revision"] == "a" * 40


@pytest.mark.parametrize(("args", "code", "said"), [
    (("x:1",), 2, "error: x:1 names no registry"),
    (("127.0.0.1:5999/UPPER:1",), 2, "error: IMAGE: '127.0.0.1:5999/UPPER:1': repository part 'UPPER' is not valid"),
    (("127.0.0.1:5999/team/absent:1",), 2, "is not in the registry"),
    ((), 2, "exit 2: see stderr"),
])
def test_verify_json_that_fails_before_a_verification_still_prints_one_document(cli, args: tuple[str, ...], code: int,
                                                                                said: str) -> None:  # noqa: ANN001
    """`verify --json` printed nothing on stdout when it exited 2 (a malformed reference, an image the registry does
    not hold, a usage error): a script reading the document got an empty one. Now it prints verify's document with
    `verified` false and the error, as `release --json` does, and the same exit code."""
    got, out, err = cli(*args, "--json")
    doc = json.loads(out)
    assert got == code and doc["verified"] is False and doc["exit_code"] == code and said in doc["error"], (out, err)
    assert doc["problem"] == doc["error"] and doc["problems"] == [doc["error"]] and doc["image"] is None
    assert {"cell", "gated", "not_run", "manifests"} <= set(doc)


def test_verify_of_an_image_whose_verdict_failed_exits_1_naming_it(client: MemRegistry, cli) -> None:  # noqa: ANN001
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    chained(client, digest, result="failed")
    code, out, err = cli(f"{client.host}/{REPO}:2.13-0.1.0")
    assert code == 1
    assert err.strip() == f"failed: the verdict of {digest} is 'failed' (failed: common/test_x.py::test_common, " \
                          "pytorch/test_x.py::test_pytorch)"
    assert "result  NOT verified: the verdict of" in out
    code, out, _ = cli(f"{client.host}/{REPO}:2.13-0.1.0", "--json")
    assert code == 1 and json.loads(out)["verified"] is False and "is 'failed'" in json.loads(out)["problem"]


def test_verify_checks_every_platform_of_an_index(client: MemRegistry, cli) -> None:  # noqa: ANN001
    amd = client.push_image(REPO, "amd", b"amd64", labels=LABELS)
    arm = client.push_image(REPO, "arm", b"arm64", labels=LABELS)
    chained(client, amd)
    chained(client, arm, provenance=False)
    children = [{"mediaType": OCI_MANIFEST, "digest": d, "size": 1, "platform": {"os": "linux", "architecture": a}}
                for d, a in ((amd, "amd64"), (arm, "arm64"))]
    children.append({"mediaType": OCI_MANIFEST, "digest": amd, "size": 1,
                     "platform": {"os": "unknown", "architecture": "unknown"}})
    client.put_manifest(REPO, "2.13", json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                                                  "manifests": children}).encode(), OCI_INDEX)
    code, out, err = cli(f"{client.host}/{REPO}:2.13")
    assert code == 1 and err.strip() == (f"failed: {arm} has no valid provenance (no provenance attached (push it "
                                         "with `make push`, which signs it with the builder key))")
    assert "platform linux/amd64" in out and "platform linux/arm64" in out and "tested  by ci" in out
    assert out.count("result") == 1 and out.splitlines()[-1].startswith(f"result  NOT verified: {arm} has no valid")


@pytest.mark.parametrize("declared", [OCI_INDEX, OCI_MANIFEST])
def test_verify_refuses_an_index_in_an_index_as_release_does(client: MemRegistry, cli, declared: str) -> None:  # noqa: ANN001
    """Before, verify read an entry that is itself an index through (its children's labels, the inner index's
    attestations) and refused it for another cause (no provenance of the inner index), or none; release refuses it
    as an index in an index."""
    amd = client.push_image(REPO, "amd", b"amd64", labels=LABELS)
    arm = client.push_image(REPO, "arm", b"arm64", labels=LABELS)
    chained(client, amd)
    chained(client, arm)
    arm_entry = {"mediaType": OCI_MANIFEST, "digest": arm, "size": 1, "platform": {"os": "linux", "architecture":
                                                                                   "arm64"}}
    inner = client.put_manifest(REPO, "inner", json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                                                           "manifests": [arm_entry]}).encode(), OCI_INDEX)
    children = [{"mediaType": OCI_MANIFEST, "digest": amd, "size": 1, "platform": {"os": "linux",
                                                                                   "architecture": "amd64"}},
                {**arm_entry, "mediaType": declared, "digest": inner}]
    client.put_manifest(REPO, "2.13", json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                                                  "manifests": children}).encode(), OCI_INDEX)
    code, out, err = cli(f"{client.host}/{REPO}:2.13")
    assert code == 1 and err.strip() == (f"failed: linux/arm64 ({inner}): the registry serves an index for it, not "
                                         "one platform's image manifest; push the cell again"), err
    assert out.count("result") == 1


def test_verify_trusts_the_local_key_only_on_a_loopback_registry(cli) -> None:  # noqa: ANN001
    code, _, err = cli("registry.example.com/team/pytorch-cpu:2.13", "--trust-local-key")
    assert code == 2 and "--trust-local-key is only for a loopback registry, not registry.example.com" in err


def test_verify_refuses_a_verdict_that_records_another_platform_than_its_index_entry(client: MemRegistry,
                                                                                    cli) -> None:  # noqa: ANN001
    """Signed for the arm64 digest, but saying it ran linux/amd64: not the arm64 platform's verdict."""
    amd = client.push_image(REPO, "amd", b"amd64", labels=LABELS)
    arm = client.push_image(REPO, "arm", b"arm64", labels=LABELS)
    chained(client, amd)
    chained(client, arm)     # its verdict records linux/amd64 (the helper's default)
    children = [{"mediaType": OCI_MANIFEST, "digest": d, "size": 1, "platform": {"os": "linux", "architecture": a}}
                for d, a in ((amd, "amd64"), (arm, "arm64"))]
    client.put_manifest(REPO, "2.13", json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                                                  "manifests": children}).encode(), OCI_INDEX)
    code, out, err = cli(f"{client.host}/{REPO}:2.13")
    assert code == 1 and err.strip() == (f"failed: the verdict of {arm} records platform linux/amd64, not "
                                         "linux/arm64, the index entry it is attached to")
    assert "ran linux/amd64, names sbom" in out and out.count("result") == 1
    assert out.splitlines()[-1].startswith(f"result  NOT verified: the verdict of {arm} records platform")


def test_a_gpu_cell_verdict_that_says_passed_without_its_gpu_tests_does_not_verify(client: MemRegistry) -> None:
    """Without a checkout (release's gate not run), a signed verdict that says passed while it records a GPU cell
    (runner.gpus_usable set) whose GPU test was skipped for want of a GPU verified: `verified` for a GPU path no GPU
    ran. Now the chain fails on the verdict, naming the GPU test; the same verdict with its GPU test passed on
    usable GPUs verifies."""
    digest = client.push_image(REPO, "2.13-0.1.0", labels=LABELS)
    provenance_fixture.attest_provenance(client, REPO, digest)   # type: ignore[arg-type]
    named = signing.attest_sbom(client, REPO, digest)   # type: ignore[arg-type]
    tests = [signing.result(f"{g}/test_x.py::test_{g}") for g in CPU.tests]
    gpu_id = tests[-1]["id"]
    tests[-1] = signing.result(gpu_id, "skipped", code="no-gpu-on-runner", gpu=True)
    body = signing.verdict(CPU, digest, "passed", tests=tests, sbom=named, gpu_tests=[gpu_id])
    body["runner"].update(gpus_usable=False, gpu_problem="nvidia-smi not found")
    signing.attest(client, REPO, digest, body)   # type: ignore[arg-type]
    chain = verify_digest(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    assert not chain.ok and chain.problem == (f"the verdict of {digest} says passed, but 1 GPU test(s) of this GPU "
                                              f"cell did not pass on a GPU (nvidia-smi not found): "
                                              f"{gpu_id.rsplit('::', 1)[-1]}")
    honest = MemRegistry()
    assert honest.push_image(REPO, "2.13-0.1.0", labels=LABELS) == digest
    provenance_fixture.attest_provenance(honest, REPO, digest)   # type: ignore[arg-type]
    named = signing.attest_sbom(honest, REPO, digest)   # type: ignore[arg-type]
    tests[-1] = signing.result(gpu_id, gpu=True)
    body = signing.verdict(CPU, digest, "passed", tests=tests, sbom=named, gpu_tests=[gpu_id])
    body["runner"].update(gpus_usable=True, gpus=[{"index": "0", "name": "NVIDIA H100 80GB HBM3"}])
    signing.attest(honest, REPO, digest, body)   # type: ignore[arg-type]
    assert verify_digest(honest, REPO, digest, signing.trusted()).ok   # type: ignore[arg-type]
