"""The runner's GPU inventory (validate.probe.gpu_inventory) read from nvidia-smi's answers as a broken runner gives
them, not as tests/gpu_sim.py's healthy fake does: `--query-gpu=... --format=csv,noheader,nounits` rows whose fields
NVML could not read ([Unknown Error], [GPU requires reset]), a lost GPU's line among the rows, and a failing
nvidia-smi that printed the healthy GPUs' rows before its error; and the probe of the GPUs' start (probe_flags)
when it hangs."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import stat
from pathlib import Path

import pytest

from buildtool.common import docker_cli
from buildtool.common.errors import FailedError
from buildtool.contracts import label_keys, skips
from buildtool.validate import probe, runner
from buildtool.validate.containers import Resolved
from buildtool.validate.options import Options
from buildtool.validate.run_plan import RunOutcome, RunPlan, make_verdict
from tests.conftest import fixture_matrix
from tests.gpu_sim import FakeGpus, fake_nvidia_smi

H100 = "NVIDIA H100 80GB HBM3"
# nvidia-smi on a GPU that fell off the bus (Xid 79), as users report it upstream
LOST = "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU"
HEADER = "| NVIDIA-SMI 570.86.15      Driver Version: 570.86.15      CUDA Version: 12.8     |"


def _smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: list[str], rc: int = 0,
         modes: list[str] | None = None) -> None:
    """A fake nvidia-smi first on PATH: `rows` (and exit `rc`) for --query-gpu, `modes` for its index,mig.mode.current
    (by default [N/A], a GPU without MIG, for each row), the table's header otherwise."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (tmp_path / "rows").write_text("".join(f"{row}\n" for row in rows))
    modes = [f"{row.split(',')[0]}, [N/A]" for row in rows] if modes is None else modes
    (tmp_path / "modes").write_text("".join(f"{mode}\n" for mode in modes))
    script = folder / "nvidia-smi"
    script.write_text(f"""#!/bin/bash
case "$*" in
  *--query-gpu=index,mig.mode.current*) cat {tmp_path / "modes"} ;;
  *--query-gpu*) cat {tmp_path / "rows"}; exit {rc} ;;
  topo*) exit 3 ;;
  *) echo '{HEADER}' ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")


@pytest.mark.parametrize(("row", "field", "value"), [
    (f"0, {H100}, 570.86.15, [GPU requires reset]", "memory.total", "[GPU requires reset]"),
    ("0, [Unknown Error], [Unknown Error], [Unknown Error]", "name", "[Unknown Error]"),
    (f"0, {H100}, [GPU is lost], [GPU is lost]", "driver_version", "[GPU is lost]"),
])
def test_a_gpu_whose_fields_nvml_cannot_read_is_no_usable_gpu_and_the_problem_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, row: str, field: str, value: str) -> None:
    """Before: the row was a GPU like any other (name '[Unknown Error]', memory None), so the GPU tests ran on a GPU
    CUDA cannot see, or --require-gpu passed; now the runner has no usable GPU, and why names the GPU and field."""
    _smi(tmp_path, monkeypatch, [f"1, {H100}, 570.86.15, 81559", row])
    found = probe.gpu_inventory()
    assert found.gpus == []
    assert found.problem.startswith("nvidia-smi lists GPU 0 (") and f"reads its {field} as {value!r}" in found.problem
    assert "\n" not in found.problem
    with pytest.raises(FailedError, match=r"declared a GPU runner .*" + field):
        probe.require_gpus(found)


@pytest.mark.parametrize("index", ["²", "٣"])
def test_an_index_of_digits_that_are_not_ascii_is_no_gpu_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             index: str) -> None:
    """Before: str.isdigit() took '²' (or '٣') for a GPU's index, so a garbled row counted as a GPU's; nvidia-smi
    prints ASCII indexes only, and any other line among the rows names itself as no GPU's."""
    _smi(tmp_path, monkeypatch, [f"{index}, {H100}, 570.86.15, 81559"])
    found = probe.gpu_inventory()
    assert found.gpus == [] and found.problem == (f"nvidia-smi --query-gpu printed '{index}, {H100}, 570.86.15, "
                                                  "81559', not a GPU's index, name, driver_version, memory.total")


def test_a_unified_memory_gpus_memory_na_is_still_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[N/A] is a value the GPU does not have (GB10's memory.total), not an error: the GPU stays, its memory unknown."""
    _smi(tmp_path, monkeypatch, ["0, NVIDIA GB10, 580.95.05, [N/A]"])
    found = probe.gpu_inventory()
    assert [(g.name, g.memory_mib) for g in found.gpus] == [("NVIDIA GB10", None)] and found.problem == ""


@pytest.mark.parametrize("line", [
    LOST,
    "Unable to determine the device handle for GPU0000:65:00.0: Unknown Error",
])
def test_a_line_among_the_rows_that_is_no_gpu_is_never_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               line: str) -> None:
    """Before: a lost GPU's line between the rows was skipped (it has no commas), so 2 of 3 GPUs passed for the
    runner's inventory and the tests ran on them as if they were all; now the runner has no usable GPU, naming it."""
    _smi(tmp_path, monkeypatch, [f"0, {H100}, 570.86.15, 81559", line, f"2, {H100}, 570.86.15, 81559"])
    found = probe.gpu_inventory()
    assert found.gpus == [] and found.problem == (f"nvidia-smi --query-gpu printed {line!r}, not a GPU's index, name, "
                                                  "driver_version, memory.total")


def test_a_failing_nvidia_smi_is_named_by_its_error_not_by_the_row_of_a_gpu_it_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the problem was the first line nvidia-smi printed, the healthy GPU 0's row ('nvidia-smi failed
    (exit 15): 0, NVIDIA H100 ...'), which names no cause; now it is the line that says what failed."""
    lost = LOST
    _smi(tmp_path, monkeypatch, [f"0, {H100}, 570.86.15, 81559", lost], rc=15)
    found = probe.gpu_inventory()
    assert found.gpus == [] and found.problem == f"nvidia-smi failed (exit 15): {lost}"


def _hanging_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hangs: str, seconds: int, container: str) -> Path:
    """A docker client (DOCKER_CLIENT) whose commands matching the case pattern `hangs` sleep `seconds`, whose
    `ps -aq --filter` names `container`, and which logs every command to the file returned."""
    calls = tmp_path / "calls"
    fake = tmp_path / "docker"
    fake.write_text(f"""#!/bin/bash
echo "$*" >> {calls}
case "$*" in
  {hangs}) exec sleep {seconds} ;;
  "ps -aq --filter"*) echo {container} ;;
esac
exit 0
""")
    fake.chmod(0o755)
    monkeypatch.setenv("DOCKER_CLIENT", str(fake))
    return calls


def test_a_gpu_start_that_hangs_is_the_runners_failure_and_its_container_is_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: `docker run --gpus` that never returned (the NVIDIA hook stuck on a lost GPU) was exit 2, "is the engine
    answering?", though the same start without --gpus had just passed, and the container the engine was still
    starting was left behind (unnamed, unlabelled); now it is the runner's failure (exit 1) naming the hang, and the
    probe's container, labelled, is removed."""
    calls = _hanging_docker(tmp_path, monkeypatch, "*--gpus*", 5, "c9")
    monkeypatch.setattr(probe, "GPU_START_TIMEOUT_S", 1.0, raising=False)
    with pytest.raises(FailedError) as caught:
        probe.probe_flags("img", ["--shm-size=8g", "--gpus=all"], print, "13.0")
    assert str(caught.value).startswith("this runner lists GPUs but img did not start with them within 1 s "), caught
    lines = calls.read_text().splitlines()
    [started] = [line for line in lines if "--gpus=all" in line]
    label = started.split("--label ", 1)[1].split()[0]
    assert label.split("=", 1)[1].startswith("gpu-probe-")
    assert lines[-2:] == [f"ps -aq --filter label={label}", "rm -f -v c9"], lines


def test_a_plain_probe_start_that_hangs_has_its_container_removed_by_its_label(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the run profile's probe (`docker run --rm ... --entrypoint true`, no --gpus) carried no label, so a
    start past its timeout left the container the engine was still starting, with nothing to find it by; now it goes
    through the GPU probe's path: labelled, and removed by its label before the timeout (one line) goes on."""
    calls = _hanging_docker(tmp_path, monkeypatch, '"run "*', 3, "c7")
    monkeypatch.setattr(probe, "START_TIMEOUT_S", 1.0, raising=False)
    with pytest.raises(docker_cli.DockerTimeout, match=r"^`docker run` did not finish within 1 s; "):
        probe.probe_flags("img", ["--shm-size=8g"], print)
    lines = calls.read_text().splitlines()
    [started] = [line for line in lines if line.startswith("run ")]
    assert "--label " in started, started
    label = started.split("--label ", 1)[1].split()[0]
    assert label.startswith(f"{label_keys.IMAGETEST_RUN}=probe-"), label
    assert lines[-2:] == [f"ps -aq --filter label={label}", "rm -f -v c7"], lines


A100 = "NVIDIA A100-SXM4-80GB"


def test_a_runner_with_mig_on_has_no_usable_gpu_and_a_gpu_cells_verdict_is_incomplete_naming_mig(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a runner whose GPUs are in MIG mode listed them whole, so the GPU tests ran and failed at test_contents
    with "is the container started with --gpus all?" (CUDA sees only MIG instances there); now it has no usable GPU,
    the problem naming MIG and the fix: --require-gpu fails (exit 1), a GPU cell's GPU tests are not run and its
    verdict is incomplete, never passed."""
    fake_nvidia_smi(tmp_path / "bin", FakeGpus(count=2, name=A100, mig="Enabled"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    found = probe.gpu_inventory()
    assert found.gpus == [] and found.problem.startswith(f"MIG mode is on for GPU 0 ({A100}), 1 ({A100}) "), found
    assert "`nvidia-smi -i 0,1 -mig 0` as root" in found.problem and "a runner without MIG" in found.problem
    with pytest.raises(FailedError, match="declared a GPU runner .*MIG mode is on"):
        probe.require_gpus(found)
    matrix = fixture_matrix()
    cpu = {c.key: c for c in matrix.cells}["pytorch-cpu:2.13"]
    cell = dataclasses.replace(cpu, run=dataclasses.replace(cpu.run, gpus="all"))   # a GPU cell (its run profile)
    monkeypatch.setattr(runner, "probe_flags", lambda image, flags, log, cuda=None: (list(flags), []))
    image = Resolved("r", "r@d", "sha256:" + "1" * 64, "h", "repo", {})
    plan = runner._plan(RunPlan("r", image, cell, matrix, Options(reports=tmp_path), found, flags=[]),
                        Path(__file__).resolve().parent.parent, lambda line: None)
    assert plan.usable == [] and plan.gpu_problem == found.problem
    tests = [{"id": "common/a.py::t", "group": "common", "result": "passed", "skip_code": "", "gpu": False},
             {"id": "common/gpu.py::t", "group": "common", "result": "skipped",
              "skip_code": skips.NO_GPU_ON_RUNNER.code, "gpu": True}]
    (tmp_path / "defined.json").write_text(json.dumps({"defined": [{"id": t["id"], "gpu": t["gpu"]} for t in tests],
                                                       "deselected": []}))
    run = RunOutcome(dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"), 1.0, 0, {"tests": tests},
                     tmp_path / "defined.json")
    verdict = make_verdict(plan, run, ("sha256:" + "5" * 64, ""), "sha256:" + "c" * 64)
    assert verdict.result == "incomplete" and "did not pass on a GPU (MIG mode is on for GPU 0" in verdict.incomplete[0]


@pytest.mark.parametrize(("modes", "rc", "problem"), [
    (["0, Disabled", "1, [N/A]", "2, [Not Supported]"], 0, ""),
    (["0, Disabled", "1, [Unknown Error]", "2, Disabled"], 0,
     f"nvidia-smi lists GPU 1 ({H100}) but reads its mig.mode.current as '[Unknown Error]' "),
    (["0, Disabled", "2, Disabled"], 0,
     "nvidia-smi --query-gpu=index,mig.mode.current answered for GPUs ['0', '2'], not for the GPUs listed "),
    (['Field "mig.mode.current" is not a valid field to query.'], 2,
     'nvidia-smi --query-gpu=index,mig.mode.current failed (exit 2): Field "mig.mode.current" is not a valid field'),
])
def test_whether_mig_is_on_is_read_for_every_gpu_and_never_guessed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, modes: list[str], rc: int, problem: str) -> None:
    """MIG off, or a GPU without MIG ([N/A], [Not Supported]), leaves the GPUs usable; a mode NVML cannot read, a GPU
    the answer leaves out, or a query that fails leaves none, naming it."""
    rows = [f"{i}, {H100}, 570.86.15, 81559" for i in range(3)]
    _smi(tmp_path, monkeypatch, rows, modes=modes)
    if rc:   # the MIG query alone fails
        script = tmp_path / "bin" / "nvidia-smi"
        answer = f'cat {tmp_path / "modes"}'
        script.write_text(script.read_text().replace(f"{answer} ;;", f"{answer}; exit {rc} ;;"))
    found = probe.gpu_inventory()
    if not problem:
        assert [g.index for g in found.gpus] == ["0", "1", "2"] and found.problem == "", found
    else:
        assert found.gpus == [] and found.problem.startswith(problem), found.problem


@pytest.mark.parametrize(("fake", "cause", "driver"), [
    (FakeGpus(count=2, name=A100, mig="Enabled"), "turn MIG off", False),
    (FakeGpus(count=1, name=A100, mig="[Unknown Error]"), "reset it or reboot the runner", False),
    (FakeGpus(broken="Failed to initialize NVML: Driver/library version mismatch"), "version mismatch", True),
], ids=["mig-on", "mig-mode-unreadable", "nvml-mismatch"])
def test_a_gpu_runner_without_a_usable_gpu_is_told_the_fix_of_its_cause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: FakeGpus, cause: str, driver: bool) -> None:
    """--require-gpu without a usable GPU ended in `fix the NVIDIA driver (...)` whatever the cause: after MIG's own
    fix (turn MIG off) or a GPU NVML cannot read (reset it), that sent the operator to a driver that was fine. The
    driver's fix is said only where nvidia-smi is missing, failing or lists nothing (contracts.nvidia_smi)."""
    fake_nvidia_smi(tmp_path / "bin", fake)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    with pytest.raises(FailedError) as caught:
        probe.require_gpus(probe.gpu_inventory())
    message = str(caught.value)
    assert cause in message and "\n" not in message, message
    assert ("fix the NVIDIA driver" in message) == driver, message


def test_a_probe_start_interrupted_while_it_hangs_has_its_container_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: only a start past its timeout was cleaned up; Ctrl-C (or CI's cancel, which the CLI raises as an
    exception) while `docker run --gpus` hung stopped the client and left the container the engine was still
    starting. Now however the start ends, the probe's containers are removed by its label."""
    import signal

    calls = _hanging_docker(tmp_path, monkeypatch, "*--gpus*", 30, "c9")

    def ctrl_c(*_args: object) -> None:
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGALRM, ctrl_c)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            probe.probe_flags("img", ["--shm-size=8g", "--gpus=all"], print, "13.0")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    lines = calls.read_text().splitlines()
    [started] = [line for line in lines if "--gpus=all" in line]
    label = started.split("--label ", 1)[1].split()[0]
    assert lines[-2:] == [f"ps -aq --filter label={label}", "rm -f -v c9"], lines


# NVML's message for a GPU whose external power is not attached, as nvidia-smi prints it: one comma, as a MIG row has.
UNPOWERED = ("Unable to determine the device handle for GPU 0000:01:00.0: Unable to communicate with GPU because it "
             "is insufficiently powered. This may be because not all required external power cables are attached, "
             "or the attached cables are not seated properly.")


def test_a_failing_mig_query_is_named_by_its_error_even_when_the_error_has_a_comma(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The MIG query's error line was picked by counting commas: NVML's insufficient-power message has one, as a
    row `0, Disabled` has, so the problem named the healthy GPU 0's row as the cause; now rows are told by their
    shape (an index, then the mode) and the message is the line that says what failed."""
    rows = [f"{i}, {H100}, 570.86.15, 81559" for i in range(2)]
    _smi(tmp_path, monkeypatch, rows, modes=["0, Disabled", UNPOWERED])
    script = tmp_path / "bin" / "nvidia-smi"
    answer = f'cat {tmp_path / "modes"}'
    script.write_text(script.read_text().replace(f"{answer} ;;", f"{answer}; exit 15 ;;"))
    found = probe.gpu_inventory()
    assert found.gpus == [] and found.problem == (f"nvidia-smi --query-gpu=index,mig.mode.current failed (exit 15): "
                                                  f"{UNPOWERED}, so whether MIG is on is unknown")


def test_a_gpu_name_with_a_comma_is_one_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi's CSV does not quote a value: a name with a comma gave the row five fields, so the GPU was read as
    a line that is no GPU and the runner had none; the name is now what lies between the index and the last two."""
    _smi(tmp_path, monkeypatch, ["0, NVIDIA Example, 80GB HBM3, 570.86.15, 81559"], modes=["0, Disabled"])
    found = probe.gpu_inventory()
    assert [(g.index, g.name, g.memory_mib) for g in found.gpus] == [("0", "NVIDIA Example, 80GB HBM3", 81559)]
    assert found.problem == ""


def test_a_failing_nvidia_smi_that_printed_only_rows_names_no_row_as_its_cause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi exiting non-zero with no error line (only the rows it read) was named by its first line, a healthy
    GPU's row ('nvidia-smi failed (exit 15): 0, NVIDIA H100 ...'), as if that row were the cause; now it says that
    nvidia-smi printed no error message."""
    _smi(tmp_path, monkeypatch, [f"0, {H100}, 570.86.15, 81559"], rc=15)
    found = probe.gpu_inventory()
    assert found.gpus == [] and found.problem == "nvidia-smi failed (exit 15): no error message"


@pytest.mark.parametrize(("memory", "mib"), [("81559", 81559), ("81559 MiB", 81559), ("[N/A]", None)])
def test_memory_with_its_unit_is_read_not_taken_as_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          memory: str, mib: int | None) -> None:
    """memory.total as nvidia-smi prints it without `nounits` (`81559 MiB`) was read as unknown memory, silently;
    now its MiB are read (and [N/A], a GPU without its own memory, stays unknown)."""
    _smi(tmp_path, monkeypatch, [f"0, {H100}, 570.86.15, {memory}"])
    found = probe.gpu_inventory()
    assert [(g.name, g.memory_mib) for g in found.gpus] == [(H100, mib)] and found.problem == ""


@pytest.mark.parametrize("memory", ["80 GB", "abc", "", "\u00b2", "-1", "81559 MiB extra"])
def test_memory_that_is_no_number_of_mib_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             memory: str) -> None:
    """A memory.total that is no number of MiB (`80 GB`, text) was read as unknown memory, silently (`²` passed
    isdigit and was a ValueError traceback); now the runner has no usable GPU, and why names the GPU and value."""
    _smi(tmp_path, monkeypatch, [f"0, {H100}, 570.86.15, {memory}"])
    found = probe.gpu_inventory()
    assert found.gpus == []
    assert found.problem == (f"nvidia-smi lists GPU 0 ({H100}) but reads its memory.total as {memory!r}, not a number "
                             "of MiB (is the nvidia-smi first on PATH NVIDIA's own?)")


@pytest.mark.parametrize("query", [("index", "name", "pci.bus_id", "driver_version", "memory.total"),
                                   ("index", "name", "driver_version", "memory.total", "pci.bus_id"),
                                   ("index", "pci.bus_id", "name", "driver_version", "memory.total")])
def test_a_row_is_read_by_the_fields_of_query_wherever_name_is(monkeypatch: pytest.MonkeyPatch,
                                                              query: tuple[str, ...]) -> None:
    """_fields split a row's last fields off with a literal rsplit(",", 2) and read_rows took them by position: a
    QUERY with another field gave a name holding it and a driver or memory of another field, silently; now the
    name's commas are found from QUERY's place of `name` and every value is taken by its field."""
    from buildtool.contracts import nvidia_smi

    monkeypatch.setattr(nvidia_smi, "QUERY", query)
    values = {"index": "0", "name": "NVIDIA Example, 80GB HBM3", "pci.bus_id": "00000000:3B:00.0",
              "driver_version": "570.86.15", "memory.total": "81559"}
    row = ", ".join(values[field] for field in query)
    assert nvidia_smi.read_rows(row + "\n") == (
        [{"index": "0", "name": "NVIDIA Example, 80GB HBM3", "driver": "570.86.15", "memory_mib": "81559"}], "")


def test_a_gpu_index_listed_twice_is_refused_not_counted_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A --query-gpu answer listing one index twice (a broken driver or wrapper) was two GPUs, so a runner with one
    passed for a two-GPU runner (its MIG answer for index 0 matched the set of indexes); now it has no usable GPU,
    and why names the index."""
    _smi(tmp_path, monkeypatch, [f"0, {H100}, 570.86.15, 81559", f"0, {H100}, 570.86.15, 81559"])
    found = probe.gpu_inventory()
    assert found.gpus == []
    assert found.problem == "nvidia-smi --query-gpu lists GPU 0 twice; each GPU is one row"


def test_a_mig_mode_listed_twice_for_one_gpu_is_refused_not_the_last_kept(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The MIG answer listing one GPU twice ("0, Enabled" then "0, Disabled") kept the last mode read, so a GPU in
    MIG mode passed for a whole one; now whether MIG is on is unknown, and why names the GPU."""
    _smi(tmp_path, monkeypatch, [f"0, {H100}, 570.86.15, 81559"], modes=["0, Enabled", "0, Disabled"])
    found = probe.gpu_inventory()
    assert found.gpus == []
    assert found.problem == ("nvidia-smi --query-gpu=index,mig.mode.current lists GPU 0 twice, so whether MIG is on "
                             "is unknown")
