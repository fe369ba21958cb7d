"""`buildtool scaling --strategy` (issue 42): strategies side by side, with fake workers standing in for torchrun and
JAX (no engine, no torch): what is refused and why, the not-run report, the flag, the comparison files and report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from buildtool.common.errors import FailedError, UserError
from buildtool.contracts.strategies import STRATEGIES, parse_strategies
from buildtool.launch.scaling import CONTAINER_BENCH, Launcher, RunSettings, run_one, shipped_with
from buildtool.launch.strategy_runs import COMPARISON, run_strategies
from tests.test_scaling import report

REPO = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"

# A stand-in for `python -m torch.distributed.run --nproc-per-node=N worker` and `python worker --spawn N`: prints
# the worker's result line for N ranks; its time per epoch is BASE / N ** EXP (EXP < 1: sub-linear scaling).
FAKE = """#!/bin/sh
n=1; prev=""
for a in "$@"; do
  case "$a" in --nproc-per-node=*) n="${a#*=}";; esac
  if [ "$prev" = "--spawn" ]; then n="$a"; fi
  prev="$a"
done
case "$*" in *deepspeed_epochs.py*) echo "SCALING_NOT_RUN DeepSpeed is not installed in this image"; exit 0;; esac
exec python3 -c '
import json, sys
n, exp, match = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
t = 8.0 / n ** exp
print("SCALING_RESULT " + json.dumps({"backend": "gloo", "world_size": n, "epoch_times_s": [2 * t, t, t],
      "losses": [2.0, 1.5, 1.0], "identical": True, "peak_memory_mb": [300.0 + i for i in range(n)],
      "matches_reference": match, "max_abs_diff": 0.0 if match else 0.04}))
' "$n" "${FAKE_EXP:-1}" "${FAKE_MATCH:-1}"
"""


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    fake = tmp_path / "python"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    return str(fake)


@pytest.fixture
def stub_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib takes a second a plot here: tests about the numbers write stand-in PNGs."""
    from buildtool.launch import scaling, strategy_runs

    def stub(names: tuple[str, ...]):
        def write(result, folder: Path) -> dict[str, Path]:
            paths = {name: folder / name for name in names}
            for path in paths.values():
                path.write_bytes(PNG)
            return paths
        return write

    monkeypatch.setattr(scaling, "plot", stub(("time_per_epoch.png", "speedup.png")))
    monkeypatch.setattr(strategy_runs, "plot_comparison", stub(("time_per_epoch.png", "speedup.png")))


def _run(python: str, names: str, out: Path, min_efficiency: float = 0.5):
    from dataclasses import replace

    base = Launcher(kind="host", python=python)
    return run_strategies(lambda s: replace(base, entry=s.launch), parse_strategies(names), [1, 2], REPO, out,
                          RunSettings(samples=512, epochs=3, batch=64, unit="processes", timeout_s=60,
                                      min_efficiency=min_efficiency))


def test_unknown_strategy_is_refused_naming_it() -> None:
    with pytest.raises(UserError, match="unknown strategy 'horovod'"):
        parse_strategies("ddp,horovod")
    assert [s.name for s in parse_strategies("fsdp,ddp,fsdp")] == ["fsdp", "ddp"]


@pytest.mark.parametrize(("args", "message"), [
    (["--strategy", "ddp,horovod"], "unknown strategy 'horovod'"),
    (["--strategy", ""], "must be a comma list of ddp, fsdp, deepspeed, jax-dp"),
    (["--strategy", "fsdp", "--cell", "jax-cpu:0.10"], "--strategy fsdp: not supported by cell jax-cpu:0.10 "
                                                       "(a jax image); jax runs jax-dp"),
    (["--strategy", "jax-dp", "--cell", "pytorch-cpu:2.13"], "--strategy jax-dp: not supported by cell pytorch-cpu"),
    (["--strategy", "ddp,jax-dp", "--image", "img:1"], "mixes frameworks (jax, pytorch)"),
    (["--strategy", "jax-dp", "--launcher", "slurm", "--runtime", "oci", "--image", "/b"],
     "--strategy jax-dp cannot run over --launcher slurm"),
    (["--min-efficiency", "1.5"], "--min-efficiency must be a fraction from 0 to 1"),
])
def test_bad_strategy_is_exit_2_naming_it(run_cli, tmp_path: Path, args: list[str], message: str) -> None:
    code, _, err = run_cli("scaling", *args, "--out", str(tmp_path / "m"), "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and message in err and not (tmp_path / "m").exists(), err


def test_every_strategy_worker_is_in_its_framework_folder() -> None:
    for strategy in STRATEGIES.values():
        worker = REPO / strategy.worker
        assert worker.is_file(), worker
        if strategy.name != "ddp":
            assert worker.parent == REPO / "image-tests" / strategy.framework / "scripts", worker


def test_jax_is_spawned_by_its_worker_in_the_container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_CLIENT", "/bin/true")
    worker = REPO / STRATEGIES["jax-dp"].worker
    cmd = Launcher(kind="docker", image="jax:1", entry="spawn").command(2, worker, {}, "t-scaling-x")
    assert cmd[-4:] == ["python3", f"{CONTAINER_BENCH}/jax_dp_epochs.py", "--spawn", "2"]
    assert Launcher(kind="host", python="py", entry="spawn").command(2, worker, {}, "x") == [
        "py", str(worker), "--spawn", "2"]



def test_a_slurm_job_ships_the_modules_a_worker_imports_from_its_folder(tmp_path: Path) -> None:
    """The SLURM job embeds files, not folders: without the worker's helper beside it FSDP dies on import."""
    fsdp, deepspeed = (REPO / STRATEGIES[name].worker for name in ("fsdp", "deepspeed"))
    assert sorted(shipped_with(fsdp)) == ["fsdp_epochs.py", "torch_epochs.py"]
    assert sorted(shipped_with(deepspeed)) == ["deepspeed_epochs.py", "torch_epochs.py"]
    assert list(shipped_with(REPO / STRATEGIES["ddp"].worker)) == ["ddp_epochs.py"]
    (tmp_path / "w.py").write_text("import json\nimport a\n")
    (tmp_path / "a.py").write_text("from b import x\n")
    (tmp_path / "b.py").write_text("x = 1\n")
    (tmp_path / "unused.py").write_text("")
    assert shipped_with(tmp_path / "w.py") == {"w.py": "import json\nimport a\n", "a.py": "from b import x\n",
                                               "b.py": "x = 1\n"}

def test_strategies_side_by_side_write_folders_table_and_plots(fake_python: str, stub_plots: None,
                                                               tmp_path: Path) -> None:
    out = tmp_path / "metrics"
    results, paths = _run(fake_python, "ddp,fsdp,deepspeed", out)
    assert [r.strategy for r in results] == ["ddp", "fsdp", "deepspeed"]
    for name in ("ddp", "fsdp"):
        data = json.loads((out / name / "scaling.json").read_text())
        assert data["strategy"] == name and data["status"] == "ran" and not data["flagged"]
        assert [r["count"] for r in data["runs"]] == [1, 2] and data["runs"][1]["speedup"] == pytest.approx(2.0)
        top = data["runs"][1]
        assert top["peak_memory_mb"] == [300.0, 301.0] and top["samples_per_s"] == pytest.approx(512 / 4.0)
        assert top["matches_reference"] is True and top["time_per_epoch_s"] == 4.0  # warm-up epoch left out
        for plot in ("time_per_epoch.png", "speedup.png"):
            assert (out / name / plot).read_bytes()[:8] == PNG
    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["strategies"] == ["ddp", "fsdp", "deepspeed"]
    for plot in ("time_per_epoch.png", "speedup.png"):   # real plots: tests/test_scaling.py's integration test
        assert (out / plot).read_bytes()[:8] == PNG
    table = (out / "comparison.md").read_text()
    assert "| FSDP (fully_shard) | 2 | 4.000 s | 2.00x | 100% | 128 | 301 MiB |  |" in table
    assert paths["comparison table"] == out / "comparison.md"


def test_deepspeed_that_cannot_run_is_not_run_never_a_pass(fake_python: str, stub_plots: None, tmp_path: Path) -> None:
    out = tmp_path / "metrics"
    results, _ = _run(fake_python, "ddp,deepspeed", out)
    deepspeed = results[1]
    assert deepspeed.status == "not run" and deepspeed.runs == []
    assert deepspeed.reason == "not run on this runner: DeepSpeed is not installed in this image"
    data = json.loads((out / "deepspeed" / "scaling.json").read_text())
    assert data["status"] == "not run" and data["runs"] == [] and not (out / "deepspeed" / "speedup.png").exists()
    assert "| DeepSpeed ZeRO-2 | — | — | — | — | — | — | not run on this runner: DeepSpeed is not installed" in (
        out / "comparison.md").read_text()


def test_a_strategy_below_the_declared_fraction_of_ideal_is_flagged(fake_python: str, stub_plots: None, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_EXP", "0.4")   # 2 ranks: 2 ** 0.4 = 1.32x, 66% of ideal
    results, _ = _run(fake_python, "ddp,fsdp", tmp_path / "m", min_efficiency=0.7)
    assert all(r.flagged for r in results) and results[0].runs[1].efficiency == pytest.approx(2 ** 0.4 / 2)
    assert "| 1.32x | 66% | 84 | 301 MiB | below 70% of ideal |" in (tmp_path / "m" / "comparison.md").read_text()
    results, _ = _run(fake_python, "ddp,fsdp", tmp_path / "n", min_efficiency=0.6)
    assert not any(r.flagged for r in results)


def test_a_sharded_run_that_differs_from_the_unsharded_replay_fails(fake_python: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MATCH", "0")
    worker = REPO / STRATEGIES["fsdp"].worker
    with pytest.raises(FailedError, match=r"differ from the same training replayed unsharded .* not averaged"):
        run_one(Launcher(kind="host", python=fake_python), 2, worker, 512, 3, 64, 60)


def test_the_report_shows_strategies_side_by_side(fake_python: str, stub_plots: None, run_cli, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_EXP", "0.4")
    out = tmp_path / "metrics"
    _run(fake_python, "ddp,fsdp,deepspeed", out, min_efficiency=0.7)
    page, markdown = report(run_cli, tmp_path, out)
    titles = ["Scaling: strategies side by side", "DDP scaling", "FSDP (fully_shard) scaling",
              "DeepSpeed ZeRO-2 scaling"]
    assert [page.index(f"<h2>{t}</h2>") for t in titles] == sorted(page.index(f"<h2>{t}</h2>") for t in titles)
    assert '<img src="scaling/speedup.png"' in page and '<img src="scaling-3/speedup.png"' in page
    assert "not run on this runner: DeepSpeed is not installed in this image" in page
    assert "flagged: speed-up 1.32x at 2 processes is 66% of ideal, below the declared 70%" in page
    assert "### FSDP (fully_shard) scaling" in markdown and "below 70% of ideal" in markdown


@pytest.mark.parametrize(("launcher", "unit", "asked"), [
    (Launcher(kind="host"), "gpus", "the counts are GPUs"),
    (Launcher(kind="docker", image="img:1", docker_flags=("--shm-size=1g", "--gpus=all")), "processes",
     "the container is started with --gpus=all"),
])
def test_a_gpu_run_that_trained_with_gloo_is_failed_never_a_gpu_figure(fake_python: str, stub_plots: None,
                                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       launcher: Launcher, unit: str,
                                                                       asked: str) -> None:
    """A run asked on GPUs (--counts gpus, a container given --gpus) whose processes saw no GPU trains with gloo on
    CPU: its scaling.json said `"unit": "gpus"` with gloo's figures, a CPU run shown as a GPU one. Now it fails
    naming the backend, and writes no figures."""
    from dataclasses import replace

    from buildtool.launch import scaling

    monkeypatch.setenv("DOCKER_CLIENT", fake_python)   # `docker run ... torchrun --nproc-per-node=N`: the fake worker
    out = tmp_path / "metrics"
    with pytest.raises(FailedError, match=rf"scaling run with 1 process was asked on GPUs \({asked}\), but trained "
                                          r"with gloo, not nccl: .* CPU figures, not GPU ones"):
        scaling.run_scaling(replace(launcher, python=fake_python), [1, 2], REPO / "bench" / "ddp_epochs.py", out,
                            RunSettings(samples=512, epochs=3, batch=64, unit=unit, timeout_s=60))
    assert not (out / "scaling.json").exists()
    slurm = scaling.SlurmLauncher(runtime="oci", image="/b", workdir=tmp_path, gpus_per_node=2)
    assert scaling.gpus_asked(slurm, "nodes") == "--gpus-per-node 2"
    assert scaling.gpus_asked(replace(slurm, gpus_per_node=0), "nodes") == ""


def test_counts_gpus_in_an_image_gives_its_container_the_gpus(run_cli, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`scaling --image X --counts gpus` asked for one process per GPU but started the container without --gpus, so
    every run trained with gloo on the container's CPU (now refused by name as no GPU figure): it is given them."""
    from buildtool.cli import scaling as scaling_cli

    seen: list[tuple[str, ...]] = []
    monkeypatch.setattr(scaling_cli, "_gpu_counts", lambda counts: [1, 2])
    monkeypatch.setattr(scaling_cli, "_run", lambda project, here, wanted, *_a: seen.append(here.docker_flags))
    code, _, err = run_cli("scaling", "--image", "img:1", "--launcher", "docker", "--strategy", "ddp",
                           "--counts", "gpus", "--metrics-dir", str(tmp_path / "m"))
    assert code == 0, err
    assert seen == [("--shm-size=1g", "--gpus=all")]


def test_a_strategy_that_fails_among_several_is_compared_as_failed_and_the_command_fails(
        fake_python: str, stub_plots: None, run_cli, tmp_path: Path) -> None:
    """One strategy failing among several stopped the run before comparison.json was written: the report showed
    none of the strategies that ran (or last night's comparison and the failed one's old figures). Now the others
    still run, the comparison records the failed one as failed with its reason (its scaling.json too, over the old
    one), the report shows it failed, and the command still fails (exit 1)."""
    out = tmp_path / "metrics"
    _run(fake_python, "ddp,fsdp,deepspeed", out)   # last night's: every strategy ran
    failing = tmp_path / "failing"
    failing.write_text(f'#!/bin/sh\ncase "$*" in *fsdp_epochs.py*) echo "fsdp broke" >&2; exit 3;; esac\n'
                       f'exec {fake_python} "$@"\n')
    failing.chmod(0o755)
    code, stdout, err = run_cli("scaling", "--launcher", "host", "--python", str(failing), "--strategy",
                                "ddp,fsdp,deepspeed", "--counts", "1,2", "--samples", "512", "--out", str(out),
                                "--matrix", str(REPO / "matrix.yaml"))
    assert code == 1 and "Traceback" not in err, err
    assert err.strip().splitlines() == [f"failed: the scaling run of fsdp failed (see above); {out / COMPARISON} "
                                        "records it as failed beside the strategies that ran"], err
    assert "fsdp: failed: scaling run with 1 process failed (exit 3):\nfsdp broke\n" in stdout
    assert "ddp   2 processes: 4.000 s/epoch" in stdout and f"{out / 'comparison.json'}" in stdout
    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["strategies"] == ["ddp", "fsdp", "deepspeed"]
    rows = {row["strategy"]: row for row in comparison["rows"]}
    assert [rows[name]["status"] for name in ("ddp", "fsdp", "deepspeed")] == ["ran", "failed", "not run"]
    assert rows["fsdp"]["reason"].startswith("failed: scaling run with 1 process failed (exit 3)")
    assert "fsdp broke" in rows["fsdp"]["reason"]
    fsdp = json.loads((out / "fsdp" / "scaling.json").read_text())
    assert fsdp["status"] == "failed" and fsdp["runs"] == [] and not (out / "fsdp" / "speedup.png").exists()
    assert "| FSDP (fully_shard) | — | — | — | — | — | — | failed: scaling run with 1 process failed (exit 3)" in (
        out / "comparison.md").read_text()
    page, markdown = report(run_cli, tmp_path, out)
    assert '<tr><td>FSDP (fully_shard)</td><td colspan="7" class="failed">failed: scaling run' in page
    assert '<h2>FSDP (fully_shard) scaling</h2>\n<p class="failed">failed: scaling run' in page
    assert "scaling-3/speedup.png" not in page and "scaling-2/speedup.png" in page   # fsdp's old plots are gone
    assert "| FSDP (fully_shard) | — | — | — | — | — | — | failed: scaling run with 1 process" in markdown
    assert "### FSDP (fully_shard) scaling\n\nfailed: scaling run with 1 process" in markdown
