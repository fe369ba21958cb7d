"""Under QEMU an image's processes run several times slower (the matrix's validate.emulation_factor): the
image's deadline stretches by it, and so do the probes' own fixed bounds. Before, tb_query.py waited a fixed
60 s for TensorBoard and 30 s for each frontend file, so an arm64 image validated on an amd64 runner failed its
profiler checks with "no answer" on a busy machine, while its deadline had hours left."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.contracts import platforms
from buildtool.validate.containers import Resolved
from buildtool.validate.options import Options
from buildtool.validate.probe import Inventory
from buildtool.validate.run_plan import RunPlan
from buildtool.validate.targets import build_target, expectations
from tests.conftest import REPO, fixture_matrix

MATRIX = fixture_matrix()
CPU = dataclasses.replace(next(c for c in MATRIX.cells if c.key == "pytorch-cpu:2.13"), emulation_factor=8)
TB_QUERY = REPO / "image-tests" / "scripts" / "tb_query.py"


def _target_for(platform: str):
    image = Resolved("reg/pytorch-cpu-dev:x", "reg/pytorch-cpu-dev@sha256:" + "1" * 64, "sha256:" + "1" * 64, "reg",
                     "pytorch-cpu-dev", {}, {}, platform=platform)
    plan = RunPlan(image.ref, image, CPU, MATRIX, Options(), Inventory([]), flags=[], run_id="r1", deadline_s=90.0)
    return build_target(plan, {}, 60.0, {**expectations(CPU, {}), "labels": []})


def test_the_target_of_an_emulated_image_carries_its_emulation_factor_and_a_native_one_1() -> None:
    native = platforms.host().name
    other = next(name for name in platforms.KNOWN if platforms.emulated(name))
    assert _target_for(other).slowdown == 8
    assert _target_for(native).slowdown == 1


def _late_tensorboard(folder: Path, delay_s: float) -> None:
    """A `tensorboard` command that starts answering only `delay_s` seconds after it started."""
    script = folder / "tensorboard"
    script.write_text(f"""#!{sys.executable}
import http.server, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
time.sleep({delay_s})
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{{}}")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Answer).serve_forever()
""")
    script.chmod(0o755)


def _query(tmp_path: Path, slowdown: str) -> dict:
    out = tmp_path / f"out-{slowdown}"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(PATH=f"{tmp_path}{os.pathsep}{env.get('PATH', '')}", IMAGETEST_OUT=str(out), IMAGETEST_SLOWDOWN=slowdown)
    subprocess.run([sys.executable, str(TB_QUERY), "--logdir", str(tmp_path / "logs"), "--mode", "listing",
                    "--timeout", "1"], env=env, cwd=TB_QUERY.parent, capture_output=True, timeout=60, check=True)
    return json.loads((out / "result.json").read_text())


def test_tb_query_stretches_its_wait_for_tensorboard_by_the_slowdown(tmp_path: Path) -> None:
    _late_tensorboard(tmp_path, 2.5)
    native = _query(tmp_path, "1")
    assert native["started"] is False and "did not answer within 1s of starting" in native["error"]
    emulated = _query(tmp_path, "8")
    assert emulated["started"] is True and emulated["plugins"] == {}


@pytest.mark.parametrize("value", ["", "abc", "0", "-1", "1.5", "8\n", "\u0668", "101"])
def test_tb_query_refuses_a_slowdown_that_is_no_factor_naming_it(tmp_path: Path, value: str) -> None:
    """$IMAGETEST_SLOWDOWN garbage was a ValueError traceback ("abc", "1.5"), a wait of no time or a negative one
    ("0", "-1": every bound multiplied by it), or 1 ("" read as unset); now tb_query exits 2 with one line naming
    the variable and its value."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(IMAGETEST_OUT=str(tmp_path), IMAGETEST_SLOWDOWN=value)
    proc = subprocess.run([sys.executable, str(TB_QUERY), "--logdir", str(tmp_path / "logs"), "--mode", "listing",
                           "--timeout", "1"], env=env, cwd=TB_QUERY.parent, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"tb_query.py: IMAGETEST_SLOWDOWN={value!r} is not a whole number from 1 to 100 (how many "
                           "times slower than native the image runs; the harness sets it from the target's slowdown)\n")
    assert not (tmp_path / "result.json").exists()
