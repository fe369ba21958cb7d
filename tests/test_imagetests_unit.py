"""Unit tests of the image-test machinery that need no engine: the probe supervisor (run here with
this machine's Python, as it runs inside an image), result recording (an interrupted test never
passes; a GPU check without GPUs is a skip before its fixtures; a spent deadline means not run),
cause naming from rank and worker files, and what validate asks of labels and deadlines."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from buildtool.common.errors import MatrixError
from buildtool.contracts import label_keys
from buildtool.contracts.target import Expectations, FrameworkInfo, Target, write_target
from buildtool.matrix.loader import load_matrix, parse_matrix
from buildtool.matrix.yamlsource import load_yaml
from buildtool.validate import pytest_run, runner
from buildtool.validate.labels import dockerfile_labels, label_checks, template_labels, version_proof
from tests.conftest import FIXTURE_MATRIX, fixture_matrix

REPO = Path(__file__).resolve().parent.parent
TESTS_DIR = REPO / "image-tests"
SUPERVISE = TESTS_DIR / "scripts" / "supervise.py"
sys.path.insert(0, str(TESTS_DIR))
sys.path.insert(0, str(TESTS_DIR / "common"))
sys.path.insert(0, str(TESTS_DIR / "pytorch"))
import harness  # noqa: E402
import ranks  # noqa: E402
import test_labels as labels_test  # noqa: E402
import test_shm as shm_test  # noqa: E402


@pytest.fixture(scope="module")
def matrix():
    return fixture_matrix()


def cell_of(matrix, key):
    return next(c for c in matrix.cells if c.key == key)


# -- the supervisor ---------------------------------------------------------------------------------


def supervise(tmp_path: Path, bound: float, *argv: str, quiet: float = 30) -> dict:
    """Run supervise.py as harness.py does: BOUND (what is left of the deadline), QUIET (how long
    the probe may show no progress), the step id, then the command."""
    out = tmp_path / "probe"
    out.mkdir()
    # A step id of its own, as harness.py gives each probe: the supervisor kills every process marked
    # with it, so a shared id would let one run's supervisor kill another's probe (other test runs
    # on the same machine included).
    step = f"unit-step-{uuid.uuid4().hex[:8]}"
    subprocess.run([sys.executable, "-I", "-S", str(SUPERVISE), str(out), str(bound), str(quiet), step, "--",
                    *argv], check=True, timeout=min(bound, quiet) + 60)
    return json.loads((out / "exit.json").read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_supervisor_kills_a_hung_probe_and_what_it_started(tmp_path):
    code = textwrap.dedent("""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        open(os.path.join(os.environ["IMAGETEST_OUT"], "child.pid"), "w").write(str(child.pid))
        time.sleep(300)
    """)
    record = supervise(tmp_path, 60, sys.executable, "-c", code, quiet=2)
    assert record["stalled"] and record["signal"] == signal.SIGTERM and record["leftovers"] >= 1
    child = int((tmp_path / "probe" / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "a process the probe started in its own session survived the probe"


def test_supervisor_records_not_found_and_signals(tmp_path):
    record = supervise(tmp_path, 10, "no-such-command-imgtest")
    assert record["not_found"] and record["rc"] == 127 and "no-such-command-imgtest: not found" in record["error"]
    shutil.rmtree(tmp_path / "probe")
    record = supervise(tmp_path, 10, sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert record["signal"] == signal.SIGSEGV and not record["timed_out"] and not record["stalled"]


def test_output_never_decides_only_the_result_file(tmp_path):
    code = ("import json, os; print('RESULT {\"fake\": true}'); "
            "json.dump({'real': 1}, open(os.path.join(os.environ['IMAGETEST_OUT'], 'result.json'), 'w'))")
    record = supervise(tmp_path, 10, sys.executable, "-c", code)
    assert record["rc"] == 0
    assert json.loads((tmp_path / "probe" / "result.json").read_text()) == {"real": 1}


# Slow is not hung: what a cold page cache looks like (busy for longer than any fixed bound) passes;
# a probe that does nothing is hung within its quiet window, long before the deadline.
BUSY = """
import os, sys, time
end = time.monotonic() + float(sys.argv[1])
mode = sys.argv[2]
with open(sys.executable, "rb") as fh:
    # spin: CPU a third of the time, progress in every quiet window, and on for at least 0.6 s of CPU
    # (counted as CPU, so a loaded machine that gives the child less of its cores only makes it run longer)
    while time.monotonic() < end or (mode == "spin" and time.process_time() < 0.6):
        if mode == "spin":
            spun = time.process_time() + 0.1
            while time.process_time() < spun:
                sum(range(20000))
            time.sleep(0.2)
        else:  # reads a little, then waits: I/O progress with hardly any CPU
            fh.seek(0)
            fh.read(1 << 16)
            time.sleep(0.3)
open(os.path.join(os.environ["IMAGETEST_OUT"], "result.json"), "w").write('{"done": true}')
"""


@pytest.mark.parametrize("mode", ["spin", "read"])
def test_a_probe_that_is_slow_but_busy_runs_past_its_quiet_window(tmp_path, mode):
    """Busy for 4 s (CPU, or reads with sleeps between them) with a quiet window of 1.5 s: it runs
    to its end, as an import reading a cold disk must."""
    record = supervise(tmp_path, 60, sys.executable, "-c", BUSY, "4", mode, quiet=1.5)
    assert record["rc"] == 0 and not record["stalled"] and not record["timed_out"], record
    assert record["seconds"] >= 4 and json.loads((tmp_path / "probe" / "result.json").read_text()) == {"done": True}
    if mode == "spin":
        assert record["cpu_s"] >= 0.5, record  # it spun for 0.6 s of CPU; the record reads it in clock ticks
    else:
        assert record["rchar"] >= 10 * (1 << 16) and record["io_visible"], record


def test_a_probe_that_sleeps_is_hung_within_its_quiet_window_not_its_bound(tmp_path):
    started = time.monotonic()
    record = supervise(tmp_path, 120, sys.executable, "-c", "import time; time.sleep(300)", quiet=2)
    assert record["stalled"] and not record["timed_out"] and record["quiet_s"] == 2, record
    assert record["idle_s"] >= 2 and time.monotonic() - started < 20, record


def test_a_busy_probe_is_cut_when_the_deadline_runs_out_and_says_it_was_busy(tmp_path):
    record = supervise(tmp_path, 3, sys.executable, "-c", BUSY, "300", "spin", quiet=30)
    assert record["timed_out"] and not record["stalled"] and record["signal"] == signal.SIGTERM, record
    assert 3 <= record["seconds"] < 30 and record["cpu_s"] > 0.1, record


def test_probes_refuse_a_shell_string():
    container = object.__new__(harness.Container)
    with pytest.raises(TypeError, match="never a shell string"):
        container.run("ulimit -s", step="x")


def test_a_probe_without_the_images_deadline_is_refused_never_unbounded(tmp_path):
    """image-tests started without a target deadline: no probe runs without a bound."""
    harness.set_deadline(0)
    container = object.__new__(harness.Container)
    probe = container.run(["python3", "-c", "pass"], step="x")
    assert probe.error.startswith("not run: no deadline was set for the image"), probe.error
    probe, _ = harness.run_once("img", [], ["true"], run_id="r", out_root=tmp_path, step="y")
    assert probe.error.startswith("not run: no deadline was set for the image"), probe.error


def test_hang_messages_tell_hung_from_slow():
    probe = harness.Probe(step="import torch", argv=["python3"], quiet=30, stalled=True, seconds=31.4)
    assert probe.cause() == "import torch hung: no CPU or I/O for 30 s; killed after 31 s"
    harness.set_deadline(50, 480)
    probe = harness.Probe(step="import tensorflow", argv=["python3"], timed_out=True, seconds=412,
                          read_bytes=1_650_000_000, cpu_s=37.2)
    assert probe.cause() == ("import tensorflow: still running after 412 s (1650 MB read, 37 s of CPU): the "
                             "image's deadline ran out (validate.deadline_s 480 s)")
    harness.set_deadline(0)
    probe = harness.Probe(step="DDP", argv=["torchrun"], bound=100, lost=True)
    assert probe.cause() == "DDP hung: not even its supervisor answered within 120 s; killed"


# -- causes from rank files ----------------------------------------------------------------------------


def rank_probe(tmp_path: Path, files: dict[str, object], rc: int = 1, **kw) -> harness.Probe:
    for name, data in files.items():
        (tmp_path / name).write_text(data if isinstance(data, str) else json.dumps(data))
    return harness.Probe(step="torchrun DDP", argv=["torchrun"], rc=rc, dir=tmp_path, **kw)


def test_rank_error_is_the_cause_not_the_ranks_torchrun_killed(tmp_path):
    probe = rank_probe(tmp_path, {
        "rank-0.start.json": {"rank": "0"}, "rank-1.start.json": {"rank": "1"},
        "rank-1.json": {"rank": "1", "ok": False, "error": "RuntimeError: Unable to find address for: nonexistent0",
                        "where": "distributed_c10d.py:2169"}})
    assert ranks.cause(probe, "DDP") == ("DDP failed: rank 1: RuntimeError: Unable to find address for: nonexistent0 "
                                         "(at distributed_c10d.py:2169)")


def test_a_rank_killed_by_a_signal_is_named(tmp_path):
    probe = rank_probe(tmp_path, {"rank-0.start.json": {}, "rank-1.start.json": {},
                                  "rank-1.fault": "Fatal Python error: Segmentation fault\n\nCurrent thread ..."})
    assert ranks.cause(probe, "DDP") == "DDP failed: rank 1 died: Fatal Python error: Segmentation fault"


def test_launcher_errors_are_told_by_their_type(tmp_path):
    message = {"message": {"message": "RendezvousTimeoutError: ", "extraInfo": {}}}
    found = ranks.read(rank_probe(tmp_path, {ranks.LAUNCHER_ERROR_FILE: message}))
    assert found.launcher_type == ranks.RENDEZVOUS_TIMEOUT
    store = {"message": {"message": "DistNetworkError: The client socket has timed out after 20000ms while trying "
                                    "to connect to (192.0.2.1, 29500).\nmore", "extraInfo": {}}}
    probe = rank_probe(tmp_path, {ranks.LAUNCHER_ERROR_FILE: store})
    cause = ranks.cause(probe, "DDP", "192.0.2.1:29500")
    assert cause.startswith("DDP: the ranks could not reach each other through 192.0.2.1:29500: torchrun "
                            "DistNetworkError: The client socket has timed out")
    # The word "timeout" in some other error never makes it a rendezvous timeout.
    other = {"message": {"message": "ValueError: bad timeout=timeout value", "extraInfo": {}}}
    assert ranks.read(rank_probe(tmp_path, {ranks.LAUNCHER_ERROR_FILE: other})).launcher_type == "ValueError"


def test_a_missing_torchrun_is_not_a_rendezvous_timeout(tmp_path):
    probe = harness.Probe(step="torchrun", argv=["torchrun"], rc=127, not_found=True,
                          error="torchrun: not found in the image (PATH=/usr/bin)", dir=tmp_path)
    assert ranks.cause(probe, "torchrun") == "torchrun: torchrun: not found in the image (PATH=/usr/bin)"
    assert ranks.read(probe).launcher_type == ""


# -- DataLoader worker causes --------------------------------------------------------------------------


SHM = {"size": 8 << 30, "free": 8 << 30}


def test_worker_failures_name_the_worker_and_blame_shm_only_for_sigbus():
    fix = "run.shm_size of pytorch-cpu:2.13 in matrix.yaml"
    crashed = {"error": "RuntimeError: DataLoader worker (pid(s) 16) exited unexpectedly", "shm": SHM,
               "workers": [{"worker": 0, "pid": 15, "alive": True, "exitcode": None},
                           {"worker": 1, "pid": 16, "alive": False, "exitcode": -11}]}
    line = shm_test.worker_failure(crashed, "a DataLoader", fix)
    assert line.startswith("a DataLoader: worker 1 (pid 16) died with SIGSEGV") and "shared memory" not in line
    bus = dict(crashed, workers=[{"worker": 0, "pid": 15, "alive": False, "exitcode": -7}],
               shm={"size": 64 << 20, "free": 0})
    line = shm_test.worker_failure(bus, "a DataLoader", fix)
    assert "worker 0 (pid 15) died with SIGBUS: out of shared memory (/dev/shm 64 MiB, 0 B free)" in line
    assert f"raise {fix}" in line
    hung = {"error": "RuntimeError: DataLoader timed out after 30.0 seconds", "shm": SHM, "timeout_s": 30,
            "timed_out": True,
            "waiting_for": 1, "workers": [{"worker": 0, "pid": 15, "alive": True, "exitcode": None},
                                          {"worker": 1, "pid": 16, "alive": True, "exitcode": None}]}
    line = shm_test.worker_failure(hung, "a DataLoader", fix)
    assert line.startswith("a DataLoader: worker 1 (pid 16) hung: no batch within 30s") and "out of" not in line
    # A worker that raised is alive but did not hang: its own record names the error and /dev/shm's room.
    small = {"size": 64 << 20, "free": 60 << 20}
    error = "RuntimeError: unable to write to file </torch_1_2_3>: No space left on device"
    raised = {"worker-0.json": {"worker": 0, "pid": 15, "bytes": 96 << 20, "shm": small, "error": error}}
    line = shm_test.worker_failure(dict(hung, timed_out=False), "a DataLoader", fix, raised)
    assert line.startswith("a DataLoader: worker 0 (pid 15) could not put a 96 MiB batch into shared memory")
    assert "out of shared memory (/dev/shm 64 MiB, 60 MiB free); raise" in line and "hung" not in line
    roomy = {"worker-0.json": dict(raised["worker-0.json"], shm=SHM, error="ValueError: bad batch")}
    assert "out of shared memory" not in shm_test.worker_failure(dict(hung, timed_out=False), "a DataLoader", fix,
                                                                  roomy)


_DIES_BEFORE_ITER_RETURNS = """
import json, os, signal, sys
sys.path.insert(0, sys.argv[1])
import torch.utils.data._utils.worker as worker_module
from torch.utils.data import DataLoader
import shm_workers

shm_workers.BATCH_BYTES = 1 << 20
loop = worker_module._worker_loop


def crashing_loop(*args, **kwargs):
    if args[10] == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    return loop(*args, **kwargs)


worker_module._worker_loop = crashing_loop
make_iter = DataLoader.__iter__


def iter_that_fails(self):
    # torch's SIGCHLD handler raising inside iter(): the workers exist, the iterator never reaches the probe
    it = make_iter(self)
    pid = it._workers[1].pid
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    raise RuntimeError(f"DataLoader worker (pid {pid}) is killed by signal: Segmentation fault.")


DataLoader.__iter__ = iter_that_fails
print(json.dumps(shm_workers.torch_mode()))
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.host_torch
def test_a_worker_that_dies_inside_iter_is_still_named(tmp_path):
    """The CI failure of stop 17: worker 1 died before iter(loader) returned, torch's SIGCHLD handler
    raised there, and the probe (which looked for workers on the iterator) named none."""
    script = tmp_path / "dies_in_iter.py"
    script.write_text(_DIES_BEFORE_ITER_RETURNS)
    done = subprocess.run([sys.executable, str(script), str(TESTS_DIR / "scripts")], capture_output=True,
                          text=True, timeout=120, check=False)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert not found["ok"] and "is killed by signal" in found["error"], found
    dead = [w for w in found["workers"] if not w["alive"]]
    assert [(w["worker"], w["exitcode"]) for w in dead] == [(1, -signal.SIGSEGV)], found
    line = shm_test.worker_failure(dict(found, shm=SHM), "a DataLoader", "run.shm_size")
    assert line.startswith("a DataLoader: worker 1 (pid ") and "died with SIGSEGV" in line


# -- labels ------------------------------------------------------------------------------------------------


def test_dockerfile_labels_parse_continuations_and_quotes():
    text = 'FROM x\n# LABEL a=b\nLABEL a="one two" \\\n      b=plain \\\n      c="say \\"hi\\""\nRUN true\n'
    assert dockerfile_labels(text) == {"a": "one two", "b": "plain", "c": 'say "hi"'}


def test_template_labels_are_what_the_committed_dockerfile_says():
    # The checkout's matrix, as the committed Dockerfiles were rendered from it (the fixture matrix still
    # sets `licenses`, to test its grammar; the real one sets none: tests/test_licenses_label.py).
    matrix = load_matrix(REPO / "matrix.yaml", REPO / "templates", display="matrix.yaml",
                         tests_dir=REPO / "image-tests")
    for cell in matrix.cells:
        committed = dockerfile_labels((REPO / cell.dockerfile).read_text())
        rendered = template_labels(matrix, cell, REPO / "templates")
        assert rendered == committed, cell.key
        assert rendered[label_keys.OCI_VERSION] == cell.version and rendered[label_keys.PYTHON] == cell.python


def test_every_template_label_is_checked_and_facts_are_labels(matrix):
    cell = cell_of(matrix, "pytorch-cpu:2.13")
    checks = {c["key"]: c for c in label_checks(matrix, cell, {}, REPO / "templates")}
    assert set(template_labels(matrix, cell, REPO / "templates")) <= set(checks)
    assert checks[label_keys.PYTHON]["fact"] == "python" and checks[label_keys.ACCELERATOR]["fact"] == "accelerator"
    assert checks[label_keys.OCI_VERSION]["expected"] == "framework-release"
    constants = {v for k, v in vars(label_keys).items() if k.isupper() and isinstance(v, str)}
    assert set(label_keys.FACTS) <= constants


def test_the_oci_labels_of_the_matrix_are_checked_on_the_image(matrix):
    """`oci:` in the matrix (defaults, each image adding its licenses) is rendered into the labels, and
    the labels contract flags an image whose OCI labels are missing or say otherwise, naming the key."""
    cell = cell_of(matrix, "pytorch-cpu:2.13")
    stated = template_labels(matrix, cell, REPO / "templates")
    assert {k: stated.get(k) for k in label_keys.OCI_FROM_MATRIX.values()} == {
        label_keys.OCI_AUTHORS: "dl-images maintainers (https://github.com/dl-images/dl-images/issues)",
        label_keys.OCI_URL: "https://github.com/dl-images/dl-images",
        label_keys.OCI_DOCUMENTATION: "https://github.com/dl-images/dl-images/blob/main/docs/images.md",
        label_keys.OCI_VENDOR: "dl-images", label_keys.OCI_LICENSES: "BSD-3-Clause"}
    assert template_labels(matrix, cell_of(matrix, "tensorflow-cpu:2.21"), REPO / "templates")[
        label_keys.OCI_LICENSES] == "Apache-2.0"
    image = {**stated, label_keys.OCI_LICENSES: "MIT"}
    del image[label_keys.OCI_VENDOR]
    target = {"cell": cell.key, "expect": {"labels": label_checks(matrix, cell, image, REPO / "templates")}}
    with pytest.raises(AssertionError) as failed:
        labels_test.test_labels_state_the_matrix_cell(target)
    assert (f"label {label_keys.OCI_LICENSES}='MIT', but matrix cell pytorch-cpu:2.13 says 'BSD-3-Clause'"
            in str(failed.value))
    assert f"label {label_keys.OCI_VENDOR} is missing (matrix cell pytorch-cpu:2.13 says 'dl-images')" \
        in str(failed.value)
    target["expect"]["labels"] = label_checks(matrix, cell, stated, REPO / "templates")
    labels_test.test_labels_state_the_matrix_cell(target)


def test_run_profile_label_is_compared_in_one_spelling(matrix):
    cell = cell_of(matrix, "pytorch-cpu:2.13")
    spaced = json.dumps({"gpus": "none", "ipc": "private", "shm_size": "8g", "ulimits": {"stack": 67108864},
                         "docker_flags": ["--shm-size=8g", "--ulimit=stack=67108864"]}, indent=2)
    checks = {c["key"]: c for c in label_checks(matrix, cell, {label_keys.RUN_PROFILE: spaced}, REPO / "templates")}
    assert checks[label_keys.RUN_PROFILE]["value"] == checks[label_keys.RUN_PROFILE]["cell_value"]
    lie = spaced.replace('"8g"', '"64m"')
    checks = {c["key"]: c for c in label_checks(matrix, cell, {label_keys.RUN_PROFILE: lie}, REPO / "templates")}
    assert checks[label_keys.RUN_PROFILE]["value"] != checks[label_keys.RUN_PROFILE]["cell_value"]


def test_standin_labels_describe_upstream_and_are_not_checked_against_contents(matrix):
    cell = cell_of(matrix, "pytorch-ngc:25.10")
    labels = {label_keys.STANDIN: "true", label_keys.STANDIN_PYTHON: "3.11", label_keys.PYTHON: "3.12"}
    checks = {c["key"]: c for c in label_checks(matrix, cell, labels, REPO / "templates")}
    assert checks[label_keys.PYTHON]["fact"] == "" and "stand-in" in checks[label_keys.PYTHON]["note"]
    assert checks[label_keys.STANDIN_PYTHON]["fact"] == "python"
    assert checks[label_keys.PYTHON]["cell_value"] == "3.12"  # still what the matrix cell says
    assert version_proof(cell) == "env:NVIDIA_PYTORCH_VERSION"


def test_label_facts_against_contents():
    target = {"framework": "pytorch", "framework_info": {"module": "torch"}}
    contents = {"python": "3.11.2", "framework_version": "2.13.0+cpu", "cuda_build": "", "env": {}}
    check = {"key": label_keys.PYTHON, "value": "3.12", "fact": "python"}
    assert labels_test._content_mismatch(check, contents, target) == (
        f"label {label_keys.PYTHON} says Python 3.12, but the image's python3 is 3.11.2")
    assert labels_test._content_mismatch(dict(check, value="3.11"), contents, target) == ""
    version = {"key": label_keys.OCI_VERSION, "value": "2.14", "fact": "version", "expected": "framework-release"}
    assert "contains torch 2.13.0+cpu" in labels_test._content_mismatch(version, contents, target)
    assert labels_test._content_mismatch(dict(version, value="2.13"), contents, target) == ""
    ngc = dict(version, value="25.10", expected="env:NVIDIA_PYTORCH_VERSION")
    assert labels_test._content_mismatch(ngc, dict(contents, env={"NVIDIA_PYTORCH_VERSION": "25.10"}), target) == ""
    assert "NVIDIA_PYTORCH_VERSION is 25.01" in labels_test._content_mismatch(
        ngc, dict(contents, env={"NVIDIA_PYTORCH_VERSION": "25.01"}), target)
    accel = {"key": label_keys.ACCELERATOR, "value": "cuda", "fact": "accelerator"}
    assert "built without CUDA" in labels_test._content_mismatch(accel, contents, target)
    cuda = {"key": label_keys.CUDA, "value": "13.0", "fact": "cuda"}
    assert labels_test._content_mismatch(cuda, dict(contents, cuda_build="13.0"), target) == ""
    assert "built with CUDA 12.8" in labels_test._content_mismatch(cuda, dict(contents, cuda_build="12.8"), target)


# -- the matrix's deadline ------------------------------------------------------------------------------


def test_deadlines_come_from_the_matrix(matrix, tmp_path):
    assert cell_of(matrix, "pytorch-cpu:2.13").validate_deadline_s == 480
    assert cell_of(matrix, "pytorch-ngc:25.10").validate_deadline_s == 1500
    text = FIXTURE_MATRIX.read_text().replace("    deadline_s: 480", "    deadline_s: 5")
    (tmp_path / "matrix.yaml").write_text(text)
    with pytest.raises(MatrixError, match=r"defaults\.validate\.deadline_s: must be between 60 and 10800"):
        parse_matrix(load_yaml(tmp_path / "matrix.yaml"))


# -- results: interrupted never passes; GPU skips before setup; deadline means not run --------------------


def _target(tmp_path: Path, budget: float, gpus: int = 0) -> Path:
    info = FrameworkInfo(name="pytorch", module="torch", gpu_count_expr="0", events_writer=["x.py"])
    target = Target(image="img", ref="img", digest="sha256:0", cell="pytorch-cpu:2.13", framework="pytorch",
                    framework_info=info, accelerator="cpu", run_flags=[], shm_promised="8g",
                    shm_expected_bytes=8 << 30, expect=Expectations(), run_id="unit", deadline_s=480,
                    probe_budget_s=budget, runner_gpus=[{"index": str(i), "name": "H100"} for i in range(gpus)])
    path = tmp_path / "target.json"
    write_target(path, target)
    return path


def image_tests_argv(tmp_path: Path, files: dict[str, str], budget: float = 0, gpus: int = 0,
                     jobs: int = 1) -> list[str]:
    """pytest on a copy of image-tests' conftest, harness and lanes with these test files (name -> body),
    on `jobs` xdist workers as validate runs them (buildtool.validate.targets.pytest_argv)."""
    suite = tmp_path / "suite"
    suite.mkdir()
    for name in ("conftest.py", "harness.py", "infra.py", "lanes.py", "pytest.ini"):
        shutil.copy2(TESTS_DIR / name, suite / name)
    for name, body in files.items():
        (suite / name).write_text(textwrap.dedent(body))
    workers = ["-n", str(jobs), "--dist", "loadscope", "--no-loadscope-reorder"] if jobs > 1 else ["-p", "no:xdist"]
    return [sys.executable, "-m", "pytest", str(suite), "-c", str(suite / "pytest.ini"), "--rootdir", str(suite),
            "--target", str(_target(tmp_path, budget, gpus)), "--results", str(tmp_path / "results.json"), "-q",
            *workers]


def run_image_tests(tmp_path: Path, body: str, budget: float = 0) -> dict:
    """pytest on a copy of image-tests' conftest and harness with one test file; its results JSON."""
    return by_name(run_suite(tmp_path, {"test_unit.py": body}, budget)["tests"])


# A backstop against a hung suite, not a figure: these suites take 5 to 30 s idle, and CI's full run (its
# integration tests and a nested make test-fast on the same 2 cores) once took a two-worker one past 120 s.
SUITE_TIMEOUT_S = 900


def run_suite(tmp_path: Path, files: dict[str, str], budget: float = 0, gpus: int = 0, jobs: int = 1) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(image_tests_argv(tmp_path, files, budget, gpus, jobs), env=env, capture_output=True, text=True,
                   timeout=SUITE_TIMEOUT_S)
    return json.loads((tmp_path / "results.json").read_text())


def by_name(tests: list[dict]) -> dict:
    return {t["id"].split("::")[-1]: t for t in tests}


def test_an_interrupted_test_is_failed_never_passed(tmp_path):
    found = run_image_tests(tmp_path, """
        import os, signal, time

        def test_ok():
            pass

        def test_interrupted():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)

        def test_after():
            pass
    """)
    assert found["test_ok"]["result"] == "passed"
    assert found["test_interrupted"]["result"] == "failed"
    assert "interrupted while running (signal 15)" in found["test_interrupted"]["message"]
    assert "test_after" not in found
    assert not [t for t in found.values() if t["result"] not in ("passed", "failed", "skipped")]


def test_a_failure_stays_a_failure_when_its_teardown_then_skips(tmp_path):
    """A fixture that skips in its teardown after the test failed: the test is failed with its own message (it was
    recorded as skipped, its failure gone from the verdict's tests)."""
    found = run_image_tests(tmp_path, """
        import pytest

        @pytest.fixture
        def tidy():
            yield
            pytest.skip("cleanup not possible here")

        def test_fails(tidy):
            assert False, "the real failure"
    """)
    assert found["test_fails"]["result"] == "failed" and found["test_fails"]["message"] == "the real failure"
    assert found["test_fails"]["skip_reason"] == ""


def test_a_gpu_check_without_gpus_is_skipped_before_its_fixtures(tmp_path):
    found = run_image_tests(tmp_path, """
        import pytest

        @pytest.fixture
        def broken():
            raise RuntimeError("TensorBoard is broken")

        @pytest.mark.gpu(what="CUDA kernels")
        def test_kernels(broken):
            pass
    """)
    assert found["test_kernels"]["result"] == "skipped"
    assert found["test_kernels"]["skip_code"] == "gpu-not-in-cell" and "CUDA kernels" in found["test_kernels"][
        "skip_reason"]


def test_a_spent_deadline_fails_the_tests_as_not_run(tmp_path):
    found = run_image_tests(tmp_path, """
        import time

        def test_slow():
            time.sleep(1.5)

        def test_next():
            pass
    """, budget=1)
    assert found["test_slow"]["result"] == "passed"
    assert found["test_next"]["result"] == "failed"
    assert found["test_next"]["message"].startswith("not run: the image's validation deadline of 480s is spent")


def test_a_test_that_fails_once_the_deadline_is_spent_names_the_deadline_before_its_own_words(tmp_path):
    """A probe cut at the deadline signals its ranks; the test then reports the signal. The cause is the
    deadline, and the message says so first (CI: 'torchrun failed ... got signal: 15' with no deadline)."""
    found = run_image_tests(tmp_path, """
        import time

        def test_early():
            assert False, "broken before the deadline"

        def test_cut():
            time.sleep(1.5)
            assert False, "torchrun failed before any rank started: SignalException: got signal: 15"
    """, budget=1)
    assert found["test_early"]["message"].startswith("broken before the deadline")
    message = found["test_cut"]["message"]
    assert message.startswith("the image's deadline ran out while it ran (validate.deadline_s 480 s): torchrun failed")


# -- validate's backstop ------------------------------------------------------------------------------------


def test_pytest_is_stopped_at_the_deadline(tmp_path):
    fired: list[bool] = []
    argv = [sys.executable, "-c", "import time; print('working', flush=True); time.sleep(60)"]
    rc = pytest_run._run_pytest(argv, tmp_path, tmp_path / "log", 1, lambda line: None, fired)
    assert fired and rc == -signal.SIGTERM
    assert "ran out" in runner.deadline_problem(480, True, None, rc)
    assert runner.deadline_problem(480, False, {"tests": [], "interrupted": ""}, 0) == ""
    assert runner.overall_result(0, [{"result": "passed"}, {"result": "running"}]) == "failed"


def test_a_run_that_dies_before_its_reports_leaves_none_of_an_earlier_runs(tmp_path, monkeypatch, matrix):
    """pytest killed before it wrote anything (SIGKILL, a crash): the run's folder (the same for every run of the
    digest and cell) keeps no earlier run's results, defined tests or JUnit XML to be read as this run's."""
    import contextlib

    from buildtool.validate.options import Options
    from buildtool.validate.run_plan import RunPlan

    for name in ("results.json", "defined.json", "junit.xml"):
        (tmp_path / name).write_text("an earlier run's, all passed")
    monkeypatch.setattr(runner.network, "run_network", contextlib.contextmanager(lambda run_id, log=None: (yield "n")))
    monkeypatch.setattr(runner, "remove_run_containers", lambda run_id, log=None: None)
    monkeypatch.setattr(runner, "_run_pytest", lambda argv, cwd, log_path, timeout, log, fired=None: -9)
    image = runner.Resolved("r", "r@d", "sha256:" + "1" * 64, "h", "repo", {})
    plan = RunPlan("r", image, cell_of(matrix, "pytorch-cpu:2.13"), matrix, Options(jobs=1), runner.Inventory([]),
                   flags=[], run_id="unit", deadline_s=100, tree=TESTS_DIR, groups=["common"], out_dir=tmp_path)
    outcome = runner._run(plan, REPO, lambda line: None, time.monotonic())
    assert outcome.problem == "image-tests wrote no results (pytest exit -9)"
    assert [p.name for p in tmp_path.iterdir() if p.name in ("results.json", "defined.json", "junit.xml")] == []


@pytest.mark.parametrize(("written", "wrong"), [("[]", ", a JSON list, not an object"),
                                               ("3", ", a JSON int, not an object"),
                                               ('{"tests": 3}', " whose `tests` is not a list of objects"),
                                               ('{"tests": ["a"]}', " whose `tests` is not a list of objects")])
def test_results_that_are_not_an_object_of_tests_fail_the_run_naming_the_file(tmp_path, monkeypatch, matrix,
                                                                             written, wrong):
    """A results.json that parses but is not an object (`[]`, `3`) crashed deadline_problem with a traceback (`tests`
    not a list of objects: make_verdict); now the run fails, its problem one line naming the file."""
    import contextlib

    from buildtool.validate.options import Options
    from buildtool.validate.run_plan import RunPlan, make_verdict

    def pytest_writes(argv, cwd, log_path, timeout, log, fired=None):
        (tmp_path / "results.json").write_text(written)
        return 0
    monkeypatch.setattr(runner.network, "run_network", contextlib.contextmanager(lambda run_id, log=None: (yield "n")))
    monkeypatch.setattr(runner, "remove_run_containers", lambda run_id, log=None: None)
    monkeypatch.setattr(runner, "_run_pytest", pytest_writes)
    image = runner.Resolved("r", "r@d", "sha256:" + "1" * 64, "h", "repo", {})
    plan = RunPlan("r", image, cell_of(matrix, "pytorch-cpu:2.13"), matrix, Options(jobs=1), runner.Inventory([]),
                   flags=[], run_id="unit", deadline_s=100, tree=TESTS_DIR, groups=["common"], out_dir=tmp_path)
    outcome = runner._run(plan, REPO, lambda line: None, time.monotonic())
    assert outcome.problem == f"image-tests wrote {tmp_path / 'results.json'}{wrong} (pytest exit 0)"
    verdict = make_verdict(plan, outcome, ("", "no registry"), "sha256:" + "c" * 64)
    assert verdict.result == "failed" and verdict.problem == outcome.problem and verdict.tests == []


# -- concurrent runs (validate --jobs N): what may run together, and results as in serial runs ----------------

# Every test sleeps: the intervals pytest records are long enough that tests run at the same time
# unless the lock keeps them apart. Nothing is asserted on time, only on the recorded intervals.
CONCURRENT_SUITE = {
    "test_a_light.py": """
        import time, pytest
        pytestmark = pytest.mark.shared(why="light")

        @pytest.mark.parametrize("n", range(4))
        def test_light(n):
            time.sleep(0.4)

        @pytest.mark.exclusive(why="a timing check")
        def test_timed():
            time.sleep(0.4)
    """,
    "test_b_ddp.py": """
        import time, pytest
        pytestmark = pytest.mark.devices(why="DDP")

        def test_ddp():
            time.sleep(0.8)

        def test_collectives():
            time.sleep(0.8)
    """,
    "test_c_new.py": """
        import time

        def test_unmarked():
            time.sleep(0.4)
    """,
    "test_d_light.py": """
        import time, pytest
        pytestmark = pytest.mark.shared(why="light")

        @pytest.mark.parametrize("n", range(4))
        def test_other(n):
            time.sleep(0.4)
    """,
}


def schedule_of(found: dict) -> dict[str, dict]:
    return {s["id"].split("::")[-1]: s for s in found["schedule"]}


@pytest.mark.parametrize("gpus", [0, 2])
def test_concurrent_workers_never_overlap_exclusive_tests(tmp_path, gpus):
    """Two workers: no exclusive test (a timing check, an unmarked test, DDP when the run has GPUs)
    ran while any other test ran, from the intervals pytest recorded; without GPUs DDP is shared."""
    found = run_suite(tmp_path, CONCURRENT_SUITE, budget=300, gpus=gpus, jobs=2)
    assert [t["result"] for t in found["tests"]] == ["passed"] * 12, found["tests"]
    slots = schedule_of(found)
    assert {s["lane"] for s in slots.values()} == {"gw0", "gw1"}, slots
    devices = "exclusive" if gpus else "shared"
    assert {name: s["access"] for name, s in slots.items()} == {
        **{f"test_light[{n}]": "shared" for n in range(4)}, **{f"test_other[{n}]": "shared" for n in range(4)},
        "test_timed": "exclusive", "test_unmarked": "exclusive", "test_ddp": devices, "test_collectives": devices}
    assert slots["test_unmarked"]["why"] == "not marked shared, devices or exclusive"
    sys.path.insert(0, str(TESTS_DIR))
    import lanes

    assert lanes.overlaps(found["schedule"]) == []


def test_overlap_check_names_the_tests_that_ran_together():
    import lanes

    ran = [{"id": "a", "access": "exclusive", "lane": "gw0", "started": 0.0, "ended": 2.0},
           {"id": "b", "access": "shared", "lane": "gw1", "started": 1.0, "ended": 3.0},
           {"id": "c", "access": "shared", "lane": "gw0", "started": 2.5, "ended": 4.0}]
    assert lanes.overlaps(ran) == ["a (exclusive, gw0) overlapped b (shared, gw1)"]


def test_a_failure_on_a_worker_names_its_cause_in_the_verdict(tmp_path):
    """A probe failing on one worker while the other runs: its own message reaches the verdict, each
    test keeps its own result, and figures and facts workers learnt are merged."""
    found = run_suite(tmp_path, {
        "test_a.py": """
            import time, pytest
            pytestmark = pytest.mark.shared(why="light")

            def test_workers(figures):
                time.sleep(0.5)
                figures["seen_by_a"] = 1
                assert False, "a DataLoader with 2 workers: worker 1 (pid 42) died with SIGBUS"

            def test_after():
                pass
        """,
        "test_b.py": """
            import time, pytest
            pytestmark = pytest.mark.shared(why="light")

            def test_other(figures):
                time.sleep(0.5)
                figures["seen_by_b"] = 2
        """}, budget=300, jobs=2)
    from buildtool.contracts.verdict import TestResult

    tests = by_name(found["tests"])
    verdict = {t.id.split("::")[-1]: t for t in map(TestResult.model_validate, found["tests"])}
    assert verdict["test_workers"].result == "failed"
    assert verdict["test_workers"].message.startswith("a DataLoader with 2 workers: worker 1 (pid 42) died with "
                                                      "SIGBUS"), verdict["test_workers"].message
    assert verdict["test_after"].result == "passed" and verdict["test_other"].result == "passed"
    assert {tests[n]["id"] for n in tests} == {"test_a.py::test_workers", "test_a.py::test_after",
                                               "test_b.py::test_other"}
    assert found["figures"] == {"seen_by_a": 1, "seen_by_b": 2}


def test_the_deadline_stops_every_worker_and_fails_what_did_not_finish(tmp_path):
    """validate's backstop (SIGTERM to pytest's process group at the deadline) in a concurrent run: the
    tests running on either worker are failed as interrupted, none passes, none stays 'running', the
    workers are gone, and the results are written."""
    hang = """
        import os, time, pytest
        pytestmark = pytest.mark.shared(why="light")

        def test_quick():
            pass

        def test_hangs_{x}(shared_dir):
            (shared_dir / f"pid-{{os.getpid()}}").touch()
            time.sleep(120)

        def test_never_started_{x}():
            pass
    """
    argv = image_tests_argv(tmp_path, {"test_a.py": hang.format(x="a"), "test_b.py": hang.format(x="b")},
                            budget=300, jobs=2)
    base = tmp_path / "base"
    fired: list[bool] = []

    def deadline() -> None:
        """What validate's timer does at the deadline, fired once both hanging tests have started."""
        while len(pids := [int(p.name[4:]) for p in base.rglob("pid-*")]) < 2:
            time.sleep(0.1)
        pytest_run._stop_group(os.getpgid(pids[0]), fired)

    import threading

    threading.Thread(target=deadline, daemon=True).start()
    rc = pytest_run._run_pytest(["env", f"PYTHONPATH={REPO}", *argv, "--basetemp", str(base)], tmp_path,
                                tmp_path / "log", 120, lambda line: None)
    assert fired, (tmp_path / "log").read_text()[-2000:]
    found = json.loads((tmp_path / "results.json").read_text())
    tests = by_name(found["tests"])
    for name in ("test_hangs_a", "test_hangs_b"):
        assert tests[name]["result"] == "failed", tests[name]
        assert tests[name]["message"].startswith("interrupted while running (signal 15)"), tests[name]["message"]
    assert not [t for t in found["tests"] if t["result"] not in ("passed", "failed", "skipped")], found["tests"]
    assert not [n for n in tests if n.startswith("test_never_started") and tests[n]["result"] == "passed"]
    assert found["interrupted"] and rc != 0
    workers = [int(p.name[4:]) for p in base.rglob("pid-*")]
    assert not [pid for pid in workers if _alive(pid)], workers


@pytest.mark.parametrize("printed", ["", "WARNING: pip is configured with locations that require TLS\n",
                                     '[{"version": "2.13.0"}]', '{"torch": "2.13.0"}'])
def test_a_pip_list_without_its_json_list_fails_naming_what_pip_printed(printed):
    """The image's `pip list --format=json` printed no JSON list of packages last: the checks that read it fail
    with one line naming it (it was an IndexError, a JSONDecodeError or a KeyError, naming nothing)."""
    from types import SimpleNamespace

    import infra

    host = SimpleNamespace(run=lambda *args: SimpleNamespace(rc=0, stdout=printed, stderr=""),
                           find_command=lambda name: "/usr/bin/pip")
    with pytest.raises(AssertionError) as caught:
        infra.pip_list(host)
    assert str(caught.value).startswith("`pip list --format=json` in the image printed no list of packages "
                                        f"(name, version) as its last line: {printed.strip() or '(nothing)'}")
    listed = '{"banner": 1}\n[{"name": "Torch_TB", "version": "0.4.3"}]'
    host.run = lambda *args: SimpleNamespace(rc=0, stdout=listed, stderr="")
    assert infra.pip_list(host) == {"torch-tb": "0.4.3"}


@pytest.mark.parametrize("value", ["", "abc", "0", "-1", "nan", "inf", "1e9"])
def test_shm_workers_refuses_a_worker_timeout_that_is_no_bound_naming_it(tmp_path, value):
    """$SHM_WORKER_TIMEOUT_S (which the image's own ENV may set) was read with float(): text was a ValueError
    traceback, and 0, nan or inf a DataLoader that waits for ever (torch's timeout 0 is none), -1 torch's error;
    now shm_workers.py exits 2 with one line naming the variable and its value, before any worker starts."""
    env = dict(os.environ, IMAGETEST_OUT=str(tmp_path), SHM_WORKER_TIMEOUT_S=value)
    proc = subprocess.run([sys.executable, str(TESTS_DIR / "scripts" / "shm_workers.py"), "python"], env=env,
                          cwd=TESTS_DIR / "scripts", capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"shm_workers.py: SHM_WORKER_TIMEOUT_S={value!r} is not a number of seconds above 0 and "
                           "at most 3600 (unset it for the default, 30)\n")
    assert not (tmp_path / "result.json").exists()


def test_a_probe_result_that_cannot_be_written_leaves_no_half_file(tmp_path, monkeypatch):
    """probe_io.write dumped into OUT/<name>.tmp-<pid> and renamed it: a value JSON cannot hold (a probe's bytes or
    set) raised half-way and left the half-written temporary file in the folder the test reads; now it is removed
    and the error goes on to the probe."""
    sys.path.insert(0, str(TESTS_DIR / "scripts"))
    try:
        import probe_io
    finally:
        sys.path.remove(str(TESTS_DIR / "scripts"))
    monkeypatch.setenv("IMAGETEST_OUT", str(tmp_path))
    with pytest.raises(TypeError):
        probe_io.result({"ok": True, "seen": {1, 2}})
    assert list(tmp_path.iterdir()) == []
    probe_io.result({"ok": True})
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


@pytest.mark.parametrize("record", [[0], "done", {"rc": 0, "seconds": "abc"}, {"rc": 0, "cpu_s": [1]},
                                    {"rc": 0, "read_bytes": "1.5"}])
def test_a_garbled_exit_record_is_named_not_a_traceback(tmp_path, record):
    """exit.json, written in the image under test by the supervisor with the image's own Python, was trusted to be an
    object of numbers: a list was an AttributeError, a text `seconds` a ValueError, a traceback in the test instead of
    its cause; now the probe did not end well, and its error names the record."""
    (tmp_path / "exit.json").write_text(json.dumps(record))
    probe = harness.Probe(step="list the packages", argv=["python3", "x.py"])
    assert probe.read_record(tmp_path)
    assert not probe.ok and probe.rc is None
    assert probe.error == f"the supervisor's exit.json is no record of how the probe ended: {json.dumps(record)}"
