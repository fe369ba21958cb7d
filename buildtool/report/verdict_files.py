"""The verdict files a report reads and the nightly keeps: verdicts (every schema the toolkit reads), and the
report's own records of an image with no verdict (`Missing`), each loaded into a row (buildtool.report.rows).
What does not parse is a UserError naming the file, never a default."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from buildtool.common.errors import UserError
from buildtool.common.files import write_atomic
from buildtool.contracts import platforms
from buildtool.contracts.verdict import (
    ColdStart,
    Verdict,
    VerdictError,
    derive_result,
    gpu_pass_problem,
    recorded_failure,
    split_size,
    verdict_paths,
    when,
)
from buildtool.contracts.verdict import parse_verdict as parse_typed
from buildtool.report.rows import UNRECORDED, Check, Row


class Missing(BaseModel):
    """The report's own record of a cell's image with no verdict to show (no image, or no valid verdict),
    saved beside the fetched verdicts so that the next night's trend sees it too. Not a verdict. `platform`
    names the platform of a multi-platform cell that has none ("" for a single-platform cell's image)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    missing: Literal[True]
    cell: str
    image: str
    digest: str = ""
    reason: str
    platform: str = UNRECORDED

    @field_validator("platform")
    @classmethod
    def _known_platform(cls, value: str) -> str:
        if value != UNRECORDED:
            platforms.get(value)     # UnknownPlatform (a ValueError) names it
        return value

    def to_json(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        if data["platform"] == UNRECORDED:
            del data["platform"]     # a single image's record, as it was written before platforms
        return data


MISSING_CHECK = "image/verdict"


class _LegacyCheck(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    id: Literal["image/verdict"]
    message: str = ""


class _LegacyMissing(BaseModel):
    """A missing record as `report --fetch` wrote it before verdicts were typed: a schema-1 pseudo-verdict
    whose one test is `image/verdict`. Read because the nightly keeps the previous night's folder (a CI
    cache) and a report that refused it would fail every night; any other schema-1 file is refused
    (parse_verdict names its schema)."""

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    schema_: Literal[1] = Field(alias="schema")
    cell: str
    image: str = ""
    digest: str = ""
    tests: list[_LegacyCheck] = Field(min_length=1, max_length=1)


def _legacy_missing(data: dict[str, Any]) -> Missing | None:
    try:
        old = _LegacyMissing.model_validate(data)
    except ValidationError:
        return None
    return Missing(missing=True, cell=old.cell, image=old.image, digest=old.digest, reason=old.tests[0].message)


def parse_verdict(data: Any, where: str) -> Row:
    """A verdict file's JSON -> Row. A verdict is parsed by buildtool.contracts.verdict.parse_verdict
    (the current schema and the one before it), plus the image size the report adds (`size_bytes`); a
    missing record (`Missing`) is a failed row naming why. Anything else is a UserError naming `where` and
    the cause."""
    if isinstance(data, dict) and data.get("missing") is True:
        try:
            return _missing_row(Missing.model_validate(data))
        except ValidationError as exc:
            raise UserError(f"{where}: malformed missing-verdict record: {exc.errors()[0]['loc']}: "
                            f"{exc.errors()[0]['msg']}") from None
    if isinstance(data, dict) and (legacy := _legacy_missing(data)) is not None:
        return _missing_row(legacy)
    try:
        data, size = split_size(data, where)
        verdict = parse_typed(data, where)
    except VerdictError as exc:
        raise UserError(str(exc)) from None
    return verdict_row(verdict, size)


def false_pass(verdict: Verdict) -> str:
    """Why a verdict's `passed` contradicts what it records ('' when it does not): validate says `passed` only when
    no test failed, pytest exited 0, a test passed and, for a GPU cell, every GPU test passed on a GPU, not emulated
    (contracts.verdict.derive_result)."""
    if verdict.result != "passed":
        return ""
    recorded = recorded_failure(verdict, "the verdict")   # what the release gate refuses too
    if recorded:
        return recorded
    if not any(t.result == "passed" for t in verdict.tests):
        return "the verdict says passed, but no test passed"
    gpu = gpu_pass_problem(verdict)
    if gpu:
        return f"the verdict says passed, but {gpu}"
    # What else makes validate say `incomplete`: a selection that deselected tests, a run that stopped early.
    tests = [{"id": t.id, "result": t.result} for t in verdict.tests]
    result, why = derive_result(verdict.pytest_exit, tests, defined=verdict.defined_tests,
                                selection=verdict.selection, gpu_cell=False, gpu_tests=[])
    return f"the verdict says passed, but {why[0]}" if result != "passed" else ""


def verdict_row(verdict: Verdict, size_bytes: int | None = None) -> Row:
    """The row of one verdict. A `passed` that its own tests contradict is shown failed, the contradiction as the
    failed check `image/verdict`: never counted as a passed image."""
    checks = {t.id: Check(id=t.id, group=t.group, result=t.result, duration_s=t.duration_s, message=t.message,
                          skip_reason=t.skip_reason) for t in verdict.tests}
    contradiction = false_pass(verdict)
    if contradiction:
        checks[MISSING_CHECK] = Check(id=MISSING_CHECK, group="pipeline", result="failed", duration_s=None,
                                      message=contradiction, skip_reason="")
    return Row(cell=verdict.cell, image=verdict.image, digest=verdict.digest,
               result="failed" if contradiction else verdict.result,
               started=verdict.started, duration_s=verdict.duration_s, size_bytes=size_bytes, runner=verdict.runner,
               checks=checks, figures=dict(verdict.figures), incomplete=tuple(verdict.incomplete),
               framework_version=verdict.framework_version, cold_start=cold_start_text(verdict.cold_start),
               platform=verdict.platform, emulated=verdict.emulated)


def _missing_row(missing: Missing) -> Row:
    check = Check(id=MISSING_CHECK, group="pipeline", result="failed", duration_s=None, message=missing.reason,
                  skip_reason="")
    return Row(cell=missing.cell, image=missing.image, digest=missing.digest, result="failed", started="",
               duration_s=None, size_bytes=None, runner=None, checks={check.id: check}, figures={},
               platform=missing.platform)


def cold_start_text(cold: ColdStart | None) -> str:
    """`import torch 54.7 s, 1650 MB read` from a verdict's cold_start ('' when absent)."""
    if cold is None or not cold.imports:
        return ""
    first = cold.imports[0]
    read = f", {first.read_bytes / 1e6:.0f} MB read" if first.read_bytes else ""
    return f"import {first.module} {first.seconds:.1f} s{read}"


def load_verdicts(folder: Path) -> list[Row]:
    """Every verdict file under `folder`; when one image (a cell's platform) appears twice, the newest
    verdict wins. Two platforms of a cell are two images: neither hides the other. A folder with none is a
    UserError naming it."""
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise UserError(f"verdict folder {folder} {what}; pass the folder `buildtool validate` wrote")
    paths = verdict_paths(folder)
    if not paths:   # a report of no image would read as a night with nothing failed
        raise UserError(f"verdict folder {folder} holds no verdict file (verdict.json or *.verdict.json); pass the "
                        "folder `buildtool validate` wrote, or fetch the verdicts with --fetch")
    return load_verdict_files(paths)


def load_verdict_files(paths: Iterable[Path]) -> list[Row]:
    """The rows of these verdict files (load_verdicts' rules): `report --fetch` reads only the files it fetched, so
    that a verdict of another digest left in the folder (an earlier validate's) never stands for what it fetched."""
    newest: dict[tuple[str, str], tuple[dt.datetime, Row]] = {}
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:   # RecursionError: nested
            raise UserError(f"{path}: cannot read verdict ({exc})") from None                # too deeply to decode
        row = parse_verdict(data, str(path))
        time = _placed(row, path)
        if row.key not in newest or time >= newest[row.key][0]:
            newest[row.key] = (time, row)
    return _fold_unrecorded(newest)


def _placed(row: Row, path: Path) -> dt.datetime:
    """A row's `started` as a time, parsed as the release gate parses it, so that both call the same verdict the
    newest (as text, 01:30 UTC written `00:30-01:00` sorts before 01:00 UTC). A missing record has none and is
    older than any verdict; a `started` that is not an ISO 8601 time is a UserError naming the file."""
    if not row.started:
        return dt.datetime.min.replace(tzinfo=dt.UTC)
    time = when(row.started)
    if time is None:
        raise UserError(f"{path}: `started` {row.started!r} is not an ISO 8601 time, so the verdict cannot be "
                        "ordered against the others of its image")
    return time


def _fold_unrecorded(newest: dict[tuple[str, str], tuple[dt.datetime, Row]]) -> list[Row]:
    """A row that records no platform (a schema-4 verdict, a single image's missing record) is about the
    image's only platform: where the cell has exactly one recorded platform besides it, the two are one
    image and the newest wins. Beside two or more recorded platforms it is an older single image of a
    cell that is now an index: kept as its own row (shown, never hiding or hidden)."""
    for cell in dict.fromkeys(cell for cell, _ in newest):
        recorded = [key for key in newest if key[0] == cell and key[1] != UNRECORDED]
        if (cell, UNRECORDED) in newest and len(recorded) == 1:
            del newest[(cell, UNRECORDED) if newest[recorded[0]][0] >= newest[(cell, UNRECORDED)][0] else recorded[0]]
    return [row for _, row in newest.values()]


def verdict_file_name(row: Row, multi_platform: bool) -> str:
    """`<cell>.verdict.json`, and `<cell>.<os>-<arch>.verdict.json` for a record of a multi-platform cell, so
    that two platforms of one cell never write the same file (':' and '/' become '_' and '-')."""
    name = row.cell.replace(":", "_").replace("/", "_")
    if multi_platform:
        name += "." + (row.platform or "unrecorded-platform").replace("/", "-")
    return name + ".verdict.json"


def save_verdicts(rows_data: Iterable[dict[str, Any]], folder: Path) -> list[Path]:
    """Write fetched verdicts and missing records (the folder the next night compares against), one file
    each: `<cell>.verdict.json`, or with the platform in the name where the cell has more than one record.
    Two records that would share a file are an error naming both, never one silently overwriting the other."""
    records = [(data, parse_verdict(data, f"fetched record {index}")) for index, data in enumerate(rows_data)]
    per_cell = Counter(row.cell for _, row in records)
    named: dict[Path, tuple[dict[str, Any], Row]] = {}
    for data, row in records:
        path = folder / verdict_file_name(row, per_cell[row.cell] > 1)
        if path in named:
            raise UserError(f"{path.name}: two fetched records of {row.cell} ({named[path][1].platform_text}, "
                            f"{row.platform_text}) would share one file")
        named[path] = (data, row)
    folder.mkdir(parents=True, exist_ok=True)
    for path, (data, _) in named.items():
        write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")   # the next night reads it: never half
    return list(named)
