"""`buildtool report`: verdicts -> HTML + Markdown, the trend against the previous night, bad input,
and the page rendered in a real headless Chromium (DOM checked, screenshot checked to be a rendered page)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from buildtool.common.errors import UserError
from buildtool.report.nightly import build_report, render_html, render_markdown
from buildtool.report.verdict_files import load_verdicts, parse_verdict

REPO = Path(__file__).resolve().parent.parent
CHROMIUM_APT = "apt-get install -y --no-install-recommends chromium"


def test(id_: str, result: str, message: str = "", skip: str = "", duration: float = 0.5) -> dict:
    return {"id": id_, "group": "image-tests", "result": result, "duration_s": duration, "message": message,
            "skip_reason": skip}


test.__test__ = False  # a helper, not a pytest test

SHM = "image-tests/common/test_shm.py::test_shm_size_matches_run_profile"
DDP = "image-tests/pytorch/test_ddp.py::test_ddp_loss_falls"
BUSBW = "image-tests/pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw"
TB = "image-tests/tensorflow/test_tensorboard.py::test_profile_plugin"
NO_GPU = "needs a GPU; this runner has none (runner.gpus is empty)"


def verdict(cell: str, tests: list[dict], *, digest: str = "sha256:" + "ab" * 32, started: str = "2026-11-29T02:00:00",
            figures: dict | None = None, gpus: list[str] | None = None, schema: int = 4) -> dict:
    """A verdict as `buildtool report --fetch` saves it: the verdict plus the image's size. Of the schema
    before the current one unless told (the report reads both; schema 5 adds the platform)."""
    failed = any(t["result"] == "failed" for t in tests)
    name, version = cell.split(":")
    return {"schema": schema, "digest": digest, "image": f"127.0.0.1:5000/{name}-dev:abc-{version}", "cell": cell,
            "result": "failed" if failed else "passed", "started": started, "duration_s": 42.0,
            "test_code": "sha256:" + "cd" * 32, "size_bytes": 1_450_000_000,
            "runner": {"hostname": "gpu-07", "gpus": [{"index": str(i), "name": g} for i, g in enumerate(gpus or [])],
                       "driver": "580.65" if gpus else ""},
            "groups": sorted({t["group"] for t in tests}), "defined_tests": [t["id"] for t in tests],
            "pytest_exit": int(failed), "tests": tests, "figures": figures or {}, "sbom": "sha256:" + "5" * 64,
            **({"platform": "linux/amd64", "emulated": False} if schema >= 5 else {})}


def tonight() -> list[dict]:
    return [
        verdict("pytorch-cpu:2.13", [test(SHM, "passed"), test(DDP, "passed", duration=6.1),
                                     test(BUSBW, "skipped", skip=NO_GPU)]),
        verdict("pytorch-ngc:25.10", [test(SHM, "passed"), test(DDP, "failed", "AssertionError: loss did not fall "
                                                                                "<0.9 -> 0.91>"),
                                      test(BUSBW, "passed")],
                digest="sha256:" + "12" * 32, figures={"busbw_GBps": 182.4, "algbw_GBps": 97.3},
                gpus=["NVIDIA H100 80GB HBM3"] * 8),
        verdict("tensorflow-cpu:2.21", [test(SHM, "failed", "/dev/shm is 64 MB, the run profile says 8g"),
                                        test(TB, "passed")], digest="sha256:" + "34" * 32),
    ]


def last_night() -> list[dict]:
    previous = copy.deepcopy(tonight())
    previous[1]["tests"][1] = test(DDP, "passed")           # pytorch-ngc DDP: newly failing tonight
    previous[2]["tests"][0] = test(SHM, "failed", "same")   # tensorflow-cpu shm: still failing
    previous[0]["tests"][1] = test(DDP, "failed", "was broken")  # pytorch-cpu DDP: fixed tonight
    return previous


def write(folder: Path, verdicts: list[dict]) -> Path:
    for v in verdicts:
        path = folder / v["cell"].split(":")[0] / v["digest"].split(":")[1][:12] / "verdict.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(v))
        (path.parent / "results.json").write_text("[]")  # validate's other files are not verdicts
    return folder


def test_trend_puts_newly_failing_checks_first() -> None:
    report = build_report([parse_verdict(v, "x") for v in tonight()], [parse_verdict(v, "y") for v in last_night()])
    assert [(t.cell, t.check, t.before) for t in report.newly_failing] == [("pytorch-ngc:25.10", DDP, "passed")]
    assert [(t.cell, t.check) for t in report.fixed] == [("pytorch-cpu:2.13", DDP)]
    assert [r.cell for r in report.rows] == ["pytorch-ngc:25.10", "tensorflow-cpu:2.21", "pytorch-cpu:2.13"]
    assert report.columns[0] == DDP and report.columns[1] == SHM
    assert report.counts == {"passed": 5, "failed": 2, "skipped": 1}


def test_html_shows_results_reasons_and_figures() -> None:
    report = build_report([parse_verdict(v, "x") for v in tonight()], [parse_verdict(v, "y") for v in last_night()])
    page = render_html(report)
    assert "<script" not in page and "&lt;0.9 -&gt; 0.91&gt;" in page  # messages are escaped
    assert NO_GPU in page and 'class="result-skipped"' in page
    assert 'class="result-failed newly"' in page
    details = page.split('<section class="failures">', 1)[1].split("</section>", 1)[0]
    assert details.index("pytorch-ngc:25.10") < details.index("tensorflow-cpu:2.21")  # newly failing first
    assert '<a href="#f1">FAIL</a>' in page and 'id="f1"' in details
    assert "busbw_GBps: 182" in page and "1.45 GB" in page and "sha256:121212121212" in page
    assert "8 GPU (NVIDIA H100 80GB HBM3), driver 580.65" in page


def test_markdown_summary() -> None:
    report = build_report([parse_verdict(v, "x") for v in tonight()], [parse_verdict(v, "y") for v in last_night()])
    md = render_markdown(report)
    assert "### Newly failing" in md and f"`pytorch-ngc:25.10` `{DDP}` (was passed)" in md
    assert "### Fixed" in md and f"- ⏭️ {NO_GPU}: `test_ddp_nccl_allreduce_busbw` (1 image)" in md
    assert f"- ❌ `pytorch-ngc:25.10` `{DDP}` (new): AssertionError: loss did not fall" in md
    table = [line for line in md.splitlines() if line.startswith("| `")]
    assert table[0].startswith("| `pytorch-ngc:25.10` | ❌ **FAIL**")


def test_without_a_previous_night_there_is_no_trend() -> None:
    report = build_report([parse_verdict(v, "x") for v in tonight()])
    assert report.newly_failing == [] and not report.has_previous
    assert "No previous night" in render_html(report)


def test_newest_verdict_of_a_cell_wins(tmp_path: Path) -> None:
    old = verdict("pytorch-cpu:2.13", [test(SHM, "failed", "old")], digest="sha256:" + "01" * 32,
                  started="2026-11-28T02:00:00")
    new = verdict("pytorch-cpu:2.13", [test(SHM, "passed")], digest="sha256:" + "02" * 32)
    rows = load_verdicts(write(tmp_path, [old, new]))
    assert len(rows) == 1 and rows[0].result == "passed"


def test_the_newest_verdict_is_the_newest_in_time_not_as_text(tmp_path: Path) -> None:
    """Ordered as the release gate orders them (verdict_choice.when): a fail at 00:30-01:00 (01:30 UTC) is newer
    than a pass at 01:00 UTC, though it sorts first as text (the report showed the pass)."""
    passed = verdict("pytorch-cpu:2.13", [test(SHM, "passed")], digest="sha256:" + "01" * 32,
                     started="2026-01-02T01:00:00+00:00")
    failed = verdict("pytorch-cpu:2.13", [test(SHM, "failed", "newer")], digest="sha256:" + "02" * 32,
                     started="2026-01-02T00:30:00-01:00")
    for order in ([passed, failed], [failed, passed]):
        shutil.rmtree(tmp_path / "pytorch-cpu", ignore_errors=True)
        rows = load_verdicts(write(tmp_path, order))
        assert [(r.result, r.started) for r in rows] == [("failed", "2026-01-02T00:30:00-01:00")]
    (tmp_path / "pytorch-cpu" / "010101010101" / "verdict.json").write_text(json.dumps({**passed, "started": "soon"}))
    with pytest.raises(UserError, match=r"010101010101/verdict.json: `started` 'soon' is not an ISO 8601 time"):
        load_verdicts(tmp_path)


def _changed(**change: object) -> str:
    return json.dumps({**tonight()[0], **change})


@pytest.mark.parametrize(("content", "needle"), [
    ("{not json", "cannot read verdict"),
    ("[]", "not a verdict (a JSON list, not an object)"),
    (json.dumps({"cell": "c"}), "not a verdict (no schema number)"),
    (_changed(schema=7), "unsupported verdict schema 7 (this toolkit reads schemas 4, 5 and 6)"),
    (_changed(schema=3), "unsupported verdict schema 3 (this toolkit reads schemas 4, 5 and 6)"),
    (_changed(schema=2), "unsupported verdict schema 2"),
    (_changed(schema=1), "unsupported verdict schema 1"),
    (json.dumps({"schema": 4}), "malformed schema-4 verdict: `digest` is missing; `image` is missing"),
    (json.dumps({"schema": 5}), "malformed schema-5 verdict: `digest` is missing; `image` is missing"),
    (_changed(schema=5), "`platform`: unknown platform ''"),
    (_changed(result="maybe"), "`result`: input should be 'passed', 'failed' or 'incomplete'"),
    (_changed(tests=[{"id": "x"}]), "`tests[0].group` is missing"),
    (_changed(duration_s="42"), "`duration_s`: input should be a valid number (got str '42')"),
    (_changed(size_bytes="1.4 GB"), "`size_bytes` (the image size the report adds) must be an integer or null"),
    (json.dumps({"missing": True, "cell": "c"}), "malformed missing-verdict record"),
])
def test_bad_verdicts_name_the_file(tmp_path: Path, content: str, needle: str) -> None:
    (tmp_path / "c.verdict.json").write_text(content)
    with pytest.raises(UserError, match=re.escape(needle)) as info:
        load_verdicts(tmp_path)
    assert "c.verdict.json" in str(info.value)


def test_cli_writes_html_and_markdown(run_cli, tmp_path: Path) -> None:
    out = tmp_path / "site"
    code, stdout, err = run_cli("report", "--verdicts", str(write(tmp_path / "now", tonight())),
                                "--previous", str(write(tmp_path / "before", last_night())), "--out", str(out))
    assert code == 0, err
    assert "3 images, 2 failed / 5 passed / 1 skipped checks, 1 newly failing" in stdout
    assert (out / "report.html").is_file() and (out / "report.md").is_file()


def test_scaling_results_that_are_not_a_json_object_are_one_line_exit_2(run_cli, tmp_path: Path) -> None:
    """A scaling.json holding `[]`: one line naming the file (was a TypeError traceback)."""
    scaling = tmp_path / "scaling"
    scaling.mkdir()
    (scaling / "scaling.json").write_text("[]")
    code, stdout, err = run_cli("report", "--verdicts", str(write(tmp_path / "now", tonight())), "--scaling",
                                str(scaling), "--out", str(tmp_path / "site"))
    assert code == 2 and "Traceback" not in err, err
    assert f"{scaling / 'scaling.json'}: cannot read the scaling results (a JSON list, not an object)" in err


def test_cli_missing_folder_is_exit_2(run_cli, tmp_path: Path) -> None:
    code, stdout, err = run_cli("report", "--verdicts", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert code == 2 and "does not exist" in err and not (tmp_path / "o").exists()


def test_cli_a_folder_with_no_verdict_file_is_exit_2_not_an_empty_report(run_cli, tmp_path: Path) -> None:
    """A verdict folder that holds no verdict file (the wrong folder, or validate wrote none) gave a report of no
    image, exit 0: "0 failed", a night that reads as clean; as --previous, a trend against nothing. Now each is
    refused, naming the folder."""
    (tmp_path / "empty" / "pytorch-cpu").mkdir(parents=True)
    (tmp_path / "empty" / "notes.txt").write_text("not a verdict\n")
    code, _, err = run_cli("report", "--verdicts", str(tmp_path / "empty"), "--out", str(tmp_path / "o"))
    assert code == 2 and "Traceback" not in err and not (tmp_path / "o").exists()
    assert f"verdict folder {tmp_path / 'empty'} holds no verdict file (verdict.json or *.verdict.json)" in err
    code, _, err = run_cli("report", "--verdicts", str(write(tmp_path / "now", tonight())),
                           "--previous", str(tmp_path / "empty"), "--out", str(tmp_path / "o"))
    assert code == 2 and f"verdict folder {tmp_path / 'empty'} holds no verdict file" in err


def test_fetch_reports_what_it_fetched_not_an_older_verdict_left_in_the_folder(project: Path, run_cli,
                                                                                monkeypatch, tmp_path: Path) -> None:
    """`report --fetch` saved each cell's record into --verdicts (default `reports/`, where validate leaves the
    verdicts of earlier digests) and then read the whole folder, where a missing record is older than any verdict:
    a cell whose image the registry lacks tonight showed an earlier digest's pass. Now only the fetched files count."""
    from buildtool.report import fetch

    folder = tmp_path / "reports"
    write(folder, [verdict("pytorch-cpu:2.13", [test(SHM, "passed")], digest="sha256:" + "99" * 32)])

    def fetched(refs: dict, trusted: object = None, platforms: object = None) -> list[dict]:
        return [{"missing": True, "cell": cell, "image": ref, "reason": "no image (the build failed)"}
                for cell, ref in refs.items()]

    monkeypatch.setattr(fetch, "fetch_verdicts", fetched)
    code, out, err = run_cli("report", "--fetch", "--framework", "pytorch-cpu:2.13", "--verdicts", str(folder),
                             "--out", str(tmp_path / "o"), "--matrix", str(project / "matrix.yaml"))
    assert code == 0, err
    assert "1 image, 1 failed / 0 passed" in out
    md = (tmp_path / "o" / "report.md").read_text()
    assert "- ❌ `pytorch-cpu:2.13` `image/verdict`: no image (the build failed)" in md
    assert "sha256:999999999999" not in md and (folder / "pytorch-cpu_2.13.verdict.json").is_file()


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail(f"headless Chromium is needed for the report test: {CHROMIUM_APT}")
    return found


def browse(page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="t-report-chromium-") as profile:
        return subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--window-size=1400,900", *args, page.as_uri()],
            capture_output=True, text=True, timeout=120)


@pytest.mark.browser
def test_report_renders_in_headless_chromium(run_cli, tmp_path: Path) -> None:
    out = tmp_path / "site"
    code, _, err = run_cli("report", "--verdicts", str(write(tmp_path / "now", tonight())),
                           "--previous", str(write(tmp_path / "before", last_night())), "--out", str(out))
    assert code == 0, err
    dom = browse(out / "report.html", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert '<table class="verdicts">' in html
    body = html.split("<tbody>", 1)[1]
    first_row = body.split("</tr>", 1)[0]
    assert 'data-cell="pytorch-ngc:25.10"' in first_row and "newly-failing" in first_row
    assert first_row.count('class="result-failed') >= 2  # the image verdict and its failing check
    assert html.count('class="result-failed') == 4  # 2 failed images + 2 failed checks, all marked
    shot = tmp_path / "report.png"   # tests never write into the repository
    taken = browse(out / "report.html", f"--screenshot={shot}")
    assert taken.returncode == 0, taken.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a rendered page, not a blank one


@pytest.mark.integration
@pytest.mark.registry
def test_fetch_reads_verdicts_and_sizes_from_the_registry(run_cli, tmp_path: Path) -> None:
    import uuid

    from buildtool.registry.client import EMPTY_JSON, EMPTY_JSON_TYPE, OCI_MANIFEST, RegistryClient
    from buildtool.report.fetch import fetch_verdicts
    from tests import signing

    host = os.environ.get("REGISTRY") or "127.0.0.1:5000"
    repo = f"t-report-{uuid.uuid4().hex[:8]}/pytorch-cpu-dev"
    client = RegistryClient(host)
    layer = b"not really a tarball, but bytes the registry counts" * 100
    layer_digest = client.put_blob(repo, layer)
    config_digest = client.put_blob(repo, EMPTY_JSON)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": EMPTY_JSON_TYPE, "digest": config_digest, "size": 2},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                                       "size": len(layer)}]}).encode()
    digest = client.put_manifest(repo, "abc-2.13", manifest, OCI_MANIFEST)
    stored = verdict("pytorch-cpu:2.13", [test(SHM, "passed"), test(BUSBW, "skipped", skip=NO_GPU)], digest=digest)
    del stored["size_bytes"]
    stored.update(schema=4, groups=sorted({t["group"] for t in stored["tests"]}),
                  defined_tests=[t["id"] for t in stored["tests"]], selection={"expression": None, "deselected": []})
    signing.attest(client, repo, digest, stored)
    forged = client.put_manifest(repo, "forged-2.13", manifest.replace(b'"schemaVersion": 2', b'"schemaVersion":  2'),
                                 OCI_MANIFEST)
    signing.attest(client, repo, forged, dict(stored, digest=forged), key=signing.ATTACKER)
    client.put_manifest(repo, "novalidation-2.13", manifest.replace(b'"schemaVersion": 2', b'"schemaVersion":2'),
                        OCI_MANIFEST)

    fetched = fetch_verdicts({"pytorch-cpu:2.13": f"{host}/{repo}:abc-2.13",
                              "tensorflow-cpu:2.21": f"{host}/{repo}:never-built-2.21",
                              "pytorch-ngc:25.10": f"{host}/{repo}:novalidation-2.13",
                              "pytorch-cuda:2.13": f"{host}/{repo}:forged-2.13"}, signing.trusted())
    by_cell = {v["cell"]: v for v in fetched}
    assert by_cell["pytorch-cpu:2.13"]["digest"] == digest and by_cell["pytorch-cpu:2.13"]["size_bytes"] == len(layer)
    assert by_cell["pytorch-cpu:2.13"]["result"] == "passed"
    assert by_cell["pytorch-cpu:2.13"]["schema"] == 4     # a signed schema-4 verdict is read as it was signed
    missing = by_cell["tensorflow-cpu:2.21"]
    assert missing["missing"] is True and "no image" in missing["reason"]
    unvalidated = by_cell["pytorch-ngc:25.10"]
    assert unvalidated["missing"] is True and "has no verdict" in unvalidated["reason"]
    untrusted = by_cell["pytorch-cuda:2.13"]      # signed, but by nobody the repository trusts
    assert untrusted["missing"] is True and "untrusted key" in untrusted["reason"]
    rows = build_report([parse_verdict(v, "registry") for v in fetched])
    assert [r.cell for r in rows.rows][-1] == "pytorch-cpu:2.13"  # failures first
    assert {r.cell: r.result for r in rows.rows}["tensorflow-cpu:2.21"] == "failed"
    assert "no image" in rows.rows[0].checks["image/verdict"].message or any(
        "no image" in r.checks["image/verdict"].message for r in rows.rows if r.cell == "tensorflow-cpu:2.21")


def test_a_schema_4_verdict_renders_as_a_schema_5_one_does_but_for_the_platform_it_records() -> None:
    """The report reads the schema before the current one: the same night written as schema 4 (what
    tonight() writes) or as schema 5 (naming the native linux/amd64 platform) gives the same pages, but
    for the platform column the schema-5 verdicts fill (schema 4 records none: no column, as before)."""
    as_5 = [verdict(v["cell"], v["tests"], digest=v["digest"], started=v["started"], figures=v["figures"],
                    gpus=[g["name"] for g in v["runner"]["gpus"]], schema=5) for v in tonight()]
    assert [v["schema"] for v in as_5] == [5, 5, 5] and [v["schema"] for v in tonight()] == [4, 4, 4]
    pages = [(render_html(report), render_markdown(report)) for report in (
        build_report([parse_verdict(v, "x") for v in tonight()]), build_report([parse_verdict(v, "x") for v in as_5]))]
    (html_4, md_4), (html_5, md_5) = pages
    assert "platform" not in html_4.split("<tbody>")[0].split("<table")[1] and "| platform |" not in md_4
    assert html_5.count('<td class="platform">linux/amd64</td>') == 3 and md_5.count(" linux/amd64 |") == 3
    without_column = (html_5.replace('<th class="platform">platform</th>', "")
                      .replace(' data-platform="linux/amd64"', "").replace('<td class="platform">linux/amd64</td>', ""),
                      md_5.replace("| image | platform |", "| image |").replace(" linux/amd64 |", "")
                      .replace("|---|", "|", 1))
    assert without_column == (html_4, md_4) and "8 GPU (NVIDIA H100 80GB HBM3), driver 580.65" in html_5


def test_a_missing_record_of_the_old_form_is_still_read_and_nothing_else_of_schema_1(tmp_path: Path) -> None:
    """Before typed verdicts `report --fetch` saved an image without a verdict as a schema-1 pseudo-verdict;
    the nightly keeps the previous night's folder, so that form is read (a failed row naming why)."""
    old = {"schema": 1, "digest": "", "image": "r/x:abc", "cell": "tensorflow-cpu:2.21", "result": "failed",
           "started": "", "duration_s": None, "tests": [{"id": "image/verdict", "group": "pipeline", "result": "failed",
                                                         "duration_s": None, "message": "no image r/x:abc",
                                                         "skip_reason": ""}]}
    [row] = build_report([parse_verdict(old, "old.json")]).rows
    assert row.result == "failed" and row.checks["image/verdict"].message == "no image r/x:abc"
    assert row.runner is None and "| `tensorflow-cpu:2.21` | ❌ **FAIL**" in render_markdown(build_report([row]))
    (tmp_path / "c.verdict.json").write_text(json.dumps(dict(old, tests=[test(SHM, "passed")])))
    with pytest.raises(UserError, match=r"c\.verdict\.json: unsupported verdict schema 1 "):
        load_verdicts(tmp_path)


def test_the_cold_start_of_each_image_is_shown_where_it_is_known() -> None:
    """What the first import cost on the runner (a cold page cache after a pull) is a figure of the
    image in both pages; a verdict without it (older, or the import hung) shows none."""
    verdicts = tonight()
    verdicts[0]["cold_start"] = {"image": "x", "seconds": 56.0, "cpu_s": 9.1, "read_bytes": 1_700_000_000,
                                 "imports": [{"module": "tensorflow", "seconds": 54.7, "read_bytes": 1_650_000_000,
                                              "rchar": 0, "error": ""}], "error": ""}
    report = build_report([parse_verdict(v, "x") for v in verdicts])
    shown = "import tensorflow 54.7 s, 1650 MB read"
    assert f"cold start: {shown}" in render_html(report)
    assert f"| `{verdicts[0]['cell']}` | cold start | {shown} |" in render_markdown(report)
    assert [r.cold_start for r in report.rows].count("") == len(verdicts) - 1


def test_a_check_that_passed_last_night_and_was_not_run_tonight_is_no_unchanged_night() -> None:
    """A GPU check that passed the previous night and was skipped tonight (no GPU), or a check gone from tonight's
    verdict, changed no result to `failed` nor from it: the trend said "No change since the previous night". Now
    both are listed as not run tonight, and the night is not called unchanged."""
    before = verdict("pytorch-ngc:25.10", [test(SHM, "passed"), test(DDP, "passed"), test(BUSBW, "passed")],
                     gpus=["NVIDIA H100 80GB HBM3"] * 2)
    now = verdict("pytorch-ngc:25.10", [test(SHM, "passed"), test(BUSBW, "skipped", skip=NO_GPU)],
                  started="2026-11-30T02:00:00")
    report = build_report([parse_verdict(now, "now")], [parse_verdict(before, "before")])
    assert [(t.check, t.now) for t in report.not_run] == [(DDP, "absent"), (BUSBW, "skipped")]
    md, page = render_markdown(report), render_html(report)
    assert "No change since the previous night" not in md and "<li>no change</li>" not in page
    assert f"- ⏭️ `pytorch-ngc:25.10` `{BUSBW}` (skipped)" in md and f"- ⏭️ `pytorch-ngc:25.10` `{DDP}` (absent)" in md
    assert f"not run tonight (skipped): pytorch-ngc:25.10 <code>{BUSBW}</code>" in page


def test_a_check_that_failed_last_night_and_was_not_run_tonight_is_named_not_unchanged() -> None:
    """A check that failed the previous night and is gone from tonight's verdict (or skipped) is not known to be
    fixed: the trend said "No change since the previous night" and the failure vanished from the report. Now it
    is listed as failed the previous night, not run tonight; a previous missing record's failure is not."""
    before = verdict("pytorch-ngc:25.10", [test(SHM, "passed"), test(DDP, "failed", "loss did not fall"),
                                           test(BUSBW, "failed", "below floor")], gpus=["NVIDIA H100 80GB HBM3"] * 2)
    now = verdict("pytorch-ngc:25.10", [test(SHM, "passed"), test(BUSBW, "skipped", skip=NO_GPU)],
                  started="2026-11-30T02:00:00")
    report = build_report([parse_verdict(now, "now")], [parse_verdict(before, "before")])
    assert [(t.check, t.before, t.now) for t in report.failed_not_run] == [(DDP, "failed", "absent"),
                                                                           (BUSBW, "failed", "skipped")]
    assert report.not_run == [] and report.fixed == []
    md, page = render_markdown(report), render_html(report)
    assert "No change since the previous night" not in md and "<li>no change</li>" not in page
    assert "### Failed the previous night, not run tonight (not known to be fixed)" in md
    assert f"- ❌ `pytorch-ngc:25.10` `{DDP}` (absent)" in md and f"- ❌ `pytorch-ngc:25.10` `{BUSBW}` (skipped)" in md
    assert (f"failed the previous night, not run tonight (absent; not known to be fixed): pytorch-ngc:25.10 "
            f"<code>{DDP}</code>") in page
    missing = {"missing": True, "cell": "pytorch-ngc:25.10", "image": "r/pytorch-ngc-dev:x", "reason": "no image"}
    assert build_report([parse_verdict(now, "now")], [parse_verdict(missing, "before")]).failed_not_run == []


def test_an_image_of_the_previous_night_with_no_row_tonight_is_named_not_unchanged() -> None:
    """An image the previous night reported (here with a failing check) that has no verdict and no missing record
    tonight (validate wrote none for it, or its platform is gone) vanished from the report, and the trend said "No
    change since the previous night". Now it is named; a cell whose only image recorded no platform (schema 4) is
    accounted for by its rows tonight."""
    two = ("sha256:" + "34" * 32, "sha256:" + "56" * 32)
    before = [verdict("pytorch-cpu:2.13", [test(SHM, "passed")]),
              verdict("tensorflow-cpu:2.21", [test(TB, "failed", "no plugin")], digest=two[0], schema=5),
              {**verdict("tensorflow-cpu:2.21", [test(TB, "passed")], digest=two[1], schema=5),
               "platform": "linux/arm64", "emulated": True}]
    now = [verdict("pytorch-cpu:2.13", [test(SHM, "passed")], started="2026-11-30T02:00:00", schema=5),
           verdict("tensorflow-cpu:2.21", [test(TB, "passed")], digest=two[0], started="2026-11-30T02:00:00",
                   schema=5)]
    report = build_report([parse_verdict(v, "now") for v in now], [parse_verdict(v, "before") for v in before])
    assert [(row.cell, row.platform, row.result) for row in report.gone] == [
        ("tensorflow-cpu:2.21", "linux/arm64", "passed")]
    md, page = render_markdown(report), render_html(report)
    assert "No change since the previous night" not in md and "<li>no change</li>" not in page
    assert ("- ❌ `tensorflow-cpu:2.21` on linux/arm64 (emulated) (was passed): no verdict and no missing record "
            "tonight") in md
    assert ("in the previous night's report, not in tonight's (was passed; no verdict and no missing record "
            "tonight): tensorflow-cpu:2.21 on linux/arm64 (emulated)") in page
    report = build_report([parse_verdict(now[0], "now")], [parse_verdict(v, "before") for v in before[:2]])
    assert [(row.cell, row.result) for row in report.gone] == [("tensorflow-cpu:2.21", "failed")]
    assert "- ❌ `tensorflow-cpu:2.21` (was failed)" not in render_markdown(report)   # it records linux/amd64
    assert "- ❌ `tensorflow-cpu:2.21` on linux/amd64 (was failed)" in render_markdown(report)


def test_a_verdict_that_says_passed_against_its_own_tests_is_no_passed_image() -> None:
    """A verdict whose `result` is `passed` while a test of it failed, pytest exited non-zero or no test passed
    (validate never writes one; a hand-made or edited verdict does) was counted as a passed image. Now its row is
    failed, the contradiction named as the failed check `image/verdict`."""
    cases = [([test(SHM, "passed"), test(DDP, "failed", "loss did not fall")], 1, "1 test(s) failed: " + DDP),
             ([test(SHM, "passed")], 2, "pytest exited with 2"),
             ([test(SHM, "skipped", skip=NO_GPU)], 0, "no test passed")]
    for tests, exit_code, why in cases:
        claimed = {**verdict("pytorch-cpu:2.13", tests), "result": "passed", "pytest_exit": exit_code}
        report = build_report([parse_verdict(claimed, "x")])
        row = report.rows[0]
        assert row.result == "failed" and report.failed_images == ["pytorch-cpu:2.13"], why
        assert row.checks["image/verdict"].message == f"the verdict says passed, but {why}"
        assert "0 images passed, 1 failed" in render_markdown(report)
    honest = parse_verdict(verdict("pytorch-cpu:2.13", [test(SHM, "passed")]), "x")
    assert honest.result == "passed" and "image/verdict" not in honest.checks


def _markdown_tables(md: str) -> list[list[list[str]]]:
    """Every table of a Markdown page, as rows of cells split the way GitHub splits them: at each `|` that no
    backslash escapes (inside code spans too)."""
    tables: list[list[list[str]]] = []
    previous = ""
    for line in md.splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])])
        previous = line
    return tables


def _assert_every_row_has_the_columns_of_its_separator(md: str) -> list[list[list[str]]]:
    tables = _markdown_tables(md)
    assert tables, md
    for table in tables:
        assert all(set(cell) <= set("-:") for cell in table[1]), table   # the line under the header
        assert [len(row) for row in table] == [len(table[1])] * len(table), table
    return tables


def test_a_pipe_in_a_verdicts_cell_or_digest_stays_in_its_table_cell() -> None:
    """A hand-made verdict file (`report --verdicts`) may hold any text: a `|` in a code span split the
    row into more cells than the header has."""
    hand_made = verdict("pytorch-ngc:25.10", [test(SHM, "passed"), test(BUSBW, "passed")],
                        digest="sha256:ab|cd" + "e" * 58, figures={"busbw_GBps": 182.4, "algbw_GBps": 97.3})
    hand_made["cell"] = "pytorch|ngc:25.10"
    md = render_markdown(build_report([parse_verdict(hand_made, "x")]))
    tables = _assert_every_row_has_the_columns_of_its_separator(md)
    rows = [row for table in tables for row in table[2:]]
    assert rows[0][:4] == ["`pytorch\\|ngc:25.10`", "✅ pass", "1.45 GB", "`sha256:ab\\|cdeeeeeee`"]
    assert all(row[0] == "`pytorch\\|ngc:25.10`" for row in rows if row[0].startswith("`"))


def test_a_report_whose_verdicts_have_no_tests_has_a_header_as_wide_as_its_table() -> None:
    """No check columns: the header had an empty fifth cell over a four-column separator (GitHub then shows no
    table)."""
    empty = verdict("pytorch-cpu:2.13", [])
    empty.update(result="failed", pytest_exit=1)
    md = render_markdown(build_report([parse_verdict(empty, "x")]))
    tables = _assert_every_row_has_the_columns_of_its_separator(md)
    assert tables[0][0] == ["image", "result", "size", "digest"]
    assert tables[0][2] == ["`pytorch-cpu:2.13`", "❌ **FAIL**", "1.45 GB", "`sha256:abababababab`"]


def test_cli_a_verdict_folder_that_is_a_file_is_named_as_one(run_cli, tmp_path: Path) -> None:
    """`--verdicts` naming a file said the folder "does not exist", which sends the user looking for a missing path."""
    (tmp_path / "verdict.json").write_text("{}")
    code, _, err = run_cli("report", "--verdicts", str(tmp_path / "verdict.json"), "--out", str(tmp_path / "o"))
    assert code == 2 and f"verdict folder {tmp_path / 'verdict.json'} is a file, not a folder; pass the folder" in err
    code, _, err = run_cli("report", "--verdicts", str(tmp_path / "none"), "--out", str(tmp_path / "o"))
    assert code == 2 and f"verdict folder {tmp_path / 'none'} does not exist; pass the folder" in err


@pytest.mark.parametrize(("registry", "trusted_dev"), [("registry.example.org:5000", False), ("127.0.0.1:5000", True)])
def test_fetch_trusts_this_machines_dev_key_only_on_a_loopback_registry(project: Path, run_cli, monkeypatch,
                                                                        tmp_path: Path, registry: str,
                                                                        trusted_dev: bool) -> None:
    """`report --fetch` trusted this machine's dev key for any registry: on a runner that holds one, a verdict in
    the shared registry signed by that key (a developer's, never a tester's) counted as the night's verdict.
    Validate, verify and release trust it on a loopback registry only; so does the report now."""
    from buildtool.attest import keys
    from buildtool.report import fetch
    from tests import signing

    dev = signing.ATTACKER.public()
    seen: list[object] = []

    def fetched(refs: dict, trusted: keys.TrustedKeys, platforms: object = None) -> list[dict]:
        seen.append(trusted)
        return [{"missing": True, "cell": cell, "image": ref, "reason": "no verdict"} for cell, ref in refs.items()]

    monkeypatch.setenv("REGISTRY", registry)
    monkeypatch.setattr(keys, "dev_public_key", lambda: dev)
    monkeypatch.setattr(fetch, "fetch_verdicts", fetched)
    code, _, err = run_cli("report", "--fetch", "--framework", "pytorch-cpu:2.13", "--verdicts",
                           str(tmp_path / "v"), "--out", str(tmp_path / "o"), "--matrix", str(project / "matrix.yaml"))
    assert code == 0, err
    [trusted] = seen
    assert isinstance(trusted, keys.TrustedKeys) and (dev.keyid in trusted.keys) is trusted_dev


def test_an_image_tonight_with_no_row_the_previous_night_is_named_not_unchanged() -> None:
    """The previous night is a night of other cells (`make nightly FRAMEWORK=...` kept a partial night): tonight's
    images it does not hold had nothing to be compared with, so pytorch-ngc's failing DDP was not newly failing, and
    the trend said "No change since the previous night". Now each is named as not compared."""
    now = [parse_verdict(v, "now") for v in tonight()]
    report = build_report(now, [parse_verdict(tonight()[0], "before")])
    assert [(row.cell, row.result) for row in report.unpaired] == [("pytorch-ngc:25.10", "failed"),
                                                                   ("tensorflow-cpu:2.21", "failed")]
    md, page = render_markdown(report), render_html(report)
    assert "No change since the previous night" not in md and "<li>no change</li>" not in page
    assert "### Not in the previous night's report (nothing to compare with)" in md
    assert "- ❌ `pytorch-ngc:25.10` (now failed): no verdict and no missing record the previous night" in md
    assert ("not in the previous night's report, nothing to compare with (now failed; no verdict and no missing "
            "record the previous night): pytorch-ngc:25.10") in page
    assert build_report(now, [parse_verdict(v, "before") for v in last_night()]).unpaired == []
    assert build_report(now).unpaired == []


@pytest.mark.parametrize(("runs", "said"), [
    ([{"count": 1, "time_per_epoch_s": None, "speedup": 1.0, "efficiency": 1.0, "backend": "gloo"}],
     "`runs[0]`.time_per_epoch_s is None, not a number"),
    ([{"count": 1, "time_per_epoch_s": 2.0, "speedup": "1x", "efficiency": 1.0, "backend": "gloo"}],
     "`runs[0]`.speedup is '1x', not a number"),
    ([{"count": 1, "time_per_epoch_s": 2.0, "speedup": 1.0, "efficiency": 1.0}], "`runs[0]` has no `backend`"),
    ({"count": 1}, "`runs` is a JSON dict, not a list")])
def test_a_scaling_file_with_a_run_the_report_cannot_show_is_exit_2_naming_it(run_cli, tmp_path: Path, runs: object,
                                                                              said: str) -> None:
    """A scaling.json whose run has a figure that is not a number (or none) ended in a traceback from the template
    (TypeError: must be real number), after the verdicts were read. Now it is one line naming the file and field."""
    folder = tmp_path / "scaling"
    folder.mkdir()
    (folder / "scaling.json").write_text(json.dumps({"title": "DDP", "runs": runs}))
    code, _, err = run_cli("report", "--verdicts", str(write(tmp_path / "now", tonight())), "--scaling", str(folder),
                           "--out", str(tmp_path / "o"))
    assert code == 2 and "Traceback" not in err, err
    assert f"{folder / 'scaling.json'}: cannot read the scaling results ({said}); run `buildtool scaling` again" in err


def test_a_gpu_cell_verdict_that_says_passed_without_its_gpu_tests_is_no_passed_image() -> None:
    """A GPU cell's verdict (it records `runner.gpus_usable`) whose `result` says passed while its GPU tests were
    skipped (no usable GPU: a GPU cell validated on a CPU runner) or ran under emulation was counted a passed image
    (release refuses it; validate writes `incomplete`). Now its row is failed, the contradiction named as the failed
    check `image/verdict`."""
    gpu_skipped = {**test(BUSBW, "skipped", skip=NO_GPU), "gpu": True}
    claimed = verdict("pytorch-ngc:25.10", [test(SHM, "passed"), gpu_skipped], schema=5)
    claimed["runner"].update(gpus_usable=False, gpu_problem="nvidia-smi not found")
    claimed["gpu_tests"] = [BUSBW]
    report = build_report([parse_verdict(claimed, "x")])
    row = report.rows[0]
    assert row.result == "failed" and report.failed_images == ["pytorch-ngc:25.10"]
    assert row.checks["image/verdict"].message == ("the verdict says passed, but 1 GPU test(s) of this GPU cell did "
                                                   "not pass on a GPU (nvidia-smi not found): "
                                                   "test_ddp_nccl_allreduce_busbw")
    assert "0 images passed, 1 failed" in render_markdown(report)
    emulated = {**claimed, "emulated": True, "tests": [test(SHM, "passed"), {**test(BUSBW, "passed"), "gpu": True}]}
    assert parse_verdict(emulated, "x").checks["image/verdict"].message == (
        "the verdict says passed, but a GPU cell's tests ran under emulation (an emulated GPU run is not a GPU run)")
    on_gpus = {**claimed, "tests": emulated["tests"]}
    on_gpus["runner"] = {**claimed["runner"], "gpus_usable": True, "gpu_problem": ""}
    assert parse_verdict(on_gpus, "x").result == "passed"
    cpu_cell = {**claimed, "runner": {**claimed["runner"], "gpus_usable": None}}   # a CPU cell: its skips are its own
    assert parse_verdict(cpu_cell, "x").result == "passed"


@pytest.mark.parametrize("field", ["floor_GBps", "baseline_GBps"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), True])
def test_a_busbw_floor_or_baseline_that_is_no_finite_number_is_refused_naming_it(field, value) -> None:
    """A NaN floor or baseline (an image's figures, JSON's NaN) compared false, so the busbw row read `ok` (passed)
    with `nan GB/s` as its floor or baseline; a bool was read as 1 GB/s."""
    import dataclasses

    from buildtool.report.nightly import busbw_rows

    figure = {"peak_GBps": 150.0, "ranks": 8, "gpu_model": "H100", "floor_GBps": 100.0, "sizes": []}
    row = parse_verdict(verdict("pytorch-cuda:2.13", [test(BUSBW, "passed")], gpus=["H100"] * 8,
                                figures={"allreduce_busbw": figure}), "x")
    # A verdict file with a NaN is refused as it is read (contracts.verdict); the report's row refuses one too.
    row = dataclasses.replace(row, figures={"allreduce_busbw": {**figure, field: value}})
    with pytest.raises(UserError, match=re.escape(f"its busbw figure's {field} {value!r} is not a finite number")):
        busbw_rows(build_report([row]))


def test_a_gpu_cell_verdict_that_says_passed_with_no_gpu_test_run_is_no_passed_image() -> None:
    """A GPU cell's `passed` verdict that defines no GPU test (validate writes `incomplete`: the cell needs a GPU but
    its groups define none), or whose skipped test marked `gpu` is left out of `gpu_tests`, was counted a passed image:
    a GPU path no GPU ran. Now its row is failed, the contradiction named."""
    claimed = verdict("pytorch-ngc:25.10", [test(SHM, "passed")], schema=5)
    claimed["runner"].update(gpus_usable=False, gpu_problem="nvidia-smi not found")
    row = parse_verdict(claimed, "x")
    assert row.result == "failed" and row.checks["image/verdict"].message == (
        "the verdict says passed, but it records no GPU test of this GPU cell (the cell needs a GPU)")
    unlisted = {**claimed, "tests": [test(SHM, "passed"), {**test(BUSBW, "skipped", skip=NO_GPU), "gpu": True}],
                "gpu_tests": [SHM]}
    assert parse_verdict(unlisted, "x").checks["image/verdict"].message == (
        "the verdict says passed, but 1 GPU test(s) of this GPU cell did not pass on a GPU (nvidia-smi not found): "
        "test_ddp_nccl_allreduce_busbw")


def test_a_megabyte_skip_reason_or_incomplete_reason_is_cut_in_the_markdown() -> None:
    """A skip reason is the image's word (image-tests skip naming what the image printed) and went into report.md
    whole: GitHub refuses a job summary over 1024k whole ("$GITHUB_STEP_SUMMARY upload aborted"), so one image could
    blank the night's summary. Now it is cut to its first line's first 300 characters, as a failure's message is."""
    reason = "the image says " + "x" * 2_000_000
    tests = [test(SHM, "passed"), test(BUSBW, "skipped", skip=reason + "\nsecond line")]
    cut = verdict("pytorch-cpu:2.13", tests)
    cut.update(result="incomplete", incomplete=["stopped early: " + "y" * 2_000_000])
    md = render_markdown(build_report([parse_verdict(cut, "x")]))
    assert len(md) < 10_000, len(md)
    assert f"- ⏭️ {reason[:300]}: `test_ddp_nccl_allreduce_busbw` (1 image)" in md
    assert "- ⚠️ `pytorch-cpu:2.13`: stopped early: " + "y" * 285 + "\n" in md


@pytest.mark.parametrize("sizes", ["8 MiB", [["8 MiB", 1.0]], [{"bytes": 8 << 20, "time_us": "fast"}],
                                   [{"bytes": 8 << 20, "busbw_GBps": True}], {"bytes": 1}])
def test_a_busbw_size_table_of_another_shape_is_refused_naming_it(run_cli, tmp_path, sizes) -> None:
    """The busbw figure's per-size table is the image's word; one that is no list of objects of numbers made the
    template raise (a str has no .get, "%.1f" of a str) out of `buildtool report`: a traceback and no report. Now a
    UserError names the verdict and the table."""
    figure = {"peak_GBps": 150.0, "ranks": 8, "gpu_model": "H100", "floor_GBps": 100.0, "sizes": sizes}
    body = verdict("pytorch-cuda:2.13", [test(BUSBW, "passed")], gpus=["H100"] * 8, figures={"allreduce_busbw": figure})
    code, _, err = run_cli("report", "--verdicts", str(write(tmp_path / "now", [body])), "--out", str(tmp_path / "o"))
    assert code == 2 and "Traceback" not in err, err
    assert "its busbw figure's sizes are not a list of objects of numbers (bytes, time_us, algbw_GBps, busbw_GBps)" \
        in err, err


def test_a_megabyte_figure_is_cut_in_the_markdown() -> None:
    """Figures are what the image's tests measured (any JSON the image wrote): a megabyte value, name or busbw GPU
    model or floor note went into report.md whole, and GitHub refuses a job summary over 1024k whole. Now each such
    cell is cut to its first 300 characters."""
    busbw = {"peak_GBps": 150.0, "ranks": 8, "gpu_model": "H" * 2_000_000, "floor_GBps": None,
             "floor_note": "n" * 2_000_000, "sizes": []}
    figures = {"allreduce_busbw": busbw, "log": "v" * 2_000_000, "k" * 2_000_000: 1.5}
    md = render_markdown(build_report([parse_verdict(verdict("pytorch-cpu:2.13", [test(SHM, "passed")],
                                                             figures=figures), "x")]))
    assert len(md) < 10_000, len(md)
    assert "| `pytorch-cpu:2.13` | log | " + "v" * 300 + " |" in md
    assert f"| 8x {'H' * 297} | 150.0 GB/s |" in md and f"| ⚠️ {'n' * 300} |" in md


def test_a_busbw_figure_with_a_link_fault_reads_failed_naming_the_fault() -> None:
    """A broken NVLink (an SXM board read as PCIe) fails the bus-bandwidth check whatever it measures, and its figure
    records the fault (`floor_fault`) with no floor; the report's bus-bandwidth table ignored the fault and showed the
    row as a warning (skipped) saying only "no floor", next to a failed check. Now the row is failed, naming it."""
    from buildtool.report.nightly import busbw_rows

    fault = "8x H100 SXM read as PCIe: GPU0-GPU1 PHB; NVLink is down: reset the GPUs or reboot the runner"
    figure = {"peak_GBps": 150.0, "ranks": 8, "gpu_model": "H100", "floor_GBps": None, "sizes": [],
              "floor_note": "no floor: H100 SXM over PCIe is a fault, not a configuration", "floor_fault": fault}
    row = parse_verdict(verdict("pytorch-cuda:2.13", [test(BUSBW, "failed", fault)], gpus=["H100"] * 8,
                                figures={"allreduce_busbw": figure}), "x")
    [found] = busbw_rows(build_report([row]))
    assert (found.status, found.verdict) == ("failed", f"link fault: {fault}")
    assert f"| ❌ link fault: {fault} |" in render_markdown(build_report([row]))


def test_json_nested_too_deeply_is_one_line_naming_the_file(run_cli, tmp_path: Path) -> None:
    """JSON nested a hundred thousand deep makes json.loads raise RecursionError, which the report did not catch: a
    verdict file (or a scaling.json, a comparison.json) anyone may drop in the nightly folder ended `buildtool report`
    with a traceback. Now it is the file's one-line error, as JSON that does not parse is."""
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "now").mkdir()
    (tmp_path / "now" / "c.verdict.json").write_text(deep)
    code, _, err = run_cli("report", "--verdicts", str(tmp_path / "now"), "--out", str(tmp_path / "o"))
    assert code == 2 and "Traceback" not in err, err
    assert f"{tmp_path / 'now' / 'c.verdict.json'}: cannot read verdict (maximum recursion depth exceeded" in err
    for name, what in (("scaling.json", "the scaling results"), ("comparison.json", "the strategies")):
        folder = tmp_path / name.split(".")[0]
        folder.mkdir()
        (folder / name).write_text(deep)
        code, _, err = run_cli("report", "--verdicts", str(write(tmp_path / f"v-{name}", tonight())), "--scaling",
                               str(folder), "--out", str(tmp_path / "o"))
        assert code == 2 and "Traceback" not in err, err
        assert f"{folder / name}: cannot read {what} (maximum recursion depth exceeded" in err, err


def test_a_pass_that_ran_a_selection_or_stopped_early_is_no_passed_image() -> None:
    """validate says `incomplete` when a selection (-k) deselected tests or a defined test neither ran nor was
    deselected (the run stopped early), and release refuses such a pass; the report counted a verdict saying
    `passed` over either as a passed image. Now its row is failed, the contradiction named."""
    selected = verdict("pytorch-cpu:2.13", [test(SHM, "passed")])
    selected["defined_tests"] = [SHM, DDP]
    selected["selection"] = {"expression": "shm", "deselected": [DDP]}
    row = parse_verdict(selected, "x")
    assert row.result == "failed" and row.checks["image/verdict"].message == (
        "the verdict says passed, but 1 of the cell's 2 tests deselected by -k 'shm'")
    stopped = verdict("pytorch-cpu:2.13", [test(SHM, "passed")])
    stopped["defined_tests"] = [SHM, DDP]
    assert parse_verdict(stopped, "x").checks["image/verdict"].message == (
        f"the verdict says passed, but 1 defined test(s) neither ran nor were deselected: {DDP}")
