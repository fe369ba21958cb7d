"""Launching the arm64 image of a GPU cell on Grace Hopper nodes (issue 38): Kubernetes pods get the
`kubernetes.io/arch: arm64` node selector of the platform named, and a cell built for both platforms is
never launched without naming one; SLURM jobs name the site's node feature of its Grace nodes with
--constraint (SLURM has no standard architecture feature), refused when it is not a feature expression."""

from __future__ import annotations

import yaml

from buildtool.contracts import frameworks
from buildtool.launch.multinode import MultiNodeJob, check_of
from buildtool.launch.slurm import SlurmOptions, sbatch_script
from tests.conftest import REPO

CUDA_IMAGE = "127.0.0.1:5000/pytorch-cuda-dev:0123456789ab-2.13"


def test_the_arm64_pods_of_pytorch_cuda_run_on_arm64_nodes(run_cli) -> None:  # noqa: ANN001
    code, out, err = run_cli("k8s", CUDA_IMAGE, "--variant", "job", "--platform", "linux/arm64",
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    pod = list(yaml.safe_load_all(out))[-1]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["kubernetes.io/arch"] == "arm64"
    code, out, err = run_cli("k8s", CUDA_IMAGE, "--variant", "job", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == ""
    assert "pytorch-cuda:2.13 is built for linux/amd64, linux/arm64: pass --platform" in err


def test_a_slurm_constraint_becomes_the_jobs_sbatch_directive_and_none_adds_nothing() -> None:
    job = MultiNodeJob(image="/shared/pytorch-cuda.sif", nodes=2, gpus_per_node=1, join_timeout_s=8, shm_size="8g",
                       check=check_of(frameworks.get("pytorch")))
    script = sbatch_script(job, SlurmOptions(constraint="gh200&ib"))
    assert "#SBATCH --constraint=gh200&ib\n" in script
    assert "--constraint" not in sbatch_script(job, SlurmOptions())


def test_a_constraint_that_is_no_feature_expression_is_refused_naming_the_flag(run_cli) -> None:  # noqa: ANN001
    code, out, err = run_cli("slurm", "/shared/pytorch-cuda.sif", "--constraint", "gh200 --uid=0")
    assert code == 2 and out == ""
    assert "--constraint" in err and "SLURM node features" in err, err
