"""The report's model: a row per validated image (one verdict; one per platform of a multi-platform cell), its
checks, the trend against the previous night, each image's bus bandwidth, and the report over them all. Data only."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from buildtool.contracts.busbw import MAX_FALL as BUSBW_MAX_FALL
from buildtool.contracts.verdict import Runner

RESULTS = ("passed", "failed", "skipped")
# A row's platform when its record names none: a schema-4 verdict (written before verdicts recorded one) or a
# missing record of a single image. Either is about the image's only platform, which the file does not name.
UNRECORDED = ""
UNRECORDED_TEXT = "single image, platform not recorded"


def platform_text(platform: str, emulated: bool) -> str:
    """`linux/arm64 (emulated)`, `linux/amd64`, or what an unrecorded platform is."""
    if platform == UNRECORDED:
        return UNRECORDED_TEXT
    return f"{platform} (emulated)" if emulated else platform


@dataclass(frozen=True)
class Check:
    id: str
    group: str
    result: str
    duration_s: float | None
    message: str
    skip_reason: str

    @property
    def reason(self) -> str:
        return self.skip_reason if self.result == "skipped" else self.message


@dataclass(frozen=True)
class Row:
    """One validated image (one verdict): a single-platform cell's image, or one platform manifest of a
    multi-platform cell's index."""

    cell: str
    image: str
    digest: str
    result: str
    started: str
    duration_s: float | None
    size_bytes: int | None
    runner: Runner | None                # None: no verdict (the report's record of a missing one)
    checks: dict[str, Check]
    figures: dict[str, Any]
    incomplete: tuple[str, ...] = ()     # why the verdict is incomplete
    framework_version: str = ""
    cold_start: str = ""                 # what the first import of the framework cost ('' when unknown)
    platform: str = UNRECORDED           # os/arch the verdict (schema 5) or missing record names
    emulated: bool = False               # it ran under QEMU on a runner of another architecture

    @property
    def key(self) -> tuple[str, str]:
        """What one row stands for: a cell's image of one platform."""
        return (self.cell, self.platform)

    @property
    def platform_text(self) -> str:
        return platform_text(self.platform, self.emulated)


@dataclass(frozen=True)
class Trend:
    cell: str
    check: str
    before: str | None
    now: str
    platform: str = UNRECORDED
    emulated: bool = False


@dataclass(frozen=True)
class Busbw:
    """One image's all-reduce bus bandwidth (image-tests' NCCL check), with what it is compared to: the
    median of the last nights the verdict itself carries (validate's window), else the previous night."""

    cell: str
    gpus: str
    peak_GBps: float
    floor_GBps: float | None
    previous_GBps: float | None          # the baseline: median of `nights` earlier nights
    change: float | None
    sizes: list[dict[str, Any]]
    nights: int = 0                      # how many earlier nights the baseline is the median of
    floor_note: str = ""                 # how the floor was set, or why there is none
    interconnect: str = ""
    platform: str = UNRECORDED
    emulated: bool = False
    fault: str = ""                      # why the check fails whatever it measures (a broken NVLink; contracts.busbw)

    @property
    def compared_with(self) -> str:
        if self.previous_GBps is None:
            return "no earlier night"
        return f"median of {self.nights} night{'s' if self.nights != 1 else ''}"

    @property
    def status(self) -> str:
        """passed, failed, or skipped where only the floor is missing (shown, never counted as a pass)."""
        verdict = self.verdict
        if verdict == "ok":
            return "passed"
        return "failed" if verdict.startswith(("link fault", "below floor", "fell")) else "skipped"

    @property
    def verdict(self) -> str:
        if self.fault:
            return f"link fault: {self.fault}"
        if self.floor_GBps is not None and self.peak_GBps < self.floor_GBps:
            return "below floor"
        if self.change is not None and self.change < -BUSBW_MAX_FALL:
            return f"fell {-self.change:.0%} below the {self.compared_with}"
        if self.floor_GBps is None:
            return self.floor_note or "no floor for this model"
        return "ok"


@dataclass
class Report:
    rows: list[Row]
    columns: list[str]
    newly_failing: list[Trend] = field(default_factory=list)
    fixed: list[Trend] = field(default_factory=list)
    # checks that passed the previous night and were not run tonight (skipped, or absent from the verdict)
    not_run: list[Trend] = field(default_factory=list)
    # checks that failed the previous night and were not run tonight: not known to be fixed
    failed_not_run: list[Trend] = field(default_factory=list)
    # rows (images) of the previous night with none tonight: no verdict and no missing record
    gone: list[Row] = field(default_factory=list)
    # rows (images) of tonight with none the previous night (a night of other cells): nothing to compare them with
    unpaired: list[Row] = field(default_factory=list)
    has_previous: bool = False
    previous_rows: list[Row] = field(default_factory=list)
    # scaling.json of each of the night's scaling runs (processes in one container, nodes over SLURM), with the
    # report-relative paths of its plots under "plots"
    scaling: list[dict[str, Any]] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        return {**dict.fromkeys(RESULTS, 0), **Counter(c.result for row in self.rows for c in row.checks.values())}

    @property
    def failed_images(self) -> list[str]:
        """Images (rows: one per platform of a multi-platform cell) whose verdict is not `passed`."""
        return [row.cell for row in self.rows if row.result != "passed"]

    @property
    def multi_platform_cells(self) -> set[str]:
        """Cells with rows of more than one platform tonight: their rows are named with the platform."""
        platforms = Counter(cell for cell, _ in {row.key for row in self.rows})
        return {cell for cell, count in platforms.items() if count > 1}

    @property
    def shows_platform(self) -> bool:
        """Whether the tables have a platform column: when a row records one (or ran emulated). A night of
        schema-4 verdicts only has none, as before verdicts recorded platforms."""
        return any(row.platform != UNRECORDED or row.emulated for row in self.rows)

    def platform_note(self, item: Row | Trend | Busbw) -> str:
        """The platform to name beside a cell outside the table ('' where the cell has one platform)."""
        if item.cell in self.multi_platform_cells or item.emulated:
            return platform_text(item.platform, item.emulated)
        return ""

    @property
    def incomplete_images(self) -> list[str]:
        return [row.cell for row in self.rows if row.result == "incomplete"]
