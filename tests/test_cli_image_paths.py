"""An image given as a path (slurm IMAGE, scaling --image: a .sif or bundle folder on the cluster) must be absolute:
the argument grammar took `./x.sif` as a path, while the launchers read anything but `/...` as an image reference,
so `scaling --launcher docker --image ./x` ran `docker run ./x` (exit 1) and slurm named a registry host '.'."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_cli_args_first import outside, run

__all__ = ["outside"]   # the fixture, imported for the tests here

REPO = Path(__file__).resolve().parents[1]
RELATIVE = "is a relative path; name the .sif file or bundle folder by its absolute path on the cluster"


@pytest.mark.parametrize("argv", [
    ["slurm", "./x.sif", "--shm-size", "1g", "--framework", "pytorch"],
    ["slurm", "../bundle", "--runtime", "oci", "--shm-size", "1g", "--framework", "pytorch"],
    ["scaling", "--launcher", "docker", "--image", "./x", "--counts", "1"],
    ["scaling", "--launcher", "slurm", "--runtime", "apptainer", "--image", "./x.sif", "--shm-size", "1g"],
], ids=["slurm-sif", "slurm-bundle", "scaling-docker", "scaling-slurm"])
def test_a_relative_image_path_is_refused_before_anything_runs(outside: list[str], capsys: pytest.CaptureFixture,
                                                               argv: list[str]) -> None:
    code, out, err = run(capsys, *argv, "--matrix", str(REPO / "matrix.yaml"))
    assert outside == [] and code == 2, (code, err)
    assert len(err.strip().splitlines()) == 1 and RELATIVE in err, err


def test_an_absolute_sif_still_makes_a_job(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "slurm", "/shared/x.sif", "--shm-size", "1g", "--framework", "pytorch", "--matrix",
                         str(REPO / "matrix.yaml"))
    assert code == 0 and "/shared/x.sif" in out, err


@pytest.mark.parametrize("peer", ["tensorflow=admin:s3cr3t@127.0.0.1:5000/tensorflow-cpu:2.20",
                                  "tensorflow=127.0.0.1:5000/x:$(touch /tmp/p)", "tensorflow=;touch"])
def test_a_peer_image_is_an_image_reference(outside: list[str], capsys: pytest.CaptureFixture, peer: str) -> None:
    """validate --peer FRAMEWORK=IMAGE: its IMAGE was any text without spaces, so a reference with credentials
    or shell text went on to the registry and the engine (and into the tests' target file)."""
    code, out, err = run(capsys, "validate", "127.0.0.1:5000/pytorch-cpu-dev:0123456789ab-2.13", "--peer", peer,
                         "--matrix", str(REPO / "matrix.yaml"))
    assert outside == [] and code == 2, (code, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: --peer") and "s3cr3t" not in err, err
