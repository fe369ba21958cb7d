"""An sbatch script for the multi-node check of the image's framework, with Apptainer, enroot/pyxis or
SLURM's own OCI containers.

One task per node runs the framework's check in the image, as its launcher says (launch/launchers/),
with the check's scripts in a job folder on the shared file system: beside the submit folder, bound
read-only (apptainer, pyxis), or `BUNDLE/jobs/<job>`, which the bundle binds at JOBS_MOUNT (oci: SLURM
22.05 has no per-job bind mounts). The rendezvous is at the first node's address, not its name
(containers may not resolve SLURM's node names). docs/multinode.md ("on a SLURM cluster") and docs/gpu.md
say what each runtime needs and why.

The check's output is kept: when the step fails, the script says why in one line, naming the node that
failed first (srun's `NODE: task N: ...`) or the rendezvous timeout. `parse_output` reads a job's output
back into a result.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from buildtool.common.documents import render_document
from buildtool.common.errors import UserError
from buildtool.common.refs import parse_reference
from buildtool.launch.bundle import ENTRYPOINT_FILE, JOBS_DIR, JOBS_MOUNT, META_FILE, docker_transport, shm_bytes
from buildtool.launch.launchers import IS_HOST, LOCAL_ADDR, PROCESS_ID
from buildtool.launch.multinode import (
    MOUNT_DIR,
    NODE_ADDRS_ENV,
    NODES_ENV,
    VERIFY_FILES,
    MultiNodeJob,
)

RUNTIMES = ("apptainer", "pyxis", "oci")
PASSED_PREFIX = "DDP check passed: "
RESULT_PREFIX = "DDP_RESULT "       # rank 0's result line (launch/verify_ddp.py)
# One task per node runs every rank of that node: without a count SLURM gives it one CPU, which the ranks (and
# their data loaders and NCCL's threads) would share. Sites set their own with --cpus-per-task.
CPUS_PER_GPU = 4


@dataclass(frozen=True)
class SlurmOptions:
    runtime: str = "apptainer"
    partition: str = ""
    account: str = ""
    time_limit: str = "01:00:00"
    cpus_per_task: int | None = None   # None: default_cpus_per_task(job); 0: no directive (the partition's default)
    scripts_dir: str = ""          # default: the workload's scripts folder (image-tests/<framework>/scripts) in the
                                   # submit folder
    # Node features the job needs (sbatch --constraint): how a site picks its Grace (arm64) nodes, e.g. gh200;
    # SLURM has no standard architecture feature, so the site's own word, never a guess of ours.
    constraint: str = ""

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise UserError(f"--runtime must be one of {', '.join(RUNTIMES)}, not {self.runtime!r}")
        if not re.fullmatch(r"(\d+-)?\d+(:\d{2}){0,2}", self.time_limit):
            raise UserError(f"--time {self.time_limit!r} must be a SLURM time limit like 01:00:00 or 1-00:00:00")
        if not self.time_limit.strip("0-:"):
            # sbatch: "A time limit of zero requests that no time limit be imposed": a hung node held the nodes forever.
            raise UserError(f"--time {self.time_limit} is no time limit to SLURM (zero imposes none), and a node that "
                            "hangs would hold the allocation forever; give a limit like 01:00:00")
        if self.cpus_per_task is not None and self.cpus_per_task < 0:
            raise UserError(f"--cpus-per-task must be 0 (the partition's default) or more, not {self.cpus_per_task}")

    def cpus(self, job: MultiNodeJob) -> int:
        """CPUs for the one task per node: the option, else CPUS_PER_GPU per GPU (1 for a CPU job)."""
        if self.cpus_per_task is not None:
            return self.cpus_per_task
        return max(1, job.gpus_per_node * CPUS_PER_GPU)


@dataclass(frozen=True)
class Workload:
    """What runs on every node: files in the job folder, one command, its environment."""

    label: str                                  # names the job folder and the failure line
    command: list[str]                          # may use $jobdir (the job folder as the container sees it)
    env: dict[str, str] = field(default_factory=dict)
    copied: tuple[str, ...] = ()                # from $SCRIPTS_DIR into the job folder
    scripts_dir: str = ""                       # where they are in a checkout (image-tests/<framework>/scripts)
    embedded: dict[str, str] = field(default_factory=dict)  # name -> text, written by the script
    first_node_hosts: str = "rendezvous"        # what the allocation's first node hosts (its launcher's words)


def enroot_image(image: str) -> str:
    """Docker reference -> the `registry#path:tag` form pyxis/enroot expect. enroot's URI has no `@digest`: a digest
    (which wins over a tag beside it) goes where enroot takes the manifest reference it fetches, `:sha256:<hex>`."""
    ref = parse_reference(image)
    host, path, suffix = ref.registry, ref.repository, f":{ref.digest or ref.tag or 'latest'}"
    if host == "docker.io":
        return f"{path.removeprefix('library/')}{suffix}"
    return f"{host}#{path}{suffix}"


# What a double-quoted word of the script would still expand or end.
_EXPANDED = '$`"\\'


def check_image(image: str, runtime: str) -> None:
    if runtime == "oci":
        if not image.startswith("/"):
            raise UserError(f"--runtime oci takes the bundle folder made by `buildtool bundle` as an absolute path "
                            f"on the cluster, not {image!r}")
    elif image.endswith(".sif") and any(c in image for c in _EXPANDED):
        # It goes on the srun line as one double-quoted word (_quote, which leaves $jobdir expandable).
        raise UserError(f"{image!r}: a .sif path with {_EXPANDED!r} in it would run as shell on the batch host; "
                        "rename the file")
    elif image.startswith("/") and not (runtime == "apptainer" and image.endswith(".sif")):   # a .sif is Apptainer's
        raise UserError(f"{image!r} is a path: --runtime {runtime} takes an image reference"
                        f"{' or a .sif file' if runtime == 'apptainer' else ''}; a bundle folder needs --runtime oci")


def ddp_check(job: MultiNodeJob) -> Workload:
    """The framework's check (job.check), wrapped by the verifier that fails unless it trained in sync."""
    if job.check is None:
        raise ValueError("ddp_check needs a job with a framework's check")
    command = job.command("$endpoint", "$SLURM_JOB_ID", "$jobdir")
    return Workload(label="DDP check", command=command, env=job.env, copied=(job.check.script,),
                    scripts_dir=f"image-tests/{job.check.framework}/scripts",
                    embedded=dict(VERIFY_FILES), first_node_hosts=job.launcher.first_node_hosts)


# The bundle's ENTRYPOINT words (read from ENTRYPOINT_FILE): nothing when there are none, even under `set -u`
# on bash before 4.4, where "${a[@]}" of an empty array is an unbound variable.
ENTRYPOINT_WORDS = '${entrypoint[@]+"${entrypoint[@]}"}'


def _quote(word: str) -> str:
    """Shell-quote, but leave $jobdir / $endpoint / $SLURM_JOB_ID expandable."""
    if word == ENTRYPOINT_WORDS:
        return word
    if "$" in word:
        return '"' + word.replace('"', '\\"') + '"'
    return shlex.quote(word)


def _default(var: str, value: str, prefix: str = "") -> str:
    """The line(s) setting VAR, unless the job's environment does, to PREFIX (shell words, expanded on the batch
    host) followed by VALUE (a path, taken literally)."""
    if re.fullmatch(r"[\w./,:@%+=-]*", value):
        return f'{var}="${{{var}:-{prefix}{value}}}"'
    # In "${VAR:-...}" a `}` would end the default early and `$(...)`, a backtick or `"` would run on the batch
    # host: assign a $'...' word, its quotes and backslashes as \xHH (which shellcheck takes as literal, too).
    word = "".join(f"\\x{ord(c):02x}" if c in "\"'\\" or not c.isprintable() else c for c in value)
    return f'{var}="${{{var}:-}}"\n[ -n "${var}" ] || {var}=' + (f'"{prefix}"' if prefix else "") + f"$'{word}'"


def _marker(name: str, text: str) -> str:
    """The here-document marker of embedded file NAME: one no line of TEXT equals (that line would end it early
    and bash would run the rest)."""
    marker, lines = re.sub(r"\W", "_", name).upper(), set(text.split("\n"))
    while marker in lines:
        marker += "_END"
    return marker


def _container(job: MultiNodeJob, opts: SlurmOptions, work: Workload) -> list[str]:
    """What runs the work in opts.runtime's container: srun's options, and the words before the work's command."""
    # The image's entrypoint runs first, with the command as its arguments, as under validate (issue 39): NGC's
    # sets up CUDA's forward-compatibility libraries for the older drivers contracts.driver_rules admits.
    # `apptainer run` (the runscript: ENTRYPOINT, then the arguments; `exec` skips it) and pyxis'
    # --container-entrypoint (without it enroot runs the command alone).
    if opts.runtime == "apptainer":
        source = job.image if job.image.endswith(".sif") else docker_transport(job.image)
        nv = ["--nv"] if job.gpus_per_node else []
        return ["apptainer", "run", *nv, "--bind", f"$workdir:{MOUNT_DIR}:ro", source]
    if opts.runtime == "pyxis":
        return [f"--container-image={enroot_image(job.image)}", "--container-entrypoint",
                f"--container-mounts=$workdir:{MOUNT_DIR}:ro", "--no-container-mount-home"]
    names = ",".join(sorted([*work.env, *([NODES_ENV] if _needs_nodes(work) else []),
                             *([NODE_ADDRS_ENV] if LOCAL_ADDR in work.command else [])])) or "NONE"
    # SLURM runs the step's command in place of the bundle's process: the image's ENTRYPOINT goes first.
    return [f"--export={names}", "--container=$OCI_BUNDLE", ENTRYPOINT_WORDS]


def _needs_nodes(work: Workload) -> bool:
    """The verifier finds this node's place in DDP_NODES: for a process id (PROCESS_ID) or whether it hosts the
    store (IS_HOST), whichever placeholder the launcher's command carries."""
    return any(PROCESS_ID in w or IS_HOST in w for w in work.command)


def render(job: MultiNodeJob, opts: SlurmOptions, work: Workload) -> str:
    """The sbatch script running WORK on JOB's nodes in opts.runtime's containers: templates/slurm.sbatch.j2 with
    the values computed here."""
    check_image(job.image, opts.runtime)
    cpus = opts.cpus(job)
    optional = (("gpus-per-node", job.gpus_per_node), ("cpus-per-task", cpus), ("partition", opts.partition),
                ("account", opts.account), ("constraint", opts.constraint))
    directives = [f"--job-name={job.name}", f"--nodes={job.nodes}", "--ntasks-per-node=1",
                  f"--time={opts.time_limit}", f"--output={job.name}-%j.out",
                  *(f"--{name}={value}" for name, value in optional if value)]
    shm = shm_bytes(job.shm_size, f"shm size of {job.name}")
    # srun does not take the job's --cpus-per-task from sbatch in SLURM 22.05 to 23.02: name it on the step.
    launch = ["srun", "--kill-on-bad-exit=1", *([f"--cpus-per-task={cpus}"] if cpus else []),
              *_container(job, opts, work), *work.command]
    return render_document(
        "buildtool.launch", "slurm.sbatch.j2", runtime=opts.runtime, label=work.label, directives=directives,
        work_scripts_dir=work.scripts_dir, copied=work.copied,
        scripts_dir=(_default("SCRIPTS_DIR", opts.scripts_dir) if opts.scripts_dir else
                     _default("SCRIPTS_DIR", work.scripts_dir, "${SLURM_SUBMIT_DIR:-$PWD}/")),
        bundle=_default("OCI_BUNDLE", job.image),
        shm_bytes=shm, shm_size=job.shm_size, join_timeout_s=job.join_timeout_s,
        exports=[f"{k}={shlex.quote(v)}" for k, v in sorted(work.env.items())],
        first_node_hosts=work.first_node_hosts, rdzv_port=job.rdzv_port,
        needs_nodes=_needs_nodes(work), node_addresses=LOCAL_ADDR in work.command,
        folder=f"{job.name}-$SLURM_JOB_ID",
        embedded=[(name, _marker(name, text), text.rstrip("\n")) for name, text in work.embedded.items()],
        launch=" ".join(_quote(w) for w in launch),
        meta_file=META_FILE, entrypoint_file=ENTRYPOINT_FILE, jobs_dir=JOBS_DIR, jobs_mount=JOBS_MOUNT,
        mount_dir=MOUNT_DIR, nodes_env=NODES_ENV, node_addrs_env=NODE_ADDRS_ENV)


def sbatch_script(job: MultiNodeJob, opts: SlurmOptions) -> str:
    return render(job, opts, ddp_check(job))


@dataclass(frozen=True)
class Outcome:
    """A job's result, read from its output."""

    passed: bool
    reason: str                       # the one line that says so
    failed_node: str = ""             # the node srun reported first, or whose /dev/shm is too small
    rendezvous_timeout: bool = False
    result: dict[str, Any] | None = None   # the last `DDP_RESULT <json>` line (rank 0's report)

    @property
    def world_size(self) -> int:
        value = (self.result or {}).get("world_size", 0)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0   # 0: none reported


def parse_output(text: str) -> Outcome:
    """What a DDP check's job said: passed (its PASSED_PREFIX line) or why not."""
    lines = text.splitlines()
    result = None
    for line in lines:
        if line.startswith(RESULT_PREFIX):
            try:
                found = json.loads(line[len(RESULT_PREFIX):])
            except ValueError:
                continue
            if isinstance(found, dict):   # a number or a list is as malformed as broken JSON
                result = found
    failed = [line for line in lines if line.startswith("DDP check failed")]
    shm = [line for line in lines if line.startswith("error: /dev/shm on ")]
    limit = re.search(r"CANCELLED AT \S+ DUE TO TIME LIMIT", text)
    srun = re.search(r"^srun: error: ([^ :]+): tasks? [0-9]", text, re.MULTILINE)
    passed = [line for line in lines if line.startswith(PASSED_PREFIX)]
    if not failed and not shm and not limit and passed:
        return Outcome(passed=True, reason=passed[-1], result=result)
    if shm:
        node = re.match(r"error: /dev/shm on (\S+) ", shm[0])
        return Outcome(passed=False, reason=shm[0], failed_node=node.group(1) if node else "", result=result)
    if failed:
        reason = failed[0]  # the first says the cause (the verifier's, or the script's summary of srun's)
    elif limit:
        reason = "DDP check failed: the job reached its time limit"
    else:
        reason = "DDP check failed: the job ended without a result"
    return Outcome(passed=False, reason=reason, failed_node=srun.group(1) if srun else "",
                   rendezvous_timeout="rendezvous timed out" in reason, result=result)
