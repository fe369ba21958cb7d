"""A build log never keeps the host's index credentials: not the cell's log, not the copy kept by image."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from buildtool.imagebuild import engine
from buildtool.imagebuild.pipconfig import HostPip

TOKEN = "s3cr3tTOKEN"
INDEX = f"https://user:{TOKEN}@pkgs.example.invalid/simple"
IMAGE = "sha256:" + "7" * 64


def test_the_log_kept_by_image_is_scrubbed_as_the_cells_log_is(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """pip echoes the index URL it was given into the build output: the builder scrubs the token from the cell's
    log, and the copy engine.build keeps under by-image/<id>.log (the log a later push's provenance reads) was
    made from the scrubbed log, never from the raw one."""
    from buildtool.imagebuild import builder
    from buildtool.matrix.loader import load_matrix
    from buildtool.matrix.plan import Settings, plan_cell

    root = Path(__file__).resolve().parents[1]
    cell = next(c for c in load_matrix(root / "matrix.yaml").cells if c.key == "pytorch-cpu:2.13")
    settings = Settings(registry="127.0.0.1:5999/team")
    plan = plan_cell(cell, settings, "nightly-1")
    run = builder.Builder(root, "matrix.yaml", settings, "nightly-1", builder.BuildOptions(log_dir=tmp_path), print)

    def fake_run(argv, **kwargs):  # noqa: ANN001, ANN003, ANN202
        Path(argv[argv.index("--iidfile") + 1]).write_text(IMAGE)
        kwargs["stdout"].write(f"#9 1.20 Looking in indexes: {INDEX}\n")
        return subprocess.CompletedProcess(argv, 0)

    client = engine.BuildClient(("client-stand-in", "build"), (), "classic")
    monkeypatch.setattr(engine.subprocess, "run", fake_run)
    monkeypatch.setattr(builder.Builder, "_build_env",
                        lambda self: (client, SimpleNamespace(files={}), HostPip(index_url=INDEX)))
    monkeypatch.setattr(builder, "build_labels", lambda *args: {})
    base = SimpleNamespace(ref="127.0.0.1:5000/library/debian:bookworm-slim", pinned="b@sha256:" + "b" * 64,
                           digest="sha256:" + "b" * 64)
    log = tmp_path / "pytorch-cpu-2.13.log"
    assert run._buildkit(plan, base, "sha256:" + "f" * 64, log, None) == IMAGE   # type: ignore[arg-type]
    kept = engine.image_record(tmp_path, IMAGE)
    assert kept is not None and kept[1].is_file()
    for text in (log.read_text(), kept[1].read_text(), kept[0].read_text()):
        assert TOKEN not in text
    assert "Looking in indexes: https://user:****@pkgs.example.invalid/simple" in kept[1].read_text()


def test_a_stand_in_builds_log_kept_by_image_is_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in builds of `buildtool bases` run the same engine.build: their by-image copies (both the build
    and its labelled rebuild) hold no index token either."""
    from buildtool.imagebuild import bases, pipconfig
    from buildtool.matrix.loader import load_matrix

    root = Path(__file__).resolve().parents[1]
    cell = next(c for c in load_matrix(root / "matrix.yaml").cells if c.key == "pytorch-ngc:25.10")

    def fake_run(argv, **kwargs):  # noqa: ANN001, ANN003, ANN202
        Path(argv[argv.index("--iidfile") + 1]).write_text(IMAGE)
        kwargs["stdout"].write(f"#9 1.20 Looking in indexes: {INDEX}\n")
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(engine.subprocess, "run", fake_run)
    monkeypatch.setattr(engine, "resolve_build_client",
                        lambda: engine.BuildClient(("client-stand-in", "build"), (), "classic"))
    monkeypatch.setattr(engine, "run_output", lambda *args, **kwargs: "3.11\n")
    monkeypatch.setattr(pipconfig.HostPip, "from_host", classmethod(lambda cls: HostPip(index_url=INDEX)))
    monkeypatch.setattr(bases, "pip_secrets", lambda host: contextlib.nullcontext(SimpleNamespace(files={})))
    log = tmp_path / "base-standin.log"
    bases._build_standin(cell, "FROM scratch\n", {}, "127.0.0.1:5000/nvidia/pytorch:25.10-py3", log)
    kept = engine.image_record(tmp_path, IMAGE)
    assert kept is not None and kept[1].is_file()
    assert "Looking in indexes: https://user:****@pkgs.example.invalid/simple" in kept[1].read_text()
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert TOKEN not in path.read_text(), path


def test_a_stand_ins_framework_pin_is_read_as_pip_reads_it() -> None:
    """`torch[opt]==2.13.0` pins torch: the stand-in's framework label is 2.13.0, not `unknown`."""
    from dataclasses import replace

    from buildtool.imagebuild import bases
    from buildtool.matrix.loader import load_matrix

    root = Path(__file__).resolve().parents[1]
    cell = next(c for c in load_matrix(root / "matrix.yaml").cells if c.key == "tensorflow-ngc:25.02")
    assert cell.standin is not None
    standin = cell.standin.model_copy(update={"requirements": ["tensorflow-cpu[and-cuda] == 2.21.0"],
                                              "platform_requirements": {}})
    assert bases.standin_framework_version(replace(cell, standin=standin)) == "2.21.0"


@pytest.mark.parametrize(("url", "printed"), [
    # uv's "Failed to fetch" line (measured with uv 0.x): the query as given, percent-encoding and all.
    ("https://pkgs.example/simple?token=ab%2Bcd123", "Failed to fetch: https://pkgs.example/simple/numpy/?token=ab%2Bcd123"),
    # An Azure SAS-like signature: base64 with `+`, `/` and `=` percent-encoded or `+` as written.
    ("https://pkgs.example/simple?sv=1&sig=Ab+Cd%2FEf%3D", "GET https://pkgs.example/simple/x/?sv=1&sig=Ab+Cd%2FEf%3D"),
])
def test_a_query_token_is_scrubbed_as_it_is_written_not_only_decoded(tmp_path: Path, url: str, printed: str) -> None:
    """secret_strings took a query's values decoded as a form (parse_qsl: `%2B` to `+`, `+` to a space), never as
    written: uv and pip print the URL as given, so `?token=ab%2Bcd123` stayed whole in the build log."""
    from buildtool.imagebuild.cell_inputs import scrub_log, secret_strings

    log = tmp_path / "build.log"
    log.write_text(printed + "\n")
    scrub_log(log, secret_strings(HostPip(extra_index_urls=(url,))))
    assert log.read_text().rstrip("\n").endswith("=****"), log.read_text()


def test_an_index_url_that_does_not_parse_is_still_scrubbed_not_a_traceback(tmp_path: Path) -> None:
    """secret_strings split each index URL with urlsplit, which refuses a malformed host (`[` of an IPv6 address
    left open) with ValueError: an extra index so written (left out of uv's settings as unreachable) ended each
    cell's build in that traceback, and a failed `make lock` lost its one line to it."""
    from buildtool.imagebuild.cell_inputs import scrub_log, secret_strings

    url = "https://u:tok123@[fd00::1/simple?token=zzzz1"
    log = tmp_path / "build.log"
    log.write_text(f"Looking in indexes: {url}\n")
    scrub_log(log, secret_strings(HostPip(extra_index_urls=(url,))))
    assert log.read_text() == "Looking in indexes: https://u:****@[fd00::1/simple?token=****\n"


def test_a_scrub_cut_short_leaves_the_old_log_whole_and_a_clean_log_is_not_rewritten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """scrub_log rewrote the log in place after every build: a rewrite cut short (a full disk, a kill) left it
    truncated, and a later push's provenance reads that log (it could say the apt step never ran). The log is
    rewritten atomically now, and only when scrubbing changed it; it stays private (0600)."""
    from buildtool.imagebuild.cell_inputs import scrub_log, secret_strings
    from tests.torn_writes import torn_writes

    secrets = secret_strings(HostPip(extra_index_urls=(INDEX,)))
    log = tmp_path / "build.log"
    clean = "#5 [3/9] RUN apt-get install -y --no-install-recommends curl\n" * 50
    log.write_text(clean)
    log.chmod(0o600)
    with torn_writes(monkeypatch):
        scrub_log(log, secrets)   # nothing to scrub: not rewritten, so nothing to cut short
    assert log.read_text() == clean
    log.write_text(clean + f"Looking in indexes: {INDEX}\n")
    with torn_writes(monkeypatch), pytest.raises(OSError):
        scrub_log(log, secrets)
    assert log.read_text() == clean + f"Looking in indexes: {INDEX}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["build.log"]
    scrub_log(log, secrets)
    assert log.read_text() == clean + "Looking in indexes: https://user:****@pkgs.example.invalid/simple\n"
    assert log.stat().st_mode & 0o777 == 0o600


FAKE_CLIENT = """
import time
print("#9 1.20 Looking in indexes: {index}", flush=True)
print("#9 1.21 Collecting numpy", flush=True)
time.sleep(120)
"""

BUILD = """
import sys
from pathlib import Path
from buildtool.imagebuild import engine
from buildtool.imagebuild.cell_inputs import secret_strings
from buildtool.imagebuild.pipconfig import HostPip
context, client, log = map(Path, sys.argv[1:])
engine.build(engine.BuildClient((sys.executable, str(client), "build"), (), "classic"), engine.BuildRequest(
    context, context / "Dockerfile", build_args={}, labels={}, secrets={}, log_path=log,
    log_secrets=secret_strings(HostPip(index_url=sys.stdin.read()))))
"""


def test_a_build_killed_midway_leaves_no_token_in_its_log(tmp_path: Path) -> None:
    """engine.build let the engine write straight into the log (0644 under the usual umask, so any local user's to
    read) and masked the index tokens only once the build ended: a build killed midway (SIGKILL, a cancelled CI
    job) left what pip printed in build-logs/ as it was. Now each line is masked before it is written, and the log
    is this user's only, an earlier build's log of another mode too."""
    client = tmp_path / "docker.py"
    client.write_text(FAKE_CLIENT.format(index=INDEX))
    log = tmp_path / "logs" / "pytorch-cpu-2.13.log"
    log.parent.mkdir()
    log.write_text("an earlier build's log\n")
    log.chmod(0o644)
    repo = Path(__file__).resolve().parents[1]
    run = subprocess.Popen([sys.executable, "-c", BUILD, str(tmp_path), str(client), str(log)], cwd=repo,
                           env={**os.environ, "PYTHONPATH": str(repo)}, stdin=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        assert run.stdin is not None
        run.stdin.write(INDEX)
        run.stdin.close()
        deadline = time.monotonic() + 60
        while "Collecting numpy" not in log.read_text() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "Collecting numpy" in log.read_text(), log.read_text()
    finally:   # the build and its client, as a cancelled job ends them
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
    text = log.read_text()
    assert TOKEN not in text
    assert "Looking in indexes: https://user:****@pkgs.example.invalid/simple" in text
    assert log.stat().st_mode & 0o777 == 0o600


def test_a_finished_builds_logs_are_readable_by_their_user_only(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The cell's log and the copy kept by image are created 0600 (were 0644: every local user's to read)."""
    def fake_run(argv, **kwargs):  # noqa: ANN001, ANN003, ANN202
        Path(argv[argv.index("--iidfile") + 1]).write_text(IMAGE)
        kwargs["stdout"].write(f"#9 1.20 Looking in indexes: {INDEX}\n")
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(engine.subprocess, "run", fake_run)
    log = tmp_path / "build.log"
    kept = engine.image_record(tmp_path, IMAGE)
    assert kept is not None
    kept[1].parent.mkdir()
    kept[1].write_text("an earlier build of the image\n")
    kept[1].chmod(0o644)
    engine.build(engine.BuildClient(("client-stand-in", "build"), (), "classic"), engine.BuildRequest(
        tmp_path, tmp_path / "Dockerfile", build_args={}, labels={}, secrets={}, log_path=log,
        log_secrets=[TOKEN]))
    for path in (log, kept[1]):
        assert path.stat().st_mode & 0o777 == 0o600, path
        assert "Looking in indexes: https://user:****@pkgs.example.invalid/simple" in path.read_text()
