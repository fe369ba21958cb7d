"""Issue 39 finding 4: the launchers run the image's entrypoint, as validate does. NGC's entrypoint sets up
CUDA's forward-compatibility libraries for the older drivers contracts.driver_rules admits; Kubernetes'
`command:`, `apptainer exec` and pyxis without --container-entrypoint skipped it. Each runtime's command, as
generated (no cluster, no GPU here: not run on one)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
IMAGE = "127.0.0.1:5000/pytorch-ngc-dev:0123456789ab-25.10"
VERIFY = ["python3", "/opt/image-tests/scripts/verify_ddp.py"]


@pytest.mark.parametrize("variant", ["pytorchjob", "job"])
def test_k8s_gives_the_check_as_args_so_the_image_entrypoint_runs(run_cli, variant: str) -> None:
    code, out, err = run_cli("k8s", IMAGE, "--gpus-per-node", "8", "--variant", variant,
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    workload = list(yaml.safe_load_all(out))[-1]
    spec = (workload["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"] if variant == "pytorchjob"
            else workload["spec"]["template"]["spec"])
    container = spec["containers"][0]
    assert "command" not in container, container["command"]       # `command` replaces the image's ENTRYPOINT
    assert container["args"][:2] == VERIFY


def srun_line(run_cli, tmp_path: Path, runtime: str) -> list[str]:
    script = tmp_path / "ddp.sbatch"
    code, _, err = run_cli("slurm", IMAGE, "--gpus-per-node", "8", "--runtime", runtime, "--out", str(script),
                           "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    line = next(line for line in script.read_text().splitlines() if line.startswith("srun --kill-on-bad-exit=1 --cpus"))
    return shlex.split(line)


def test_apptainer_runs_the_runscript_not_exec(run_cli, tmp_path: Path) -> None:
    words = srun_line(run_cli, tmp_path, "apptainer")
    at = words.index("apptainer")
    assert words[at:at + 3] == ["apptainer", "run", "--nv"], words
    assert words[words.index(f"docker://{IMAGE}") + 1:][:2] == ["python3", "$jobdir/verify_ddp.py"]


def test_pyxis_asks_for_the_container_entrypoint(run_cli, tmp_path: Path) -> None:
    words = srun_line(run_cli, tmp_path, "pyxis")
    assert "--container-entrypoint" in words and words.index("--container-entrypoint") < words.index("python3")
