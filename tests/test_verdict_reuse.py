"""Verdict reuse (issue 50, buildtool.validate.reuse): validate answers with the trusted passing verdict the registry
already holds for the same image digest, image tests, matrix, library promises and runner class, and stores
nothing; anything else (another runner class, other test code, another matrix, an untrusted key, a newer failure, a
verdict nobody can read, a failure) runs the tests. In-memory registry; the last tests go through validate_image
with the run itself replaced by a sentinel, to show which path was taken."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from buildtool.attest.keys import TESTER, SigningKey, dev_public_key, signing_key
from buildtool.contracts import label_keys
from buildtool.contracts.verdict import Gpu
from buildtool.validate import reuse, runner
from buildtool.validate.options import Options
from buildtool.validate.probe import Inventory
from buildtool.validate.verdicts import find_verdicts
from tests import signing
from tests.conftest import FIXTURE_MATRIX, fixture_matrix
from tests.memregistry import MemRegistry

REPO = "team/pytorch-cpu-dev"
MATRIX = fixture_matrix()
CPU = next(c for c in MATRIX.cells if c.key == "pytorch-cpu:2.13")
H100 = [Gpu(index=str(i), name="NVIDIA H100 80GB HBM3", driver="550.54.15") for i in range(8)]
# A GPU runner as a CPU cell's verdict records it: validate records `gpus_usable` for a GPU cell only.
GPU_RUNNER = {"hostname": "gpu-1", "gpu_runner": True, "driver": "550.54.15", "cuda_driver": "12.4",
              "gpus": [g.model_dump() for g in H100]}


def image(client: MemRegistry) -> tuple[str, str]:
    """An image of pytorch-cpu:2.13 and the digest of its signed SBOM."""
    digest = client.push_image(REPO, "t", labels={label_keys.CELL: CPU.key})
    return digest, signing.attest_sbom(client, REPO, digest)


def want(digest: str, sbom: str, **changes: Any) -> reuse.Wanted:
    """What a run here would be bound to: what signing.verdict records by default, on a CPU runner."""
    values: dict[str, Any] = {"digest": digest, "cell": CPU.key, "platform": "linux/amd64", "emulated": False,
                              "test_code": signing.CODE, "matrix_digest": signing.MATRIX,
                              "libraries": signing.promised(CPU), "sbom": sbom, "runner_class": "CPU",
                              "has_peer": False}
    return reuse.Wanted(**{**values, **changes})


def stored(client: MemRegistry, digest: str, outcome: str = "passed", key: Any = signing.KEY, **changes: Any) -> str:
    """A verdict of the image, signed by `key` and attached as validate attaches it; returns its artifact."""
    return signing.attest(client, REPO, digest, signing.verdict(CPU, digest, outcome, **changes), key).digest


def answer(client: MemRegistry, wanted: reuse.Wanted, trusted: Any = None) -> tuple[Any, str]:
    return reuse.find_reusable(client, REPO, wanted, trusted or signing.trusted())   # type: ignore[arg-type]


def test_a_trusted_pass_of_the_same_run_is_reused_and_nothing_is_stored() -> None:
    client = MemRegistry()
    digest, sbom = image(client)
    artifact = stored(client, digest)
    before = dict(client.manifests)
    found, why = answer(client, want(digest, sbom))
    assert why == "" and found is not None and found.artifact == artifact
    assert client.manifests == before
    # What release reads is that same verdict: the reused one is the original.
    assert find_verdicts(client, REPO, digest, signing.trusted(), CPU.key).chosen.artifact == artifact  # type: ignore[arg-type,union-attr]


@pytest.mark.parametrize(("changes", "cause"), [
    ({"runner": GPU_RUNNER},
     "it ran on a runner of class 8x NVIDIA H100 80GB HBM3, driver branch 550, CUDA 12.4, this runner is CPU"),
    ({"test_code": "sha256:" + "1" * 64},
     f"it ran image tests sha256:{'1' * 64}, this checkout's are {signing.CODE}"),
    ({"matrix_digest": "sha256:" + "2" * 64}, f"it read the matrix sha256:{'2' * 64}, this one is {signing.MATRIX}"),
    ({"libraries": {"cudnn": "9.1", "nccl": "2.21"}}, "it checked the library promises"),
    ({"sbom": "sha256:" + "3" * 64}, f"it names the SBOM sha256:{'3' * 64}, the signed SBOM attached now is "),
    ({"platform": "linux/arm64", "emulated": True}, "it ran linux/arm64 under emulation, this run is linux/amd64"),
    ({"selection": {"expression": "test_pytorch", "deselected": []}, "result": "incomplete"}, "it is incomplete"),
])
def test_a_pass_bound_to_anything_else_runs_again_naming_what_differs(changes: dict[str, Any], cause: str) -> None:
    client = MemRegistry()
    digest, sbom = image(client)
    outcome = changes.pop("result", "passed")
    artifact = stored(client, digest, outcome, **changes)
    found, why = answer(client, want(digest, sbom))
    assert found is None
    assert why.startswith(f"the verdict that counts, {artifact}, ") and cause in why, why


def test_a_selection_that_passed_is_never_a_whole_run() -> None:
    from buildtool.contracts.verdict import parse_verdict

    verdict = signing.verdict(CPU, "sha256:" + "9" * 64, selection={"expression": None, "deselected": ["x"]})
    typed = parse_verdict(verdict, "t")
    assert reuse.problem(typed, want(typed.digest, typed.sbom)) == ("it ran a selection of the tests, not the whole "
                                                                    "suite")


def test_another_gpu_runner_class_runs_again_and_the_same_one_reuses() -> None:
    """The nightly on a GPU runner: same model, count, driver branch and CUDA reuse; any of them changed runs."""
    client = MemRegistry()
    digest, sbom = image(client)
    stored(client, digest, runner=GPU_RUNNER)
    ours = reuse.runner_class(H100, "550.90.07", "12.4")     # a newer driver of the same branch
    assert answer(client, want(digest, sbom, runner_class=ours))[0] is not None
    for gpus, driver, cuda in ((H100[:4], "550.54.15", "12.4"), (H100, "560.28.03", "12.6"),
                               ([Gpu(index="0", name="NVIDIA A100-SXM4-80GB", driver="550.54.15")] * 8, "550.54.15",
                                "12.4"), ([], "", "")):
        found, why = answer(client, want(digest, sbom, runner_class=reuse.runner_class(gpus, driver, cuda)))
        assert found is None and "it ran on a runner of class 8x NVIDIA H100 80GB HBM3" in why, why


def test_a_mixed_gpu_host_is_not_the_class_of_one_with_the_counts_swapped() -> None:
    """Before: the class was the total count and the set of models, so 1x A100 + 2x H100 and 2x A100 + 1x H100 were
    both `3x NVIDIA A100-SXM4-80GB + NVIDIA H100 80GB HBM3` and one's verdict was reused on the other; now each model
    has its count (a single-model host's class reads as before)."""
    a100, h100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"

    def host(*names: str) -> list[Gpu]:
        return [Gpu(index=str(i), name=name, driver="550.54.15") for i, name in enumerate(names)]

    one_a = reuse.runner_class(host(h100, a100, h100), "550.54.15", "12.4")
    two_a = reuse.runner_class(host(a100, a100, h100), "550.54.15", "12.4")
    assert one_a == f"1x {a100} + 2x {h100}, driver branch 550, CUDA 12.4", one_a
    assert two_a == f"2x {a100} + 1x {h100}, driver branch 550, CUDA 12.4", two_a
    assert reuse.runner_class(H100, "550.54.15", "12.4") == f"8x {h100}, driver branch 550, CUDA 12.4"
    client = MemRegistry()
    digest, sbom = image(client)
    stored(client, digest, runner={**GPU_RUNNER, "gpus": [g.model_dump() for g in host(h100, a100, h100)]})
    assert answer(client, want(digest, sbom, runner_class=one_a))[0] is not None
    found, why = answer(client, want(digest, sbom, runner_class=two_a))
    assert found is None and f"it ran on a runner of class 1x {a100} + 2x {h100}, " in why, why


def test_an_untrusted_key_is_never_reused() -> None:
    client = MemRegistry()
    digest, sbom = image(client)
    artifact = stored(client, digest, key=signing.ATTACKER)
    found, why = answer(client, want(digest, sbom))
    assert found is None
    assert artifact[:19] in why and "untrusted key" in why, why


def test_a_pass_with_a_newer_failure_runs_again() -> None:
    client = MemRegistry()
    digest, sbom = image(client)
    stored(client, digest, started="2026-01-01T00:00:00+00:00")
    failure = stored(client, digest, "failed", started="2026-01-02T00:00:00+00:00",
                     tests=[signing.result("common/test_x.py::test_common", "failed"),
                            signing.result("pytorch/test_x.py::test_pytorch")])
    found, why = answer(client, want(digest, sbom))
    assert found is None and why == f"the verdict that counts, {failure}, it failed", why


def test_a_failure_alone_is_never_reused() -> None:
    client = MemRegistry()
    digest, sbom = image(client)
    failure = stored(client, digest, "failed", tests=[signing.result("common/test_x.py::test_common", "failed")])
    assert answer(client, want(digest, sbom)) == (None, f"the verdict that counts, {failure}, it failed")


def test_a_verdict_nobody_can_read_blocks_reuse() -> None:
    """A trusted pass and, newer, a trusted tester's statement this toolkit cannot type: it may be a failure."""
    client = MemRegistry()
    digest, sbom = image(client)
    stored(client, digest, started="2026-01-01T00:00:00+00:00")
    future = signing.verdict(CPU, digest, "failed", started="2026-01-02T00:00:00+00:00")
    future["schema"] = 99
    signing.attest(client, REPO, digest, future)   # type: ignore[arg-type]
    found, why = answer(client, want(digest, sbom))
    assert found is None and why.startswith(f"a verdict of {digest} cannot be read or typed"), why


def test_a_peer_at_hand_runs_the_cross_framework_checks_a_reused_verdict_skipped() -> None:
    client = MemRegistry()
    digest, sbom = image(client)
    tests = [signing.result("common/test_cross_tensorboard.py::test_other", "skipped", "no-peer-image", "no peer"),
             signing.result("pytorch/test_x.py::test_pytorch")]
    stored(client, digest, tests=tests)
    assert answer(client, want(digest, sbom))[0] is not None
    found, why = answer(client, want(digest, sbom, has_peer=True))
    assert found is None and why.endswith("it skipped the cross-framework checks for want of a peer image, and this "
                                          "run has one"), why


def test_the_dev_key_counts_only_when_this_run_signs_with_it_for_a_loopback_registry(tmp_path: Path) -> None:
    dev = signing_key(print)
    assert dev.dev and dev_public_key() is not None
    ci = SigningKey(signing.KEY, "$DL_IMAGES_SIGNING_KEY", dev=False)
    keyid = dev.key.keyid
    assert keyid in reuse.reuse_trust(tmp_path, "127.0.0.1:5000", dev).for_role(TESTER)
    assert keyid not in reuse.reuse_trust(tmp_path, "127.0.0.1:5000", ci).for_role(TESTER)
    assert keyid not in reuse.reuse_trust(tmp_path, "registry.example.com", dev).for_role(TESTER)


def test_options_that_change_what_a_run_proves_never_reuse() -> None:
    assert Options().reuses()
    for changed in (Options(rerun=True), Options(select="test_ddp"), Options(store=False),
                    Options(extra_run_flags=["--pids-limit=64"]), Options(peer_run_flags=["--read-only"]),
                    Options(ddp_timeout_s=1.0)):
        assert not changed.reuses(), changed


# -- through validate_image -------------------------------------------------------------------------------------------

class Ran(Exception):
    """The image would have been pulled and its tests run."""


def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: Any = None, **changes: Any) -> dict[str, Any]:
    """A checkout (image-tests, no trusted keys: the dev key signs, as on a developer's machine), an in-memory
    loopback registry holding an image with its SBOM and a passing verdict bound to this very run, signed by
    `key` (default this machine's dev key) with `changes` made to it."""
    from buildtool.validate.collect import image_tests_hash

    root = tmp_path / "project"
    shutil.copytree(Path(__file__).parent / "fixtures" / "frameworks" / "fixturefw", root / "image-tests" / "fw")
    shutil.copy(FIXTURE_MATRIX, root / "matrix.yaml")   # the file MATRIX was read from, where its path names it
    client = MemRegistry("127.0.0.1:5999")
    dev = signing_key(print).key
    digest = client.push_image(REPO, "t", labels={label_keys.CELL: CPU.key})
    sbom = signing.attest_sbom(client, REPO, digest, key=dev)
    bound = {"test_code": image_tests_hash(root / "image-tests"), "matrix_digest": runner.matrix_digest(MATRIX, root),
             "sbom": sbom}
    artifact = signing.attest(client, REPO, digest, signing.verdict(CPU, digest, **{**bound, **changes}),
                              key or dev).digest
    for module in ("buildtool.validate.containers", "buildtool.validate.runner", "buildtool.validate.sbomref"):
        monkeypatch.setattr(f"{module}.RegistryClient", lambda *_a, **_k: client)
    monkeypatch.setattr(runner, "gpu_inventory", lambda: Inventory([], problem="nvidia-smi not found"))

    def ran(*_a: Any, **_k: Any) -> None:
        raise Ran
    monkeypatch.setattr(runner, "resolve", ran)
    return {"root": root, "client": client, "ref": f"127.0.0.1:5999/{REPO}:t", "artifact": artifact, "dev": dev,
            "digest": digest, "bound": bound}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    return checkout(tmp_path, monkeypatch)


def test_validate_answers_with_the_verdict_and_pulls_runs_and_stores_nothing(project: dict[str, Any]) -> None:
    client, lines = project["client"], []
    before = dict(client.manifests)
    verdict = runner.validate_image(project["ref"], MATRIX, project["root"], Options(), lines.append)
    assert verdict["reused"] == project["artifact"] and verdict["result"] == "passed"
    assert verdict["runner_class"] == "CPU" and "local dev key" in verdict["signed_by"]
    assert client.manifests == before
    from buildtool.cli.validate import reused_line

    line = reused_line(verdict)
    assert line.startswith(f"reused verdict {project['artifact']} of {project['ref']} (") and "\n" not in line
    assert "nothing run, nothing stored (--rerun runs the tests again)" in line


def test_rerun_runs_the_tests(project: dict[str, Any]) -> None:
    with pytest.raises(Ran):
        runner.validate_image(project["ref"], MATRIX, project["root"], Options(rerun=True), print)


def test_a_change_to_any_image_test_runs_them_again_saying_why(project: dict[str, Any]) -> None:
    lines: list[str] = []
    test = next((project["root"] / "image-tests").rglob("test_*.py"))
    test.write_text(test.read_text() + "\n# changed\n")
    with pytest.raises(Ran):
        runner.validate_image(project["ref"], MATRIX, project["root"], Options(), lines.append)
    assert any(line.startswith("no verdict of sha256:") and "it ran image tests sha256:" in line
               and line.endswith(": running the image tests") for line in lines), lines


def _newer_failure(made: dict[str, Any]) -> None:
    failed = signing.verdict(CPU, made["digest"], "failed", started="2026-01-02T00:00:00.000+00:00",
                             tests=[signing.result("common/test_x.py::test_common", "failed")], **made["bound"])
    signing.attest(made["client"], REPO, made["digest"], failed, made["dev"])


@pytest.mark.parametrize(("key", "changes", "then", "cause"), [
    (signing.ATTACKER, {}, None, "untrusted key"),
    (None, {"runner": GPU_RUNNER}, None, "it ran on a runner of class 8x NVIDIA H100"),
    (None, {"test_code": "sha256:" + "1" * 64}, None, "it ran image tests sha256:111"),
    (None, {"matrix_digest": "sha256:" + "2" * 64}, None, "it read the matrix sha256:222"),
    (None, {}, _newer_failure, "it failed"),
])
def test_every_attack_on_reuse_is_a_real_run_saying_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: Any,
                                                        changes: dict[str, Any], then: Any, cause: str) -> None:
    """A verdict from another runner class, of other test code or another matrix, signed by a key nobody trusts, or
    a pass with a newer failure: validate runs the tests (here: reaches the pull), and the log names the cause."""
    made = checkout(tmp_path, monkeypatch, key, **changes)
    if then is not None:
        then(made)
    lines: list[str] = []
    with pytest.raises(Ran):
        runner.validate_image(made["ref"], MATRIX, made["root"], Options(), lines.append)
    assert any(line.startswith(f"no verdict of {made['digest']} to reuse (") and cause in line for line in lines), lines


@pytest.mark.parametrize(("changes", "cause"), [
    ({"tests": [signing.result("common/test_x.py::test_common"), signing.result("pytorch/test_x.py::test_pytorch",
                                                                                 "failed")]},
     "it says passed, but 1 test(s) failed: pytorch/test_x.py::test_pytorch (it contradicts itself)"),
    ({"pytest_exit": 2}, "it says passed, but pytest exited with 2 (it contradicts itself)"),
    ({"problem": "interrupted"},
     "it says passed, but the run did not end by itself (interrupted) (it contradicts itself)"),
])
def test_a_pass_its_own_record_contradicts_is_never_reused(changes: dict[str, Any], cause: str) -> None:
    """Before: reuse read `result` alone, so a signed `passed` over a failed test was answered with (nothing run),
    and release then refused it (tests/test_gate_self_contradiction.py): a failure is always run again."""
    client = MemRegistry()
    digest, sbom = image(client)
    artifact = stored(client, digest, **changes)
    found, why = answer(client, want(digest, sbom))
    assert found is None and why == f"the verdict that counts, {artifact}, {cause}", why


def test_a_gpu_cells_pass_without_its_gpu_tests_passing_on_a_gpu_is_never_reused() -> None:
    """Reuse checked a pass against its recorded failures only: a signed `passed` of a GPU cell (runner.gpus_usable
    recorded) whose GPU test was skipped for want of a GPU was answered with (nothing run), though release, verify
    and the report refuse it (contracts.verdict.gpu_pass_problem). Now it is run again, the contradiction named."""
    client = MemRegistry()
    digest, sbom = image(client)
    gpu_id = "pytorch/test_x.py::test_pytorch"
    tests = [signing.result("common/test_x.py::test_common"), signing.result(gpu_id, "skipped", gpu=True)]
    runner_ = {"hostname": "ci", "gpu_runner": False, "gpus": [], "driver": "", "cuda_driver": "",
               "gpus_usable": False, "gpu_problem": "nvidia-smi not found"}
    artifact = stored(client, digest, tests=tests, gpu_tests=[gpu_id], runner=runner_)
    found, why = answer(client, want(digest, sbom))
    assert found is None and why == (f"the verdict that counts, {artifact}, it says passed, but 1 GPU test(s) of this "
                                     "GPU cell did not pass on a GPU (nvidia-smi not found): test_pytorch (it "
                                     "contradicts itself)"), why
