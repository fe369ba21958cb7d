"""`buildtool k8s`: manifests validated offline against the Kubernetes schemas (strict) and the
PyTorchJob CRD's schema, defaults from the matrix, overrides, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv
from referencing import Registry, Resource

from buildtool.common.errors import UserError
from buildtool.launch.k8s import PodOptions
from buildtool.launch.multinode import VERIFY_FILES, NcclSettings, write_verifier

REPO = Path(__file__).resolve().parent.parent
K8S_VERSION = "1.33.0"
# A single-platform GPU cell (pytorch-ngc:25.10 is built for linux/amd64 and linux/arm64: --platform needed).
IMAGE = "127.0.0.1:5000/pytorch-ngc-dev:0123456789ab-25.01"


def pytorchjob_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((REPO / "tests/schemas/pytorchjob-v1.json").read_text())
    defs = kv.schema_contents(f"kubernetes-json-schema/v{K8S_VERSION}-local-strict/_definitions.json", K8S_VERSION)
    registry = Registry().with_resource("/api/_definitions.json", Resource.from_contents(defs))
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate(doc: dict) -> None:
    if doc["kind"] == "PyTorchJob":
        pytorchjob_validator().validate(doc)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def generate(run_cli, *args: str) -> list[dict]:
    code, out, err = run_cli("k8s", *args, "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    return list(yaml.safe_load_all(out))


@pytest.mark.parametrize("variant", ["pytorchjob", "job"])
def test_manifests_pass_the_kubernetes_schemas(run_cli, variant: str) -> None:
    docs = generate(run_cli, IMAGE, "--nodes", "3", "--gpus-per-node", "8", "--variant", variant,
                    "--node-selector", "nvidia.com/gpu.product=H100", "--cpu", "32", "--memory", "200Gi",
                    "--toleration", "nvidia.com/gpu:NoSchedule", "--toleration", "pool=training:NoExecute")
    kinds = [d["kind"] for d in docs]
    assert kinds == (["ConfigMap", "PyTorchJob"] if variant == "pytorchjob" else ["ConfigMap", "Service", "Job"])
    for doc in docs:
        validate(doc)
    pod = _pod(docs[-1])
    # The user's selector, and the nodes of the cell's only platform (the pods run its image).
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100", "kubernetes.io/arch": "amd64",
                                   "kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                  {"key": "pool", "operator": "Equal", "value": "training", "effect": "NoExecute"}]
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "32", "memory": "200Gi"}


def test_the_validators_reject_broken_manifests(run_cli) -> None:
    docs = generate(run_cli, IMAGE, "--nodes", "2", "--gpus-per-node", "8")
    job = docs[1]
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError):
        validate(job)
    docs = generate(run_cli, IMAGE, "--nodes", "2", "--gpus-per-node", "8")
    pod = docs[1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    pod["volumes"][0]["emptyDir"]["mediun"] = "Memory"  # a typo the strict pod schema must catch
    with pytest.raises(jsonschema.ValidationError):
        validate(docs[1])
    docs = generate(run_cli, IMAGE, "--variant", "job")
    docs[2]["spec"]["completionMode"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(docs[2])


def _pod(doc: dict) -> dict:
    if doc["kind"] == "PyTorchJob":
        return doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    return doc["spec"]["template"]["spec"]


@pytest.mark.parametrize("variant", ["pytorchjob", "job"])
def test_defaults_shm_rendezvous_and_bounded_restarts(run_cli, variant: str) -> None:
    docs = generate(run_cli, IMAGE, "--nodes", "4", "--gpus-per-node", "8", "--variant", variant)
    job = docs[-1]
    pod = _pod(job)
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}  # pytorch-ngc's run profile: 8g
    container = pod["containers"][0]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    command = container["args"]
    # The store's read timeout follows the join timeout: late nodes may join after 60 s.
    # is_host: the verifier says from the pod's index. A PyTorchJob pins rank 0 to its Master instead: the static
    # rendezvous with the operator's node rank, whose store waits the join timeout (test_the_pytorchjobs_master_...).
    if variant == "job":
        assert "--rdzv-backend=c10d" in command
        assert "--rdzv-conf=join_timeout=900,read_timeout=900,is_host={is_host}" in command
    else:
        assert "--rdzv-backend=static" in command and "--node-rank={node_rank}" in command
        assert "--rdzv-conf=timeout=900" in command
    assert "--nnodes=4" in command and "--nproc-per-node=8" in command
    assert command[-1] == "/opt/image-tests/scripts/ddp_train.py"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    if variant == "pytorchjob":
        assert job["spec"]["runPolicy"]["backoffLimit"] == 2
        assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
        assert container["name"] == "pytorch"
        assert container["ports"][0]["name"] == "pytorchjob-port"
    else:
        assert job["spec"]["backoffLimit"] == 2
        assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 4
        assert pod["subdomain"] == docs[1]["metadata"]["name"] == "ddp-check"
        assert "--rdzv-endpoint=ddp-check-0.ddp-check:29400" in command
        assert docs[1]["spec"]["clusterIP"] == "None" and docs[1]["spec"]["publishNotReadyAddresses"] is True
    configmap = docs[0]
    assert configmap["data"]["ddp_train.py"] == (REPO / "image-tests/pytorch/scripts/ddp_train.py").read_text()
    assert {k: configmap["data"][k] for k in VERIFY_FILES} == VERIFY_FILES   # the verifier and what it imports


@pytest.mark.parametrize("variant", ["pytorchjob", "job"])
def test_a_tag_is_pulled_at_every_start_and_a_digest_from_the_nodes_cache(run_cli, variant: str) -> None:
    """imagePullPolicy was IfNotPresent for every image: a node that had pulled an earlier image of a moving tag (the
    cell's `{version}` and `latest` follow its newest release) ran that one, and the check judged another image than
    the one named. A tag is resolved at every pod start (Always); a digest, which names one image, IfNotPresent."""
    moving = "127.0.0.1:5000/pytorch-ngc:25.01"   # the cell's {version} tag
    for image, policy in ((moving, "Always"), (IMAGE, "Always"), (f"{moving}@sha256:{'a' * 64}", "IfNotPresent")):
        docs = generate(run_cli, image, "--variant", variant, "--platform", "linux/amd64")
        pods = ([r["template"]["spec"] for r in docs[-1]["spec"]["pytorchReplicaSpecs"].values()]
                if variant == "pytorchjob" else [_pod(docs[-1])])
        assert [c["imagePullPolicy"] for pod in pods for c in pod["containers"]] == [policy] * len(pods), image
        assert all(c["image"] == image for pod in pods for c in pod["containers"])


def test_every_default_can_be_overridden(run_cli) -> None:
    docs = generate(run_cli, IMAGE, "--nodes", "2", "--gpus-per-node", "4", "--shm-size", "32g",
                    "--join-timeout", "1800", "--backoff-limit", "5", "--name", "nightly-ddp", "--namespace", "ml",
                    "--gpu-resource", "amd.com/gpu", "--rdzv-port", "29500")
    job = docs[1]
    pod = _pod(job)
    assert pod["volumes"][0]["emptyDir"]["sizeLimit"] == "32Gi"
    assert "--rdzv-conf=timeout=1800" in pod["containers"][0]["args"]   # a PyTorchJob's static rendezvous
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["DDP_EXPECT_WORLD_SIZE"] == "8" and env["DDP_EXPECT_BACKEND"] == "nccl"
    assert job["spec"]["runPolicy"]["backoffLimit"] == 5
    assert job["metadata"] == {"name": "nightly-ddp", "namespace": "ml",
                               "labels": {"app.kubernetes.io/name": "nightly-ddp",
                                          "app.kubernetes.io/part-of": "dl-images"}}
    assert pod["containers"][0]["resources"]["limits"] == {"amd.com/gpu": 4}
    assert pod["containers"][0]["ports"][0]["containerPort"] == 29500
    assert pod["volumes"][1]["configMap"]["name"] == "nightly-ddp-scripts"
    validate(job)


def test_cpu_cell_gets_its_own_shm_and_no_gpu(run_cli) -> None:
    docs = generate(run_cli, "127.0.0.1:5000/pytorch-cpu-dev:abc-2.13", "--nodes", "2", "--gpus-per-node", "0",
                    "--variant", "job")
    pod = _pod(docs[-1])
    assert "resources" not in pod["containers"][0]
    assert "--nproc-per-node=1" in pod["containers"][0]["args"]
    for doc in docs:
        validate(doc)


@pytest.mark.parametrize(("args", "needle"), [
    (["--nodes", "0"], "--nodes"),
    (["--variant", "mpijob"], "--variant"),
    (["--node-selector", "no-equals-sign"], "--node-selector"),
    (["--shm-size", "lots"], "--shm-size"),
    (["--toleration", "nvidia.com/gpu:Sometimes"], "--toleration"),
    # RDMA resources and NCCL settings: a malformed one is refused, never passed to the cluster.
    (["--rdma-resource", "rdma_shared_device_a"], "--rdma-resource 'rdma_shared_device_a' is not a resource name"),
    (["--rdma-resource", "RDMA/dev"], "--rdma-resource 'RDMA/dev' is not a resource name"),
    (["--rdma-resource", "rdma/bad name"], "--rdma-resource 'rdma/bad name' is not a resource name"),
    (["--rdma-resource", "kubernetes.io/rdma"], "kubernetes.io names no extended resource"),
    (["--rdma-resource", "rdma/dev=0"], "COUNT must be a positive whole number"),
    (["--gpus-per-node", "0", "--rdma-resource", "rdma/dev"], "--rdma-resource is for GPU jobs"),
    (["--nccl-debug", "LOUD"], "--nccl-debug must be one of VERSION, WARN, INFO, TRACE"),
    (["--nccl-env", "GLOO_SOCKET_IFNAME=eth0"], "the name must be an NCCL_* variable"),
    (["--nccl-env", "NCCL_DEBUG=INFO"], "use its own option, --nccl-debug"),
    (["--nccl-socket-ifname", "eth0 eth1"], "--nccl-socket-ifname 'eth0 eth1' is not a comma list"),
    (["--gpus-per-node", "0", "--nccl-socket-ifname", "eth0"], "NCCL settings (--nccl-*) apply to GPU jobs"),
])
def test_bad_input_is_one_line_and_exit_2(run_cli, args: list[str], needle: str) -> None:
    code, out, err = run_cli("k8s", IMAGE, *args, "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == ""
    assert needle in err and len(err.strip().splitlines()) == 1


def test_a_toleration_key_must_be_a_label_key() -> None:
    """parse_tolerations took an empty key (`=v:NoSchedule`, which Kubernetes allows only with Exists) and a key with
    a space; Kubernetes refused them only when the manifest was applied. Refused here, in one line."""
    for item, bad in (("=v:NoSchedule", "''"), ("a b:NoSchedule", "'a b'"), ("nvidia.com/:NoSchedule", "'nvidia.com/'"),
                      ("-a:NoExecute", "'-a'")):
        with pytest.raises(UserError) as caught:
            PodOptions.parse_tolerations([item])
        assert str(caught.value).startswith(f"--toleration: {bad} is not a Kubernetes label key ([prefix/]name"), item
    with pytest.raises(UserError, match="^--toleration: 'a b' is not a Kubernetes label value"):
        PodOptions.parse_tolerations(["k=a b:NoSchedule"])
    assert PodOptions.parse_tolerations(["nvidia.com/gpu:NoSchedule", "pool=:NoExecute"]) == (
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "pool", "operator": "Equal", "value": "", "effect": "NoExecute"})


def _verify(tmp_path: Path, result: dict, exit_code: int = 0, world: int = 4,
            backend: str = "nccl", env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "fake_torchrun.py"
    fake.write_text(f"import sys\nprint('DDP_RESULT ' + {json.dumps(json.dumps(result))})\nsys.exit({exit_code})\n")
    verify = write_verifier(tmp_path)
    env = {**os.environ, "DDP_EXPECT_WORLD_SIZE": str(world), "DDP_EXPECT_BACKEND": backend, **(env_extra or {})}
    return subprocess.run([sys.executable, str(verify), sys.executable, str(fake)], capture_output=True, text=True,
                          timeout=60, env=env)


def test_the_verifier_fails_a_run_that_did_not_train_in_sync(tmp_path: Path) -> None:
    good = {"backend": "nccl", "world_size": 4, "first_loss": 2.0, "last_loss": 0.5, "identical": True}
    assert _verify(tmp_path, good).returncode == 0
    diverged = _verify(tmp_path, {**good, "identical": False})
    assert diverged.returncode == 1 and "different parameters" in diverged.stderr
    stuck = _verify(tmp_path, {**good, "last_loss": 2.5})
    assert stuck.returncode == 1 and "loss did not fall" in stuck.stderr
    assert _verify(tmp_path, good, exit_code=3).returncode == 3


def test_the_verifier_fails_the_wrong_backend_or_world_size(tmp_path: Path) -> None:
    """GPUs asked for but none reached the containers: DDP falls back to gloo on CPU and trains
    fine; the verifier must still fail it. Likewise a world smaller than the launcher asked for."""
    good = {"backend": "nccl", "world_size": 16, "first_loss": 2.0, "last_loss": 0.5, "identical": True}
    assert _verify(tmp_path, good, world=16).returncode == 0
    gloo = _verify(tmp_path, {**good, "backend": "gloo"}, world=16)
    assert gloo.returncode == 1 and "trained with gloo, not nccl" in gloo.stderr, gloo.stderr
    small = _verify(tmp_path, {**good, "world_size": 8}, world=16)
    assert small.returncode == 1 and "world size 8, not the 16 asked for" in small.stderr, small.stderr
    unset = subprocess.run([sys.executable, str(tmp_path / "verify_ddp.py"), "true"], capture_output=True, text=True,
                           timeout=60, env={k: v for k, v in os.environ.items() if not k.startswith("DDP_EXPECT")})
    assert unset.returncode != 0 and "DDP_EXPECT_WORLD_SIZE" in unset.stderr


def test_job_expectations_follow_nodes_and_gpus() -> None:
    from buildtool.contracts import frameworks
    from buildtool.launch.multinode import MultiNodeJob

    check = frameworks.get("pytorch").multinode
    assert MultiNodeJob(image="x:1", nodes=3, gpus_per_node=8, check=check).env["DDP_EXPECT_WORLD_SIZE"] == "24"
    assert MultiNodeJob(image="x:1", nodes=3, gpus_per_node=8, check=check).backend == "nccl"
    cpu = MultiNodeJob(image="x:1", nodes=2, gpus_per_node=0, check=check)
    assert (cpu.world_size, cpu.backend) == (2, "gloo")
    command = MultiNodeJob(image="x:1", nodes=2, gpus_per_node=8, check=check, join_timeout_s=1200).command("h:1", "r")
    assert "--rdzv-conf=join_timeout=1200,read_timeout=1200,is_host={is_host}" in command


# -- the image's cell comes from its tag, or the command stops (issue 21: never the default cell) -----

@pytest.mark.parametrize(("image", "tag", "name"), [
    ("127.0.0.1:5000/pytorch-cpu-dev:0123456789ab-25.01", "0123456789ab-25.01", "pytorch-cpu"),  # no such version
    ("127.0.0.1:5000/pytorch-ngc-dev:0123456789ab-24.01", "0123456789ab-24.01", "pytorch-ngc"),
    ("127.0.0.1:5000/pytorch-ngc:garbage", "garbage", "pytorch-ngc"),
])
def test_a_tag_that_names_no_cell_is_exit_2_never_the_default_cell(run_cli, image: str, tag: str, name: str) -> None:
    code, out, err = run_cli("k8s", image, "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "", err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{image}: tag {tag!r} names no cell of {name} in the matrix" in err, err
    assert "a tag is <version>, <version>-<release>" in err and "or a dev tag <revision>-<version>" in err, err


def test_a_tag_of_each_accepted_form_names_its_cell() -> None:
    from buildtool.launch.multinode import cell_for_image
    from buildtool.matrix.loader import load_matrix

    matrix = load_matrix(REPO / "matrix.yaml", REPO / "templates")
    found = {ref: getattr(cell_for_image(matrix, ref), "key", None) for ref in (
        "127.0.0.1:5000/pytorch-ngc-dev:0123456789ab-25.01", "127.0.0.1:5000/pytorch-ngc-dev:build.7-25.10",
        "pytorch-ngc:25.01", "pytorch-ngc:25.01-0.1.0", "pytorch-ngc:latest", "registry.example/team/pytorch-ngc:25.10",
        "pytorch-cpu:latest", "ghcr.io/someone/other:1")}
    assert found == {
        "127.0.0.1:5000/pytorch-ngc-dev:0123456789ab-25.01": "pytorch-ngc:25.01",
        "127.0.0.1:5000/pytorch-ngc-dev:build.7-25.10": "pytorch-ngc:25.10",
        "pytorch-ngc:25.01": "pytorch-ngc:25.01", "pytorch-ngc:25.01-0.1.0": "pytorch-ngc:25.01",
        "pytorch-ngc:latest": "pytorch-ngc:25.10", "registry.example/team/pytorch-ngc:25.10": "pytorch-ngc:25.10",
        "pytorch-cpu:latest": "pytorch-cpu:2.13", "ghcr.io/someone/other:1": None}


@pytest.mark.parametrize(("image", "message"), [
    ("pytorch-ngc:latest-0.1.0", "tag 'latest-0.1.0' names no cell of pytorch-ngc"),  # latest is the 25.10 cell's alone
    ("pytorch-cpu@sha256:" + "a" * 64, "names no tag, so no cell of pytorch-cpu"),
    ("127.0.0.1:5000/pytorch-cpu:", "ends its name with ':' but names no tag"),
    ("ghcr.io/someone/other:1", "ghcr.io/someone/other:1 is no image of the matrix (pytorch-ngc, "),
])
def test_an_image_the_matrix_cannot_place_is_exit_2_naming_it(run_cli, image: str, message: str) -> None:
    code, out, err = run_cli("k8s", image, "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and message in err, err
    # --shm-size, --framework and --platform: nothing to read from the matrix (a foreign image names no
    # framework and no platform either)
    code, out, err = run_cli("k8s", image, "--shm-size", "2g", "--framework", "pytorch", "--matrix",
                             str(REPO / "matrix.yaml"))
    assert code == 2 and (image.endswith(":") or "pass --platform" in err or message in err), err
    code, out, err = run_cli("k8s", image, "--shm-size", "2g", "--framework", "pytorch", "--platform", "linux/arm64",
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == (2 if image.endswith(":") else 0), err


# -- issue 23 (5): NCCL, IPC_LOCK, RDMA, the store host by index, GKE's driver folder ------------------------

def _container(docs: list[dict]) -> dict:
    return _pod(docs[-1])["containers"][0]


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


@pytest.mark.parametrize("variant", ["pytorchjob", "job"])
def test_gpu_pods_get_nccl_settings_ipc_lock_and_rdma_when_asked(run_cli, variant: str) -> None:
    container = _container(generate(run_cli, IMAGE, "--gpus-per-node", "8", "--variant", variant))
    env = _env(container)
    # NCCL_DEBUG=INFO on INIT,NET by default (the verifier reports the network NCCL chose; issue 39); the
    # interface and HCAs only when the user names them.
    assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"]) == ("INFO", "INIT,NET")
    assert not {"NCCL_SOCKET_IFNAME", "NCCL_IB_HCA"} & set(env)
    assert container["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}      # no RDMA unless asked
    assert env["DDP_APPEND_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"   # GKE's driver folder, after the image's
    docs = generate(run_cli, IMAGE, "--gpus-per-node", "8", "--variant", variant, "--nccl-debug", "INFO",
                    "--nccl-socket-ifname", "^lo,docker", "--nccl-ib-hca", "mlx5_0:1,mlx5_1:1",
                    "--nccl-env", "NCCL_IB_GID_INDEX=3", "--rdma-resource", "rdma/rdma_shared_device_a",
                    "--rdma-resource", "example.com/ib=2")
    for doc in docs:
        validate(doc)
    container = _container(docs)
    env = _env(container)
    assert (env["NCCL_DEBUG"], env["NCCL_SOCKET_IFNAME"], env["NCCL_IB_HCA"], env["NCCL_IB_GID_INDEX"]) == (
        "INFO", "^lo,docker", "mlx5_0:1,mlx5_1:1", "3")
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8, "rdma/rdma_shared_device_a": 1,
                                                "example.com/ib": 2}
    unlocked = _container(generate(run_cli, IMAGE, "--gpus-per-node", "8", "--variant", variant, "--no-ipc-lock"))
    assert "securityContext" not in unlocked


def test_cpu_pods_get_no_nccl_no_ipc_lock_no_driver_folder(run_cli) -> None:
    container = _container(generate(run_cli, "127.0.0.1:5000/pytorch-cpu-dev:abc-2.13", "--gpus-per-node", "0",
                                    "--variant", "job"))
    assert not [name for name in _env(container) if name.startswith("NCCL_") or name == "DDP_APPEND_LIBRARY_PATH"]
    assert "securityContext" not in container


def _echo_args(tmp_path: Path, env_extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The verifier around a command that prints its arguments (and LD_LIBRARY_PATH), then fails: no DDP_RESULT."""
    verify = write_verifier(tmp_path)
    echo = "import os, sys; print('ARGS', sys.argv[1:]); print('LD', os.environ.get('LD_LIBRARY_PATH')); sys.exit(7)"
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_LIBRARY_PATH", "JOB_COMPLETION_INDEX", "DDP_NODES", "RANK")}
    env |= {"DDP_EXPECT_WORLD_SIZE": "2", "DDP_EXPECT_BACKEND": "nccl", **env_extra}
    return subprocess.run([sys.executable, str(verify), sys.executable, "-c", echo, *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_pod_0_hosts_the_store_by_its_index_not_by_dns(tmp_path: Path) -> None:
    """torch would decide by matching its hostname through DNS: a record not there yet left no store host."""
    conf = "--rdzv-conf=join_timeout=9,read_timeout=9,is_host={is_host}"
    for index, flag in (("0", ",is_host=true"), ("1", ",is_host=false")):
        run = _echo_args(tmp_path, {"JOB_COMPLETION_INDEX": index}, conf)
        assert f"ARGS ['--rdzv-conf=join_timeout=9,read_timeout=9{flag}']" in run.stdout, run.stdout + run.stderr
    # No index and no node list (a PyTorchJob): torch decides, as before.
    run = _echo_args(tmp_path, {}, conf)
    assert "ARGS ['--rdzv-conf=join_timeout=9,read_timeout=9']" in run.stdout, run.stdout + run.stderr


def test_the_pytorchjobs_master_runs_rank_0_by_the_operators_node_rank(run_cli, tmp_path: Path) -> None:
    """The training operator marks a PyTorchJob Succeeded once its Master succeeds (Workers restart in place), but
    c10d's rendezvous may give global rank 0 to a Worker, whose failed check then never reached the job's status.
    Now every pod runs torchrun's static rendezvous with the node rank the operator gives it (RANK: the Master 0),
    so the Master runs rank 0; the indexed Job, which needs every pod to succeed, keeps c10d."""
    docs = generate(run_cli, IMAGE, "--nodes", "3", "--gpus-per-node", "8")
    validate(docs[-1])
    specs = docs[-1]["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 2
    for role in ("Master", "Worker"):
        assert specs[role]["template"]["spec"]["containers"][0]["args"] == [
            "python3", "/opt/image-tests/scripts/verify_ddp.py", "torchrun", "--nnodes=3", "--nproc-per-node=8",
            "--rdzv-backend=static", "--rdzv-endpoint=$(MASTER_ADDR):$(MASTER_PORT)", "--rdzv-id=ddp-check",
            "--rdzv-conf=timeout=900", "--node-rank={node_rank}", "--max-restarts=0",
            "/opt/image-tests/scripts/ddp_train.py"]
    job = _container(generate(run_cli, IMAGE, "--nodes", "3", "--gpus-per-node", "8", "--variant", "job"))["args"]
    assert job[2:] == ["torchrun", "--nnodes=3", "--nproc-per-node=8", "--rdzv-backend=c10d",
                       "--rdzv-endpoint=ddp-check-0.ddp-check:29400", "--rdzv-id=ddp-check",
                       "--rdzv-conf=join_timeout=900,read_timeout=900,is_host={is_host}", "--local-addr={local_addr}",
                       "--max-restarts=0", "/opt/image-tests/scripts/ddp_train.py"]
    # The verifier puts the operator's RANK there; without a whole number there it stops naming RANK.
    for rank in ("0", "2"):
        run = _echo_args(tmp_path, {"RANK": rank}, "--node-rank={node_rank}")
        assert f"ARGS ['--node-rank={rank}']" in run.stdout, run.stdout + run.stderr
    unset = _echo_args(tmp_path, {}, "--node-rank={node_rank}")
    assert unset.returncode == 1 and "ARGS" not in unset.stdout
    assert unset.stderr == ("DDP check failed: no node rank for this node: RANK is not set (Kubeflow's training "
                            "operator sets it in a PyTorchJob's pods: the Master 0, Worker i i+1)\n"), unset.stderr
    odd = _echo_args(tmp_path, {"RANK": "-1"}, "--node-rank={node_rank}")
    assert odd.returncode == 1, odd.stdout
    assert odd.stderr.startswith("DDP check failed: RANK='-1' is not a whole number"), odd.stderr


def test_pods_wait_for_the_store_hosts_name_then_fail_naming_it(tmp_path: Path) -> None:
    lost = _echo_args(tmp_path, {"DDP_RDZV_HOST": "ddp-check-0.ddp-check.invalid", "DDP_RESOLVE_TIMEOUT_S": "1"})
    assert lost.returncode == 1 and "ARGS" not in lost.stdout   # the check never started
    assert ("DDP check failed: the rendezvous host ddp-check-0.ddp-check.invalid did not resolve within 1 s"
            in lost.stderr), lost.stderr
    found = _echo_args(tmp_path, {"DDP_RDZV_HOST": "localhost", "DDP_RESOLVE_TIMEOUT_S": "1"})
    assert found.returncode == 7 and "ARGS" in found.stdout


def test_the_driver_folder_is_appended_after_the_images_library_path(tmp_path: Path) -> None:
    gke = {"DDP_APPEND_LIBRARY_PATH": "/usr/local/nvidia/lib64"}
    kept = _echo_args(tmp_path, {**gke, "LD_LIBRARY_PATH": "/opt/image/lib"})
    assert "LD /opt/image/lib:/usr/local/nvidia/lib64" in kept.stdout.splitlines()
    alone = _echo_args(tmp_path, gke)
    assert "LD /usr/local/nvidia/lib64" in alone.stdout.splitlines()


def test_the_gloo_fallback_hint_names_a_missing_driver_library(tmp_path: Path) -> None:
    good = {"backend": "nccl", "world_size": 4, "first_loss": 2.0, "last_loss": 0.5, "identical": True}
    gloo = _verify(tmp_path, {**good, "backend": "gloo"}, env_extra={"LD_LIBRARY_PATH": "/opt/image/lib"})
    assert gloo.returncode == 1
    assert ("libcuda.so.1 is in none of LD_LIBRARY_PATH's folders (/opt/image/lib) nor the linker cache: on GKE the "
            "driver installer mounts it at /usr/local/nvidia/lib64, which must be on LD_LIBRARY_PATH") in gloo.stderr
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "libcuda.so.1").write_text("")
    found = _verify(tmp_path, {**good, "backend": "gloo"}, env_extra={"LD_LIBRARY_PATH": str(driver)})
    assert "trained with gloo, not nccl" in found.stderr and "libcuda.so.1 is in none" not in found.stderr


# -- issue 24: the platform the pods run ----------------------------------------------------------------------

def test_pods_run_on_nodes_of_the_named_platform_and_a_platform_the_cell_lacks_is_refused(run_cli) -> None:
    docs = generate(run_cli, IMAGE, "--variant", "job", "--platform", "linux/amd64")
    assert _pod(docs[-1])["nodeSelector"] == {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"}
    code, out, err = run_cli("k8s", IMAGE, "--platform", "linux/arm64", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and "--platform linux/arm64: pytorch-ngc:25.01 is built for linux/amd64 only" in err
    code, out, err = run_cli("k8s", IMAGE, "--platform", "linux/riscv64", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and "--platform: unknown platform 'linux/riscv64'; one of linux/amd64, linux/arm64" in err
    code, out, err = run_cli("k8s", IMAGE, "--node-selector", "kubernetes.io/arch=arm64", "--matrix",
                             str(REPO / "matrix.yaml"))
    assert code == 2 and ("--node-selector kubernetes.io/arch=arm64 contradicts --platform linux/amd64 "
                          "(kubernetes.io/arch=amd64)") in err


def test_a_multi_platform_cell_needs_its_platform_named() -> None:
    """An index of amd64 and arm64 manifests: a multi-node job runs one of them on every node, never a mix."""
    import dataclasses

    from buildtool.common.errors import UserError
    from buildtool.launch.arch import choose_platform, node_selector
    from tests.conftest import fixture_matrix

    cpu = {c.key: c for c in fixture_matrix().cells}["pytorch-cpu:2.13"]
    both = dataclasses.replace(cpu, platforms=("linux/amd64", "linux/arm64"), emulation_factor=4)
    with pytest.raises(UserError, match=r"pytorch-cpu:2.13 is built for linux/amd64, linux/arm64: pass --platform"):
        choose_platform("x/pytorch-cpu:2.13", None, both)
    arm = choose_platform("x/pytorch-cpu:2.13", "linux/arm64", both)
    assert node_selector(arm, {"pool": "grace"}) == {"pool": "grace", "kubernetes.io/arch": "arm64",
                                                     "kubernetes.io/os": "linux"}
    assert choose_platform("x/pytorch-cpu:2.13", None, cpu).name == "linux/amd64"
    with pytest.raises(UserError, match="no image of the matrix, so its platforms are unknown: pass --platform"):
        choose_platform("ghcr.io/other:1", None, None)


def test_a_single_image_of_a_multi_platform_cell_is_launched_on_its_own_platform() -> None:
    """A test or mirror that holds one platform's image alone (a single manifest, not the index): that image has
    one platform, which needs no naming; one its cell is not built for is refused; an index still needs it."""
    import dataclasses

    from buildtool.common.errors import UserError
    from buildtool.launch.arch import choose_platform
    from tests.conftest import fixture_matrix

    cpu = {c.key: c for c in fixture_matrix().cells}["pytorch-cpu:2.13"]
    both = dataclasses.replace(cpu, platforms=("linux/amd64", "linux/arm64"), emulation_factor=4)
    assert choose_platform("x/pytorch-cpu:2.13", None, both, ["linux/arm64"]).name == "linux/arm64"
    assert choose_platform("ghcr.io/other:1", None, None, ["linux/arm64"]).name == "linux/arm64"
    with pytest.raises(UserError, match="is a linux/arm64 image, and pytorch-cpu:2.13 is built for linux/amd64 only"):
        choose_platform("x/pytorch-cpu:2.13", None, cpu, ["linux/arm64"])
    with pytest.raises(UserError, match="pass --platform"):
        choose_platform("x/pytorch-cpu:2.13", None, both, ["linux/amd64", "linux/arm64"])


def test_the_platforms_an_image_holds_are_read_from_its_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from buildtool.launch import arch
    from buildtool.registry import client as registry_client
    from buildtool.registry.client import OCI_INDEX, OCI_MANIFEST
    from tests.memregistry import MemRegistry

    registry = MemRegistry("127.0.0.1:5999")
    monkeypatch.setattr(registry_client, "RegistryClient", lambda host, **_: registry)
    amd = registry.push_image("team/x", "amd", payload=b"a")
    arm = registry.push_image("team/x", "arm", payload=b"b", architecture="arm64")
    registry.put_manifest("team/x", "both", json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": d, "size": 1, "platform": {"os": "linux", "architecture": a}}
        for d, a in ((amd, "amd64"), (arm, "arm64"))]}).encode(), OCI_INDEX)
    assert arch.image_platforms("127.0.0.1:5999/team/x:arm") == ["linux/arm64"]
    assert arch.image_platforms("127.0.0.1:5999/team/x:both") == ["linux/amd64", "linux/arm64"]
    assert arch.image_platforms("127.0.0.1:5999/team/x:gone") is None     # unreadable: --platform decides
    assert arch.image_platforms("x-dev:local") is None                    # no registry in the reference


def test_an_empty_name_is_refused_and_an_empty_namespace_is_the_contexts(run_cli) -> None:
    """--name names every object (the job, its Service, the `<name>-scripts` ConfigMap, the app label): '' made a
    ConfigMap `-scripts` and an empty label, which no cluster takes. --namespace '' stays the kubectl context's."""
    code, out, err = run_cli("k8s", IMAGE, "--name", "", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and err.strip() == "error: --name '' is not a Kubernetes name (at most 63 lower-case letters, " \
        "digits, '-', alphanumeric at both ends)" and out == "", err
    docs = generate(run_cli, IMAGE, "--namespace", "")
    assert all("namespace" not in d["metadata"] for d in docs)


@pytest.mark.parametrize(("variant", "name", "nodes", "words"), [
    ("job", "1check", "2", "--name '1check': the Service's name must start with a letter (a DNS-1035 label)"),
    ("pytorchjob", "1check", "2", "--name '1check': a PyTorchJob's name must start with a letter"),
    ("job", "a" * 62, "2", f"the pod hostname '{'a' * 62}-1' is 64 characters, and Kubernetes takes at most 63; "
     "use a name of at most 61 characters"),
    ("job", "a" * 61, "12", f"the pod hostname '{'a' * 61}-11' is 64 characters"),
    ("pytorchjob", "a" * 55, "3", f"the pod and Service '{'a' * 55}-worker-1' is 64 characters"),
    ("pytorchjob", "a" * 55, "1", f"the pod and Service '{'a' * 55}-master-0' is 64 characters"),
])
def test_a_name_the_cluster_would_refuse_for_its_objects_is_exit_2(run_cli, variant: str, name: str, nodes: str,
                                                                    words: str) -> None:
    """--name passed as any DNS-1123 label of 63, but the Service (and a PyTorchJob, by the operator's webhook) must
    start with a letter, and the Job controller's pod hostname `<name>-<index>` (the operator's Services
    `<name>-worker-<index>`) must fit 63 characters: kubectl applied the manifests and no pod ever started."""
    code, out, err = run_cli("k8s", IMAGE, "--name", name, "--nodes", nodes, "--variant", variant,
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and words in err and len(err.strip().splitlines()) == 1, err
    docs = generate(run_cli, IMAGE, "--name", "a" * 61, "--nodes", "2", "--variant", "job")   # `<61 a>-1`: 63
    assert docs[-1]["metadata"]["name"] == "a" * 61


@pytest.mark.parametrize(("resource", "words"), [
    ("cpu", "--gpu-resource 'cpu' is not a resource name like vendor.example/device"),
    ("gpu", "--gpu-resource 'gpu' is not a resource name like vendor.example/device"),
    ("kubernetes.io/gpu", "--gpu-resource 'kubernetes.io/gpu': kubernetes.io names no extended resource"),
])
def test_a_gpu_resource_that_is_no_extended_resource_is_exit_2(run_cli, resource: str, words: str) -> None:
    """--gpu-resource was written into the limits unchecked: `cpu` asked for 8 CPUs and no GPU (the NCCL job then
    failed on the node), `gpu` for a resource the API server refuses. It is checked as --rdma-resource is."""
    code, out, err = run_cli("k8s", IMAGE, "--gpu-resource", resource, "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and err.startswith(f"error: {words}") and len(err.strip().splitlines()) == 1, err
    docs = generate(run_cli, IMAGE, "--gpu-resource", "amd.com/gpu")
    assert _pod(docs[-1])["containers"][0]["resources"]["limits"] == {"amd.com/gpu": 8}


@pytest.mark.parametrize(("args", "words"), [
    (["--rdma-resource", "nvidia.com/gpu=1"], "--rdma-resource nvidia.com/gpu is named twice (also by --gpu-resource)"),
    (["--rdma-resource", "rdma/ib", "--rdma-resource", "rdma/ib=2"],
     "--rdma-resource rdma/ib is named twice (also by --rdma-resource)"),
])
def test_a_resource_named_twice_is_exit_2_never_one_limit_replacing_the_other(run_cli, args: list[str],
                                                                               words: str) -> None:
    """The pod's limits are one value per name: `--rdma-resource nvidia.com/gpu=1` replaced the job's 8 GPUs by 1
    (torchrun then started 8 processes on one GPU), a repeated RDMA resource kept only its last count."""
    code, out, err = run_cli("k8s", IMAGE, *args, "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and err.startswith(f"error: {words}") and len(err.strip().splitlines()) == 1, err


# NCCL values that are free text, as NCCL takes them: aws-ofi-nccl's plugin name (a space), NCCL 2.24's per-function
# algorithms (`;`, `,`), a topology file whose path has a space and quotes.
NCCL_TEXT = {"NCCL_NET": "AWS Libfabric", "NCCL_ALGO": "allreduce:tree,ring;broadcast:ring",
             "NCCL_TOPO_FILE": "/shared/topo files/it's \"p5\".xml"}


@pytest.mark.parametrize("variant", ["pytorchjob", "job"])
def test_nccl_env_values_with_spaces_reach_every_pod_as_given(run_cli, variant: str) -> None:
    """--nccl-env took a value only if it was one word: NCCL_NET="AWS Libfabric" (aws-ofi-nccl's name, the one way
    to pin EFA) exited 2. The value reaches each pod's env byte for byte."""
    given = [a for name, value in NCCL_TEXT.items() for a in ("--nccl-env", f"{name}={value}")]
    docs = generate(run_cli, IMAGE, "--nodes", "2", "--gpus-per-node", "8", "--variant", variant,
                    "--efa-resource", "vpc.amazonaws.com/efa=32", *given)
    specs = docs[-1]["spec"]["pytorchReplicaSpecs"].values() if variant == "pytorchjob" else [docs[-1]["spec"]]
    for spec in specs:
        env = {e["name"]: e["value"] for e in spec["template"]["spec"]["containers"][0]["env"]}
        assert {name: env[name] for name in NCCL_TEXT} == NCCL_TEXT
        assert env["DDP_EXPECT_TRANSPORT"] == "EFA"
    validate(docs[-1])


@pytest.mark.parametrize(("item", "cause"), [
    ("NCCL_TOPO_FILE=$HOME/topo.xml", "the value of NCCL_TOPO_FILE is not printable ASCII, spaces allowed, no '$'"),
    ("NCCL_NET=AWS\nLibfabric", "contains the control or format character '\\n'"),
    ("NCCL_NET=AWS\0Libfabric", "contains the control or format character '\\x00'"),
    ("NCCL_HOSTID=h\u00f6st", "the value of NCCL_HOSTID is not printable ASCII"),
])
def test_an_nccl_value_no_job_can_carry_as_given_is_refused_in_one_line(run_cli, item: str, cause: str) -> None:
    code, out, err = run_cli("k8s", IMAGE, "--gpus-per-node", "8", "--nccl-env", item,
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "--nccl-env" in err and cause in err, err
    name, value = item.split("=", 1)   # the settings refuse it too, whoever makes them
    with pytest.raises(UserError, match=f"^--nccl-env {name}: the value "):
        NcclSettings(extra=((name, value),))


@pytest.mark.parametrize("value", ["1e3", "0o17", "0x1F", ".inf", "-.5e-3"])
def test_an_env_value_a_yaml_1_2_reader_takes_for_a_number_is_quoted(run_cli, value: str) -> None:
    """PyYAML (YAML 1.1) wrote `value: 1e3` plain; Kubernetes reads manifests as YAML 1.2 (sigs.k8s.io/yaml), where
    that is a float, and the API server refuses a number for EnvVar.value. Quoted, it is the string given."""
    code, out, err = run_cli("k8s", IMAGE, "--gpus-per-node", "8", "--nccl-env", f"NCCL_BUFFSIZE={value}",
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    assert f"value: '{value}'\n" in out, [line for line in out.splitlines() if "BUFFSIZE" in line]


@pytest.mark.parametrize("value", ["y", "Y", "n", "N"])
def test_a_value_kubectl_reads_as_a_bool_is_quoted_in_env_selector_and_toleration(run_cli, value: str) -> None:
    """kubectl reads manifests with go-yaml v2 (sigs.k8s.io/yaml), whose booleans include y, Y, n and N; PyYAML (YAML
    1.1 without them) wrote them plain: `value: n` became false, which the API server refuses for EnvVar.value and a
    toleration's value, and a nodeSelector of `gpu: y` selected no node labelled gpu=y."""
    code, out, err = run_cli("k8s", IMAGE, "--variant", "job", "--nccl-env", f"NCCL_IB_DISABLE={value}",
                             "--node-selector", f"gpu={value}", "--toleration", f"pool={value}:NoSchedule",
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    lines = [line.strip() for line in out.splitlines()]
    assert f"value: '{value}'" in lines and f"gpu: '{value}'" in lines, [x for x in lines if x.endswith(value)]
    assert not [x for x in lines if x.endswith(f": {value}")], [x for x in lines if x.endswith(value)]
    pod = _pod(list(yaml.safe_load_all(out))[-1])
    assert pod["nodeSelector"]["gpu"] == value and pod["tolerations"][0]["value"] == value


@pytest.mark.parametrize(("memory", "shm"), [("4Gi", "8g"), ("8Gi", "8g"), ("8G", "8g"), ("500M", "512m")])
def test_a_memory_limit_not_above_dev_shm_is_exit_2(run_cli, memory: str, shm: str) -> None:
    """A memory-backed emptyDir holds at most the pod's memory limit (EmptyDirVolumeSource.sizeLimit): --memory 4Gi
    with an 8g /dev/shm gave the check 4Gi of /dev/shm, not the run profile's, and nothing to run in."""
    code, out, err = run_cli("k8s", IMAGE, "--memory", memory, "--shm-size", shm, "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"--memory {memory} is not above the pod's /dev/shm of" in err, err
    docs = generate(run_cli, IMAGE, "--memory", "9Gi", "--shm-size", "8g")
    assert _pod(docs[-1])["containers"][0]["resources"]["limits"]["memory"] == "9Gi"


def test_a_check_script_the_configmap_cannot_hold_is_refused_naming_its_size() -> None:
    """The ConfigMap carrying the check script and the verifier was never measured: Kubernetes refuses a ConfigMap
    whose data values are over 1 MiB together (ValidateConfigMap sums len(value) against MaxSecretSize), so a large
    check script made manifests the API server refuses at submit time, after the user was told they were written."""
    from buildtool.contracts import frameworks
    from buildtool.launch import k8s
    from buildtool.launch.multinode import MultiNodeJob

    check = frameworks.get("pytorch").multinode
    job = MultiNodeJob(image="x:1", nodes=2, gpus_per_node=8, check=check)
    fits = "#" * (k8s.MAX_CONFIGMAP_BYTES - sum(len(v.encode()) for v in VERIFY_FILES.values()))   # values only
    assert k8s.config_map(job, PodOptions(), fits)["data"][check.script] == fits
    with pytest.raises(UserError) as refused:
        k8s.config_map(job, PodOptions(), fits + "#")
    assert str(refused.value) == (
        f"the Kubernetes ConfigMap with {check.script} and the verifier's files would hold "
        f"{k8s.MAX_CONFIGMAP_BYTES + 1} bytes, over the 1048576 Kubernetes allows; make {check.script} smaller")
