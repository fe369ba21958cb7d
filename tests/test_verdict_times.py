"""A verdict's signed `started` as every reader places it (contracts.verdict.when): offsets other than Z, times an
offset takes out of the calendar. Never a traceback: a time that cannot be placed is named."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from buildtool.contracts.verdict import Gpu, when
from buildtool.validate import runner
from tests.test_verdict_paths import H100, KEY, _verdict, _write


def test_a_started_time_an_offset_takes_past_year_9999_is_left_out_of_the_busbw_window_named(tmp_path: Path) -> None:
    """validate's bus-bandwidth baseline reads the earlier nights' verdicts (NIGHTLY_HISTORY, what report --fetch
    saved): one dated 9999-12-31T23:59:59-05:00 (in UTC, year 10000) ended validate in an OverflowError traceback."""
    history = tmp_path / "history"
    _write(history / "night1" / "a.verdict.json", _verdict("2026-01-01T00:00:00+05:30", 400.0))
    _write(history / "night2" / "b.verdict.json", _verdict("9999-12-31T23:59:59-05:00", 1.0))
    inventory = runner.Inventory([Gpu(index=str(i), name=H100) for i in range(8)])
    found = runner.busbw_baseline([history], KEY, inventory)
    assert found["peaks"] == [400.0] and found["nights"] == 1
    [left_out] = found["left_out"]
    assert left_out.endswith("b.verdict.json: `started` '9999-12-31T23:59:59-05:00' is not an ISO 8601 time, so the "
                             "verdict cannot be placed in a night")


def test_when_places_one_instant_written_two_ways_as_one_and_in_utc() -> None:
    assert when("2026-01-01T05:30:00+05:30") == when("2026-01-01T00:00:00Z") == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert when("0001-01-01T00:00:00+05:00") is None
