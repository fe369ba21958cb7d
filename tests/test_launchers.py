"""A launcher kind is one module of buildtool/launch/launchers/ and one entry of contracts.frameworks.LAUNCHERS.

The table is what a framework.yaml is checked against when it loads (contracts cannot import launch);
the module is found by the entry's name. These tests keep the two in step, and show a new kind (a
stand-in `mpirun`, written to a temporary folder) taking part in the Kubernetes manifests and the sbatch
script with nothing else changed. The shm worker kinds are kept in step with the in-image script the
same way (contracts.frameworks.SHM_WORKERS against image-tests/scripts/shm_workers.py's `<kind>_mode`).
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest

from buildtool.contracts import frameworks, versions
from buildtool.launch import launchers
from buildtool.launch.k8s import VARIANTS, PodOptions, default_variant, manifests
from buildtool.launch.multinode import MultiNodeJob
from buildtool.launch.slurm import SlurmOptions, sbatch_script

REPO = Path(__file__).resolve().parent.parent
PACKAGE = Path(launchers.__file__).parent
FIXTURE_FW = REPO / "tests" / "fixtures" / "frameworks" / "fixturefw"


def test_every_registered_launcher_is_a_module_and_every_module_is_registered() -> None:
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert modules == sorted(launchers.module_name(n).rsplit(".", 1)[1] for n in frameworks.LAUNCHERS)
    for name in frameworks.LAUNCHERS:
        launcher = launchers.get(name)
        assert launcher.name == name and launcher.processes and launcher.first_node_hosts
        assert launcher.k8s_variants and set(launcher.k8s_variants) <= set(VARIANTS), name


def test_an_unknown_launcher_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown launcher 'mpirun'; one of torchrun, coordinator"):
        launchers.get("mpirun")


def test_a_registered_launcher_without_its_module_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(frameworks.LAUNCHERS, "mpirun", "mpirun on the first node")
    with pytest.raises(ValueError, match=r"launcher 'mpirun' is registered in contracts.frameworks.LAUNCHERS but "
                                         r"has no module buildtool\.launch\.launchers\.mpirun"):
        launchers.get("mpirun")


@pytest.mark.parametrize(("name", "gpus", "procs"), [("torchrun", 8, 8), ("torchrun", 0, 1), ("coordinator", 8, 1),
                                                     ("coordinator", 0, 1)])
def test_each_launcher_says_its_processes_per_node(name: str, gpus: int, procs: int) -> None:
    check = frameworks.MultiNodeCheck(framework="x", script="train.py", launcher=name)
    job = MultiNodeJob(image="x:1", nodes=3, gpus_per_node=gpus, check=check)
    assert (job.procs_per_node, job.world_size) == (procs, 3 * procs)
    assert job.env["DDP_EXPECT_WORLD_SIZE"] == str(3 * procs)


def test_the_placeholders_a_command_carries_are_the_verifiers() -> None:
    """What the verifier resolves on the node: a launcher's command may carry these, and the verifier knows them."""
    from buildtool.launch.multinode import VERIFY_SOURCE

    for placeholder in (launchers.PROCESS_ID, launchers.IS_HOST, launchers.LOCAL_ADDR):
        assert placeholder in VERIFY_SOURCE


MPIRUN = '''"""A stand-in launcher kind for the tests: one process per node, told its rank on its command line."""

from buildtool.launch.launchers import PROCESS_ID, Launcher


class Mpirun(Launcher):
    name = "mpirun"
    processes = "one rank per node"
    first_node_hosts = "rank 0"
    k8s_variants = ("job",)

    def procs_per_node(self, gpus_per_node):
        return 1

    def node_command(self, job, endpoint, rdzv_id, script):
        return ["python3", script, "--root", endpoint, "--rank", PROCESS_ID, "--size", str(job.nodes)]


LAUNCHER = Mpirun()
'''


def test_a_new_launcher_is_one_module_and_one_table_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The module (in a folder of its own here, added to the package's path) and its entry in LAUNCHERS: a
    framework.yaml naming it loads, and both generators run its command with nothing else told about it."""
    (tmp_path / "launchers").mkdir()
    (tmp_path / "launchers" / "mpirun.py").write_text(MPIRUN)
    monkeypatch.setattr(launchers, "__path__", [*launchers.__path__, str(tmp_path / "launchers")])
    monkeypatch.setitem(frameworks.LAUNCHERS, "mpirun", "one rank per node, told the root and its rank")
    monkeypatch.delitem(sys.modules, "buildtool.launch.launchers.mpirun", raising=False)

    suite = tmp_path / "image-tests"
    shutil.copytree(REPO / "image-tests" / "scripts", suite / "scripts")
    shutil.copytree(FIXTURE_FW, suite / "fixturefw")
    row = suite / "fixturefw" / "framework.yaml"
    row.write_text(row.read_text().replace("launcher: coordinator", "launcher: mpirun"))
    check = frameworks.load_row(suite / "fixturefw").multinode
    assert check is not None and check.launcher == "mpirun"

    job = MultiNodeJob(image="127.0.0.1:5000/x:1", nodes=2, gpus_per_node=0, check=check)
    assert (job.world_size, default_variant(job)) == (2, "job")
    docs = manifests(job, PodOptions(), "# the script\n", "job")
    [container] = docs[-1]["spec"]["template"]["spec"]["containers"]
    scripts = "/opt/image-tests/scripts"
    assert container["args"] == ["python3", f"{scripts}/verify_ddp.py", "python3", f"{scripts}/fixture_train.py",
                                    "--root", "ddp-check-0.ddp-check:29400", "--rank", "{process_id}", "--size", "2"]
    with pytest.raises(Exception, match=r"--variant pytorchjob runs torchrun under Kubeflow's training operator, and "
                                        r"fixturefw's multi-node check is a mpirun check \(fixture_train.py, one rank "
                                        r"per node\): use --variant job"):
        manifests(job, PodOptions(), "# the script\n", "pytorchjob")
    script = sbatch_script(job, SlurmOptions())
    assert "# The first node of the allocation hosts the rank 0." in script
    assert '--root "$endpoint" --rank \'{process_id}\' --size 2' in script
    assert "export DDP_NODES" in script   # its command needs a process id: the node list goes to the verifier


def test_the_shm_worker_kinds_are_the_in_image_scripts_modes() -> None:
    """contracts.frameworks.SHM_WORKERS (what framework.yaml is checked against) and the `<kind>_mode` functions
    of image-tests/scripts/shm_workers.py (which runs in the image and cannot import buildtool) agree."""
    tree = ast.parse((REPO / "image-tests" / "scripts" / "shm_workers.py").read_text())
    modes = sorted(node.name.removesuffix("_mode") for node in tree.body
                   if isinstance(node, ast.FunctionDef) and node.name.endswith("_mode"))
    assert modes == sorted(frameworks.SHM_WORKERS)


def test_every_version_scheme_has_its_rule() -> None:
    for name, scheme in versions.SCHEMES.items():
        assert scheme.description, name
        assert isinstance(scheme.rule("cpu", None, None), versions.Expectation)
        assert isinstance(scheme.rule("cuda", "13.0", "25.10"), versions.Expectation)
    with pytest.raises(ValueError, match=r"unknown version scheme 'nightly'; one of torch, plain, source"):
        versions.expectation("1.0", scheme="nightly", accelerator="cpu", cuda=None, ngc=None)


def test_the_shipped_frameworks_name_known_kinds() -> None:
    """Each framework folder's row names kinds of the tables (the load refuses any other; this says which)."""
    frameworks.use_checkout()
    for name in frameworks.names():
        row = frameworks.get(name)
        assert row.local_versions in versions.SCHEMES and row.shm_workers in frameworks.SHM_WORKERS
        if row.multinode is not None:
            assert launchers.get(row.multinode.launcher).name == row.multinode.launcher
