"""The runner's GPU inventory (validate.probe.gpu_inventory) read from nvidia-smi's answers as a broken runner gives
them, not as tests/gpu_sim.py's healthy fake does: `--query-gpu=... --format=csv,noheader,nounits` rows whose fields
NVML could not read ([Unknown Error], [GPU requires reset]), a lost GPU's line among the rows, and a failing
nvidia-smi that printed the healthy GPUs' rows before its error; and the probe of the GPUs' start (probe_flags)
when it hangs."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from buildtool.common.errors import FailedError
from buildtool.validate import probe

H100 = "NVIDIA H100 80GB HBM3"
# nvidia-smi on a GPU that fell off the bus (Xid 79), as users report it upstream
LOST = "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU"
HEADER = "| NVIDIA-SMI 570.86.15      Driver Version: 570.86.15      CUDA Version: 12.8     |"


def _smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: list[str], rc: int = 0) -> None:
    """A fake nvidia-smi first on PATH: `rows` (and exit `rc`) for --query-gpu, the table's header otherwise."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (tmp_path / "rows").write_text("".join(f"{row}\n" for row in rows))
    script = folder / "nvidia-smi"
    script.write_text(f"""#!/bin/bash
case "$*" in
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


def test_a_gpu_start_that_hangs_is_the_runners_failure_and_its_container_is_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: `docker run --gpus` that never returned (the NVIDIA hook stuck on a lost GPU) was exit 2, "is the engine
    answering?", though the same start without --gpus had just passed, and the container the engine was still
    starting was left behind (unnamed, unlabelled); now it is the runner's failure (exit 1) naming the hang, and the
    probe's container, labelled, is removed."""
    calls = tmp_path / "calls"
    fake = tmp_path / "docker"
    fake.write_text(f"""#!/bin/bash
echo "$*" >> {calls}
case "$*" in
  *--gpus*) exec sleep 5 ;;
  "ps -aq --filter"*) echo c9 ;;
esac
exit 0
""")
    fake.chmod(0o755)
    monkeypatch.setenv("DOCKER_CLIENT", str(fake))
    monkeypatch.setattr(probe, "GPU_START_TIMEOUT_S", 1.0, raising=False)
    with pytest.raises(FailedError) as caught:
        probe.probe_flags("img", ["--shm-size=8g", "--gpus=all"], print, "13.0")
    assert str(caught.value).startswith("this runner lists GPUs but img did not start with them within 1 s "), caught
    lines = calls.read_text().splitlines()
    [started] = [line for line in lines if "--gpus=all" in line]
    label = started.split("--label ", 1)[1].split()[0]
    assert label.split("=", 1)[1].startswith("gpu-probe-")
    assert lines[-2:] == [f"ps -aq --filter label={label}", "rm -f -v c9"], lines
