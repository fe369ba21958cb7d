"""One validation run as planned before pytest starts: the image and its cell, what the engine granted (run flags,
ulimits it could not), the GPUs the tests may use and why not, the run's id, deadline, folders and test groups.
The target file (validate.targets.build_target) and the verdict (make_verdict) are made from it; what only the run
adds (its outcome) travels separately. The verdict of a run is pure apart from reading what pytest wrote.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from buildtool.contracts.verdict import SCHEMA, ColdStart, Runner, Selection, TestResult, Verdict, derive_result
from buildtool.matrix.schema import Cell, Matrix
from buildtool.validate.collect import image_tests_hash
from buildtool.validate.containers import Resolved
from buildtool.validate.options import Options
from buildtool.validate.probe import Inventory


@dataclass(frozen=True)
class RunPlan:
    ref: str                                  # what the user named
    image: Resolved
    cell: Cell
    matrix: Matrix
    options: Options
    inventory: Inventory
    flags: list[str]                          # the run flags the engine granted
    not_granted: list[str] = field(default_factory=list)   # ulimits of the run profile it could not grant
    usable: list[dict[str, str]] = field(default_factory=list)   # GPUs the cell's containers get
    gpu_problem: str = ""                     # why a GPU cell's tests get none
    run_id: str = ""
    deadline_s: float = 0.0
    tree: Path = Path("image-tests")          # the image-tests tree that runs (a site folder staged in)
    test_code: str = ""                       # its hash when the run was planned (image_tests_hash of `tree`)
    groups: list[str] = field(default_factory=list)
    out_dir: Path = Path("reports")


@dataclass(frozen=True)
class RunOutcome:
    """What the pytest run gave: when it started, how long it took, its exit code, the results and defined-tests
    files the plugin wrote, and why it did not end by itself ("" when it did)."""

    started_at: str
    duration_s: float
    rc: int
    results: dict[str, object]
    defined_path: Path
    problem: str = ""


def gpu_cell(cell: Cell) -> bool:
    """Whether the cell's GPU tests must pass on GPUs for `passed`: a CUDA image, or a run profile that gives its
    containers GPUs (`run.gpus` not none), as release's gate counts a GPU cell (release.gates.is_gpu_cell)."""
    return cell.needs_gpu or cell.run.gpus != "none"


def overall_result(pytest_exit: int, tests: list[dict[str, Any]]) -> str:
    """Passed only when pytest succeeded, something passed and nothing failed: skips never count."""
    failed = any(t["result"] not in ("passed", "skipped") for t in tests)
    passed = any(t["result"] == "passed" for t in tests)
    return "passed" if pytest_exit == 0 and passed and not failed else "failed"


def make_verdict(plan: RunPlan, run: RunOutcome, sbom: tuple[str, str], matrix_digest: str) -> Verdict:
    """The verdict (schema SCHEMA) of a planned run and what it gave: what ran, what the groups define (the collect
    plugin's file), what a selection left out, the runner's GPUs, and the result with why it is not `passed`
    (`run.problem`: why the run did not end by itself, its deadline ran out or it was interrupted); `sbom`: the
    digest of the image's signed SBOM and "", or "" and why there is none (buildtool.validate.sbomref);
    `matrix_digest`: the matrix file's sha256, which with the cell's library promises binds the verdict (schema 6)."""
    image, cell, inventory, select = plan.image, plan.cell, plan.inventory, plan.options.select
    results: dict[str, Any] = dict(run.results)
    tests = [TestResult.model_validate(t) for t in results["tests"]]
    try:
        collected = json.loads(run.defined_path.read_text())
    except (OSError, ValueError):
        collected = {"defined": [], "deselected": []}
    defined = [str(d["id"]) for d in collected["defined"]]
    gpu_tests = [str(d["id"]) for d in collected["defined"] if d.get("gpu")]
    deselected = sorted(set(collected["deselected"]))
    result, reasons = derive_result(run.rc, results["tests"], defined=defined,
                                    selection=Selection(expression=select, deselected=deselected),
                                    gpu_cell=gpu_cell(cell), gpu_tests=gpu_tests, gpu_problem=plan.gpu_problem,
                                    emulated=image.emulated)
    if run.problem:
        result, reasons = "failed", [run.problem]
    facts = results.get("facts") or {}
    return Verdict(
        schema=SCHEMA, digest=image.digest, image=image.ref, cell=cell.key, result=result,
        started=run.started_at, duration_s=round(run.duration_s, 2),
        # Hashed before pytest started (runner._plan): a tree edited during the run is not the code that ran.
        test_code=plan.test_code or image_tests_hash(plan.tree),
        runner=Runner(hostname=socket.gethostname(), gpu_runner=plan.options.require_gpu, gpus=inventory.gpus,
                      driver=inventory.driver, cuda_driver=inventory.cuda_driver,
                      driver_rule=inventory.driver_rule, interconnect=inventory.interconnect,
                      gpus_usable=bool(plan.usable) if gpu_cell(cell) else None,
                      gpu_problem=plan.gpu_problem or inventory.problem),
        groups=plan.groups, defined_tests=defined, gpu_tests=gpu_tests,
        selection=Selection(expression=select or None, deselected=deselected),
        incomplete=reasons if result == "incomplete" else [],
        framework_version=str(facts.get("framework_version") or ""),
        cold_start=_cold_start(facts.get("cold_start")),
        run_flags=plan.flags, pytest_exit=run.rc, tests=tests,
        # The image's measurements: a NaN or Infinity (no JSON number; the verdict refuses it) is written null.
        figures=json.loads(json.dumps(results.get("figures", {})), parse_constant=lambda _name: None),
        problem=run.problem, deadline_s=plan.deadline_s, sbom=sbom[0], sbom_problem=sbom[1] if not sbom[0] else "",
        platform=image.platform, emulated=image.emulated, matrix_digest=matrix_digest,
        libraries=promised_libraries(cell))


def _cold_start(cold: Any) -> ColdStart | None:
    """The cold start the image's probe recorded (None: it never ran); a record of another shape is a ColdStart whose
    error names what is wrong (the image's word: never a traceback, never a verdict lost)."""
    if not cold:
        return None
    try:
        return ColdStart.model_validate(cold)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "(the record)"
        return ColdStart(error=f"the cold start's record is not one validate can read: `{where}`: {first['msg']}")


def promised_libraries(cell: Cell) -> dict[str, str]:
    """The NVIDIA library promises of a cell, as a verdict records them and release compares them ({}: none)."""
    return {} if cell.libraries is None else {"cudnn": cell.libraries.cudnn, "nccl": cell.libraries.nccl}
