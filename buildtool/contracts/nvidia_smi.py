"""The runner's GPUs as `nvidia-smi --query-gpu` lists them, read one way by validate (validate.probe) and by
`make gpu-smoke` (scripts/gpu_smoke.py), so both refuse the same broken inventories. gpu_smoke runs on a GPU
runner's own Python: standard library only, Python 3.9 syntax.
"""

from __future__ import annotations

import subprocess

TIMEOUT_S = 30
QUERY = ("index", "name", "driver_version", "memory.total")
# nvidia-smi prints a value a GPU does not have as [N/A] or [Not Supported] (memory.total of a unified-memory GPU:
# GB10, Jetson); any other bracketed value is the NVML error of reading it ([Unknown Error], [GPU requires reset],
# [GPU is lost]), and ERR! the table's: such a GPU is listed but not usable (CUDA sees no device there).
NO_VALUE = ("[N/A]", "[Not Supported]")


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
        why = next((line for line in said if not is_row(line)), said[0] if said else "no output")
        return [], f"nvidia-smi failed (exit {proc.returncode}): {why}"
    return read_rows(proc.stdout)


def read_rows(text: str) -> tuple[list[dict[str, str]], str]:
    """The GPUs of a `--query-gpu=QUERY --format=csv,noheader,nounits` answer, or [] and why it lists no usable one."""
    found = []
    for line in text.strip().splitlines():
        if not is_row(line):
            # Not one GPU's fields (a lost GPU's "Unable to determine the device handle ...", a warning): never
            # skipped, or the GPUs listed would pass for all of the runner's.
            return [], f"nvidia-smi --query-gpu printed {line.strip()[:200]!r}, not a GPU's {', '.join(QUERY)}"
        parts = [p.strip() for p in line.split(",")]
        broken = _broken_field(parts)
        if broken:
            return [], broken
        found.append({"index": parts[0], "name": parts[1], "driver": parts[2], "memory_mib": parts[3]})
    return found, "" if found else "nvidia-smi lists no GPU"


def is_row(line: str) -> bool:
    """Whether `line` has the shape of one GPU's row of the --query-gpu answer (its values may still be errors)."""
    parts = line.split(",")
    return len(parts) == len(QUERY) and parts[0].strip().isdigit()


def _broken_field(parts: list[str]) -> str:
    """Why a GPU row of nvidia-smi's --query-gpu answer is no usable GPU (a field it could not read), or ""."""
    for field, value in zip(QUERY, parts):  # noqa: B905 (is_row: as many; zip's strict is Python 3.10's)
        error = value.startswith("[") and value.endswith("]") and value not in NO_VALUE
        if error or value == "ERR!" or (field == "name" and value in ("", *NO_VALUE)):
            return (f"nvidia-smi lists GPU {parts[0][:20]} ({parts[1][:60]}) but reads its {field} as {value[:60]!r} "
                    "(a GPU NVML cannot read is no usable GPU; reset it or reboot the runner)")
    return ""
