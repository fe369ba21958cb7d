"""What a build shows while it runs: BuildKit steps read from the log, one line per change."""

from __future__ import annotations

import time
from pathlib import Path

from buildtool.imagebuild.progress import LogProgress, StepWatcher, latest_step

# As Debian's docker 20.10 client with DOCKER_BUILDKIT=1 --progress=plain writes it.
LOG = """\
$ /usr/bin/docker build (classic, DOCKER_BUILDKIT=1) ... dockerfiles/pytorch/pytorch-cpu/2.13
#1 [internal] load build definition from Dockerfile
#1 transferring dockerfile: 2.41kB done
#5 [1/7] FROM 127.0.0.1:5000/library/debian@sha256:1111
#6 [2/7] RUN apt-get update  && apt-get install -y --no-install-recommends ca-certificates python3
#6 3.120 Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]
#8 [stage-1 4/7] RUN --mount=type=secret,id=pip.conf python -m pip install torch==2.13.0+cpu
#8 12.4 Collecting torch==2.13.0+cpu
"""


def test_latest_step_is_the_last_numbered_buildkit_step(tmp_path: Path) -> None:
    log = tmp_path / "cell.log"
    log.write_text(LOG)
    assert latest_step(log) == "4/7 RUN --mount=type=secret,id=pip.conf python -m pip install torch==2.13.0+cpu"
    log.write_text(LOG.split("#6 [2/7]")[0])
    assert latest_step(log) == "1/7 FROM 127.0.0.1:5000/library/debian@sha256:1111"
    log.write_text("#1 [internal] load build definition from Dockerfile\n")
    assert latest_step(log) == ""
    assert latest_step(tmp_path / "missing.log") == ""


def test_log_progress_prints_changes_only() -> None:
    lines: list[str] = []
    progress = LogProgress(lines.append)
    progress.update("a:1", "queued")
    progress.update("a:1", "building", "1/7 FROM x")
    progress.update("a:1", "building", "1/7 FROM x")
    progress.update("a:1", "building", "2/7 RUN y")
    progress.update("a:1", "built", "")
    assert [line.split("s ", 1)[1] for line in lines] == ["queued", "building: 1/7 FROM x", "building: 2/7 RUN y",
                                                          "built"]
    assert all(line.startswith("[a:1] ") for line in lines)


def test_step_watcher_reports_each_new_step_of_a_growing_log(tmp_path: Path) -> None:
    seen: list[tuple[str, str, str]] = []

    class Sink:
        def update(self, cell: str, state: str, step: str = "") -> None:
            seen.append((cell, state, step))

    log = tmp_path / "cell.log"
    log.write_text("#5 [1/2] FROM base\n")
    with StepWatcher(Sink(), every=0.05, scrub=lambda line: line.replace("token", "****")) as watcher:
        watcher.watch("a:1", log)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        with log.open("a") as handle:
            handle.write("#6 [2/2] RUN pip install --index-url https://token@example/simple x\n")
        while len({s for _, _, s in seen}) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    steps = list(dict.fromkeys(step for _, _, step in seen))
    assert steps == ["1/2 FROM base", "2/2 RUN pip install --index-url https://****@example/simple x"]
    assert {(cell, state) for cell, state, _ in seen} == {("a:1", "building")}
