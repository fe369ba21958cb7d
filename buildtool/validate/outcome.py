"""The verdict of a run (pure apart from reading what pytest wrote): what ran, what the groups define,
what a selection left out, the runner's GPUs, and the result with why it is not `passed`.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
from pathlib import Path
from typing import Any

from buildtool.contracts.verdict import (
    SCHEMA,
    ColdStart,
    Runner,
    Selection,
    TestResult,
    Verdict,
    derive_result,
)
from buildtool.matrix.schema import Cell
from buildtool.validate.collect import image_tests_hash
from buildtool.validate.engine import Resolved
from buildtool.validate.probe import Inventory


def overall_result(pytest_exit: int, tests: list[dict[str, Any]]) -> str:
    """Passed only when pytest succeeded, something passed and nothing failed: skips never count."""
    failed = any(t["result"] not in ("passed", "skipped") for t in tests)
    passed = any(t["result"] == "passed" for t in tests)
    return "passed" if pytest_exit == 0 and passed and not failed else "failed"


def make_verdict(image: Resolved, cell: Cell, started_at: dt.datetime, duration: float, tests_dir: Path,
                 groups: list[str], inventory: Inventory, usable: list[dict[str, str]], gpu_problem: str,
                 gpu_runner: bool, run_flags: list[str], rc: int, results: dict[str, Any], defined_path: Path,
                 select: str | None, problem: str = "", deadline_s: float = 0.0, *, sbom: str,
                 sbom_problem: str, matrix_digest: str) -> Verdict:
    """The verdict (schema SCHEMA): what ran, what the groups define (the collect plugin's file), what a
    selection left out, the runner's GPUs, and the result with why it is not `passed`;
    `problem`: why the run did not end by itself (its deadline ran out, it was interrupted);
    `sbom`: the digest of the image's signed SBOM, or "" with `sbom_problem` saying why (buildtool.validate.sbomref);
    `matrix_digest`: the matrix file's sha256, which with the cell's library promises binds the verdict (schema 6)."""
    tests = [TestResult.model_validate(t) for t in results["tests"]]
    try:
        collected = json.loads(defined_path.read_text())
    except (OSError, ValueError):
        collected = {"defined": [], "deselected": []}
    defined = [str(d["id"]) for d in collected["defined"]]
    gpu_tests = [str(d["id"]) for d in collected["defined"] if d.get("gpu")]
    deselected = sorted(set(collected["deselected"]))
    result, reasons = derive_result(rc, results["tests"], defined=defined,
                                    selection=Selection(expression=select, deselected=deselected),
                                    gpu_cell=cell.needs_gpu, gpu_tests=gpu_tests, gpu_problem=gpu_problem,
                                    emulated=image.emulated)
    if problem:
        result, reasons = "failed", [problem]
    return Verdict(
        schema=SCHEMA, digest=image.digest, image=image.ref, cell=cell.key, result=result,
        started=started_at.isoformat(timespec="milliseconds"), duration_s=round(duration, 2),
        test_code=image_tests_hash(tests_dir),
        runner=Runner(hostname=socket.gethostname(), gpu_runner=gpu_runner, gpus=inventory.gpus,
                      driver=inventory.driver, cuda_driver=inventory.cuda_driver,
                      driver_rule=inventory.driver_rule, interconnect=inventory.interconnect,
                      gpus_usable=bool(usable) if cell.needs_gpu else None,
                      gpu_problem=gpu_problem or inventory.problem),
        groups=groups, defined_tests=defined, gpu_tests=gpu_tests,
        selection=Selection(expression=select or None, deselected=deselected),
        incomplete=reasons if result == "incomplete" else [],
        framework_version=str((results.get("facts") or {}).get("framework_version") or ""),
        cold_start=ColdStart.model_validate(cold) if (cold := (results.get("facts") or {}).get("cold_start")) else None,
        run_flags=run_flags, pytest_exit=rc, tests=tests, figures=results.get("figures", {}), problem=problem,
        deadline_s=deadline_s, sbom=sbom, sbom_problem=sbom_problem if not sbom else "",
        platform=image.platform, emulated=image.emulated, matrix_digest=matrix_digest,
        libraries=promised_libraries(cell))


def promised_libraries(cell: Cell) -> dict[str, str]:
    """The NVIDIA library promises of a cell, as a verdict records them and release compares them ({}: none)."""
    return {} if cell.libraries is None else {"cudnn": cell.libraries.cudnn, "nccl": cell.libraries.nccl}
