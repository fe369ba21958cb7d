"""Scaling benchmark: a real CPU DDP run (gloo, 1 and 2 processes) to metrics and plots, inside the
pytorch-cpu dev image when the registry has one (and the engine holds it), else with the host's torch."""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.common import docker_cli
from buildtool.common.errors import FailedError, UserError
from buildtool.contracts import names
from buildtool.launch.scaling import Launcher, RunResult, parse_counts, run_one, with_speedups
from tests.signing import complete

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "bench" / "ddp_epochs.py"
PNG = b"\x89PNG\r\n\x1a\n"


def cpu_image() -> str | None:
    """A pytorch-cpu dev image from REGISTRY that the engine already holds (no 1.4 GB pull in a test)."""
    registry = os.environ.get("REGISTRY") or names.DEFAULT_REGISTRY
    try:
        listed = docker_cli.docker("images", "--format", "{{.Repository}}:{{.Tag}}",
                                   names.dev_repo(registry, "pytorch-cpu"), timeout=30)
    except docker_cli.ClientNotFound:
        return None
    tags = sorted(line for line in listed.stdout.splitlines() if names.parse_dev_tag(line.rsplit(":", 1)[1], "2.13"))
    return tags[-1] if listed.returncode == 0 and tags else None


@pytest.mark.integration   # starts containers of the pytorch-cpu dev image when there is one
@pytest.mark.engine
def test_scaling_run_produces_metrics_and_plots(run_cli, tmp_path: Path) -> None:
    image = cpu_image()
    where = ["--image", image] if image else ["--launcher", "host", "--python", sys.executable]
    if not image:
        probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, timeout=120)
        assert probe.returncode == 0, "no pytorch-cpu dev image and no torch on the host: pip install -e '.[scaling]'"
    out = tmp_path / "metrics"
    code, stdout, err = run_cli("scaling", *where, "--counts", "2,1", "--samples", "1024", "--epochs", "2",
                                "--out", str(out), "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    data = json.loads((out / "scaling.json").read_text())
    assert data["launcher"]["kind"] == ("docker" if image else "host")
    runs = data["runs"]
    assert [r["count"] for r in runs] == [1, 2]
    for r in runs:
        assert r["backend"] == "gloo" and r["identical"] is True
        assert len(r["epoch_times_s"]) == 2 and all(t > 0 for t in r["epoch_times_s"])
        assert r["losses"][-1] < r["losses"][0]  # it really trained
        assert r["time_per_epoch_s"] == r["epoch_times_s"][1]  # the warm-up epoch is left out
    assert runs[0]["speedup"] == 1.0
    assert runs[1]["speedup"] == pytest.approx(runs[0]["time_per_epoch_s"] / runs[1]["time_per_epoch_s"])
    rows = list(csv.reader((out / "scaling.csv").open()))
    assert rows[0] == ["processes", "time_per_epoch_s", "speedup", "efficiency", "backend", "samples_per_s",
                       "peak_memory_mb_max"] and len(rows) == 3
    for name in ("time_per_epoch.png", "speedup.png"):
        blob = (out / name).read_bytes()
        assert blob[:8] == PNG and len(blob) > 10_000
    assert "2 processes:" in stdout and "speed-up" in stdout
    if image:
        names = docker_cli.docker("ps", "-a", "--filter", "name=t-scaling-", "--format", "{{.Names}}",
                                  timeout=30).stdout
        assert names.strip() == "", f"containers left behind: {names}"


def dev_image(name: str, version: str) -> str | None:
    """A dev image of cell NAME:VERSION from REGISTRY that the engine already holds (none pulled in a test)."""
    registry = os.environ.get("REGISTRY") or names.DEFAULT_REGISTRY
    try:
        listed = docker_cli.docker("images", "--format", "{{.Repository}}:{{.Tag}}", names.dev_repo(registry, name),
                                   timeout=30)
    except docker_cli.ClientNotFound:
        return None
    tags = sorted(line for line in listed.stdout.splitlines() if names.parse_dev_tag(line.rsplit(":", 1)[1], version))
    return tags[-1] if listed.returncode == 0 and tags else None


def jax_cpu_image() -> str:
    """This commit's jax-cpu dev image, built (or retagged from an identical build) as the fault tests build theirs:
    a test that skipped when no earlier test had built one ran or not by test order."""
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    import fixture_images

    return fixture_images.ensure("jax")


@pytest.mark.integration   # issue 42: DDP, FSDP and DeepSpeed side by side in the pytorch-cpu dev image
@pytest.mark.engine
def test_strategies_side_by_side_in_the_image(run_cli, tmp_path: Path) -> None:
    """Real FSDP (fully_shard, gloo) beside DDP, and DeepSpeed, which the image does not carry: reported as not run
    with the worker's reason, never a pass. 23 s here (four short runs and DeepSpeed's import check)."""
    image = cpu_image()
    where = ["--image", image] if image else ["--launcher", "host", "--python", sys.executable]
    out = tmp_path / "metrics"
    code, stdout, err = run_cli("scaling", *where, "--strategy", "ddp,fsdp,deepspeed", "--counts", "1,2",
                                "--samples", "1024", "--epochs", "2", "--out", str(out),
                                "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    for strategy in ("ddp", "fsdp"):
        data = json.loads((out / strategy / "scaling.json").read_text())
        assert data["status"] == "ran" and [r["count"] for r in data["runs"]] == [1, 2]
        for r in data["runs"]:
            assert r["identical"] is True and len(r["peak_memory_mb"]) == r["count"] and r["samples_per_s"] > 0
            assert r["time_per_epoch_s"] == r["epoch_times_s"][1]   # the warm-up epoch left out
            if strategy == "fsdp":
                assert r["matches_reference"] is True and r["max_abs_diff"] < 1e-3
    deepspeed = json.loads((out / "deepspeed" / "scaling.json").read_text())
    assert deepspeed["status"] == "not run" and deepspeed["runs"] == []
    assert deepspeed["reason"].startswith("not run on this runner: DeepSpeed is not installed in this image")
    assert "deepspeed: not run on this runner: DeepSpeed is not installed" in stdout
    comparison = json.loads((out / "comparison.json").read_text())
    assert [row["status"] for row in comparison["rows"]] == ["ran", "ran", "not run"]
    for name in ("time_per_epoch.png", "speedup.png"):   # every strategy that ran, on one plot
        blob = (out / name).read_bytes()
        assert blob[:8] == PNG and len(blob) > 10_000


@pytest.mark.integration   # issue 42: JAX sharded data parallelism in the jax-cpu dev image
@pytest.mark.engine
def test_jax_data_parallel_scaling_in_the_image(run_cli, tmp_path: Path) -> None:
    image = dev_image("jax-cpu", "0.10") or jax_cpu_image()
    out = tmp_path / "metrics"
    code, stdout, err = run_cli("scaling", "--image", image, "--strategy", "jax-dp", "--counts", "1,2",
                                "--samples", "1024", "--epochs", "2", "--out", str(out),
                                "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    data = json.loads((out / "scaling.json").read_text())
    assert data["strategy"] == "jax-dp" and [r["count"] for r in data["runs"]] == [1, 2]
    for r in data["runs"]:
        assert r["backend"] == "gloo" and r["identical"] is True and r["matches_reference"] is True
        assert len(r["peak_memory_mb"]) == r["count"]
    assert (out / "speedup.png").read_bytes()[:8] == PNG and "jax-dp   2 processes:" in stdout



def report(run_cli, tmp_path: Path, *scaling: Path) -> tuple[str, str]:
    """`buildtool report` over one passing verdict and the `scaling` folders, into tmp_path/o: its HTML and Markdown."""
    verdicts = tmp_path / "verdicts"
    verdicts.mkdir()
    (verdicts / "x.verdict.json").write_text(json.dumps(complete({
        "digest": "sha256:" + "0" * 64, "cell": "pytorch-cpu:2.13", "result": "passed", "tests": []})))
    folders = [arg for folder in scaling for arg in ("--scaling", str(folder))]
    code, _, err = run_cli("report", "--verdicts", str(verdicts), *folders, "--out", str(tmp_path / "o"))
    assert code == 0, err
    return (tmp_path / "o" / "report.html").read_text(), (tmp_path / "o" / "report.md").read_text()

def test_report_embeds_the_scaling_plots(run_cli, tmp_path: Path) -> None:
    plots = tmp_path / "scaling"
    plots.mkdir()
    for name in ("time_per_epoch.png", "speedup.png"):
        (plots / name).write_bytes(PNG + b"\0" * 64)
    (plots / "scaling.json").write_text(json.dumps({"unit": "gpus", "runs": [
        {"count": 1, "time_per_epoch_s": 8.0, "speedup": 1.0, "efficiency": 1.0, "backend": "nccl"},
        {"count": 8, "time_per_epoch_s": 1.25, "speedup": 6.4, "efficiency": 0.8, "backend": "nccl"}]}))
    page, markdown = report(run_cli, tmp_path, plots)
    assert '<img src="scaling/speedup.png"' in page and (tmp_path / "o" / "scaling" / "speedup.png").is_file()
    assert "<td>8</td><td>1.250 s</td><td>6.40x</td><td>80%</td>" in page
    assert "| 8 | 1.250 s | 6.40x | 80% |" in markdown


def test_speedups_are_against_the_smallest_run() -> None:
    runs = [RunResult(count=c, backend="nccl", epoch_times_s=[], losses=[], identical=True, time_per_epoch_s=t)
            for c, t in ((4, 30.0), (2, 50.0), (8, 20.0))]
    out = with_speedups(runs)
    assert [r.count for r in out] == [2, 4, 8]
    assert [round(r.speedup, 3) for r in out] == [1.0, 1.667, 2.5]
    assert [round(r.efficiency, 3) for r in out] == [1.0, 0.833, 0.625]


@pytest.mark.parametrize("text", ["", "0,1", "1,two", "-2"])
def test_bad_counts(text: str) -> None:
    with pytest.raises(UserError, match="--counts"):
        parse_counts(text)


@pytest.mark.host_torch
def test_too_small_a_subset_is_exit_2(run_cli, tmp_path: Path) -> None:
    code, out, err = run_cli("scaling", "--launcher", "host", "--counts", "1,8", "--samples", "100",
                             "--out", str(tmp_path / "m"), "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and "--samples 100 is too small" in err and not (tmp_path / "m").exists()


def test_docker_launch_uses_host_network_shm_and_read_only_bench(tmp_path: Path, monkeypatch) -> None:
    client = tmp_path / "docker-client"
    client.write_text("#!/bin/sh\nexit 0\n")
    client.chmod(0o755)
    monkeypatch.setenv("DOCKER_CLIENT", str(client))
    cmd = Launcher(kind="docker", image="img:1", docker_flags=("--shm-size=8g", "--gpus=all")).command(
        4, WORKER, {"SCALING_SAMPLES": "64"}, "t-scaling-x")
    assert cmd[:5] == [str(client), "run", "--rm", "--name=t-scaling-x", "--network=host"]
    assert "--shm-size=8g" in cmd and "--gpus=all" in cmd and "--env=SCALING_SAMPLES=64" in cmd
    assert f"--volume={WORKER.parent}:/opt/dl-images-bench:ro" in cmd
    assert cmd[-3:] == ["--standalone", "--nproc-per-node=4", "/opt/dl-images-bench/ddp_epochs.py"]


def fake_python(tmp_path: Path, result: dict, code: int = 0) -> str:
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho 'SCALING_RESULT {json.dumps(result)}'\nexit {code}\n")
    fake.chmod(0o755)
    return str(fake)


def test_a_run_whose_ranks_disagree_fails(tmp_path: Path) -> None:
    result = {"backend": "gloo", "world_size": 2, "epoch_times_s": [1.0, 1.0], "losses": [2.0, 1.0],
              "identical": False, "peak_memory_mb": [100.0, 100.0]}
    with pytest.raises(FailedError, match="different parameters"):
        run_one(Launcher(kind="host", python=fake_python(tmp_path, result)), 2, WORKER, 256, 2, 64, 60)
    with pytest.raises(FailedError, match="asked for 4 processes"):
        run_one(Launcher(kind="host", python=fake_python(tmp_path, {**result, "identical": True})), 4, WORKER,
                256, 2, 64, 60)
    with pytest.raises(FailedError, match="exit 3"):
        run_one(Launcher(kind="host", python=fake_python(tmp_path, result, 3)), 2, WORKER, 256, 2, 64, 60)


def test_a_malformed_result_fails_the_run_in_one_line(tmp_path: Path) -> None:
    """A SCALING_RESULT line that is not JSON (JSONDecodeError), lacks a field (KeyError) or has no epoch times
    (statistics.StatisticsError) ended the scaling run in a traceback; now it is the run's failure, one line."""
    good = {"backend": "gloo", "world_size": 2, "epoch_times_s": [1.0, 1.0], "losses": [2.0, 1.0],
            "identical": True, "peak_memory_mb": [100.0, 100.0]}
    fake = tmp_path / "python"
    cases = [('{"world_size": 2', "its SCALING_RESULT line is not JSON (Expecting ',' delimiter"),
             ("[1, 2]", "its SCALING_RESULT line is not a JSON object: [1, 2]"),
             (json.dumps({k: v for k, v in good.items() if k != "epoch_times_s"}),
              "its SCALING_RESULT line has no valid epoch_times_s (a non-empty list of seconds above 0)"),
             (json.dumps({**good, "epoch_times_s": []}), "has no valid epoch_times_s (a non-empty list of seconds"),
             (json.dumps({**good, "epoch_times_s": [0]}), "has no valid epoch_times_s (a non-empty list of seconds"),
             (json.dumps({k: v for k, v in good.items() if k not in ("identical", "losses")}),
              "has no valid identical (true or false), losses (a list of numbers)"),
             (json.dumps({**good, "peak_memory_mb": ["lots", 1]}), "reported no peak memory for each of its 2 ranks")]
    for line, why in cases:
        fake.write_text(f"#!/bin/sh\necho {shlex.quote('SCALING_RESULT ' + line)}\n")
        fake.chmod(0o755)
        with pytest.raises(FailedError) as caught:
            run_one(Launcher(kind="host", python=str(fake)), 2, WORKER, 256, 2, 64, 60)
        message = str(caught.value)
        assert "\n" not in message and message.startswith("run with 2 processes" if "peak" in why else
                                                          "scaling run with 2 processes failed: "), message
        assert why in message, message
    fake.write_text(f"#!/bin/sh\necho {shlex.quote('SCALING_RESULT ' + json.dumps(good))}\n")
    assert run_one(Launcher(kind="host", python=str(fake)), 2, WORKER, 256, 2, 64, 60).time_per_epoch_s == 1.0


def test_the_report_has_a_section_per_scaling_run(run_cli, tmp_path: Path) -> None:
    runs = {"processes": ({"kind": "docker"}, "gloo", 2), "nodes": ({"kind": "slurm", "runtime": "oci"}, "gloo", 2)}
    folders = []
    for unit, (launcher, backend, top) in runs.items():
        folder = tmp_path / unit
        folder.mkdir()
        for name in ("time_per_epoch.png", "speedup.png"):
            (folder / name).write_bytes(PNG + unit.encode())
        (folder / "scaling.json").write_text(json.dumps({"unit": unit, "launcher": launcher, "runs": [
            {"count": 1, "time_per_epoch_s": 4.0, "speedup": 1.0, "efficiency": 1.0, "backend": backend},
            {"count": top, "time_per_epoch_s": 2.5, "speedup": 1.6, "efficiency": 0.8, "backend": backend}]}))
        folders.append(folder)
    page, markdown = report(run_cli, tmp_path, *folders)
    out = tmp_path / "o"
    assert "<h2>DDP scaling</h2>" in page and "<h2>DDP scaling over SLURM nodes (oci containers)</h2>" in page
    assert page.index("<th>processes</th>") < page.index("<h2>DDP scaling over SLURM") < page.index("<th>nodes</th>")
    assert '<img src="scaling-2/speedup.png"' in page and (out / "scaling-2" / "speedup.png").read_bytes().endswith(
        b"nodes")
    assert (out / "scaling" / "speedup.png").read_bytes().endswith(b"processes")
    assert "### DDP scaling over SLURM nodes (oci containers)" in markdown and "| nodes | time per epoch" in markdown


def test_a_slurm_run_is_one_job_per_node_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from buildtool.launch import slurmjobs
    from buildtool.launch.scaling import SlurmLauncher

    submitted: list[str] = []

    def fake_run_job(script: Path, *, cwd: Path, timeout_s: float, env=None, args=()) -> slurmjobs.JobEnd:
        submitted.append(script.read_text())
        world = 4 if "--nnodes=2" in submitted[-1] else 2
        result = {"backend": "gloo", "world_size": world, "epoch_times_s": [2.0, 1.0], "losses": [2.0, 1.0],
                  "identical": True, "peak_memory_mb": [100.0] * world}
        return slurmjobs.JobEnd(job_id="7", state="COMPLETED", exit_code="0:0", output_path=cwd / "x.out",
                                output=f"SCALING_RESULT {json.dumps(result)}\n", seconds=1.0)

    monkeypatch.setattr(slurmjobs, "run_job", fake_run_job)
    launcher = SlurmLauncher(runtime="oci", image="/shared/bundle", workdir=tmp_path / "jobs", gpus_per_node=2)
    run = run_one(launcher, 2, WORKER, 512, 2, 64, 60)
    assert run.count == 2 and run.time_per_epoch_s == 1.0 and run.wall_clock_s > 0
    script = submitted[0]
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=2" in script
    assert "--nnodes=2 --nproc-per-node=2" in script and "--rdzv-conf=join_timeout=300,read_timeout=300" in script
    assert ("--export=DDP_EXPECT_BACKEND,DDP_EXPECT_WORLD_SIZE,DDP_GPUS_PER_NODE,DDP_NODES,DDP_NODE_ADDRS,"
            "DDP_OWN_WORKLOAD,NCCL_DEBUG,NCCL_DEBUG_SUBSYS,PYTHONUNBUFFERED,SCALING_BATCH,SCALING_EPOCHS,"
            "SCALING_SAMPLES") in script
    # Through the DDP check's verifier, which gives torchrun is_host and this node's address (issue 23, 6).
    assert ('python3 "$jobdir/verify_ddp.py" torchrun --nnodes=2' in script
            and "is_host={is_host}' '--local-addr={local_addr}'" in script)
    assert "cat > \"$workdir/ddp_epochs.py\" <<'DDP_EPOCHS_PY'" in script and WORKER.read_text().strip() in script
    assert (tmp_path / "jobs" / "ddp-scaling-2n.sbatch").read_text() == script
    four_gpus = SlurmLauncher(runtime="oci", image="/shared/bundle", workdir=tmp_path / "jobs", gpus_per_node=4)
    with pytest.raises(FailedError, match=r"asked for 1 node \(4 processes\), the run had 2"):
        run_one(four_gpus, 1, WORKER, 512, 2, 64, 60)


@pytest.mark.parametrize(("args", "message"), [
    (["--runtime", "oci", "--cell", "pytorch-cpu:2.13"], "--runtime oci needs --image BUNDLE"),
    (["--runtime", "oci"], "--launcher slurm needs --image"),
    (["--runtime", "oci", "--image", "/b", "--nodes", "0,2"], "--nodes '0,2'"),
    (["--runtime", "oci", "--image", "relative/bundle"], "--runtime oci takes the bundle folder"),
    (["--runtime", "docker", "--image", "/b"], "--runtime must be one of"),
])
def test_slurm_scaling_bad_input_is_exit_2(run_cli, tmp_path: Path, args: list[str], message: str) -> None:
    code, out, err = run_cli("scaling", "--launcher", "slurm", *args, "--out", str(tmp_path / "m"),
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and message in err and not (tmp_path / "m").exists(), err


def test_an_infinite_epoch_time_fails_the_run_in_one_line(tmp_path: Path) -> None:
    """json reads Infinity: a worker's `epoch_times_s: [Infinity, ...]` was taken as seconds, giving a speed-up of
    0 (or NaN against an infinite base, whose efficiency is below no --min-efficiency) and an invalid scaling.json.
    Now it is a malformed result, named in one line."""
    good = {"backend": "gloo", "world_size": 2, "epoch_times_s": [1.0, 1.0], "losses": [2.0, 1.0],
            "identical": True, "peak_memory_mb": [100.0, 100.0]}
    fake = tmp_path / "python"
    line = "SCALING_RESULT " + json.dumps({**good, "epoch_times_s": [1.0, math.inf]})
    fake.write_text(f"#!/bin/sh\necho {shlex.quote(line)}\n")
    fake.chmod(0o755)
    with pytest.raises(FailedError) as caught:
        run_one(Launcher(kind="host", python=str(fake)), 2, WORKER, 256, 2, 64, 60)
    assert str(caught.value).startswith("scaling run with 2 processes failed: its SCALING_RESULT line has no valid "
                                        "epoch_times_s (a non-empty list of seconds above 0): "), caught.value


def test_docs_say_the_slurm_join_timeout_and_that_it_is_under_the_job_timeout() -> None:
    """The SLURM scaling jobs' 300 s rendezvous join timeout is deliberate (test_a_slurm_run_is_one_job_per_node_count)
    but docs/scaling.md did not say it, nor that it is under the jobs' 600 s --timeout, nor that no option sets it."""
    import inspect

    from buildtool.cli.scaling import scaling
    from buildtool.launch.scaling import SlurmLauncher

    join = SlurmLauncher.__dataclass_fields__["join_timeout_s"].default
    job = inspect.signature(scaling).parameters["timeout"].default
    assert (join, job) == (300, 600)
    doc = " ".join((REPO / "docs" / "scaling.md").read_text().split())
    assert f"waits up to {join} s for every node to join the c10d rendezvous" in doc
    assert f"half of the {job} s each job gets by default (`--timeout`, queueing included)" in doc
    assert "`buildtool scaling` has no option for it" in doc


def test_a_run_of_one_process_or_node_says_so_in_the_singular(tmp_path: Path) -> None:
    """A failed run of one process read `scaling run with 1 processes failed`; a count is printed with its noun in
    the singular where it is 1 (common.documents.plural)."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(FailedError) as caught:
        run_one(Launcher(kind="host", python=str(fake)), 1, WORKER, 256, 2, 64, 60)
    assert str(caught.value).startswith("scaling run with 1 process failed (exit 3)"), caught.value
