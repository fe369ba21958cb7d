"""What a validation is asked to do (`buildtool validate` flags, and the toolkit's own tests' faults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from buildtool.contracts.busbw import DEFAULT_WINDOW as DEFAULT_BUSBW_WINDOW
from buildtool.contracts.rendezvous import JOIN_TIMEOUT_S

DEFAULT_JOIN_TIMEOUT_S = float(JOIN_TIMEOUT_S)
# pytest-xdist workers the image tests run on (image-tests/lanes.py says what may run together);
# 1: one process, one test after another, as before.
DEFAULT_JOBS = 2


@dataclass
class Options:
    store: bool = True
    select: str | None = None
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    missing_peer_timeout_s: float = 5.0
    peers: dict[str, str] = field(default_factory=dict)
    reports: Path = Path("reports")
    cell: str | None = None
    # Fault injection for the toolkit's own tests: flags appended after the run profile's.
    extra_run_flags: list[str] = field(default_factory=list)
    peer_run_flags: list[str] = field(default_factory=list)
    ddp_master_addr: str = "127.0.0.1"
    ddp_timeout_s: float = 60.0
    deadline_s: float | None = None   # overrides the cell's validate.deadline_s
    # A declared GPU runner: fail (exit 1) unless its GPUs are seen and usable.
    require_gpu: bool = False
    # Folders of earlier verdicts (verdict.json, *.verdict.json) to compare bus bandwidth with;
    # the reports folder is always searched too.
    baselines: list[Path] = field(default_factory=list)
    # How many earlier nights the bus bandwidth is compared with (their median; contracts.busbw).
    busbw_window: int = DEFAULT_BUSBW_WINDOW
    jobs: int = DEFAULT_JOBS
    # A folder of site checks run as one more group (contracts.sitetests); None: the matrix's, if any.
    extra_tests: Path | None = None
    # Run the tests even when the registry holds a trusted passing verdict of this very run (validate.reuse).
    rerun: bool = False
    # sha256 of the matrix file as the command read it (runner.matrix_digest); "": read when the validation starts.
    matrix_digest: str = ""

    def reuses(self) -> bool:
        """Whether a verdict already in the registry may answer (buildtool.validate.reuse): a run that stores its
        verdict, of the whole suite, with nothing injected (the toolkit's own fault tests) and no --rerun."""
        injected = (self.extra_run_flags or self.peer_run_flags or self.ddp_master_addr != "127.0.0.1"
                    or self.ddp_timeout_s != 60.0 or self.missing_peer_timeout_s != 5.0
                    or self.join_timeout_s != DEFAULT_JOIN_TIMEOUT_S)
        return self.store and not self.rerun and not self.select and not injected
