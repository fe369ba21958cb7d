"""Issue 23 items 3 and 4: which rule admits a host driver for a cell (NGC forward compatibility), and
bus-bandwidth floors by exact GPU model and interconnect, compared with the median of the last nights.

The nvidia-smi outputs under fixtures/nvidia_smi/ keep nvidia-smi's shapes: `-L` lines
"GPU i: NAME (UUID: GPU-...)" and `topo -m` tab-separated, header underlined on a terminal."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from buildtool.common.errors import FailedError, MatrixError
from buildtool.contracts import busbw, driver_rules, gpu
from buildtool.contracts.verdict import SCHEMA, Gpu
from buildtool.matrix.loader import load_matrix
from buildtool.validate import probe
from tests.conftest import fixture_image_tests
from tests.signing import complete

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures" / "nvidia_smi"
REPO = HERE.parent
_LISTING = re.compile(r"^GPU (?P<index>[0-9]+): (?P<name>.+) \(UUID: GPU-[0-9a-f-]+\)$")


def listed_names(fixture: str) -> list[str]:
    lines = (FIXTURES / f"{fixture}.L.txt").read_text().splitlines()
    found = [_LISTING.match(line) for line in lines]
    assert all(found), lines
    return [m.group("name") for m in found if m]


def topo(fixture: str) -> str:
    return (FIXTURES / f"{fixture}.topo.txt").read_text()


# -- item 3: drivers ------------------------------------------------------------------------------------

H100 = "NVIDIA H100 80GB HBM3"
# (driver, CUDA the driver reports, GPU, NGC release or None for a pip cell, CUDA of the cell) -> admitted, rule
DRIVER_TABLE = [
    ("580.65.06", "13.0", H100, "25.10", "13.0", True, "supports CUDA 13.0 natively"),
    ("535.261.03", "12.2", H100, "25.10", "13.0", True, "NGC 25.10's forward-compatibility rule for data-center "
                                                         "GPUs (R535 >= 535.261"),
    ("550.163.01", "12.4", "NVIDIA A100-SXM4-80GB", "25.10", "13.0", True, "(R550 >= 550.163"),
    ("570.172.08", "12.8", "NVIDIA L40S", "25.10", "13.0", True, "(R570 >= 570.172"),
    ("570.86.15", "12.8", H100, "25.01", "12.8", True, "natively"),
    ("550.54.15", "12.4", H100, "25.01", "12.8", False, "R550 is not a forward-compatible branch for CUDA 12.8"),
    ("535.86.10", "12.2", "Tesla T4", "25.01", "12.8", True, "NGC 25.01's forward-compatibility rule"),
    ("545.23.08", "12.3", H100, "25.02", "12.8", True, "(R545 >= 545.23"),
    ("545.23.08", "12.3", H100, "25.10", "13.0", False, "R545 is not a forward-compatible branch for CUDA 13.0"),
    ("550.54.15", "12.4", H100, "25.10", "13.0", False, "needs R550 >= 550.163"),
    ("535.261.03", "12.2", "NVIDIA GeForce RTX 4090", "25.10", "13.0", False, "data-center GPUs only, and "
                                                                           "NVIDIA GeForce RTX 4090 is not one"),
    ("535.261.03", "12.2", "NVIDIA RTX A6000", "25.10", "13.0", False, "data-center GPUs only"),
    ("550.163.01", "12.4", H100, None, "13.0", False, "forward compatibility does not apply to this image"),
    ("570.172.08", "12.8", H100, None, "13.0", False, "install NVIDIA driver 580.65.06 or newer"),
]


@pytest.mark.parametrize(("driver", "reported", "model", "ngc", "cuda", "admitted", "rule"), DRIVER_TABLE)
def test_driver_table_names_the_rule(driver, reported, model, ngc, cuda, admitted, rule):
    decision = driver_rules.decide(cuda, driver, reported, [model] * 8, ngc, "amd64")
    assert decision.admitted is admitted, decision.rule
    assert rule in decision.rule
    assert decision.rule.startswith("refused: ") is not admitted


def _cell(matrix, key):
    return next(c for c in matrix.cells if c.key == key)


@pytest.fixture(scope="module")
def repo_matrix():
    return load_matrix(REPO / "matrix.yaml", REPO / "templates", display="matrix.yaml", tests_dir=REPO / "image-tests")


@pytest.mark.parametrize(("driver", "reported", "key"), [
    ("535.261.03", "12.2", "pytorch-ngc:25.10"), ("550.163.01", "12.4", "jax-ngc:25.10"),
    ("570.172.08", "12.8", "pytorch-ngc:25.10"), ("535.86.10", "12.2", "tensorflow-ngc:25.02"),
])
def test_validate_admits_datacenter_drivers_on_ngc_cells_and_says_why(repo_matrix, driver, reported, key):
    """The old check (CUDA the driver reports >= the image's) refused every one of these."""
    inventory = probe.Inventory([Gpu(index=str(i), name=H100, driver=driver) for i in range(8)], driver=driver,
                                cuda_driver=reported)
    rule = probe.check_cell_gpus(_cell(repo_matrix, key), inventory)
    assert "forward-compatibility rule for data-center GPUs" in rule and f"driver {driver} admitted" in rule


def test_validate_refuses_forward_compat_on_pip_cells_naming_the_rule(repo_matrix):
    inventory = probe.Inventory([Gpu(index="0", name=H100, driver="550.163.01")], driver="550.163.01",
                                cuda_driver="12.4")
    with pytest.raises(FailedError, match="forward compatibility does not apply to this image"):
        probe.check_cell_gpus(_cell(repo_matrix, "pytorch-cuda:2.13"), inventory)


def test_catalogue_states_the_rule_the_code_applies(repo_matrix):
    """docs/images.md says, for every NGC cell, exactly the branches the code admits."""
    from buildtool.contracts.versions import ngc_release

    text = (REPO / "docs" / "images.md").read_text()
    sections = dict(re.findall(r"(?ms)^### (\S+)\n(.*?)(?=^### |^## |\Z)", text))
    for c in repo_matrix.cells:
        if not c.needs_gpu:
            continue
        release = ngc_release(c.base)
        if release is None:
            assert "no forward compatibility" in sections[c.key], c.key
            continue
        assert driver_rules.forward_compat_summary(release) in sections[c.key], c.key
        for branch, first in driver_rules.ngc_rule(release).branches:
            decided = driver_rules.decide(c.cuda or "", first + ".01", "", [H100], release, "amd64")
            assert decided.admitted, (c.key, branch)


def test_an_ngc_release_without_a_rule_is_refused_at_load(tmp_path):
    text = (REPO / "tests" / "fixtures" / "mini" / "matrix.yaml").read_text()
    assert "tensorflow:25.02-tf2-py3" in text
    (tmp_path / "matrix.yaml").write_text(text.replace("tensorflow:25.02-tf2-py3", "tensorflow:25.03-tf2-py3"))
    with pytest.raises(MatrixError, match="NGC release 25.03 has no forward-compatibility rule"):
        load_matrix(tmp_path / "matrix.yaml", REPO / "templates", display="matrix.yaml",
                    tests_dir=fixture_image_tests())


# -- item 4: floors ---------------------------------------------------------------------------------------

# fixture -> (normalised model, interconnect, floor GB/s or None)
FLOOR_TABLE = {
    "h100_sxm": ("H100 SXM", busbw.NVLINK, 112.5),
    "h200_sxm": ("H200 SXM", busbw.NVLINK, 112.5),
    "b200": ("B200", busbw.NVLINK, 225.0),
    "a100_sxm4": ("A100 SXM4", busbw.NVLINK, 75.0),
    "h100_nvl_pair": ("H100 NVL", busbw.NVLINK, 75.0),
    "h100_nvl_bridged": ("H100 NVL", busbw.PCIE, 16.0),      # bridged pairs: the ring crosses PCIe
    "h200_nvl_pcie": ("H200 NVL", busbw.PCIE, 16.0),
    "h100_pcie": ("H100 PCIe", busbw.PCIE, 16.0),
    "l40s": ("L40S", busbw.PCIE, 8.0),
    "a100_pcie": ("A100 PCIe", busbw.PCIE, 8.0),
}


@pytest.mark.parametrize("fixture", sorted(FLOOR_TABLE))
def test_floor_by_exact_model_and_interconnect(fixture):
    model, link, floor = FLOOR_TABLE[fixture]
    names = listed_names(fixture)
    assert busbw.read_topology(topo(fixture))[0] == link
    found = busbw.floor_for(names[0], link)
    assert (found.model, found.interconnect, found.floor_GBps) == (model, link, floor)
    assert found.expected_GBps is not None and found.floor_GBps == busbw.FLOOR_FRACTION * found.expected_GBps
    assert "datasheet" in found.source and "25% of" in found.note


def test_h200_no_longer_matches_gh200_or_h200_nvl():
    """The old substring rule gave GH200 and H200 NVL (PCIe) the H200 SXM NVLink floor."""
    gh200 = busbw.floor_for(listed_names("gh200")[0], "", "one GPU: no link between GPUs", gpus=1)
    assert gh200.floor_GBps is None and gh200.note.startswith("no floor on one GPU") and "GH200" in gh200.note
    nvl = busbw.floor_for(listed_names("h200_nvl_pcie")[0], busbw.PCIE)
    assert nvl.model == "H200 NVL" and nvl.floor_GBps == 16.0


@pytest.mark.parametrize(("name", "link", "why"), [
    ("NVIDIA RTX 6000 Ada Generation", busbw.PCIE, "nvidia-smi name 'NVIDIA RTX 6000 Ada Generation' is not in"),
    ("NVIDIA L40S", "", "interconnect of L40S here is unknown"),
])
def test_unknown_model_or_interconnect_says_no_floor(name, link, why):
    found = busbw.floor_for(name, link, "topo unreadable")
    assert found.floor_GBps is None and found.note.startswith("no floor for this model") and why in found.note


def test_an_sxm_part_over_pcie_is_a_fault_not_a_missing_floor():
    """Issue 39: it was 'no floor for this model: H100 SXM over PCIe has no documented figure' (a pass with a
    note); NVLink is down there (tests/test_busbw_faults.py)."""
    found = busbw.floor_for("NVIDIA H100 80GB HBM3", busbw.PCIE, seen="GPU0-GPU1 SYS")
    assert found.floor_GBps is None and "NVLink is down" in found.fault and "GPU0-GPU1 SYS" in found.fault


@pytest.mark.parametrize(("text", "message"), [
    ("GPU0\tGPU1\n", "no GPU0 column header"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-7\nGPU1\tSOC\t X \t0-7\n", "unknown link 'SOC' between GPU0"),
    ("\tGPU0\tCPU Affinity\nGPU0\t X \t0-7\n", "needs two or more GPUs"),
])
def test_unreadable_topology_is_an_error_naming_it(text, message):
    with pytest.raises(ValueError, match=message):
        busbw.read_topology(text)


def test_inventory_reads_the_interconnect_from_a_fake_nvidia_smi(tmp_path, monkeypatch):
    from tests.gpu_sim import FakeGpus, fake_nvidia_smi

    fake_nvidia_smi(tmp_path / "bin", FakeGpus(count=4, name="NVIDIA H100 NVL", driver="580.65.06",
                                               topo=topo("h100_nvl_bridged")))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    found = probe.gpu_inventory()
    assert [g.name for g in found.gpus] == ["NVIDIA H100 NVL"] * 4 and found.interconnect == busbw.PCIE


# -- item 4: the window of nights --------------------------------------------------------------------------

def _night(tmp_path: Path, day: int, peak: float, key: str = "pytorch-ngc:25.10") -> None:
    started = f"2026-03-{day:02d}T02:00:00+00:00"
    data = {"schema": SCHEMA, "digest": "sha256:" + "a" * 64, "image": "r/x", "cell": key,
            "result": "passed", "started": started, "duration_s": 1.0, "groups": ["pytorch"],
            "runner": {"hostname": "gpu-01", "gpus": [{"index": str(i), "name": H100} for i in range(8)],
                       "driver": "580.65.06", "cuda_driver": "13.0", "gpus_usable": True},
            "figures": {gpu.BUSBW_FIGURE: {"peak_GBps": peak, "interconnect": busbw.NVLINK}},
            "tests": [{"id": "pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw", "group": "pytorch",
                       "result": "passed", "gpu": True}]}
    folder = tmp_path / f"night{day:02d}"
    folder.mkdir()
    (folder / "verdict.json").write_text(json.dumps(complete(data)))


def test_a_slow_decay_fails_against_the_median_of_seven_nights(tmp_path):
    """10% a night: each night passes against the night before (the old rule), but by night 8 the peak is
    34% below the median of the 7 nights before it."""
    peaks = [400.0 * 0.9 ** n for n in range(8)]
    for day, peak in enumerate(peaks[:7], 1):
        _night(tmp_path, day, peak)
    tonight = peaks[7]
    assert all(now >= (1 - busbw.MAX_FALL) * before for before, now in zip(peaks, peaks[1:], strict=False))
    inventory = probe.Inventory([Gpu(index=str(i), name=H100) for i in range(8)], interconnect=busbw.NVLINK)
    baseline = probe.busbw_baseline([tmp_path], "pytorch-ngc:25.10", inventory)
    assert baseline["nights"] == 7 and baseline["median_GBps"] == pytest.approx(peaks[3])
    found = busbw.problems(tonight, 112.5, "H100 SXM", baseline)
    assert found == [f"peak {tonight:.1f} GB/s fell 34% below {peaks[3]:.1f} GB/s, the median of the last 7 nights"]


def test_fewer_nights_than_the_window_use_what_exists_and_say_so(tmp_path):
    for day, peak in ((1, 400.0), (2, 300.0), (3, 280.0)):
        _night(tmp_path, day, peak)
    inventory = probe.Inventory([Gpu(index=str(i), name=H100) for i in range(8)], interconnect=busbw.NVLINK)
    baseline = probe.busbw_baseline([tmp_path], "pytorch-ngc:25.10", inventory, window=7)
    assert (baseline["nights"], baseline["median_GBps"]) == (3, 300.0)
    assert busbw.problems(200.0, None, "H100 SXM", baseline) == [
        "peak 200.0 GB/s fell 33% below 300.0 GB/s, the median of the last 3 nights (fewer than the window of 7)"]
    two = probe.busbw_baseline([tmp_path], "pytorch-ngc:25.10", inventory, window=2)
    assert (two["nights"], two["median_GBps"]) == (2, 290.0)


def test_the_window_orders_verdicts_by_time_and_leaves_out_a_time_that_does_not_parse(tmp_path):
    """Nights are placed by the time the verdicts' `started` says, parsed as release and the report parse it: as
    text 00:30+02:00 sorts after 23:00+00:00 of the day before, though it is half an hour earlier. A time that
    does not parse is no night: it is left out, and the baseline says so."""
    def night(day: int, peak: float, started: str) -> Path:
        _night(tmp_path, day, peak)
        path = tmp_path / f"night{day:02d}" / "verdict.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "started": started}))
        return path

    night(1, 100.0, "2026-06-02T00:30:00+02:00")
    newer = night(2, 50.0, "2026-06-01T23:00:00+00:00")
    inventory = probe.Inventory([Gpu(index=str(i), name=H100) for i in range(8)], interconnect=busbw.NVLINK)
    one = probe.busbw_baseline([tmp_path], "pytorch-ngc:25.10", inventory, window=1)
    assert (one["sources"], one["median_GBps"]) == ([f"{newer} (2026-06-01T23:00:00+00:00)"], 50.0)
    assert probe.busbw_baseline([tmp_path], "pytorch-ngc:25.10", inventory)["nights"] == 1   # one UTC day
    bad = night(3, 7.0, "yesterday-ish")
    baseline = probe.busbw_baseline([tmp_path], "pytorch-ngc:25.10", inventory)
    assert (baseline["nights"], baseline["peaks"]) == (1, [50.0])
    assert baseline["left_out"] == [f"{bad}: `started` 'yesterday-ish' is not an ISO 8601 time, so the verdict "
                                    "cannot be placed in a night"]
    assert busbw.problems(30.0, None, "H100 SXM", baseline) == [
        "peak 30.0 GB/s fell 40% below 50.0 GB/s, the median of the last 1 night (fewer than the window of 7); "
        f"1 earlier verdict left out: {baseline['left_out'][0]}"]


def test_the_window_reads_the_size_the_report_adds_by_the_reports_rule(tmp_path):
    """`size_bytes` (what `report --fetch` adds) must be an integer or null: the report refuses a file with
    "12", and validate's baseline used that file as a night. One rule for both: it is left out, and named."""
    from buildtool.common.errors import UserError
    from buildtool.report.verdict_files import load_verdicts

    for day, size in ((1, 12), (2, "12")):
        _night(tmp_path, day, 300.0 + day)
        path = tmp_path / f"night{day:02d}" / "verdict.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "size_bytes": size}))
    inventory = probe.Inventory([Gpu(index=str(i), name=H100) for i in range(8)], interconnect=busbw.NVLINK)
    baseline = probe.busbw_baseline([tmp_path], "pytorch-ngc:25.10", inventory)
    bad = tmp_path / "night02" / "verdict.json"
    assert (baseline["nights"], baseline["peaks"]) == (1, [301.0])
    assert baseline["left_out"] == [f"{bad}: `size_bytes` (the image size the report adds) must be an integer or "
                                    "null, not '12'"]
    with pytest.raises(UserError, match=re.escape(baseline["left_out"][0])):
        load_verdicts(tmp_path)


def test_report_shows_the_window_comparison_and_a_missing_floor():
    from buildtool.report.nightly import Busbw

    decayed = Busbw(cell="pytorch-ngc:25.10", gpus="8x H100", peak_GBps=191.3, floor_GBps=112.5,
                    previous_GBps=291.6, change=191.3 / 291.6 - 1, sizes=[], nights=7)
    assert decayed.verdict == "fell 34% below the median of 7 nights" and decayed.status == "failed"
    nofloor = Busbw(cell="pytorch-ngc:25.10", gpus="8x GH200", peak_GBps=50.0, floor_GBps=None, previous_GBps=None,
                    change=None, sizes=[], floor_note="no floor for this model: nvidia-smi name 'X' is not in ...")
    assert nofloor.verdict.startswith("no floor for this model") and nofloor.status == "skipped"


@pytest.mark.parametrize(("driver", "admitted"), [("535.261.03", True), ("535.104.05", False), ("545.23.08", False)])
def test_ngc_25_10_decisions_say_their_minimums_are_unverified(driver: str, admitted: bool) -> None:
    """Issue 49: no NVIDIA page read here states CUDA 13's forward-compatibility minimums (searched: NVIDIA's
    Forward Compatibility guide, NGC 25.10 release notes; only SGLang 25.10's, which prints the 12.8-era list).
    Every decision by NGC 25.10's rule says so; NGC 25.01's, verified, do not."""
    decided = driver_rules.decide("13.0", driver, "12.2", [H100], "25.10", "amd64")
    assert decided.admitted is admitted
    assert decided.rule.endswith("(NGC 25.10's forward-compatibility minimums (R535 >= 535.261, R550 >= 550.163, "
                                 "R570 >= 570.172) are unverified: no NVIDIA page read here states them (NVIDIA's "
                                 "Forward Compatibility guide names none for CUDA 13; SGLang 25.10's notes print the "
                                 "CUDA 12.8-era list); confirm them in that release's Driver Requirements before "
                                 "relying on them)")
    assert "minimums unverified" in driver_rules.forward_compat_summary("25.10")
    old = driver_rules.decide("12.8", "535.86.10", "12.2", [H100], "25.01", "amd64")
    assert old.admitted and "unverified" not in old.rule and "unverified" not in driver_rules.forward_compat_summary(
        "25.01")


@pytest.mark.parametrize(("driver", "reported", "named"), [
    ("N/A", "", "the driver version 'N/A'"),
    ("N/A", "N/A", "the driver version 'N/A' and the CUDA version 'N/A'"),
    ("570.86.15", "[N/A]", "the CUDA version '[N/A]'"),
])
def test_a_driver_version_that_is_not_a_version_is_refused_not_a_traceback(driver: str, reported: str, named: str):
    """A runner whose driver just broke: nvidia-smi says N/A. decide() raised IndexError on the NGC path."""
    for ngc in ("25.01", None):
        decision = driver_rules.decide("12.8", driver, reported, ["NVIDIA H100 80GB HBM3"], ngc, "amd64")
        assert not decision.admitted
        assert decision.rule.startswith(f"refused: nvidia-smi reported {named}, not a version, so CUDA 12.8 cannot")


@pytest.mark.parametrize("peak", [float("nan"), float("inf"), True])
def test_a_busbw_peak_that_is_no_finite_figure_is_no_peak(peak):
    """Before: a verdict's peak_GBps of NaN or Infinity (json reads both) or true was a peak, so one such earlier
    verdict made the window's median NaN (the fall check then compares nothing) or Infinity; now it is none."""
    assert gpu.busbw_peak({gpu.BUSBW_FIGURE: {"peak_GBps": peak}}) is None
    assert gpu.busbw_peak({gpu.BUSBW_FIGURE: {"peak_GBps": 360}}) == 360.0


@pytest.mark.parametrize(("text", "message"), [
    ("\tGPU0\tGPU1\nGPU0\t X \t X \nGPU1\t X \t X \n", "unknown link 'X' between GPU0 and GPU1 in"),
    ("\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU0\t X \tNV18\n", "`nvidia-smi topo -m` lists the GPU rows GPU0, GPU0 for the "
                                                        "GPU columns GPU0, GPU1"),
])
def test_a_garbled_topology_matrix_is_an_error_not_nvlink(text, message):
    """Before: X (a GPU's link to itself) between two GPUs, or one GPU's row twice for another's, was read as NVLink
    between all pairs (a garbled matrix passing for the fast interconnect); now it is an error naming it."""
    with pytest.raises(ValueError, match=re.escape(message)):
        busbw.read_topology(text)

@pytest.mark.parametrize("link", ["NV18", "PIX", "SYS"])
def test_a_gpus_link_to_itself_that_is_not_x_is_an_error(link):
    """Before: a link on the diagonal (a GPU's cell for itself, always X) was read as a link: NV18 there passed, PIX
    there counted GPU0-GPU0 as a pair joined only through PCIe; a matrix that garbled is now an error naming it."""
    text = f"\tGPU0\tGPU1\nGPU0\t {link} \tNV18\nGPU1\tNV18\t X \n"
    message = f"GPU0's link to itself is {link!r}, not X, in `nvidia-smi topo -m`"
    with pytest.raises(ValueError, match=re.escape(message)):
        busbw.read_topology(text)



def test_the_window_compares_only_nights_on_the_same_gpus_not_the_same_first_gpu(tmp_path):
    """Before: an earlier night counted when its runner's first GPU and GPU count matched, so nights on 8x H100 were
    the baseline of 7x H100 and an L40S (a ring as slow as its L40S); now every GPU's model must match."""
    for day, peak in ((1, 400.0), (2, 380.0)):
        _night(tmp_path, day, peak)
    mixed = probe.Inventory([Gpu(index=str(i), name=H100) for i in range(7)] + [Gpu(index="7", name="NVIDIA L40S")],
                            interconnect=busbw.PCIE)
    assert probe.busbw_baseline([tmp_path], "pytorch-ngc:25.10", mixed) == {}
    same = probe.Inventory([Gpu(index=str(i), name=H100) for i in range(8)], interconnect=busbw.NVLINK)
    assert probe.busbw_baseline([tmp_path], "pytorch-ngc:25.10", same)["nights"] == 2


@pytest.mark.parametrize("peak", [float("nan"), float("inf")])
def test_a_peak_that_is_no_finite_number_fails_never_passes(peak):
    """ddp_train.py's table reaches validate as JSON, which reads NaN and Infinity: a NaN peak (a GPU returning
    garbage timings) is below no floor and has fallen from no median, and Infinity is above every floor, so
    test_ddp_nccl_allreduce_busbw passed either with no measurement at all."""
    baseline = {"median_GBps": 300.0, "nights": 7, "window": 7}
    assert busbw.problems(peak, 112.5, "H100 SXM", baseline) == [
        f"peak {peak} GB/s is no measurement (not a finite number of GB/s)"]


def test_a_night_whose_verdict_does_not_parse_is_left_out_named_not_silently(tmp_path):
    """A night's verdict file cut short (a full disk, a hand edit) or of a read schema but malformed was passed over
    in silence: the baseline quietly lost that night (the report refuses the same file naming it). Now it is left out
    and named, as a `started` that does not parse is; a missing record (no verdict) still is no night, unnamed."""
    for day, peak in ((1, 300.0), (2, 310.0), (3, 320.0)):
        _night(tmp_path, day, peak)
    cut = tmp_path / "night02" / "verdict.json"
    cut.write_text(cut.read_text()[:40])
    malformed = tmp_path / "night03" / "verdict.json"
    malformed.write_text(json.dumps({**json.loads(malformed.read_text()), "verdict": "passed"}))
    (tmp_path / "night04").mkdir()
    (tmp_path / "night04" / "verdict.json").write_text(json.dumps({"missing": True, "cell": "pytorch-ngc:25.10",
                                                                   "image": "r/x", "reason": "no image"}))
    inventory = probe.Inventory([Gpu(index=str(i), name=H100) for i in range(8)], interconnect=busbw.NVLINK)
    baseline = probe.busbw_baseline([tmp_path], "pytorch-ngc:25.10", inventory)
    assert (baseline["nights"], baseline["peaks"]) == (1, [300.0])
    assert [line.split(":")[0] for line in baseline["left_out"]] == [str(cut), str(malformed)]
    assert baseline["left_out"][0].startswith(f"{cut}: cannot read verdict (")
    assert baseline["left_out"][1] == (f"{malformed}: malformed schema-{SCHEMA} verdict: `verdict` is not a field of "
                                       "this schema")


def test_a_night_whose_verdict_is_nested_too_deeply_is_left_out_named(tmp_path):
    """JSON nested a hundred thousand deep makes json.loads raise RecursionError, which the baseline did not catch:
    one such file in the history ended every validation of a GPU cell with a traceback. Now it is left out, named."""
    _night(tmp_path, 1, 300.0)
    (tmp_path / "night02").mkdir()
    deep = tmp_path / "night02" / "verdict.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    inventory = probe.Inventory([Gpu(index=str(i), name=H100) for i in range(8)], interconnect=busbw.NVLINK)
    baseline = probe.busbw_baseline([tmp_path], "pytorch-ngc:25.10", inventory)
    assert (baseline["nights"], baseline["peaks"]) == (1, [300.0])
    assert baseline["left_out"][0].startswith(f"{deep}: cannot read verdict (maximum recursion depth exceeded")
