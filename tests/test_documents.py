"""The document templates: HTML is escaped, Markdown cells cannot break their table, and a template
that names a field nobody passes fails instead of printing nothing."""

from __future__ import annotations

import re

import jinja2
import pytest

from buildtool.common.documents import code_span, markdown_cell, plural, render_document
from buildtool.release.notes import render_notes
from buildtool.report.nightly import build_report, render_html, render_markdown
from buildtool.report.verdict_files import parse_verdict
from tests.signing import complete


def _verdict(cell: str, message: str) -> dict:
    return complete({"schema": 4, "digest": "sha256:" + "a" * 64, "cell": cell, "image": f"reg/{cell}",
                     "result": "failed", "started": "2026-11-30T00:00:00Z", "tests": [
                {"id": "image-tests/common/test_x.py::test_y", "group": "common", "result": "failed",
                 "duration_s": 1.0, "message": message}]})


def test_markdown_cell_keeps_one_cell_on_one_line() -> None:
    assert markdown_cell("a|b\nc\r\nd") == "a\\|b c  d"


def test_code_span_with_a_backtick_gets_a_longer_fence() -> None:
    assert code_span("x") == "`x`"
    assert code_span("a`b") == "`` a`b ``"


def test_code_span_holds_any_run_of_backticks_and_stays_on_one_line() -> None:
    """A value with two backticks in a row closed the `` fence early: what followed was Markdown (a verdict's cell
    `x``[link](https://e.invalid)``` gave the report a link); a line break ended a table row."""
    import markdown_it

    md = markdown_it.MarkdownIt("commonmark")
    for value in ("x``[link](https://e.invalid)``", "a```b", "``", "a\nb"):
        html = md.render("- " + code_span(value) + " after")
        assert "<a " not in html and html.count("<code>") == 1 and html.endswith("</code> after</li>\n</ul>\n"), html
    assert code_span("a``b") == "``` a``b ```" and code_span("a\r\nb") == "`a  b`"


def test_plural() -> None:
    assert (plural(1, "image"), plural(2, "image"), plural(0, "image")) == ("1 image", "2 images", "0 images")


def test_plural_of_a_noun_that_takes_es() -> None:
    """The scaling benchmark's `1 processes` and the report's `1 images`: every count with its noun goes through
    plural, which takes a plural of its own where WORD + s is not it."""
    assert [plural(n, "process", "processes") for n in (0, 1, 2)] == ["0 processes", "1 process", "2 processes"]


def test_html_report_escapes_every_value_from_a_verdict() -> None:
    hostile = '<script>alert(1)</script>" onmouseover="x'
    report = build_report([parse_verdict(_verdict(f"cell{hostile}", hostile), "v")])
    page = render_html(report)
    assert "<script>" not in page and 'onmouseover="x' not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34; onmouseover=&#34;x" in page


def test_markdown_report_keeps_a_pipe_in_a_message_inside_its_line() -> None:
    report = build_report([parse_verdict(_verdict("c", "expected a | b\nsecond line"), "v")])
    text = render_markdown(report)
    failure = next(line for line in text.splitlines() if line.startswith("- ❌"))
    assert failure.endswith("expected a \\| b")


def test_release_notes_fail_loudly_on_a_manifest_missing_a_field() -> None:
    with pytest.raises(jinja2.UndefinedError, match="source_commit"):
        render_notes({"version": "0.1.0", "dirty": False, "images": []})


def test_a_template_that_does_not_exist_is_an_error() -> None:
    with pytest.raises(jinja2.TemplateNotFound):
        render_document("buildtool.report", "nope.md.j2")


def test_markdown_report_keeps_a_bus_bandwidth_note_inside_its_row() -> None:
    """The bus-bandwidth table's check column printed the verdict's `floor_note` (which quotes nvidia-smi's GPU
    name) bare: a `|` in it added columns and a line break ended the table there, the rest as Markdown."""
    from buildtool.contracts.gpu import BUSBW_FIGURE

    data = _verdict("c", "m")
    data["figures"] = {BUSBW_FIGURE: {"peak_GBps": 100.0, "ranks": 2, "gpu_model": "X",
                                      "floor_note": "no floor: nvidia-smi name 'A|B' is unknown\n| injected | row |"}}
    text = render_markdown(build_report([parse_verdict(data, "v")]))
    row = next(line for line in text.splitlines() if line.startswith("| `c` | 2x X |"))
    assert row.endswith("⚠️ no floor: nvidia-smi name 'A\\|B' is unknown \\| injected \\| row \\| |")
    assert "\n| injected" not in text


@pytest.mark.parametrize("nights", ["three", "2", [], -1, True])
def test_a_busbw_figure_whose_nights_are_no_count_is_refused_naming_the_image(nights: object) -> None:
    """`int(baseline_nights)` of a hand-edited verdict ended the report in ValueError or TypeError (or counted "2"
    and True as nights); now one line naming the image and the value."""
    from buildtool.common.errors import UserError
    from buildtool.contracts.gpu import BUSBW_FIGURE
    from buildtool.report.nightly import busbw_rows

    data = _verdict("c", "m")
    data["figures"] = {BUSBW_FIGURE: {"peak_GBps": 100.0, "baseline_GBps": 90.0, "baseline_nights": nights}}
    report = build_report([parse_verdict(data, "v")])
    with pytest.raises(UserError) as info:
        busbw_rows(report)
    assert str(info.value) == (f"verdict of reg/c: its busbw figure's baseline_nights {nights!r} is not a count of "
                               "nights; validate it again (validate writes them)")
    data["figures"][BUSBW_FIGURE]["baseline_nights"] = 3
    assert [row.nights for row in busbw_rows(build_report([parse_verdict(data, "v")]))] == [3]


@pytest.mark.parametrize("value", ["[x](https://e.invalid)", "![i](https://e.invalid/i.png)", "<img src=x>",
                                   "<script>alert(1)</script>", "[a]: https://e.invalid", "a\\|b [c]"])
def test_markdown_cell_renders_as_its_text_never_a_link_image_or_html(value: str) -> None:
    """A failure message, skip reason or GPU name from a verdict goes into the Markdown report through `md`: it
    escaped only `|` and line breaks, so `[x](url)` became a link and `<img>` raw HTML in the summary."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parseInline(markdown_cell(value))[0].children or []
    assert [t.type for t in tokens] == ["text"] and tokens[0].content == value, tokens


def test_markdown_scaling_tables_keep_a_hostile_unit_and_count_inside_their_cells(tmp_path) -> None:
    """The scaling tables (the report's, and comparison.md of `buildtool scaling`) printed the unit (free text:
    `--unit`, or a scaling.json) and the count bare: a `|` added columns, a line break ended the table, `<img>` was
    raw HTML in the job summary."""
    from buildtool.launch.scaling import RunResult, ScalingResult
    from buildtool.launch.strategy_runs import write_comparison

    unit, count = "gpus | x <img src=x>\nbad", "2|y"
    row = {"status": "ran", "title": "DDP", "count": count, "time_per_epoch_s": 1.0, "speedup": 1.0, "efficiency": 1.0,
           "samples_per_s": 1.0, "peak_memory_mb": 1.0, "flagged": False}
    report = build_report([parse_verdict(_verdict("c", "m"), "v")])
    report.scaling = [{"unit": unit, "runs": [{k: row[k] for k in ("count", "time_per_epoch_s", "speedup",
                                                                      "efficiency")}]},
                      {"unit": unit, "rows": [row]}]
    text = render_markdown(report)
    escaped = "gpus \\| x \\<img src=x\\> bad"
    assert f"| {escaped} | time per epoch | speed-up | efficiency |\n|---|---|---|---|\n| 2\\|y | 1.000 s |" in text
    assert f"| strategy | {escaped} | time per epoch |" in text and "| DDP | 2\\|y | 1.000 s |" in text
    assert not re.search(r"(?<!\\)<img", text) and "\nbad" not in text   # only the escaped \\<img
    result = ScalingResult(unit=unit, samples=64, epochs=2, launcher={}, strategy="ddp", title="DDP", batch=8,
                           runs=[RunResult(count=2, backend="gloo", epoch_times_s=[], losses=[], identical=True,
                                           time_per_epoch_s=1.0)])
    table = write_comparison([result], tmp_path)["comparison table"].read_text()
    assert table.startswith(f"| strategy | {escaped} | time per epoch |") and not re.search(r"(?<!\\)<img", table)
