"""Issue 39 finding 4: the launchers run the image's entrypoint, as validate does. NGC's entrypoint sets up
CUDA's forward-compatibility libraries for the older drivers contracts.driver_rules admits; Kubernetes'
`command:`, `apptainer exec` and pyxis without --container-entrypoint skipped it. Each runtime's command, as
generated (no cluster, no GPU here: not run on one)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from tests import test_multinode

fw_project = test_multinode.fw_project   # the fixture framework's project (a pytest fixture of that module)

REPO = Path(__file__).resolve().parent.parent
# A single-platform GPU cell (pytorch-ngc:25.10 is built for linux/amd64 and linux/arm64: --platform needed).
IMAGE = "127.0.0.1:5000/pytorch-ngc-dev:0123456789ab-25.01"
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


def test_slurm_oci_puts_the_bundles_entrypoint_first(run_cli, fw_project: Path, tmp_path: Path) -> None:
    """SLURM's containers run the step's command in place of the bundle's process: the script reads the
    ENTRYPOINT `buildtool bundle` recorded and runs it first. Dry run on stub srun nodes: the entrypoint ran on
    each node, then the check passed through it (before: the command ran alone)."""
    from buildtool.common.net import free_port
    from tests.test_multinode import NODES, slurm_dry_run, slurm_script
    from tests.test_slurm import fake_bundle

    bundle = fake_bundle(tmp_path)
    marks = tmp_path / "entrypoint-ran"
    entry = bundle / "entry.sh"
    entry.write_text(f'#!/bin/sh\necho "$(hostname) $1" >> {marks}\nexec "$@"\n')
    entry.chmod(0o755)
    (bundle / "entrypoint.args").write_text(f"{entry}\n")
    script = slurm_script(run_cli, fw_project, tmp_path, str(bundle), "--runtime", "oci", "--framework", "fixturefw",
                          "--nodes", "2", "--gpus-per-node", "0", "--shm-size", "1m", "--rdzv-port",
                          str(free_port()), "--join-timeout", "20")
    assert '"--container=$OCI_BUNDLE" ${entrypoint[@]+"${entrypoint[@]}"} python3' in script.read_text()
    proc, _ = slurm_dry_run(tmp_path, script, nodes=NODES[:2])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "DDP check passed: world size 2" in proc.stdout
    assert len(marks.read_text().splitlines()) == 2 and all(line.endswith(" python3")
                                                             for line in marks.read_text().splitlines())


def test_an_oci_bundle_without_its_entrypoint_record_is_refused(run_cli, fw_project: Path, tmp_path: Path) -> None:
    from tests.test_multinode import slurm_dry_run, slurm_script
    from tests.test_slurm import fake_bundle

    bundle = fake_bundle(tmp_path)
    (bundle / "entrypoint.args").unlink()
    script = slurm_script(run_cli, fw_project, tmp_path, str(bundle), "--runtime", "oci", "--framework", "fixturefw",
                          "--gpus-per-node", "0", "--shm-size", "1m")
    proc, _ = slurm_dry_run(tmp_path, script)
    assert proc.returncode == 2 and "records no entrypoint (a bundle made before bundles recorded it)" in proc.stderr


def _layout(folder: Path, entrypoint: list[str] | None) -> Path:
    """An OCI layout as skopeo writes it, of one image whose config has this ENTRYPOINT."""
    import hashlib
    import json

    blobs = folder / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: dict) -> str:
        raw = json.dumps(data).encode()
        digest = hashlib.sha256(raw).hexdigest()
        (blobs / digest).write_bytes(raw)
        return f"sha256:{digest}"

    config = put({"os": "linux", "architecture": "amd64", "config": {"Entrypoint": entrypoint, "Cmd": ["bash"]}})
    manifest = put({"schemaVersion": 2, "config": {"digest": config}, "layers": []})
    (folder / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{"digest": manifest}]}))
    return folder


def test_a_bundle_records_the_images_entrypoint(tmp_path: Path) -> None:
    from buildtool.common.errors import UserError
    from buildtool.launch.bundle import layout_entrypoint

    ngc = ["/opt/nvidia/nvidia_entrypoint.sh"]
    assert layout_entrypoint(_layout(tmp_path / "ngc", ngc)) == tuple(ngc)
    assert layout_entrypoint(_layout(tmp_path / "pip", None)) == ()
    with pytest.raises(UserError, match="has an empty word or a newline"):
        layout_entrypoint(_layout(tmp_path / "bad", ["/bin/sh", "-c", "a\nb"]))


@pytest.mark.parametrize("entrypoint", ["/opt/nvidia/nvidia_entrypoint.sh", ["/bin/sh", 5], {"a": "b"}])
def test_an_entrypoint_that_is_no_list_of_strings_is_refused(tmp_path: Path, entrypoint: object) -> None:
    """A config whose Entrypoint was a string was recorded one character a line (`/`, `o`, `p`, ...: every node would
    run `/` with the rest as its arguments), a number as its text; now the bundle is refused naming it."""
    from buildtool.common.errors import UserError
    from buildtool.launch.bundle import layout_entrypoint

    with pytest.raises(UserError) as caught:
        layout_entrypoint(_layout(tmp_path / "bad", entrypoint))  # type: ignore[arg-type]
    assert str(caught.value).startswith("the image's ENTRYPOINT "), caught.value
    assert str(caught.value).endswith(" is not a list of strings (the image config's Entrypoint); rebuild the image "
                                      "with an exec-form ENTRYPOINT"), caught.value
