"""Commands for running validation at scale: report, k8s, slurm, workflows, scaling."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildtool.cli.options import (
    FrameworkOption,
    JsonOption,
    MatrixOption,
    Project,
    RevisionOption,
    err,
    find_project,
    log,
    out,
    say,
)
from buildtool.common.errors import FailedError, UserError
from buildtool.contracts.rendezvous import (
    ACTIVE_DEADLINE_S,
    BACKOFF_LIMIT,
    GPU_RESOURCE,
    JOIN_TIMEOUT_S,
    MAX_RESTARTS,
    RDZV_PORT,
)

if TYPE_CHECKING:
    from buildtool.contracts import platforms as contracts_platforms
    from buildtool.contracts.frameworks import Framework
    from buildtool.launch.multinode import NcclSettings
    from buildtool.launch.scaling import ScalingResult

# Not FrameworkOption (--framework/-f selects cells of the matrix, from $FRAMEWORK too): this one names the
# framework of an image the matrix does not know, and only on the command line.
CheckFrameworkOption = Annotated[
    str | None,
    typer.Option("--framework", help="The image's framework (a folder image-tests/<name>/), whose multi-node check "
                                     "runs: needed for an image the matrix does not know (a foreign image, a .sif, a "
                                     "bundle folder); an image of the matrix has its cell's."),
]


NcclDebugOption = Annotated[str, typer.Option(help="NCCL_DEBUG of a GPU job: VERSION, WARN, INFO or TRACE "
                                                   "(default WARN).")]
NcclIfnameOption = Annotated[str, typer.Option(help="NCCL_SOCKET_IFNAME of a GPU job, e.g. eth0 or ^lo,docker "
                                                    "(default: unset, NCCL's choice).")]
NcclHcaOption = Annotated[str, typer.Option(help="NCCL_IB_HCA of a GPU job, e.g. mlx5_0:1,mlx5_1:1 "
                                                 "(default: unset, NCCL's choice).")]
NcclEnvOption = Annotated[list[str] | None, typer.Option(help="Another NCCL_* variable of a GPU job, NAME=VALUE "
                                                              "(repeatable; e.g. NCCL_IB_GID_INDEX=3).")]


def _nccl(debug: str, ifname: str, hca: str, env: list[str] | None) -> NcclSettings:
    from buildtool.launch.multinode import NcclSettings

    return NcclSettings(debug=debug, socket_ifname=ifname, ib_hca=hca, extra=NcclSettings.parse_env(env or []))


def _project(matrix: Path | None) -> Project:
    return find_project(matrix)


def _write_or_print(text: str, target: Path | None) -> None:
    if target is None:
        sys.stdout.write(text)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    out.print(f"wrote {target}")


def _shm_for(image: str, shm_size: str | None, matrix: Path | None) -> str:
    """The run profile's shm size of the image's cell, unless given."""
    if shm_size:
        return shm_size
    from buildtool.launch.multinode import cell_for_image

    if image.startswith("/"):
        raise UserError(f"{image} is a file, not a registry image: the matrix has no run profile for it; "
                        "pass --shm-size")
    loaded = _project(matrix).load()
    cell = cell_for_image(loaded, image)
    if cell is None:
        raise UserError(f"{image} is no image of the matrix ({', '.join(loaded.image_names)}), so it has no run "
                        "profile to take /dev/shm from; pass --shm-size")
    return cell.run.shm_size


def _platform_for(image: str, platform: str | None, matrix: Path | None) -> contracts_platforms.Platform:
    """The platform to launch IMAGE on: --platform, else its matrix cell's only one (launch.arch)."""
    from buildtool.launch.arch import choose_platform, image_platforms
    from buildtool.launch.multinode import cell_for_image

    try:
        project = _project(matrix)
    except UserError:
        project = None     # outside a checkout: nothing knows the image's platforms
    cell = None
    if project is not None and not image.startswith("/"):
        try:
            cell = cell_for_image(project.load(), image)
        except UserError:
            if platform is None:    # a matrix image whose tag names no cell: said so, never its default cell's
                raise
    return choose_platform(image, platform, cell, None if platform else image_platforms(image))


def _framework_for(image: str, framework: str | None, matrix: Path | None) -> Framework:
    """The framework whose multi-node check runs in IMAGE: its matrix cell's, else --framework; never a default."""
    from buildtool.contracts import frameworks
    from buildtool.launch.multinode import cell_for_image

    try:
        project = _project(matrix)
    except UserError:
        if framework is None:
            raise
        project = None     # outside a checkout: this checkout's framework table
    # Loading the matrix also makes its image-tests folders the framework table.
    loaded = project.load() if project is not None else None
    cell = None
    if loaded is not None and not image.startswith("/"):
        try:
            cell = cell_for_image(loaded, image)
        except UserError:
            if framework is None:   # a matrix image whose tag names no cell: said so, never its default cell's
                raise
            # ... unless --framework says it, as --shm-size does for its /dev/shm
    if cell is not None:
        if framework is not None and framework != cell.framework:
            raise UserError(f"--framework {framework}, but {image} is an image of {cell.framework} (the matrix cell "
                            f"{cell.key}); leave --framework out")
        name = cell.framework
    elif framework is None:
        what = "a file, not a registry image" if image.startswith("/") else "no image of the matrix"
        raise UserError(f"{image} is {what}, so its framework is unknown; pass --framework NAME "
                        f"({', '.join(frameworks.names())}) to say whose multi-node check runs in it")
    else:
        name = framework
    try:
        return frameworks.get(name)
    except KeyError:
        raise UserError(f"--framework {name!r} is no framework; one of {', '.join(frameworks.names())} (a framework "
                        "is a folder image-tests/<name>/ with its framework.yaml)") from None


def _check_steps(steps: int) -> None:
    if steps < 3:
        raise UserError(f"--steps must be at least 3 (the check compares the first and last three), not {steps}")


def _bundle_shm(bundle: str, shm_size: str | None) -> str:
    """The /dev/shm size a bundle was made with (its record), unless given."""
    if shm_size:
        return shm_size
    from buildtool.launch.bundle import META_FILE, read_meta

    meta = read_meta(Path(bundle))
    if meta is None or not isinstance(meta.get("shm_size"), str):
        raise UserError(f"no bundle record ({META_FILE}) in {bundle} on this machine, so the bundle's /dev/shm size is "
                        "unknown; pass --shm-size (the size it was made with)")
    return str(meta["shm_size"])


def register(app: typer.Typer) -> None:
    workflows_app = typer.Typer(help="GitHub Actions workflows generated from the matrix.", no_args_is_help=True)
    app.add_typer(workflows_app, name="workflows")

    @workflows_app.command("write")
    def workflows_write(
        gpu_labels: Annotated[str, typer.Option(help="Comma list of the GPU runners' labels.")]
        = "self-hosted,linux,x64,gpu",
        cron: Annotated[str, typer.Option(help="When the nightly runs (cron, UTC).")] = "17 2 * * *",
        out_dir: Annotated[Path | None, typer.Option("--out", help="Folder to write into (default: the project).")]
        = None,
        matrix: MatrixOption = None,
    ) -> None:
        """Write .github/workflows/*.yml (`make render` writes them with the defaults)."""
        from buildtool.render.dockerfiles import Outputs, write_outputs
        from buildtool.render.workflows import WorkflowOptions, render_workflows

        project = _project(matrix)
        labels = tuple(label.strip() for label in gpu_labels.split(",") if label.strip())
        if not labels:
            raise UserError("--gpu-labels must name at least one runner label")
        files = render_workflows(project.load(), WorkflowOptions(gpu_labels=labels, nightly_cron=cron))
        for rel in write_outputs(out_dir or project.root, Outputs(files=files)):
            out.print(f"wrote {rel}")

    @workflows_app.command("ci-matrix")
    def workflows_ci_matrix(
        plan: Annotated[Path, typer.Option(help="Output of `buildtool plan --json`.")],
        cells: Annotated[str, typer.Option(help="Comma list of cells to keep.")],
    ) -> None:
        """Print `matrix=<one-line JSON>` for $GITHUB_OUTPUT: the plan narrowed to CELLS."""
        from buildtool.render.workflows import ci_matrix

        try:
            data = json.loads(plan.read_text(encoding="utf-8"))
            narrowed = ci_matrix(data, [c for c in cells.split(",") if c])
        except (OSError, json.JSONDecodeError, ValueError) as exc:
            raise UserError(f"{plan}: {exc}") from None
        sys.stdout.write("matrix=" + json.dumps(narrowed, separators=(",", ":"), sort_keys=True) + "\n")

    @app.command()
    def report(
        verdicts: Annotated[Path, typer.Option(help="Folder searched for verdict.json / *.verdict.json files (as "
                                                    "`buildtool validate` writes them); --fetch writes here.")]
        = Path("reports"),
        previous: Annotated[Path | None, typer.Option(help="The previous night's verdict folder, for the trend.")]
        = None,
        fetch: Annotated[bool, typer.Option(help="First fetch each planned cell's verdict from the registry.")]
        = False,
        framework: FrameworkOption = "all",
        revision: RevisionOption = None,
        scaling: Annotated[list[Path] | None, typer.Option(help="Folder with a scaling run's results and plots to "
                                                                "include (repeat: processes, SLURM nodes).")]
        = None,
        out_dir: Annotated[Path, typer.Option("--out", help="Where report.html and report.md go.")]
        = Path("reports/nightly"),
        matrix: MatrixOption = None,
    ) -> None:
        """Turn verdicts into one static HTML page and Markdown (images by rows, checks by columns)."""
        from buildtool.report import nightly as rep

        if fetch:
            from buildtool.matrix.plan import Settings, plan_matrix

            project = _project(matrix)
            loaded = project.load()
            plans = plan_matrix(loaded, loaded.select(framework), Settings.from_env(), project.revision(revision))
            from buildtool.validate.keys import dev_public_key, load_trusted

            # The verdicts release would count: signed by a trusted key, or by this machine's dev key
            # (a report is a view, not a gate: a local run shows its own verdicts).
            trusted = load_trusted(project.root)
            local = dev_public_key()
            if local is not None:
                trusted.add_dev(local)
            from buildtool.report.fetch import fetch_verdicts

            # One record per platform of a multi-platform cell: each platform's verdict, or why it has none.
            fetched = fetch_verdicts({p.cell.key: p.dev_ref for p in plans}, trusted,
                                     platforms={p.cell.key: p.cell.platforms for p in plans})
            rep.save_verdicts(fetched, verdicts)
        prev_rows = rep.load_verdicts(previous) if previous is not None and previous.is_dir() else None
        if previous is not None and prev_rows is None:
            err.print(f"no previous verdicts in {previous}; the report shows no trend")
        model = rep.build_report(rep.load_verdicts(verdicts), prev_rows)
        paths = rep.write_report(model, out_dir, scaling)
        counts = model.counts
        out.print(f"{paths['html']}: {len(model.rows)} images, {counts['failed']} failed / {counts['passed']} passed"
                  f" / {counts['skipped']} skipped checks, {len(model.newly_failing)} newly failing")

    @app.command()
    def k8s(
        image: Annotated[str, typer.Argument(help="The image to check (a dev or release reference).")],
        nodes: Annotated[int, typer.Option(help="Pods (nodes) taking part.")] = 2,
        gpus_per_node: Annotated[int, typer.Option(help="GPUs per pod; 0 runs one CPU process with gloo.")] = 8,
        variant: Annotated[str, typer.Option(help="pytorchjob (Kubeflow training operator; torchrun checks) or job "
                                                  "(indexed Job + headless Service). Default: pytorchjob for a "
                                                  "torchrun check, job for a coordinator check.")] = "",
        name: Annotated[str, typer.Option(help="Name of the job and its objects.")] = "ddp-check",
        namespace: Annotated[str, typer.Option(help="Namespace (default: the kubectl context's).")] = "",
        shm_size: Annotated[str | None, typer.Option(help="/dev/shm size (default: the cell's run profile).")]
        = None,
        join_timeout: Annotated[int, typer.Option(help="c10d rendezvous join timeout, seconds.")] = JOIN_TIMEOUT_S,
        rdzv_port: Annotated[int, typer.Option(help="Port of the c10d rendezvous store.")] = RDZV_PORT,
        backoff_limit: Annotated[int, typer.Option(help="Restarts of the job before it counts as failed.")]
        = BACKOFF_LIMIT,
        max_restarts: Annotated[int, typer.Option(help="torchrun restarts per node.")] = MAX_RESTARTS,
        cpu: Annotated[str, typer.Option(help="CPU request per pod, e.g. 16.")] = "",
        memory: Annotated[str, typer.Option(help="Memory request and limit per pod (include /dev/shm).")] = "",
        node_selector: Annotated[list[str] | None, typer.Option(help="KEY=VALUE, repeatable.")] = None,
        toleration: Annotated[list[str] | None, typer.Option(help="KEY[=VALUE]:EFFECT, repeatable "
                                                                  "(e.g. nvidia.com/gpu:NoSchedule).")] = None,
        gpu_resource: Annotated[str, typer.Option(help="Extended resource name of a GPU.")] = GPU_RESOURCE,
        deadline: Annotated[int, typer.Option(help="activeDeadlineSeconds of the job.")] = ACTIVE_DEADLINE_S,
        steps: Annotated[int, typer.Option(help="Training steps of the check.")] = 40,
        rdma_resource: Annotated[list[str] | None, typer.Option(
            help="An RDMA device resource for each GPU pod, NAME[=COUNT] (repeatable; e.g. "
                 "rdma/rdma_shared_device_a).")] = None,
        ipc_lock: Annotated[bool, typer.Option(help="Add the IPC_LOCK capability to GPU pods (NCCL and RDMA pin "
                                                    "memory).")] = True,
        nccl_debug: NcclDebugOption = "",
        nccl_socket_ifname: NcclIfnameOption = "",
        nccl_ib_hca: NcclHcaOption = "",
        nccl_env: NcclEnvOption = None,
        framework: CheckFrameworkOption = None,
        platform: Annotated[str | None, typer.Option(
            help="The platform the pods run (os/arch, e.g. linux/arm64): its nodes by the kubernetes.io/arch and "
                 "kubernetes.io/os labels. Default: the cell's only platform; a multi-platform cell's must be "
                 "named.")] = None,
        out_file: Annotated[Path | None, typer.Option("--out", help="Write here instead of stdout.")] = None,
        matrix: MatrixOption = None,
    ) -> None:
        """Manifests that run the multi-node check of the image's framework on Kubernetes."""
        from buildtool.launch.arch import node_selector as arch_selector
        from buildtool.launch.k8s import PodOptions, default_variant, manifests, to_yaml
        from buildtool.launch.multinode import MultiNodeJob, check_of, k8s_quantity, read_check_script

        shm = _shm_for(image, shm_size, matrix)
        try:
            k8s_quantity(shm)
        except ValueError as exc:   # SizeError: the one size grammar's message names the text
            raise UserError(f"--shm-size: {exc}") from None
        _check_steps(steps)
        row = _framework_for(image, framework, matrix)
        chosen = _platform_for(image, platform, matrix)
        job = MultiNodeJob(image=image, nodes=nodes, gpus_per_node=gpus_per_node, check=check_of(row), name=name,
                           shm_size=shm, join_timeout_s=join_timeout, max_restarts=max_restarts,
                           backoff_limit=backoff_limit, rdzv_port=rdzv_port, steps=steps,
                           nccl=_nccl(nccl_debug, nccl_socket_ifname, nccl_ib_hca, nccl_env))
        opts = PodOptions(namespace=namespace, cpu=cpu, memory=memory, gpu_resource=gpu_resource,
                          node_selector=arch_selector(chosen, PodOptions.parse_selector(node_selector or [])),
                          active_deadline_s=deadline,
                          tolerations=PodOptions.parse_tolerations(toleration or []), ipc_lock=ipc_lock,
                          rdma_resources=PodOptions.parse_rdma(rdma_resource or []))
        docs = manifests(job, opts, read_check_script(row), variant or default_variant(job))
        _write_or_print(to_yaml(docs), out_file)

    @app.command()
    def slurm(
        image: Annotated[str, typer.Argument(help="The image to check (registry reference, or a .sif file).")],
        nodes: Annotated[int, typer.Option(help="Nodes taking part.")] = 2,
        gpus_per_node: Annotated[int, typer.Option(help="GPUs per node; 0 runs one CPU process with gloo.")] = 8,
        runtime: Annotated[str, typer.Option(help="apptainer, pyxis (enroot) or oci (SLURM's own containers: "
                                                  "IMAGE is the bundle folder made by `buildtool bundle`).")]
        = "apptainer",
        name: Annotated[str, typer.Option(help="Job name.")] = "ddp-check",
        partition: Annotated[str, typer.Option(help="SLURM partition.")] = "",
        account: Annotated[str, typer.Option(help="SLURM account.")] = "",
        time_limit: Annotated[str, typer.Option("--time", help="Wall-clock limit.")] = "01:00:00",
        cpus_per_task: Annotated[int | None, typer.Option(
            help="CPUs of the one task per node, which runs all its ranks (default: 4 per GPU, 1 for a CPU job; "
                 "0: the partition's default).")] = None,
        shm_size: Annotated[str | None, typer.Option(help="/dev/shm size required on every node "
                                                          "(default: the cell's run profile).")] = None,
        join_timeout: Annotated[int, typer.Option(help="c10d rendezvous join timeout, seconds.")] = JOIN_TIMEOUT_S,
        rdzv_port: Annotated[int, typer.Option(help="Port of the c10d rendezvous store.")] = RDZV_PORT,
        max_restarts: Annotated[int, typer.Option(help="torchrun restarts per node.")] = MAX_RESTARTS,
        scripts_dir: Annotated[str, typer.Option(
            help="Where image-tests/<framework>/scripts (the framework's check) is on the cluster "
                 "(default: in the submit folder).")] = "",
        steps: Annotated[int, typer.Option(help="Training steps of the check.")] = 40,
        nccl_debug: NcclDebugOption = "",
        nccl_socket_ifname: NcclIfnameOption = "",
        nccl_ib_hca: NcclHcaOption = "",
        nccl_env: NcclEnvOption = None,
        framework: CheckFrameworkOption = None,
        out_file: Annotated[Path | None, typer.Option("--out", help="Write here instead of stdout.")] = None,
        matrix: MatrixOption = None,
    ) -> None:
        """An sbatch script that runs the multi-node check of the image's framework under srun."""
        from buildtool.launch.multinode import MultiNodeJob, check_of
        from buildtool.launch.slurm import SlurmOptions, check_image, sbatch_script

        check_image(image, runtime)
        shm = _bundle_shm(image, shm_size) if runtime == "oci" else _shm_for(image, shm_size, matrix)
        if not re.fullmatch(r"[0-9]+[kmgKMG]?", shm):
            raise UserError(f"--shm-size {shm!r} must be a size like 8g or 512m")
        _check_steps(steps)
        check = check_of(_framework_for(image, framework, matrix))
        job = MultiNodeJob(image=image, nodes=nodes, gpus_per_node=gpus_per_node, check=check, name=name,
                           shm_size=shm, join_timeout_s=join_timeout, max_restarts=max_restarts, rdzv_port=rdzv_port,
                           steps=steps, nccl=_nccl(nccl_debug, nccl_socket_ifname, nccl_ib_hca, nccl_env))
        opts = SlurmOptions(runtime=runtime, partition=partition, account=account, time_limit=time_limit,
                            cpus_per_task=cpus_per_task, scripts_dir=scripts_dir)
        _write_or_print(sbatch_script(job, opts), out_file)
        if out_file is not None:
            out_file.chmod(0o755)

    @app.command()
    def bundle(
        image: Annotated[str, typer.Argument(help="The image, as a registry reference (a dev or release tag).")],
        dest: Annotated[Path, typer.Argument(help="The bundle folder to create, where the cluster's nodes will "
                                                  "find it (a shared file system).")],
        shm_size: Annotated[str | None, typer.Option(help="/dev/shm size (default: the run profile's).")] = None,
        ulimit: Annotated[list[str] | None, typer.Option(help="NAME=VALUE over the run profile's ulimits, for nodes "
                                                               "that cannot grant one (e.g. memlock=8388608).")]
        = None,
        hosts: Annotated[Path | None, typer.Option(help="A hosts file to bind at /etc/hosts (default: the node's "
                                                        "/etc/hosts and /etc/resolv.conf).")] = None,
        jobs_dir: Annotated[Path | None, typer.Option(help="Where jobs write their scripts, seen read-only inside "
                                                           "(default: DEST/jobs, writable by everyone).")] = None,
        writable: Annotated[bool, typer.Option(help="A writable root file system (default: read-only).")] = False,
        force: Annotated[bool, typer.Option(help="Replace DEST when it exists.")] = False,
        platform: Annotated[str | None, typer.Option(
            help="The platform to bundle (os/arch, e.g. linux/arm64: that manifest of an image index), the nodes' "
                 "architecture. Default: the cell's only platform; a multi-platform cell's must be named.")] = None,
        json_out: JsonOption = False,
        matrix: MatrixOption = None,
    ) -> None:
        """An OCI bundle of IMAGE for `srun --container` (`buildtool slurm --runtime oci`), run-profile ready."""
        from dataclasses import asdict

        from buildtool.launch.bundle import Profile, make_bundle, parse_ulimits
        from buildtool.launch.multinode import cell_for_image

        fallback = None
        try:
            project = _project(matrix)
        except UserError:
            project = None  # outside a checkout: the image's own label is the profile
        # A matrix that does not load, or a tag that names no cell of a matrix image, stops here.
        cell = cell_for_image(project.load(), image) if project is not None else None
        if cell is not None:
            run = cell.run
            fallback = Profile(shm_size=run.shm_size, ulimits=run.ulimits, gpus=run.gpus != "none",
                               ipc_host=run.ipc == "host", source=f"the matrix cell {cell.key}")
        overrides = parse_ulimits(ulimit or [])
        from buildtool.launch.arch import choose_platform, image_platforms

        chosen = choose_platform(image, platform, cell, None if platform else image_platforms(image))
        made = make_bundle(image, dest, chosen, fallback=fallback, shm_size=shm_size, ulimits=overrides, hosts=hosts,
                           jobs_dir=jobs_dir, read_only=not writable, force=force, log=log)
        if json_out:
            say(json.dumps(asdict(made), indent=1))
            return
        limits = ", ".join(f"{k}={v}" for k, v in made.ulimits.items()) or "none"
        say(f"{made.path}: {made.image}@{made.digest} ({made.platform})")
        say(f"  /dev/shm {made.shm_size}, ulimits {limits}, root {'read-only' if made.read_only else 'writable'}, "
            f"hosts {made.hosts}, jobs in {made.jobs_dir} (profile: {made.profile_source}; {made.seconds:.0f} s)")

    @app.command()
    def scaling(
        counts: Annotated[str, typer.Option(help="Comma list of process (GPU) counts, or `gpus`: 1, 2, 4, ... "
                                                 "up to this runner's GPU count.")] = "1,2",
        image: Annotated[str, typer.Option(help="Run inside this image (docker run, host network); with --launcher "
                                                "slurm the image, .sif or (--runtime oci) bundle folder.")] = "",
        cell: Annotated[str, typer.Option(help="Run inside this cell's dev image of the current commit.")] = "",
        launcher: Annotated[str, typer.Option(help="docker, host, slurm (one job per node count) or auto (docker "
                                                   "when an image is given).")] = "auto",
        python: Annotated[str, typer.Option(help="Host Python with torch, for --launcher host.")] = sys.executable,
        samples: Annotated[int, typer.Option("--samples", "--subset-size",
                                             help="Data subset size (samples per epoch).")] = 4096,
        epochs: Annotated[int, typer.Option(help="Epochs per run (the first is warm-up).")] = 3,
        batch: Annotated[int, typer.Option(help="Batch size per rank.")] = 64,
        unit: Annotated[str, typer.Option(help="What the counts are, for the plots: processes, gpus.")]
        = "processes",
        timeout: Annotated[int, typer.Option(help="Seconds per run (SLURM: per job, queueing included) before it is "
                                                  "stopped.")] = 600,
        nodes: Annotated[str, typer.Option(help="--launcher slurm: comma list of node counts.")] = "1,2",
        runtime: Annotated[str, typer.Option(help="--launcher slurm: apptainer, pyxis or oci.")] = "oci",
        gpus_per_node: Annotated[int, typer.Option(help="--launcher slurm: GPUs per node (0: one CPU process).")]
        = 0,
        partition: Annotated[str, typer.Option(help="--launcher slurm: partition.")] = "",
        account: Annotated[str, typer.Option(help="--launcher slurm: account.")] = "",
        time_limit: Annotated[str, typer.Option("--time", help="--launcher slurm: each job's time limit.")]
        = "00:30:00",
        shm_size: Annotated[str | None, typer.Option(help="--launcher slurm: /dev/shm each node needs (default: the "
                                                          "bundle's or the cell's run profile).")] = None,
        rdzv_port: Annotated[int, typer.Option(help="--launcher slurm: port of the c10d store.")] = RDZV_PORT,
        out_dir: Annotated[Path, typer.Option("--out", "--metrics-dir", help="Metrics folder (JSON, CSV, plots).")]
        = Path("reports/scaling"),
        revision: RevisionOption = None,
        matrix: MatrixOption = None,
    ) -> None:
        """DDP scaling benchmark: time per epoch at each count (processes, or SLURM nodes), speed-up plots."""
        from buildtool.launch.scaling import (
            GPU_COUNTS,
            WORKER,
            Launcher,
            check_counts_fit,
            counts_for_gpus,
            host_has_torch,
            parse_counts,
            run_scaling,
        )

        project = _project(matrix)
        if launcher == "slurm":
            _scaling_over_slurm(project, image=image, cell=cell, nodes=nodes, runtime=runtime,
                                gpus_per_node=gpus_per_node, partition=partition, account=account,
                                time_limit=time_limit, shm_size=shm_size, rdzv_port=rdzv_port, samples=samples,
                                epochs=epochs, batch=batch, timeout=timeout, out_dir=out_dir, revision=revision)
            return
        docker_flags: tuple[str, ...] = ("--shm-size=1g",)
        if cell:
            from buildtool.matrix.plan import Settings, plan_cell

            chosen = project.load().select(cell)
            if len(chosen) != 1:
                raise UserError(f"--cell {cell!r} names {len(chosen)} cells; name one, like pytorch-cpu:2.13")
            plan = plan_cell(chosen[0], Settings.from_env(), project.revision(revision))
            image = image or plan.dev_ref
            docker_flags = tuple(chosen[0].run.docker_flags())
            unit = "gpus" if chosen[0].needs_gpu and unit == "processes" else unit
        kind = launcher if launcher != "auto" else ("docker" if image else "host")
        if kind == "docker" and not image:
            raise UserError("--launcher docker needs --image or --cell")
        if kind == "host" and not host_has_torch(python):
            raise UserError(f"{python} cannot import torch; `pip install '.[scaling]'` or pass --image")
        # One process per GPU where the cell runs on GPUs (or --counts gpus): the counts must fit the runner.
        if counts == GPU_COUNTS or (kind == "docker" and any(f.startswith("--gpus") for f in docker_flags)):
            from buildtool.validate.probe import gpu_inventory

            inventory = gpu_inventory()
            if not inventory.gpus:
                raise FailedError(f"the scaling run needs GPUs and this runner has none usable ({inventory.problem})")
            wanted = counts_for_gpus(len(inventory.gpus)) if counts == GPU_COUNTS else parse_counts(counts)
            check_counts_fit(wanted, len(inventory.gpus))
            unit = "gpus" if unit == "processes" else unit
        else:
            wanted = parse_counts(counts)
        if kind == "docker" and cell:
            from buildtool.validate.probe import probe_flags

            # As validate does: an engine that cannot grant a ulimit runs with its default, and says so.
            kept, _ = probe_flags(image, list(docker_flags), lambda line: err.print(line, markup=False))
            docker_flags = tuple(kept)
        chosen_launcher = Launcher(kind=kind, image=image, python=python, docker_flags=docker_flags)
        result, paths = run_scaling(chosen_launcher, wanted, project.root / WORKER, out_dir,
                                    samples=samples, epochs=epochs, batch=batch, unit=unit, timeout_s=timeout)
        _print_scaling(result, paths)


def _print_scaling(result: ScalingResult, paths: dict[str, Path]) -> None:
    base = result.runs[0]
    for r in result.runs:
        out.print(f"{r.count:>3} {result.unit}: {r.time_per_epoch_s:.3f} s/epoch, speed-up {r.speedup:.2f}x "
                  f"(ideal {r.count / base.count:.0f}x), efficiency {r.efficiency:.0%}, "
                  f"wall-clock {r.wall_clock_s:.1f} s")
    out.print("wrote " + ", ".join(str(p) for p in paths.values()))


def _scaling_over_slurm(project: Project, *, image: str, cell: str, nodes: str, runtime: str, gpus_per_node: int,
                        partition: str, account: str, time_limit: str, shm_size: str | None, rdzv_port: int,
                        samples: int, epochs: int, batch: int, timeout: int, out_dir: Path,
                        revision: str | None) -> None:
    """`buildtool scaling --launcher slurm`: one sbatch job per node count, submitted from METRICS_DIR/jobs."""
    from buildtool.launch.scaling import WORKER, SlurmLauncher, parse_counts, run_scaling
    from buildtool.launch.slurm import SlurmOptions, check_image

    SlurmOptions(runtime=runtime, time_limit=time_limit)  # refuses a bad runtime or time limit up front
    if cell and not image:
        if runtime == "oci":
            raise UserError("--runtime oci needs --image BUNDLE (the folder `buildtool bundle` made), not --cell")
        from buildtool.matrix.plan import Settings, plan_cell

        chosen = project.load().select(cell)
        if len(chosen) != 1:
            raise UserError(f"--cell {cell!r} names {len(chosen)} cells; name one, like pytorch-cpu:2.13")
        image = plan_cell(chosen[0], Settings.from_env(), project.revision(revision)).dev_ref
    if not image:
        raise UserError("--launcher slurm needs --image (an image, a .sif or, with --runtime oci, a bundle folder)")
    check_image(image, runtime)
    try:
        counts = parse_counts(nodes)
    except UserError:
        raise UserError(f"--nodes {nodes!r} must be a comma list of node counts like 1,2") from None
    shm = _bundle_shm(image, shm_size) if runtime == "oci" else _shm_for(image, shm_size, project.matrix_path)
    slurm = SlurmLauncher(runtime=runtime, image=image, workdir=out_dir.absolute() / "jobs",
                          gpus_per_node=gpus_per_node, shm_size=shm, partition=partition, account=account,
                          time_limit=time_limit, rdzv_port=rdzv_port)
    result, paths = run_scaling(slurm, counts, project.root / WORKER, out_dir, samples=samples, epochs=epochs,
                                batch=batch, unit="nodes", timeout_s=timeout)
    _print_scaling(result, paths)
