"""The runner's GPUs as `nvidia-smi --query-gpu` lists them, read one way by validate (validate.probe) and by
`make gpu-smoke` (scripts/gpu_smoke.py), so both refuse the same broken inventories. gpu_smoke runs on a GPU
runner's own Python: standard library only, Python 3.9 syntax.
"""

from __future__ import annotations

import re
import subprocess

TIMEOUT_S = 30
QUERY = ("index", "name", "driver_version", "memory.total")
# nvidia-smi prints a value a GPU does not have as [N/A] or [Not Supported] (memory.total of a unified-memory GPU:
# GB10, Jetson); any other bracketed value is the NVML error of reading it ([Unknown Error], [GPU requires reset],
# [GPU is lost]), and ERR! the table's: such a GPU is listed but not usable (CUDA sees no device there).
NO_VALUE = ("[N/A]", "[Not Supported]")
# A GPU in MIG mode is listed whole, but CUDA (and a container given --gpus all) sees only its MIG instances, none
# when none are made: its GPU tests would fail misleadingly. Asked apart, so the rows of QUERY keep their shape.
MIG_QUERY = ("index", "mig.mode.current")
MIG_OFF = ("Disabled", *NO_VALUE)   # [N/A] on a GPU without MIG (consumer, pre-Ampere)
# The fixes the problems below name themselves, where the NVIDIA driver is not the cause (names_its_fix).
UNREADABLE_FIX = "reset it or reboot the runner"
MIG_FIX = "or use a runner without MIG"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """`nvidia-smi ARGS` (the first on PATH), bounded by TIMEOUT_S."""
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=TIMEOUT_S)


def gpus() -> tuple[list[dict[str, str]], str]:
    """This host's usable GPUs ({index, name, driver, memory_mib}, as nvidia-smi prints them), or [] and why none."""
    try:
        proc = run(f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits")
    except FileNotFoundError:
        return [], "nvidia-smi not found (no NVIDIA driver on this runner)"
    except subprocess.TimeoutExpired:
        return [], f"nvidia-smi did not answer within {TIMEOUT_S}s"
    if proc.returncode != 0:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        # Its error, not the row of a GPU it could read before it (a lost GPU's line comes after the rows before it).
        why = next((line for line in said if not is_row(line)), "no error message" if said else "no output")
        return [], f"nvidia-smi failed (exit {proc.returncode}): {why}"
    found, problem = read_rows(proc.stdout)
    problem = problem or mig_problem(found)
    return ([] if problem else found), problem


def read_rows(text: str) -> tuple[list[dict[str, str]], str]:
    """The GPUs of a `--query-gpu=QUERY --format=csv,noheader,nounits` answer, or [] and why it lists no usable one."""
    found: list[dict[str, str]] = []
    for line in text.strip().splitlines():
        if not is_row(line):
            # Not one GPU's fields (a lost GPU's "Unable to determine the device handle ...", a warning): never
            # skipped, or the GPUs listed would pass for all of the runner's.
            return [], f"nvidia-smi --query-gpu printed {line.strip()[:200]!r}, not a GPU's {', '.join(QUERY)}"
        row = dict(zip(QUERY, _fields(line)))  # noqa: B905 (is_row: as many; zip's strict is Python 3.10's)
        broken = _broken_field(row)
        if broken:
            return [], broken
        # MiB, as `nounits` prints it or with its unit (without nounits): nothing else is silently unknown memory.
        memory = re.fullmatch(r"([0-9]+)(?: MiB)?", row["memory.total"])
        if memory is None and row["memory.total"] not in NO_VALUE:
            return [], (f"nvidia-smi lists GPU {row['index'][:20]} ({row['name'][:60]}) but reads its memory.total "
                        f"as {row['memory.total'][:60]!r}, not a number of MiB (is the nvidia-smi first on PATH "
                        "NVIDIA's own?)")
        if any(gpu["index"] == row["index"] for gpu in found):
            return [], f"nvidia-smi --query-gpu lists GPU {row['index'][:20]} twice; each GPU is one row"
        found.append({"index": row["index"], "name": row["name"], "driver": row["driver_version"],
                      "memory_mib": memory.group(1) if memory else row["memory.total"]})
    return found, "" if found else "nvidia-smi lists no GPU"


def is_row(line: str) -> bool:
    """Whether `line` has the shape of one GPU's row of the --query-gpu answer (its values may still be errors).
    nvidia-smi's CSV quotes nothing: a name with a comma gives the row more fields (_fields)."""
    parts = line.split(",")
    return len(parts) >= len(QUERY) and _is_index(parts[0])


def _fields(line: str) -> list[str]:
    """A row's QUERY values, in QUERY's order: the commas past QUERY's count are the name's (the one field that may
    hold one), wherever QUERY puts it."""
    parts, at = line.split(","), QUERY.index("name")
    end = at + 1 + len(parts) - len(QUERY)
    return [p.strip() for p in (*parts[:at], ",".join(parts[at:end]), *parts[end:])]


def _is_mig_row(line: str) -> bool:
    """Whether `line` has the shape of one GPU's row of the MIG_QUERY answer: its index, then its mode (an error's
    line may hold a comma too: NVML's insufficient-power message)."""
    parts = line.split(",")
    return len(parts) == len(MIG_QUERY) and _is_index(parts[0])


def _is_index(text: str) -> bool:
    """nvidia-smi's GPU index: ASCII digits (str.isdigit alone takes '²' too)."""
    return text.strip().isascii() and text.strip().isdigit()


def _broken_field(row: dict[str, str]) -> str:
    """Why a GPU row of nvidia-smi's --query-gpu answer is no usable GPU (a field it could not read), or ""."""
    for field, value in row.items():
        error = value.startswith("[") and value.endswith("]") and value not in NO_VALUE
        if error or value == "ERR!" or (field == "name" and value in ("", *NO_VALUE)):
            return (f"nvidia-smi lists GPU {row['index'][:20]} ({row['name'][:60]}) but reads its {field} as "
                    f"{value[:60]!r} (a GPU NVML cannot read is no usable GPU; {UNREADABLE_FIX})")
    return ""


def mig_problem(found: list[dict[str, str]]) -> str:
    """Why the GPUs `found` are no usable GPUs because of MIG (on, or its mode unreadable), or ""."""
    if not found:
        return ""
    ask = f"nvidia-smi --query-gpu={','.join(MIG_QUERY)}"
    try:
        proc = run(f"--query-gpu={','.join(MIG_QUERY)}", "--format=csv,noheader,nounits")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{ask} failed ({exc}), so whether MIG is on is unknown"
    if proc.returncode != 0:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        why = next((line for line in said if not _is_mig_row(line)), "no error message" if said else "no output")
        return f"{ask} failed (exit {proc.returncode}): {why}, so whether MIG is on is unknown"
    modes = {}
    for line in proc.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if not _is_mig_row(line):
            return f"{ask} printed {line.strip()[:200]!r}, not a GPU's {', '.join(MIG_QUERY)}"
        if parts[0] in modes:
            return f"{ask} lists GPU {parts[0][:20]} twice, so whether MIG is on is unknown"
        modes[parts[0]] = parts[1]
    names = {gpu["index"]: gpu["name"] for gpu in found}
    if set(modes) != set(names):
        return f"{ask} answered for GPUs {sorted(modes)}, not for the GPUs listed ({sorted(names)})"
    for index, mode in modes.items():
        if mode not in ("Enabled", *MIG_OFF):
            return (f"nvidia-smi lists GPU {index} ({names[index][:60]}) but reads its mig.mode.current as "
                    f"{mode[:60]!r} (a GPU NVML cannot read is no usable GPU; {UNREADABLE_FIX})")
    on = [index for index, mode in modes.items() if mode == "Enabled"]
    if not on:
        return ""
    listed = ", ".join(f"{index} ({names[index][:60]})" for index in on)
    return (f"MIG mode is on for GPU {listed} (mig.mode.current Enabled): CUDA sees its MIG instances, not the whole "
            f"GPU, so the GPU tests cannot run on it; turn MIG off (`nvidia-smi -i {','.join(on)} -mig 0` as root, "
            f"then reset the GPU or reboot) {MIG_FIX}")


def names_its_fix(problem: str) -> bool:
    """Whether a problem of gpus() says what to do itself (MIG on, a GPU NVML cannot read), the NVIDIA driver being
    no cause; the others (nvidia-smi missing, failing, listing nothing) are the driver's to fix."""
    return UNREADABLE_FIX in problem or MIG_FIX in problem
