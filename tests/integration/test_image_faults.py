"""Fault injection: every image-test check passes on a good image and fails, naming the cause,
on a real image or container that has the fault it is for.

Images come from fixture_images (one good PyTorch CPU image, one good TensorFlow CPU image,
thin broken layers on top), built once and reused by their content-hash tags. Faults that are
about how a container is run (a 64 MB /dev/shm, ranks that cannot reach each other, a peer
that never joins) are the good image started with different flags.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_images  # noqa: E402

from buildtool.matrix.schema import load_matrix  # noqa: E402
from buildtool.validate.runner import Options, validate_image  # noqa: E402

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def matrix():
    return load_matrix(REPO / "matrix.yaml", REPO / "templates")


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    return {name: fixture_images.ensure(name) for name in fixture_images.RECIPES}


@pytest.fixture(scope="session")
def validate(matrix, tmp_path_factory):
    reports = tmp_path_factory.mktemp("reports")

    def _validate(image: str, **overrides: Any) -> dict[str, Any]:
        options = Options(store=False, reports=reports, **overrides)
        return validate_image(image, matrix, REPO, options, log=lambda line: None)

    return _validate


def results(verdict: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["id"].split("::")[-1]: t for t in verdict["tests"]}


def assert_fails(verdict: dict[str, Any], test: str, *causes: str) -> None:
    """`test` failed, and its message names one of `causes`."""
    assert verdict["result"] == "failed", verdict
    found = results(verdict)
    assert test in found, f"{test} did not run: {sorted(found)}"
    outcome = found[test]
    assert outcome["result"] == "failed", f"{test} did not fail: {outcome}"
    print(f"{test}: {outcome['message'].splitlines()[0]}")  # shown with -rA: what a user reads
    assert any(c.lower() in outcome["message"].lower() for c in causes), (
        f"{test} failed without naming {causes}: {outcome['message']}")


@pytest.fixture(scope="session")
def good_pytorch(images, validate) -> dict[str, Any]:
    return validate(images["pytorch"], peers={"tensorflow": images["tensorflow"]}, join_timeout_s=120)


@pytest.fixture(scope="session")
def good_tensorflow(images, validate) -> dict[str, Any]:
    return validate(images["tensorflow"], peers={"pytorch": images["pytorch"]})


def test_good_pytorch_image_passes_every_check(good_pytorch):
    found = results(good_pytorch)
    failed = {k: v["message"] for k, v in found.items() if v["result"] == "failed"}
    assert not failed, failed
    assert good_pytorch["result"] == "passed"
    for name in ("test_shm_size_matches_run_profile", "test_workers_pass_large_batches_through_shm",
                 "test_framework_version", "test_ddp_loss_falls", "test_ddp_ranks_end_identical",
                 "test_two_nodes_rendezvous_and_agree", "test_missing_peer_fails_with_clear_timeout",
                 "test_profiler_plugin_active", "test_profiler_views", "test_profiler_worker_overview",
                 "test_tensorboard_answers_on_empty_logdir", "test_our_tensorboard_reads_other_frameworks_events",
                 "test_other_tensorboard_reads_our_events"):
        assert found[name]["result"] == "passed", (name, found[name])
    # No GPU here: the GPU paths are reported as skipped, with the reason, never as passed.
    for name in ("test_ddp_nccl_allreduce_busbw", "test_profiler_cuda_kernels", "test_gpus_visible"):
        assert found[name]["result"] == "skipped" and "no GPU" in found[name]["skip_reason"], found[name]


def test_good_tensorflow_image_passes_every_check(good_tensorflow):
    found = results(good_tensorflow)
    failed = {k: v["message"] for k, v in found.items() if v["result"] == "failed"}
    assert not failed, failed
    for name in ("test_tensorboard_serves_scalars", "test_profile_plugin_loaded", "test_tf_writes_profile",
                 "test_shm_size_matches_run_profile", "test_workers_pass_large_batches_through_shm",
                 "test_our_tensorboard_reads_other_frameworks_events"):
        assert found[name]["result"] == "passed", (name, found[name])


def test_shm_64m_is_caught(images, validate):
    verdict = validate(images["pytorch"], select="shm", extra_run_flags=["--shm-size=64m"])
    assert_fails(verdict, "test_shm_size_matches_run_profile", "/dev/shm is 64 MiB")
    assert_fails(verdict, "test_workers_pass_large_batches_through_shm", "out of shared memory")


def test_missing_torch_tb_profiler_is_caught(images, validate):
    verdict = validate(images["pytorch-noprofiler"], select="profiler_plugin_active or profiler_views")
    assert_fails(verdict, "test_profiler_plugin_active", "no pytorch_profiler plugin", "torch-tb-profiler")


def test_tensorboard_broken_by_setuptools82_is_caught(images, validate):
    verdict = validate(images["tensorflow-setuptools82"], select="serves_scalars")
    assert_fails(verdict, "test_tensorboard_serves_scalars", "pkg_resources")


def test_ddp_ranks_that_cannot_reach_each_other_are_caught(images, validate):
    # No network but loopback, and a master address on another host: rank 0's store is unreachable.
    verdict = validate(images["pytorch"], select="ddp_loss_falls", extra_run_flags=["--network=none"],
                       ddp_master_addr="192.0.2.1", ddp_timeout_s=20)
    assert_fails(verdict, "test_ddp_loss_falls", "could not reach each other")


def test_missing_rendezvous_peer_is_caught(images, validate):
    # The second node cannot reach the rendezvous endpoint (no network): it never joins.
    verdict = validate(images["pytorch"], select="two_nodes", peer_run_flags=["--network=none"],
                       join_timeout_s=15)
    assert_fails(verdict, "test_two_nodes_rendezvous_and_agree", "rendezvous timed out")


def test_contents_mismatch_is_caught(images, validate):
    verdict = validate(images["pytorch-mislabelled"], select="framework_version")
    assert_fails(verdict, "test_framework_version", "claims torch 2.12.0+cpu but the image contains torch 2.13.0+cpu")


# -- the command line: exit codes and verdicts stored by digest ------------------------------------


@pytest.fixture(scope="session")
def pushed_pytorch(images) -> str:
    """The good PyTorch fixture in the local registry, as a dev image would be."""
    import subprocess

    ref = f"127.0.0.1:5000/{images['pytorch'].replace(':', '-dev:')}"
    for args in (["tag", images["pytorch"], ref], ["push", ref]):
        subprocess.run([fixture_images.DOCKER, *args], check=True, capture_output=True, timeout=900)
    return ref


def test_validate_stores_verdict_by_digest(pushed_pytorch, run_cli, tmp_path):
    from buildtool.common.refs import split_repo
    from buildtool.registry.client import RegistryClient
    from buildtool.validate.keys import TrustedKeys, dev_public_key
    from buildtool.validate.verdicts import find_verdicts

    code, out, err = run_cli("validate", pushed_pytorch, "-k", "framework_version or shm_size", "--json",
                             "--reports", str(tmp_path), "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    host, repo, tag = split_repo(pushed_pytorch)
    client = RegistryClient(host)
    digest = client.manifest_digest(repo, tag)
    trusted = TrustedKeys()
    trusted.add_dev(dev_public_key())          # validate signed with this machine's dev key
    chosen = find_verdicts(client, repo, digest, trusted).chosen
    assert chosen is not None and json.loads(out)[0]["stored"] == chosen.artifact
    stored = chosen.verdict
    assert stored["digest"] == digest and stored["result"] == "passed"
    assert stored["selection"]["expression"] == "framework_version or shm_size" and stored["selection"]["deselected"]
    assert stored["cell"] == "pytorch-cpu:2.13"
    assert {t["id"].split("::")[-1] for t in stored["tests"]} == {"test_framework_version",
                                                                  "test_shm_size_matches_run_profile"}
    assert (Path(tmp_path) / "pytorch-cpu" / digest.split(":")[1][:12] / "junit.xml").is_file()


def test_validate_exit_codes(images, run_cli, tmp_path):
    common = ["--reports", str(tmp_path), "--matrix", str(REPO / "matrix.yaml")]
    code, out, err = run_cli("validate", images["pytorch-mislabelled"], "--no-store", "-k", "framework_version",
                             *common)
    assert code == 1 and "claims torch 2.12.0+cpu" in out, (out, err)
    code, _, err = run_cli("validate", "t-imgtest-no-such-image:1", "--no-store", *common)
    assert code == 2 and "not found" in err
    code, _, err = run_cli("validate", "127.0.0.1:5000/t-imgtest-no-such-repo:1", *common)
    assert code == 2 and "not found in registry" in err
    code, _, err = run_cli("validate", images["pytorch"], *common)  # local only: no digest to store under
    assert code == 2 and "--no-store" in err
