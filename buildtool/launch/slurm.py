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

from buildtool.common.errors import UserError
from buildtool.common.refs import split_reference
from buildtool.launch.bundle import ENTRYPOINT_FILE, JOBS_DIR, JOBS_MOUNT, META_FILE, shm_bytes
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
    """Docker reference -> the `registry#path:tag` form pyxis/enroot expect."""
    host, path, tag = split_reference(image)
    suffix = tag if tag.startswith("@") else f":{tag}"
    if host == "docker.io":
        return f"{path.removeprefix('library/')}{suffix}"
    return f"{host}#{path}{suffix}"


def check_image(image: str, runtime: str) -> None:
    if runtime == "oci":
        if not image.startswith("/"):
            raise UserError(f"--runtime oci takes the bundle folder made by `buildtool bundle` as an absolute path "
                            f"on the cluster, not {image!r}")
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


def _shm_check(opts: SlurmOptions, failed: str) -> list[str]:
    test = ("have=$(df -B1 --output=size /dev/shm | tail -n 1 | tr -d \" \"); if [ \"$have\" -lt \"$1\" ]; then "
            "echo \"error: /dev/shm on NODE is $have bytes, need $1 as the run profile says\" >&2; exit 1; fi")
    if opts.runtime == "oci":
        # In the container: /dev/shm is the bundle's tmpfs. The node's hostname names it (no uts namespace).
        inner = test.replace("NODE", "$(hostname)")
        return ["# /dev/shm is the bundle's own tmpfs: check it inside the container, on every node.",
                "# shellcheck disable=SC2016  # the single-quoted script expands in the container, not here",
                f"srun --ntasks-per-node=1 --export=NONE --container=\"$OCI_BUNDLE\" sh -c '{inner}' "
                "shm-check \"$SHM_BYTES\" || { status=$?; echo \"" + failed + ": the /dev/shm check step failed "
                "(exit $status): a node's /dev/shm is too small (above), or the container did not start there "
                "(runc's error above)\" >&2; exit \"$status\"; }"]
    inner = test.replace("NODE", "${SLURMD_NODENAME:-$(hostname)}")
    return ["# Containers share the node's /dev/shm: refuse to start on a node where it is too small.",
            "# shellcheck disable=SC2016  # the single-quoted script expands on each node, not here",
            f"srun --ntasks-per-node=1 bash -c '{inner}' shm-check \"$SHM_BYTES\""]


def _platform_check(failed: str) -> list[str]:
    """A bundle is of one platform (its record's `machine`, buildtool.launch.bundle): refuse to start on nodes
    of another architecture (runc would fail with `exec format error`, or QEMU would run it unvalidated)."""
    return ["# The bundle is of one platform: every node must be of its architecture (uname -m).",
            "bundle_machine=\"$(sed -n 's/^ *\"machine\": \"\\([^\"]*\\)\".*/\\1/p' \"$OCI_BUNDLE/" + META_FILE
            + "\" 2>/dev/null || true)\"",
            *_fail_if('[ -z "$bundle_machine" ]', f"error: $OCI_BUNDLE/{META_FILE} records no platform (a bundle made "
                      "before bundles recorded one): make it again with \\`buildtool bundle --platform\\`"),
            "node_machines=\"$(srun --ntasks-per-node=1 uname -m | sort -u | tr '\\n' ' ')\"",
            *_fail_if('[ "$node_machines" != "$bundle_machine " ]', f"{failed}: the bundle is for $bundle_machine, "
                      "but the nodes are $node_machines(uname -m); make a bundle of their platform (buildtool bundle "
                      "--platform) or submit to nodes of its own")]


def _fail_if(test: str, message: str) -> list[str]:
    """Lines that end the job (exit 2) saying MESSAGE (double-quoted in the script) when TEST holds."""
    return [f"if {test}; then", f"  echo \"{message}\" >&2", "  exit 2", "fi"]


def _container(job: MultiNodeJob, opts: SlurmOptions, work: Workload) -> list[str]:
    """What runs the work in opts.runtime's container: srun's options, and the words before the work's command."""
    # The image's entrypoint runs first, with the command as its arguments, as under validate (issue 39): NGC's
    # sets up CUDA's forward-compatibility libraries for the older drivers contracts.driver_rules admits.
    # `apptainer run` (the runscript: ENTRYPOINT, then the arguments; `exec` skips it) and pyxis'
    # --container-entrypoint (without it enroot runs the command alone).
    if opts.runtime == "apptainer":
        source = job.image if job.image.endswith(".sif") else f"docker://{job.image}"
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


def _head_address(failed: str) -> list[str]:
    """Lines that set head_addr to the first node's IP address, or end the job naming the node (c10d would
    retry a name the containers cannot resolve until the time limit)."""
    return [
        "# Containers may not resolve node names: rendezvous at the first node's address (RDZV_ADDR overrides).",
        "# node_ip_of NODE: its NodeAddr as an IPv4 address (resolved here, on the batch host, when it is a name).",
        "node_ip_of() {",
        "  node_addr=\"$(scontrol show node \"$1\" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p' | sed -n 1p)\"",
        "  node_ip=\"$(getent ahostsv4 \"${node_addr:-$1}\" | awk 'NR == 1 {print $1}' || true)\"",
        "}",
        "head_addr=\"${RDZV_ADDR:-}\"",
        "node_addr=\"\"",
        "if [ -z \"$head_addr\" ]; then",
        "  node_ip_of \"$head_node\"",
        "  head_addr=\"$node_ip\"",
        "fi",
        *_fail_if('[ -z "$head_addr" ]', f"{failed}: cannot resolve the address of node $head_node (NodeAddr "
                  "${node_addr:-unknown}), which hosts the rendezvous; set RDZV_ADDR to its IP address"),
    ]


def _node_addresses(failed: str) -> list[str]:
    """torchrun: every node's address in DDP_NODE_ADDRS (the verifier gives its node's to --local-addr: the
    agent of group rank 0 publishes it to the workers as MASTER_ADDR, by default the node's name)."""
    return [
        f"{NODE_ADDRS_ENV}=\"\"",
        "while read -r node; do",
        "  if [ \"$node\" = \"$head_node\" ]; then node_ip=\"$head_addr\"; else node_ip_of \"$node\" < /dev/null; fi",
        *(f"  {line}" for line in _fail_if('[ -z "$node_ip" ]', f"{failed}: cannot resolve the address of node "
                                           "$node (NodeAddr ${node_addr:-unknown}), which torchrun's workers may "
                                           "need to reach")),
        f"  {NODE_ADDRS_ENV}=\"${NODE_ADDRS_ENV}$node_ip \"",
        "done < <(scontrol show hostnames \"$SLURM_JOB_NODELIST\")",
        f"export {NODE_ADDRS_ENV}",
    ]


def render(job: MultiNodeJob, opts: SlurmOptions, work: Workload) -> str:
    """The sbatch script running WORK on JOB's nodes in opts.runtime's containers."""
    check_image(job.image, opts.runtime)
    failed = f"{work.label} failed"
    lines = [*_header(job, opts, work), *_inputs(job, opts, work), *_rendezvous(job, work, failed),
             *_job_folder(job, opts, work)]
    lines += ["", *(_platform_check(failed) if opts.runtime == "oci" else []), *_shm_check(opts, failed), ""]
    lines += _srun_step(job, opts, work, failed)
    return "\n".join(lines)


def _header(job: MultiNodeJob, opts: SlurmOptions, work: Workload) -> list[str]:
    """The script's first lines: what made it, how to submit it, its #SBATCH directives."""
    directives = [f"--job-name={job.name}", f"--nodes={job.nodes}", "--ntasks-per-node=1",
                  f"--time={opts.time_limit}", f"--output={job.name}-%j.out"]
    optional = (("gpus-per-node", job.gpus_per_node), ("cpus-per-task", opts.cpus(job)),
                ("partition", opts.partition), ("account", opts.account), ("constraint", opts.constraint))
    directives += [f"--{name}={value}" for name, value in optional if value]
    return [
        "#!/bin/bash",
        f"# Generated by buildtool: the multi-node {work.label} of dl-images ({opts.runtime}).",
        f"# Submit with: sbatch THIS_FILE   (override SCRIPTS_DIR to point at {work.scripts_dir or 'the scripts'}"
        + (", OCI_BUNDLE at the bundle)" if opts.runtime == "oci" else ")"),
        *[f"#SBATCH {d}" for d in directives],
        "set -euo pipefail",
        "",
    ]


def _inputs(job: MultiNodeJob, opts: SlurmOptions, work: Workload) -> list[str]:
    """The job's settings and the files it needs, each checked before anything runs."""
    lines = []
    if work.copied:
        scripts_dir = opts.scripts_dir or f"${{SLURM_SUBMIT_DIR:-$PWD}}/{work.scripts_dir}"
        lines.append(f"SCRIPTS_DIR=\"${{SCRIPTS_DIR:-{scripts_dir}}}\"")
    if opts.runtime == "oci":
        lines.append(f"OCI_BUNDLE=\"${{OCI_BUNDLE:-{job.image}}}\"")
    lines += [f"SHM_BYTES={shm_bytes(job.shm_size, f'shm size of {job.name}')}  # {job.shm_size}, the run "
              "profile's --shm-size",
              f"JOIN_TIMEOUT_S={job.join_timeout_s}",
              *[f"export {k}={shlex.quote(v)}" for k, v in sorted(work.env.items())], ""]
    for name in work.copied:
        lines += _fail_if(f'[ ! -f "$SCRIPTS_DIR/{name}" ]',
                          f"error: $SCRIPTS_DIR/{name} not found; set SCRIPTS_DIR to {work.scripts_dir}")
    if opts.runtime == "oci":
        lines += [*_fail_if(f'[ ! -f "$OCI_BUNDLE/config.json" ] || [ ! -d "$OCI_BUNDLE/{JOBS_DIR}" ]',
                            "error: $OCI_BUNDLE is not a bundle made by \\`buildtool bundle\\`; set OCI_BUNDLE"),
                  "# SLURM runs the step's command in place of the bundle's process: the image's ENTRYPOINT",
                  "# (NGC's sets up CUDA's forward-compatibility libraries) goes first, as under validate.",
                  *_fail_if(f'[ ! -f "$OCI_BUNDLE/{ENTRYPOINT_FILE}" ]', "error: $OCI_BUNDLE records no entrypoint "
                            "(a bundle made before bundles recorded it): make it again with \\`buildtool bundle\\`"),
                  "entrypoint=()",
                  "while IFS= read -r word; do entrypoint+=(\"$word\"); done < \"$OCI_BUNDLE/" + ENTRYPOINT_FILE + "\""]
    return lines


def _rendezvous(job: MultiNodeJob, work: Workload, failed: str) -> list[str]:
    """Where the rendezvous is (the first node), and each node's place in the node list where the work needs it."""
    lines = [
        "",
        f"# The first node of the allocation hosts the {work.first_node_hosts}.",
        "# sed, not head: head would close the pipe early and pipefail would kill the job (SIGPIPE).",
        "head_node=\"$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | sed -n 1p)\"",
        *_head_address(failed),
        f"endpoint=\"$head_addr:{job.rdzv_port}\"",
        "echo \"rendezvous at $endpoint (node $head_node)\"",
    ]
    if _needs_nodes(work):
        lines += [
            "# Each node's process id is its place in this list (the first hosts the rendezvous): the verifier,",
            "# in the container, finds its hostname there (SLURM_PROCID would be expanded once, here, and is",
            "# wrong in OCI containers).",
            f"{NODES_ENV}=\"$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | tr '\\n' ' ')\"",
            f"export {NODES_ENV}",
            *(_node_addresses(failed) if LOCAL_ADDR in work.command else []),
        ]
    lines.append("")
    return lines


def _job_folder(job: MultiNodeJob, opts: SlurmOptions, work: Workload) -> list[str]:
    """The job's folder the container sees (the bundle's jobs/ folder, or one on the shared file system), removed
    when the job ends, with the work's scripts in it."""
    folder = f"{job.name}-$SLURM_JOB_ID"
    if opts.runtime == "oci":
        lines = [
            "# SLURM 22.05 has no per-job bind mounts: the bundle binds its jobs/ folder read-only at "
            f"{JOBS_MOUNT}.",
            f"workdir=\"$OCI_BUNDLE/{JOBS_DIR}/{folder}\"",
            f"jobdir=\"{JOBS_MOUNT}/{folder}\"",
            "mkdir -p \"$workdir\" || { echo \"error: cannot write $OCI_BUNDLE/" + JOBS_DIR + "; make the bundle "
            "with --jobs-dir on a folder you can write\" >&2; exit 2; }",
        ]
    else:
        lines = [
            "# Scripts go to a job folder on the shared file system, bound read-only into the container.",
            f"workdir=\"${{SLURM_SUBMIT_DIR:-$PWD}}/.{folder}\"",
            f"jobdir={MOUNT_DIR}",
            "mkdir -p \"$workdir\"",
        ]
    lines.append("trap 'rm -rf \"$workdir\"' EXIT")
    lines += [f"cp \"$SCRIPTS_DIR/{name}\" \"$workdir/{name}\"" for name in work.copied]
    for name, text in work.embedded.items():
        marker = re.sub(r"\W", "_", name).upper()
        lines += [f"cat > \"$workdir/{name}\" <<'{marker}'", text.rstrip("\n"), marker]
    return lines


def _srun_step(job: MultiNodeJob, opts: SlurmOptions, work: Workload, failed: str) -> list[str]:
    """The srun step, and a failure that names its cause (the rendezvous, the node whose task ended first)."""
    # srun does not take the job's --cpus-per-task from sbatch in SLURM 22.05 to 23.02: name it on the step.
    cpus = [f"--cpus-per-task={opts.cpus(job)}"] if opts.cpus(job) else []
    launch = " ".join(_quote(w) for w in ["srun", "--kill-on-bad-exit=1", *cpus, *_container(job, opts, work),
                                          *work.command])
    return [
        "# Keep the step's output to say what failed: srun names the node whose task ended first.",
        "set +e",
        f"{launch} 2>&1 | tee \"$workdir/step.log\"",
        "status=${PIPESTATUS[0]}",
        "set -e",
        "if [ \"$status\" -ne 0 ]; then",
        "  first=\"$(grep -m 1 -E '^srun: error: [^ ]+: tasks? [0-9]' \"$workdir/step.log\" "
        "| sed 's/^srun: error: //' || true)\"",
        "  if grep -q -E 'Rendezvous(Timeout|Connection|Closed)Error' \"$workdir/step.log\"; then",
        f"    echo \"{failed}: the c10d rendezvous timed out: not every node joined within the join timeout "
        "of ${JOIN_TIMEOUT_S} s (${first%%:*} gave up first: ${first#*: })\" >&2",
        "  elif [ -n \"$first\" ]; then",
        f"    echo \"{failed} on node ${{first%%:*}}: ${{first#*: }}; --kill-on-bad-exit stopped the "
        "other nodes\" >&2",
        "  else",
        f"    echo \"{failed}: the step exited $status (see the output above)\" >&2",
        "  fi",
        "fi",
        "exit \"$status\"",
        "",
    ]


def sbatch_script(job: MultiNodeJob, opts: SlurmOptions) -> str:
    return render(job, opts, ddp_check(job))


@dataclass(frozen=True)
class Outcome:
    """A job's result, read from its output."""

    passed: bool
    reason: str                       # the one line that says so
    failed_node: str = ""             # the node srun reported first, or whose /dev/shm is too small
    rendezvous_timeout: bool = False
    result: dict[str, Any] | None = None   # the last `<marker><json>` line (rank 0's report)

    @property
    def world_size(self) -> int:
        value = (self.result or {}).get("world_size", 0)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0   # 0: none reported


def parse_output(text: str, label: str = "DDP check", marker: str = "DDP_RESULT ",
                 passed_prefix: str | None = PASSED_PREFIX) -> Outcome:
    """What a job said: passed (its `passed_prefix` line, or its result when there is no such line) or why not."""
    lines = text.splitlines()
    result = None
    for line in lines:
        if line.startswith(marker):
            try:
                found = json.loads(line[len(marker):])
            except ValueError:
                continue
            if isinstance(found, dict):   # a number or a list is as malformed as broken JSON
                result = found
    failed = [line for line in lines if line.startswith(f"{label} failed")]
    shm = [line for line in lines if line.startswith("error: /dev/shm on ")]
    limit = re.search(r"CANCELLED AT \S+ DUE TO TIME LIMIT", text)
    srun = re.search(r"^srun: error: ([^ :]+): tasks? [0-9]", text, re.MULTILINE)
    passed = [line for line in lines if passed_prefix and line.startswith(passed_prefix)]
    if not failed and not shm and not limit and (passed or (passed_prefix is None and result is not None)):
        return Outcome(passed=True, reason=(passed or [f"{label} reported {marker.strip()}"])[-1], result=result)
    if shm:
        node = re.match(r"error: /dev/shm on (\S+) ", shm[0])
        return Outcome(passed=False, reason=shm[0], failed_node=node.group(1) if node else "", result=result)
    if failed:
        reason = failed[0]  # the first says the cause (the verifier's, or the script's summary of srun's)
    elif limit:
        reason = f"{label} failed: the job reached its time limit"
    else:
        reason = f"{label} failed: the job ended without a result"
    return Outcome(passed=False, reason=reason, failed_node=srun.group(1) if srun else "",
                   rendezvous_timeout="rendezvous timed out" in reason, result=result)
