"""One validation run as planned before pytest starts: the image and its cell, what the engine granted (run flags,
ulimits it could not), the GPUs the tests may use and why not, the run's id, deadline, folders and test groups.
The target file (validate.targets.build_target) and the verdict (validate.outcome.make_verdict) are made from it;
what only the run adds (its outcome) travels separately."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from buildtool.matrix.schema import Cell, Matrix
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
