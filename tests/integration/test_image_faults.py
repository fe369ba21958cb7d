"""Fault injection: every image-test check passes on healthy images and fails, naming the cause
on the first line of its message (the line the console prints), on a real image or container
that has the fault it is for.

Images come from fixture_images: this commit's real CPU dev images, and thin layers over them
that each add one fault, or one healthy oddity for the controls (banners everywhere, an
entrypoint that talks, another user). Faults that are about how a container is run (a small
/dev/shm, a ulimit, ranks that cannot reach each other, a peer that never joins) are the dev
image started with different flags. Each fault is validated with `-k` restricted to the checks
meant for it (a restricted run is never a verdict for release); the controls run everything.
What it costs is printed per validation (pytest -s) and summed in the report.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_images  # noqa: E402

from buildtool.contracts import label_keys, names  # noqa: E402
from buildtool.matrix.loader import load_matrix  # noqa: E402
from buildtool.validate.runner import Options, validate_image  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]
REPO = Path(__file__).resolve().parents[2]
GPU_TESTS = ("test_gpus_visible", "test_ddp_nccl_allreduce_busbw", "test_profiler_cuda_kernels",
             "test_collectives_give_known_results_with_nccl", "test_nccl_across_all_gpus")


@pytest.fixture(scope="session")
def matrix():
    return load_matrix(REPO / "matrix.yaml", REPO / "templates")


class _Images(dict[str, str]):
    """Fixture name -> its local reference, built (or reused) when a test first asks for it: a `-k`
    selection builds only the images it validates."""

    def __missing__(self, name: str) -> str:
        self[name] = fixture_images.ensure(name)
        return self[name]


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    return _Images()


@pytest.fixture(scope="session")
def validate(matrix, tmp_path_factory):
    reports = tmp_path_factory.mktemp("reports")

    def _validate(image: str, using: Any = None, **overrides: Any) -> dict[str, Any]:
        options = Options(store=False, reports=reports, **overrides)
        started = time.monotonic()
        verdict = validate_image(image, using or matrix, REPO, options, log=lambda line: None)
        print(f"\n[cost] validate {image} -k {overrides.get('select')!r}: {time.monotonic() - started:.0f}s")
        return verdict

    return _validate


def results(verdict: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["id"].split("::")[-1]: t for t in verdict["tests"]}


def assert_fails(verdict: dict[str, Any], test: str, *causes: str, absent: tuple[str, ...] = ()) -> None:
    """`test` failed, and the first line of its message names every one of `causes`."""
    assert verdict["result"] == "failed", verdict
    found = results(verdict)
    assert test in found, f"{test} did not run: {sorted(found)}"
    outcome = found[test]
    assert outcome["result"] == "failed", f"{test} did not fail: {outcome}"
    line = outcome["message"].splitlines()[0] if outcome["message"] else ""
    print(f"{test}: {line}")  # shown with -rA/-s: what a user reads
    missing = [c for c in causes if c.lower() not in line.lower()]
    assert not missing, f"{test}'s first line does not name {missing}: {line}"
    wrong = [a for a in absent if a.lower() in outcome["message"].lower()]
    assert not wrong, f"{test} blames {wrong}, which is not the cause: {outcome['message']}"


def assert_all_pass(verdict: dict[str, Any], must_pass: tuple[str, ...]) -> None:
    found = results(verdict)
    failed = {k: v["message"] for k, v in found.items() if v["result"] == "failed"}
    assert not failed, failed
    assert verdict["result"] == "passed", verdict.get("problem") or verdict["result"]
    for name in must_pass:
        assert found[name]["result"] == "passed", (name, found[name])
    # No GPU here: the GPU paths are reported as skipped, with the reason, never as passed.
    for name in GPU_TESTS:
        if name in found:
            assert found[name]["result"] == "skipped" and "no GPUs" in found[name]["skip_reason"], found[name]


# -- controls: unusual but healthy images pass every check ------------------------------------------


@pytest.fixture(scope="session")
def banners_pytorch(images, validate) -> dict[str, Any]:
    return validate(images["pytorch-banners"], peers={"tensorflow": images["tensorflow-banners"]},
                    join_timeout_s=120)


def test_pytorch_with_banners_and_another_user_passes_every_check(banners_pytorch):
    """profile.d, bashrc, BASH_ENV and motd banners, an NGC-like entrypoint that prints and execs,
    a start-up hook that prints at every Python start, and uid 1000 as the default user."""
    assert_all_pass(banners_pytorch, (
        "test_ulimit[stack]", "test_shm_size_matches_run_profile", "test_workers_pass_large_batches_through_shm",
        "test_python_version", "test_framework_version", "test_labels_state_the_matrix_cell",
        "test_labels_state_the_image_contents", "test_image_user_can_write_in_its_workdir",
        "test_image_user_can_write_tmp", "test_image_user_can_write_its_home", "test_entrypoint_runs_the_command",
        "test_locked_packages_installed_at_their_versions", "test_extra_packages", "test_nvidia_runtime_variables",
        "test_python_trusts_the_system_ca_certificates", "test_tensorboard_listens_on_loopback_only",
        "test_socket_interfaces_are_not_pinned_to_loopback", "test_proxies_leave_local_traffic_local",
        "test_ddp_loss_falls",
        "test_ddp_ranks_end_identical", "test_ddp_checkpoint_saved_in_workdir",
        "test_collectives_give_known_results_on_cpu", "test_two_nodes_rendezvous_and_agree",
        "test_missing_peer_fails_with_clear_timeout", "test_profiler_plugin_active", "test_profiler_views",
        "test_profiler_worker_overview", "test_profiler_frontend_served", "test_tensorboard_answers_on_empty_logdir",
        "test_our_tensorboard_reads_other_frameworks_events", "test_other_tensorboard_reads_our_events"))


def test_tensorflow_with_banners_and_another_user_passes_every_check(images, validate):
    verdict = validate(images["tensorflow-banners"], peers={"pytorch": images["pytorch-banners"]})
    assert_all_pass(verdict, (
        "test_ulimit[stack]", "test_shm_size_matches_run_profile", "test_workers_pass_large_batches_through_shm",
        "test_labels_state_the_matrix_cell", "test_labels_state_the_image_contents",
        "test_image_user_can_write_in_its_workdir", "test_entrypoint_runs_the_command",
        "test_tensorboard_serves_scalars", "test_profile_plugin_loaded", "test_profile_plugin_frontend_served",
        "test_tf_writes_profile", "test_our_tensorboard_reads_other_frameworks_events"))


def test_jax_with_banners_and_another_user_passes_every_check(images, validate):
    verdict = validate(images["jax-banners"], peers={"pytorch": images["pytorch-banners"]}, join_timeout_s=120)
    assert_all_pass(verdict, (
        "test_ulimit[stack]", "test_shm_size_matches_run_profile", "test_workers_pass_large_batches_through_shm",
        "test_python_version", "test_framework_version", "test_extra_packages", "test_labels_state_the_matrix_cell",
        "test_labels_state_the_image_contents", "test_image_user_can_write_in_its_workdir",
        "test_entrypoint_runs_the_command", "test_psum_across_processes_gives_known_sum",
        "test_cpu_collectives_are_gloo", "test_loss_falls_with_averaged_gradients",
        "test_processes_end_with_identical_parameters", "test_process0_prints_the_launcher_result_line",
        "test_two_containers_train_and_agree", "test_missing_process_fails_within_init_timeout",
        "test_jax_profiler_writes_xplane", "test_profile_plugin_lists_the_run",
        "test_profile_plugin_offers_the_trace_viewer", "test_trace_holds_the_traced_steps",
        "test_profile_plugin_frontend_served", "test_tensorboard_serves_the_loss_jax_wrote",
        "test_our_tensorboard_reads_other_frameworks_events", "test_other_tensorboard_reads_our_events"))


# -- faults: each caught by the check meant for it, the cause on the first line --------------------


@dataclass(frozen=True)
class Fault:
    image: str
    select: str
    fails: dict[str, tuple[str, ...]]            # test -> what its first line must name
    overrides: dict[str, Any] = field(default_factory=dict)
    absent: tuple[str, ...] = ()                 # words that would blame the wrong cause
    passes: tuple[str, ...] = ()                 # checks that (rightly or tellingly) still pass
    skipped: tuple[str, ...] = ()                # GPU checks: a skip even when their setup fails


FAULTS: dict[str, Fault] = {
    "labels-lie": Fault("pytorch-labels-lie", "labels", {
        "test_labels_state_the_matrix_cell": (
            f"{label_keys.PYTHON}='3.12', but matrix cell pytorch-cpu:2.13 says '3.11'",
            f"{label_keys.OCI_VERSION}='2.14', but matrix cell pytorch-cpu:2.13 says '2.13'",
            f"{label_keys.ACCELERATOR}='cuda', but matrix cell pytorch-cpu:2.13 says 'cpu'",
            f"""{label_keys.RUN_PROFILE}='{{"shm_size":"64m"}}', but matrix cell pytorch-cpu:2.13 says"""),
        "test_labels_state_the_image_contents": (
            "says Python 3.12, but the image's python3 is 3.11",
            "says version 2.14, but the image contains torch 2.13.0+cpu",
            "says cuda, but torch in the image is built without CUDA")}),
    "framework-version-label": Fault("pytorch-mislabelled", "framework_version", {
        "test_framework_version": ("claims torch 2.12.0+cpu but the image contains torch 2.13.0+cpu",)}),
    "profiler-static-removed": Fault("pytorch-profiler-nostatic", "profiler_frontend or profiler_views", {
        "test_profiler_frontend_served": ("tab would not render", "index.html answered 404")},
        passes=("test_profiler_views",)),  # its JSON API still answers: why the frontend check exists
    "profiler-entry-point-gone": Fault("pytorch-profiler-noentrypoint", "profiler_plugin_active or cuda_kernels", {
        "test_profiler_plugin_active": ("torch-tb-profiler 0.4.3 is installed but declares no `tensorboard_plugins` "
                                        "entry point",)},
        absent=("not installed",), skipped=("test_profiler_cuda_kernels",)),
    "profiler-uninstalled": Fault("pytorch-noprofiler", "profiler_plugin_active", {
        "test_profiler_plugin_active": ("torch-tb-profiler is not installed",)}),
    # A lock with mpmath deleted by hand: the image lacks it and so does its lock label, so the locked-packages
    # check passes (the label is what it compares with); `pip check` names the broken requirement.
    "requirement-missing": Fault("pytorch-nompmath", "locked_packages or installed_requirements", {
        "test_installed_requirements_are_met": ("pip check", "1 broken requirement",
                                                "sympy 1.14.0 requires mpmath, which is not installed")},
        passes=("test_locked_packages_installed_at_their_versions",)),
    "bytecode-broken": Fault("pytorch-bytecode-broken", "bytecode", {
        "test_locked_packages_load_from_precompiled_bytecode": (
            "Python files of the locked packages have no bytecode", f"{fixture_images.SITE}/sympy/",
            "1 of ", "have bytecode that does not match its source", f"{fixture_images.SITE}/torch/__init__.py",
            "every process compiles them again on import")}),
    "tensorboard-script-gone": Fault("pytorch-notensorboard", "profiler", {
        "test_profiler_plugin_active": ("no `tensorboard` command on PATH",),
        "test_tensorboard_answers_on_empty_logdir": ("no `tensorboard` command on PATH",)},
        skipped=("test_profiler_cuda_kernels",)),
    # DDP's reducer does not call it (test_ddp passes on this image): why the collective check exists.
    "all-reduce-noop": Fault("pytorch-allreduce-noop", "collectives", {
        "test_collectives_give_known_results_on_cpu": ("all_reduce(SUM) on rank 0 gave [1.0",
                                                       "expected [3.0")}),
    "user-cannot-write-workdir": Fault("pytorch-nobody", "test_user or ddp_checkpoint or profiler_writes", {
        "test_image_user_can_write_in_its_workdir": ("user 65534 (nobody) cannot write in its working directory "
                                                     "/workspace: mktemp: failed to create file", "Permission denied"),
        "test_image_user_can_write_its_home": ("user 65534 (nobody) cannot write in its HOME /nonexistent",
                                               "No such file or directory"),
        "test_ddp_checkpoint_saved_in_workdir": ("Permission denied", "/workspace/imgtest-checkpoint-"),
        "test_profiler_writes_trace": ("/workspace/imgtest-profiler-",)}),
    "ca-certificates-removed": Fault("pytorch-nocerts", "system_ca_certificates", {
        "test_python_trusts_the_system_ca_certificates": (
            "Python's default SSL context trusts no CA certificate (none in /usr/lib/ssl/cert.pem or "
            "/usr/lib/ssl/certs)", "fails with CERTIFICATE_VERIFY_FAILED", "install ca-certificates")}),
    "tmp-not-writable": Fault("pytorch-tmp-readonly", "test_user", {
        "test_image_user_can_write_tmp": ("user 1000 (trainer) cannot write in /tmp: mktemp",
                                          "/tmp/.imagetest-write-", "Permission denied")}),
    # -- issue 54: checks written with testinfra's `host`, each failing on its fault -------------------------
    "locked-package-removed": Fault("pytorch-noprofiler", "locked_packages", {
        "test_locked_packages_installed_at_their_versions": ("1 of ", "locked packages differ",
                                                             "torch-tb-profiler: locked 0.4.3, image has nothing "
                                                             "installed")}),
    "cpu-image-requires-cuda": Fault("pytorch-requires-cuda", "nvidia_runtime_variables", {
        "test_nvidia_runtime_variables": ("a CPU image sets NVIDIA_REQUIRE_CUDA=cuda>=12.4",
                                          "GPU runtimes would refuse to start it")}),
    "tensorboard-listens-everywhere": Fault("pytorch-tensorboard-exposed", "tensorboard_listens", {
        "test_tensorboard_listens_on_loopback_only": ("TensorBoard started without --host listens on 0.0.0.0:",
                                                      "not on loopback only")}),
    "gloo-interface-missing": Fault("pytorch-gloo-ifname", "ddp_loss or collectives", {
        "test_ddp_loss_falls": ("failed: rank", "RuntimeError", "Unable to find address for: nonexistent0"),
        "test_collectives_give_known_results_on_cpu": ("Unable to find address for: nonexistent0",)},
        absent=("SIGTERM", "exitcode -15")),
    "dataloader-worker-hangs": Fault("pytorch-worker-hangs", "workers_pass", {
        "test_workers_pass_large_batches_through_shm": ("worker 1 (pid", "hung: no batch within 30s")},
        absent=("out of shared memory", "waiter.acquire")),
    "dataloader-worker-crashes": Fault("pytorch-worker-crashes", "workers_pass", {
        "test_workers_pass_large_batches_through_shm": ("worker 1 (pid", "died with SIGSEGV")},
        absent=("out of shared memory", "os.waitpid")),
    "ddp-rank-crashes": Fault("pytorch-rank-crashes", "ddp_loss", {
        "test_ddp_loss_falls": ("rank 1 died: Fatal Python error: Segmentation fault",)}),
    "no-torchrun": Fault("pytorch-notorchrun", "missing_peer", {
        "test_missing_peer_fails_with_clear_timeout": ("torchrun: not found in the image",)}),
    "entrypoint-ignores-command": Fault("pytorch-entrypoint-ignores", "entrypoint or python_version", {
        "test_entrypoint_runs_the_command": ("did not run the command: the image's entrypoint",
                                             "notebook server ready"),
        "test_python_version": ("the container stopped (exit code 0): the image's entrypoint",)}),
    "entrypoint-runs-something-else": Fault("pytorch-entrypoint-blocks", "entrypoint", {
        "test_entrypoint_runs_the_command": ("did not run", "hung: no CPU or I/O for 30 s",
                                             "keeps the container running without running the command")}),
    "run-flags-shm-and-ulimit": Fault("pytorch", "shm or ulimit", {
        "test_shm_size_matches_run_profile": ("/dev/shm is 64 MiB but the run profile promises 8g",
                                              "run.shm_size of pytorch-cpu:2.13 in matrix.yaml"),
        "test_workers_pass_large_batches_through_shm": ("could not put a 96 MiB batch into shared memory",
                                                        "out of shared memory",
                                                        "raise run.shm_size of pytorch-cpu:2.13"),
        "test_ulimit[stack]": ("ulimit stack in the container is 8388608", "asks for 67108864")},
        overrides={"extra_run_flags": ["--shm-size=64m", "--ulimit=stack=8388608"]},
        absent=("--shm-size=64m",)),
    "shm-256m": Fault("pytorch", "shm_size", {
        "test_shm_size_matches_run_profile": ("/dev/shm is 256 MiB but the run profile promises 8g",
                                              "run.shm_size of pytorch-cpu:2.13 in matrix.yaml")},
        overrides={"extra_run_flags": ["--shm-size=256m"]}, absent=("--shm-size=256m",)),
    "ddp-ranks-unreachable": Fault("pytorch", "ddp_loss", {
        "test_ddp_loss_falls": ("could not reach each other through 192.0.2.1",)},
        # No network but loopback, and a master address on another host: rank 0's store is unreachable.
        overrides={"extra_run_flags": ["--network=none"], "ddp_master_addr": "192.0.2.1", "ddp_timeout_s": 20}),
    "rendezvous-peer-cannot-reach": Fault("pytorch", "two_nodes", {
        "test_two_nodes_rendezvous_and_agree": ("rendezvous timed out after", "the second node never joined",
                                                "RendezvousTimeoutError")},
        # The second node has no network: it cannot reach the rendezvous endpoint and never joins.
        overrides={"peer_run_flags": ["--network=none"], "join_timeout_s": 15}),
    "tensorflow-profile-static-removed": Fault("tensorflow-profile-nostatic", "profile_plugin", {
        "test_profile_plugin_frontend_served": ("profile tab would not render", "index.html answered 404")},
        passes=("test_profile_plugin_loaded",)),
    "tensorflow-tensorboard-crashes": Fault("tensorflow-setuptools82", "serves_scalars", {
        "test_tensorboard_serves_scalars": ("TensorBoard exited with code", "pkg_resources")}),
    # FSDP whose gradient reduction sums nothing across ranks: the gathered parameters still agree and the loss still
    # falls; only the replay of the same steps unsharded tells (issue 42).
    "fsdp-gradient-reduction-broken": Fault("pytorch-fsdp-noreduce", "fsdp", {
        "test_fsdp_gradient_reduction_matches_unsharded_training": (
            "FSDP gradient reduction is wrong", "differ from the same steps trained unsharded",
            "the reduce-scatter did not average every rank's gradients")},
        passes=("test_fsdp_shards_gather_the_same_parameters_on_every_rank", "test_fsdp_loss_falls")),
    # -- JAX: one fault per check of the jax group ---------------------------------------------------
    "jax-psum-noop": Fault("jax-psum-noop", "psum_across or identical_parameters", {
        "test_psum_across_processes_gives_known_sum": ("psum over 2 devices of 2 processes gave 1.0, expected 3.0",),
        "test_processes_end_with_identical_parameters": ("the processes ended with different parameters",)}),
    "jax-init-ignores-timeout": Fault("jax-init-hangs", "missing_process", {
        "test_missing_process_fails_within_init_timeout": (
            "hung: no CPU or I/O for 70 s", "at initialize", "instead of failing after its 10 s init timeout")}),
    "jax-peer-cannot-reach-coordinator": Fault("jax", "two_containers", {
        # Either process may be the first to be aborted: process 1 cannot reach the coordinator, process 0
        # waits for it in vain.
        "test_two_containers_train_and_agree": ("died at initialize: Fatal Python error: Aborted",
                                                "not all 2 processes join the coordinator t-imagetest-jax-node0-",
                                                "within its init timeout of 15 s")},
        # The second node has no network: it never reaches process 0's coordinator (node0, on the run's bridge
        # network); jax aborts it after its init timeout (the join timeout), and process 0 is stopped.
        overrides={"peer_run_flags": ["--network=none"], "join_timeout_s": 15}, absent=("hung",)),
    "jax-framework-version-label": Fault("jax-mislabelled", "framework_version", {
        "test_framework_version": ("claims jax 0.10.1 but the image contains jax 0.10.2",)}),
    "jax-profiler-traces-nothing": Fault("jax-profiler-notrace", "jax_profiler_writes", {
        "test_jax_profiler_writes_xplane": ("jax.profiler could not write its trace", "wrote no .xplane.pb")}),
    "jax-step-annotations-dropped": Fault("jax-steps-unnamed", "trace_holds or lists_the_run", {
        "test_trace_holds_the_traced_steps": ("lacks ['imgtest_step 0', 'imgtest_step 1'",)},
        passes=("test_profile_plugin_lists_the_run",)),   # the trace is there, just without its steps
    "jax-profile-plugin-uninstalled": Fault("jax-noprofile", "profile_plugin_lists or trace_holds", {
        "test_profile_plugin_lists_the_run": ("TensorBoard did not load the profile plugin: tensorboard-plugin-profile "
                                              "or xprof is not installed",),
        "test_trace_holds_the_traced_steps": ("TensorBoard did not load the profile plugin",)}),
    "jax-profile-static-removed": Fault("jax-profile-nostatic", "profile_plugin_frontend or trace_holds", {
        "test_profile_plugin_frontend_served": ("profile tab would not render", "index.html answered 404")},
        passes=("test_trace_holds_the_traced_steps",)),   # its data API still answers
    "jax-events-dropped": Fault("jax-events-dropped", "serves_the_loss", {
        "test_tensorboard_serves_the_loss_jax_wrote": ("JAX could not write event files",
                                                       "the event writer left no events.out.tfevents.* file")}),
    # -- issue 43: what a user looks at, across network namespaces, the cause named ------------------------
    # A trace of metadata events only: every view is listed and the overview has its `steps` key (the old
    # checks passed), but the Overview, Operator and Trace views are empty.
    "profiler-trace-metadata-only": Fault("pytorch-trace-metadata-only", "profiler", {
        "test_profiler_trace_holds_operator_events": ("the profiler trace holds no operator events in "
                                                      "ProfilerStep#2, ProfilerStep#3, ProfilerStep#4",),
        "test_profiler_overview_shows_the_traced_steps": ("the Overview's step chart shows",
                                                          "instead of steps 2, 3, 4 with their time"),
        "test_profiler_operator_view_lists_the_operators": ("the Operator view lists 0 operators",
                                                            "'aten::addmm'")},
        passes=("test_profiler_views", "test_profiler_worker_overview", "test_profiler_writes_trace"),
        skipped=("test_profiler_cuda_kernels",)),
    # Works on one host (the old two-node check ran on the host network and passed); across network
    # namespaces gloo tells the other node 127.0.0.1 and the nodes time out connecting.
    "gloo-pinned-to-loopback": Fault("pytorch-gloo-loopback", "network_env or two_nodes", {
        "test_socket_interfaces_are_not_pinned_to_loopback": ("GLOO_SOCKET_IFNAME=lo set in the image pins the "
                                                               "sockets to the loopback device",),
        "test_two_nodes_rendezvous_and_agree": ("two-node DDP failed", "Gloo",
                                                "the image's environment could redirect it: GLOO_SOCKET_IFNAME=lo")},
        passes=("test_proxies_leave_local_traffic_local",)),
    # The proxy took TensorBoard's local queries (blamed on TensorBoard before) and the coordinator's join.
    "proxy-without-no-proxy": Fault("jax-proxy", "network_env or profile_plugin_lists", {
        "test_proxies_leave_local_traffic_local": (f"http_proxy={fixture_images.PROXY}",
                                                   f"HTTPS_PROXY={fixture_images.PROXY}", "no_proxy is unset",
                                                   "does not cover localhost, 127.0.0.1"),
        "test_profile_plugin_lists_the_run": ("went to the proxy http_proxy=" + fixture_images.PROXY,
                                              "no_proxy does not cover 127.0.0.1",
                                              "it answers without the proxy")},
        passes=("test_socket_interfaces_are_not_pinned_to_loopback",), absent=("did not answer within",)),
    "jax-profile-native-module-missing": Fault("jax-profile-nonative", "profile_plugin_lists", {
        "test_profile_plugin_lists_the_run": ("TensorBoard did not load the profile plugin",
                                              "xprof/convert/_pywrap_profiler_plugin.so (in the RECORD of xprof)",
                                              "_pywrap_profiler_plugin")},
        absent=("did not list the plugin",)),
    "tensorflow-shm-64m": Fault("tensorflow", "workers_pass", {
        "test_workers_pass_large_batches_through_shm": ("worker", "died with SIGBUS: out of shared memory")},
        overrides={"extra_run_flags": ["--shm-size=64m"]}),
}


# -- NVIDIA's libraries (issue 39): the cuDNN and NCCL an NGC base's notes promise ----------------------------
# No NGC image is reachable here: pytorch-cpu stands for the base, in a matrix whose cell promises what NGC
# 25.10's cells record, and fixture layers put libraries reporting other versions (or the promised ones) on the
# dynamic loader's path.
LIBRARY_TEST = "test_nvidia_libraries_are_the_ones_the_base_promises"
_PROMISE = ('        libraries: {cudnn: "9.14.0.64", nccl: "2.27.7", source: '
            '"https://docs.nvidia.com/deeplearning/frameworks/pytorch-release-notes/rel-25-10.html"}\n')


@pytest.fixture(scope="session")
def promising_matrix(tmp_path_factory):
    """The real matrix, with pytorch-cpu:2.13 promising NGC 25.10's cuDNN and NCCL."""
    text = (REPO / "matrix.yaml").read_text()
    anchor = "        framework_version: 2.13.0+cpu\n"
    assert text.count(anchor) == 1, "pytorch-cpu:2.13 moved in matrix.yaml"
    path = tmp_path_factory.mktemp("promise") / "matrix.yaml"
    path.write_text(text.replace(anchor, anchor + _PROMISE))
    return load_matrix(path, REPO / "templates", tests_dir=REPO / "image-tests")


@pytest.mark.parametrize(("image", "causes"), [
    ("pytorch-nvlibs-other", ("cuDNN 9.6.0 in the image, the matrix records cuDNN 9.14.0.64",
                              "loaded from /usr/local/lib/libcudnn.so.9", "rel-25-10.html")),
    ("pytorch", ("no cuDNN 9.14.0.64: the dynamic loader finds no libcudnn.so.9",
                 "no NCCL 2.27.7: the dynamic loader finds no libnccl.so.2")),
])
def test_nvidia_libraries_other_than_promised_fail_naming_both_versions(image, causes, images, validate,
                                                                        promising_matrix):
    verdict = validate(images[image], using=promising_matrix, select="nvidia_libraries")
    assert_fails(verdict, LIBRARY_TEST, *causes, absent=("NCCL 2.27.7 in the image",))


def test_nvidia_libraries_as_promised_pass_and_no_promise_is_an_expected_skip(images, validate, promising_matrix):
    verdict = validate(images["pytorch-nvlibs-promised"], using=promising_matrix, select="nvidia_libraries")
    assert results(verdict)[LIBRARY_TEST]["result"] == "passed", results(verdict)[LIBRARY_TEST]
    plain = results(validate(images["pytorch"], select="nvidia_libraries"))[LIBRARY_TEST]
    assert plain["result"] == "skipped" and plain["skip_code"] == "no-library-promise", plain


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_is_caught_naming_its_cause(name, images, validate):
    fault = FAULTS[name]
    verdict = validate(images[fault.image], select=fault.select, **fault.overrides)
    for test, causes in fault.fails.items():
        assert_fails(verdict, test, *causes, absent=fault.absent)
    found = results(verdict)
    for test in fault.passes:
        assert found[test]["result"] == "passed", (test, found[test])
    for test in fault.skipped:
        assert found[test]["result"] == "skipped" and found[test]["skip_code"] == "gpu-not-in-cell", found[test]


def test_hang_is_named_within_its_quiet_window_and_validation_goes_on(images, run_cli, tmp_path):
    """`import torch` sleeps 600 s: the first import (the cold start, before any check) shows no CPU
    or I/O for 30 s and is killed as hung, long before the image's deadline; every check that needs
    the container fails naming it; the next image is validated."""
    started = time.monotonic()
    code, out, err = run_cli("validate", images["pytorch-import-hangs"], images["pytorch"], "--no-store", "--json",
                             "-k", "contents or collectives", "--deadline", "200", "--reports", str(tmp_path),
                             "--matrix", str(REPO / "matrix.yaml"))
    print(f"\n[cost] the hang and a healthy image, deadline 200s: {time.monotonic() - started:.0f}s")
    assert code == 1, err
    hung, healthy = json.loads(out)
    cause = "import torch for the first time in this image (cold start) hung: no CPU or I/O for 30 s"
    assert_fails(hung, "test_python_version", cause)
    assert_fails(hung, "test_collectives_give_known_results_on_cpu", cause)
    assert results(hung)["test_collectives_give_known_results_with_nccl"]["result"] == "skipped"
    assert hung["deadline_s"] == 200 and hung["duration_s"] < 120, hung["duration_s"]
    assert hung["cold_start"] is None  # it never finished, so there is no cold import to report
    print(f"hang: validated in {hung['duration_s']:.0f}s against a 200s deadline")
    # Validation went on with the next image: nothing failed there (-k makes its verdict incomplete).
    assert healthy["result"] == "incomplete" and not [t for t in healthy["tests"] if t["result"] == "failed"], healthy
    assert healthy["incomplete"] and "deselected by -k" in healthy["incomplete"][0], healthy["incomplete"]
    cold = {i["module"]: i for i in healthy["cold_start"]["imports"]}
    assert cold["torch"]["seconds"] > 0 and not cold["torch"]["error"], healthy["cold_start"]


def test_a_slow_but_busy_first_import_passes_and_its_cost_is_in_the_verdict(images, run_cli, tmp_path):
    """The first `import torch` stays busy (CPU and reads) for 75 s, longer than the 60 s the import
    was once given: what a cold page cache does to a healthy image on a fresh runner. It passes, the
    later checks run warm, and the verdict records what the cold import cost. With a deadline too
    short for it, it fails saying it was still busy when the deadline ran out, not that it hung."""
    slow = fixture_images.SLOW_IMPORT_S
    code, out, err = run_cli("validate", images["pytorch-import-slow"], "--no-store", "--json", "-k", "contents",
                             "--reports", str(tmp_path / "default"), "--matrix", str(REPO / "matrix.yaml"))
    verdict = json.loads(out)[0]
    failed = {t["id"]: t["message"] for t in verdict["tests"] if t["result"] == "failed"}
    assert not failed, failed
    assert code == 0 and verdict["result"] == "incomplete" and "deselected by -k" in verdict["incomplete"][0], err
    for test in ("test_python_version", "test_framework_version", "test_extra_packages"):
        assert results(verdict)[test]["result"] == "passed", results(verdict)[test]
    cold = verdict["cold_start"]
    first = {i["module"]: i for i in cold["imports"]}["torch"]
    # Busy, not hung: the fixture spins for `slow` s of wall time, so the CPU it gets is the machine's
    # share (33 s of 81 s with four test workers on two cores); a plain `import torch` costs 1.7-1.9 s,
    # so an import that waits instead of working stays far below slow / 5.
    assert first["seconds"] >= slow and not first["error"] and cold["cpu_s"] >= slow / 5, cold

    code, out, err = run_cli("validate", images["pytorch-import-slow"], "--no-store", "--json", "-k", "contents",
                             "--deadline", "70", "--reports", str(tmp_path / "short"),
                             "--matrix", str(REPO / "matrix.yaml"))
    short = json.loads(out)[0]
    assert code == 1, err
    assert_fails(short, "test_python_version", "import torch for the first time in this image (cold start): still "
                 "running after", "s of CPU): the image's deadline ran out (validate.deadline_s 70 s)",
                 absent=("hung",))
    print(f"slow import: torch first imported in {first['seconds']:.0f}s, then every check warm")


# -- the command line: exit codes and verdicts stored by digest ------------------------------------


@pytest.fixture(scope="session")
def pushed_pytorch(images) -> str:
    """The PyTorch dev image in the local registry under a fixture name, as a dev image would be."""
    from buildtool.common import docker_cli

    repo, tag = images["pytorch"].split(":")
    ref = f"{names.dev_repo(names.DEFAULT_REGISTRY, repo)}:{names.dev_tag(tag, '2.13')}"
    for args in (["tag", images["pytorch"], ref], ["push", ref]):
        docker_cli.docker(*args, check=True, timeout=900)
    return ref


def test_validate_stores_verdict_by_digest(pushed_pytorch, run_cli, tmp_path):
    from buildtool.attest.keys import TrustedKeys, dev_public_key
    from buildtool.common.refs import split_repo
    from buildtool.registry.client import RegistryClient
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
    # -k narrows the run: the verdict says so (incomplete, with the selection) and can never release it.
    assert stored.digest == digest and stored.result == "incomplete"
    assert stored.selection.expression == "framework_version or shm_size" and stored.selection.deselected
    assert stored.cell == "pytorch-cpu:2.13"
    assert {t.id.split("::")[-1] for t in stored.tests} == {"test_framework_version",
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


def test_the_two_node_run_records_its_transport_family(images, validate):
    """Issue 49: the two-container run (two nodes on the run's bridge network) records what carried it in the
    verdict, which the nightly report shows: on CPU gloo over TCP, the family Socket (on GPUs, NCCL's per-rank
    log read by contracts/nccl_log.py; an empty one fails: tests/test_nccl_log.py)."""
    verdict = validate(images["pytorch"], select="two_nodes_rendezvous")
    assert results(verdict)["test_two_nodes_rendezvous_and_agree"]["result"] == "passed", verdict
    assert verdict["figures"]["two_node_transport"] == (
        "Socket (gloo: torch's CPU collectives over TCP; NCCL not used)"), verdict["figures"]
