"""What the Kubernetes and SLURM generators share: the multi-node check of the image's framework, and its defaults.

A framework declares its check in its framework.yaml (`multinode`: a script in its scripts/ and a
launcher; buildtool/contracts/frameworks.py). Both generators run it on every node wrapped by a verifier
(launch/verify_ddp.py, a program of its own, shipped into the job with the contracts it imports: VERIFY_FILES)
that fails the job unless it trained in sync with the backend and world size asked for and, on GPUs, NCCL's log
shows the fabric the job asked for (issue 49). The script itself only reports: the image-tests harness asserts
on one machine, this wrapper across machines. What runs on every node is its launcher's (launch/launchers/);
a process id is resolved by the verifier on the node, from JOB_COMPLETION_INDEX or the place of the
container's hostname in DDP_NODES, never from SLURM_PROCID: docs/multinode.md says why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from buildtool.common import argcheck
from buildtool.common.errors import UserError
from buildtool.common.sizes import parse_size
from buildtool.contracts import busbw, nccl_log
from buildtool.contracts.arguments import NCCL_VALUE, NCCL_VALUE_WHAT
from buildtool.contracts.frameworks import LAUNCHERS, Framework, MultiNodeCheck
from buildtool.contracts.names import check_revision, dev_tag, image_of_repo_path, parse_dev_tag
from buildtool.contracts.rendezvous import BACKOFF_LIMIT, JOIN_TIMEOUT_S, MAX_RESTARTS, RDZV_PORT
from buildtool.launch import launchers

if TYPE_CHECKING:
    from buildtool.matrix.schema import Cell, Matrix

VERIFY_SCRIPT = "verify_ddp.py"
MOUNT_DIR = "/opt/image-tests/scripts"
DEFAULT_SHM = "8g"
# A workload of the caller's own (the scaling benchmark, a job without a framework's check) is a torchrun script.
OWN_WORKLOAD_LAUNCHER = "torchrun"
NODE_ADDRS_ENV = "DDP_NODE_ADDRS"  # SLURM: the nodes' addresses, in DDP_NODES' order
RDZV_HOST_ENV = "DDP_RDZV_HOST"  # a name the verifier waits to resolve (bounded) before it starts the check
LIBRARY_PATH_ENV = "DDP_APPEND_LIBRARY_PATH"   # folders the verifier appends to the check's LD_LIBRARY_PATH
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
# INFO, limited to the subsystems that say which network NCCL chose (`Using network NAME`, the NET channels and
# their GPUDirect RDMA, the devices or why there are none): the verifier reports them per process and checks them.
DEFAULT_NCCL_DEBUG = "INFO"
DEFAULT_NCCL_DEBUG_SUBSYS = "INIT,NET"
# What the verifier checks NCCL's log against (GPU jobs across nodes; launch/verify_ddp.py reads them).
TRANSPORT_ENV = "DDP_EXPECT_TRANSPORT"   # the family NCCL must use: busbw.IB or busbw.EFA, when the job asked
GDR_ENV = "DDP_EXPECT_GDR"               # 1: every NET channel must be GPUDirect RDMA (--require-gdr)
RATE_ENV = "DDP_FABRIC_RATE"             # a busbw.LINK_RATES name (--fabric-rate)
NICS_ENV = "DDP_FABRIC_NICS"             # NICs per node the job names (--fabric-nics, an EFA resource's count)
NICS_FROM_ENV = "DDP_FABRIC_NICS_FROM"   # which option named them
GPUS_ENV = "DDP_GPUS_PER_NODE"           # the node's GPUs: at most one NIC each is counted
NODES_ENV = "DDP_NODES"          # SLURM: the allocation's node names, space-separated, in order

# What every node runs around the check (launch/verify_ddp.py, a program of its own), and the contracts it reads
# NCCL's log and the fabric floors with: shipped as files beside it (a ConfigMap, the sbatch script's job folder),
# imported by their file names there.
_SHIPPED = {VERIFY_SCRIPT: Path(__file__).with_name(VERIFY_SCRIPT),
            "nccl_log.py": Path(nccl_log.__file__), "busbw.py": Path(busbw.__file__)}
VERIFY_FILES: dict[str, str] = {name: path.read_text(encoding="utf-8") for name, path in _SHIPPED.items()}
VERIFY_SOURCE = VERIFY_FILES[VERIFY_SCRIPT]


_NCCL_NAME = re.compile(r"NCCL_[A-Z0-9_]+")
_NCCL_LIST = re.compile(r"[A-Za-z0-9_.:,=^-]+")   # interface and HCA lists: `^` excludes, `=` matches exactly


@dataclass(frozen=True)
class NcclSettings:
    """NCCL's environment for a GPU job: what the user names, never guessed (the right interface and HCAs
    are the cluster's to say). NCCL_DEBUG defaults to INFO with NCCL_DEBUG_SUBSYS=INIT,NET: the transport NCCL
    chose reaches the job's log, where the transport check reads it."""

    debug: str = ""                      # "" -> DEFAULT_NCCL_DEBUG
    socket_ifname: str = ""              # NCCL_SOCKET_IFNAME, e.g. eth0 or ^lo,docker
    ib_hca: str = ""                     # NCCL_IB_HCA, e.g. mlx5_0:1,mlx5_1:1
    extra: tuple[tuple[str, str], ...] = ()   # other NCCL_* variables (--nccl-env NAME=VALUE)

    def __post_init__(self) -> None:
        if self.debug and self.debug not in NCCL_DEBUG_LEVELS:
            raise UserError(f"--nccl-debug must be one of {', '.join(NCCL_DEBUG_LEVELS)}, not {self.debug!r}")
        for option, value in (("--nccl-socket-ifname", self.socket_ifname), ("--nccl-ib-hca", self.ib_hca)):
            if value and not _NCCL_LIST.fullmatch(value):
                raise UserError(f"{option} {value!r} is not a comma list of names (NCCL's syntax: ^ excludes, "
                                "= matches exactly)")
        given: dict[str, str] = {}
        for name, value in self.extra:
            if not _NCCL_NAME.fullmatch(name):
                raise UserError(f"--nccl-env {name}={value}: the name must be an NCCL_* variable")
            if name in given:   # one value reaches the job: the other was dropped without a word
                raise UserError(f"--nccl-env {name} is given twice ({given[name]} and {value}); give it once")
            given[name] = value
            own = {"NCCL_DEBUG": "--nccl-debug", "NCCL_SOCKET_IFNAME": "--nccl-socket-ifname",
                   "NCCL_IB_HCA": "--nccl-ib-hca"}
            if name == "NCCL_DEBUG_FILE":
                raise UserError("--nccl-env NCCL_DEBUG_FILE: the verifier sets it, one file per process that it "
                                "reads after the check and prints into the job's log; leave it out")
            if name in own:
                raise UserError(f"--nccl-env {name}: use its own option, {own[name]}")
            if "\n" in value or not value:
                raise UserError(f"--nccl-env {name}: the value must be one non-empty line")
            if not NCCL_VALUE.match(value):
                raise UserError(f"--nccl-env {name}: the value is not {NCCL_VALUE_WHAT}")

    @staticmethod
    def parse_env(items: list[str]) -> tuple[tuple[str, str], ...]:
        for item in items:
            if "=" not in item:
                raise UserError(f"--nccl-env {item!r} is not NAME=VALUE")
        return tuple((name, value) for name, _, value in (item.partition("=") for item in items))

    @property
    def explicit(self) -> bool:
        return bool(self.debug or self.socket_ifname or self.ib_hca or self.extra)

    def env(self) -> dict[str, str]:
        env = {"NCCL_DEBUG": self.debug or DEFAULT_NCCL_DEBUG}
        if not self.debug and "NCCL_DEBUG_SUBSYS" not in dict(self.extra):
            env["NCCL_DEBUG_SUBSYS"] = DEFAULT_NCCL_DEBUG_SUBSYS
        named = (("NCCL_SOCKET_IFNAME", self.socket_ifname), ("NCCL_IB_HCA", self.ib_hca))
        return {**env, **{name: value for name, value in named if value}, **dict(self.extra)}


def subsys_shows_init(subsys: str) -> bool:
    """Whether NCCL_DEBUG_SUBSYS=SUBSYS lets NCCL print its INIT lines (`Using network`), read as NCCL reads it
    (src/debug.cc): a comma list of subsystems in any case, or after a leading ^ all subsystems but those listed
    (`^NET,INIT` leaves INIT out; `^NET` keeps it)."""
    invert = subsys.startswith("^")
    names = {name.strip().upper() for name in subsys.removeprefix("^").split(",")}
    return bool({"INIT", "ALL"} & names) != invert


@dataclass(frozen=True)
class MultiNodeJob:
    """One multi-node run of a framework's check (`check`; None for a workload of the caller's own, as
    the scaling benchmark's); every default overridable from the command line."""

    image: str
    nodes: int
    gpus_per_node: int
    check: MultiNodeCheck | None = None
    name: str = "ddp-check"
    shm_size: str = DEFAULT_SHM
    join_timeout_s: int = JOIN_TIMEOUT_S
    max_restarts: int = MAX_RESTARTS
    backoff_limit: int = BACKOFF_LIMIT
    rdzv_port: int = RDZV_PORT
    steps: int = 40
    nccl: NcclSettings = NcclSettings()
    rdma: bool = False          # Kubernetes: the pods get RDMA devices (--rdma-resource)
    efa_devices: int = 0        # Kubernetes: the pods get this many EFA devices (--efa-resource)
    fabric_rate: str = ""       # a busbw.LINK_RATES name (--fabric-rate): the fabric's documented rate
    fabric_nics: int = 0        # NICs per node NCCL must use (--fabric-nics); 0: NCCL_IB_HCA's or NCCL's count
    require_gdr: bool = False   # every NET channel must be GPUDirect RDMA (--require-gdr)

    def __post_init__(self) -> None:
        if self.nccl.explicit and not self.gpus_per_node:
            raise UserError("NCCL settings (--nccl-*) apply to GPU jobs: with --gpus-per-node 0 the check runs gloo")
        if self.fabric_rate:
            try:
                busbw.link_rate(self.fabric_rate)
            except ValueError as exc:
                raise UserError(str(exc)) from None
        if self.fabric_nics < 0:
            raise UserError(f"--fabric-nics must be a positive number of NICs per node, not {self.fabric_nics}")
        # The options that ask the fabric for something only a GPU job across nodes can show.
        fabric = [option for option, on in (("--fabric-rate", self.fabric_rate), ("--fabric-nics", self.fabric_nics),
                                            ("--require-gdr", self.require_gdr), ("--efa-resource", self.efa_devices))
                  if on]
        if fabric and not (self.gpus_per_node and self.nodes > 1):
            raise UserError(f"{' and '.join(fabric)} check NCCL's traffic between nodes: they need a GPU job "
                            f"(--gpus-per-node, now {self.gpus_per_node}) across nodes (--nodes, now {self.nodes})")
        asked = self._asked()
        if len(asked) > 1:
            raise UserError("the job asks for two fabrics: " + " and ".join(
                f"{family} ({', '.join(options)})" for family, options in sorted(asked.items())) + "; name one")
        net = dict(self.nccl.extra).get("NCCL_NET")
        if asked and net is not None and nccl_log.family_of(net) != self.wanted_family:
            # The verifier fails every node whose NCCL used another family: say so before any pod is scheduled.
            family, options = next(iter(asked.items()))
            raise UserError(f"--nccl-env NCCL_NET={net} selects {nccl_log.FAMILY_WORDS[nccl_log.family_of(net)]}, "
                            f"but the job asks for {family} ({' and '.join(options)}): name a network of {family} "
                            "in NCCL_NET or leave it out")
        if (asked or self.require_gdr) and self.nccl.debug in ("VERSION", "WARN"):
            raise UserError(f"--nccl-debug {self.nccl.debug}: the job asks for {self.fabric_reason}, and the check "
                            "reads NCCL's INFO lines to see that NCCL used it; leave --nccl-debug unset (INFO, "
                            "subsystems INIT,NET) or set INFO or TRACE")
        subsys = dict(self.nccl.extra).get("NCCL_DEBUG_SUBSYS")
        if (asked or self.require_gdr) and subsys is not None and not subsys_shows_init(subsys):
            raise UserError(f"--nccl-env NCCL_DEBUG_SUBSYS={subsys}: the job asks for {self.fabric_reason}, and "
                            "NCCL prints the network and its channels under INIT; include INIT")
        if self.nodes < 1:
            raise UserError(f"--nodes must be at least 1, not {self.nodes}")
        if self.gpus_per_node < 0:
            raise UserError(f"--gpus-per-node must be 0 (CPU, gloo) or more, not {self.gpus_per_node}")
        if self.join_timeout_s < 1:
            raise UserError("--join-timeout must be a positive number of seconds")
        if not self.image or any(c.isspace() for c in self.image):
            raise UserError(f"IMAGE {self.image!r} is not an image reference")
        if not self.image.startswith("/"):   # a path (a .sif, a bundle) is the SLURM runtime's to check
            argcheck.reference("IMAGE", self.image)

    @property
    def launcher(self) -> launchers.Launcher:
        """The check's launcher (launch/launchers/), or torchrun for a workload of the caller's own."""
        return launchers.get(self.check.launcher if self.check is not None else OWN_WORKLOAD_LAUNCHER)

    @property
    def procs_per_node(self) -> int:
        return self.launcher.procs_per_node(self.gpus_per_node)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def backend(self) -> str:
        return "nccl" if self.gpus_per_node > 0 else "gloo"

    def _asked(self) -> dict[str, list[str]]:
        """family -> the options that asked for it."""
        asked: dict[str, list[str]] = {}
        for family, option, on in ((busbw.IB, "--nccl-ib-hca", self.nccl.ib_hca),
                                   (busbw.IB, "--rdma-resource", self.rdma),
                                   (busbw.EFA, "--efa-resource", self.efa_devices)):
            if on:
                asked.setdefault(family, []).append(option)
        if self.fabric_rate:
            asked.setdefault(busbw.link_rate(self.fabric_rate).family, []).append(f"--fabric-rate {self.fabric_rate}")
        return asked

    @property
    def wanted_family(self) -> str:
        """The fabric family the job asked for (busbw.IB, busbw.EFA), or '' (a job may ask for one only)."""
        return next(iter(self._asked()), "")

    @property
    def fabric_reason(self) -> str:
        words = [f"{family} ({' and '.join(options)})" for family, options in self._asked().items()]
        return " and ".join([*words, *(["GPUDirect RDMA (--require-gdr)"] if self.require_gdr else [])])

    def fabric_env(self) -> dict[str, str]:
        """What the verifier checks NCCL's log and the cross-node bus bandwidth against (GPU jobs across nodes)."""
        if not (self.gpus_per_node and self.nodes > 1):
            return {}
        env = {GPUS_ENV: str(self.gpus_per_node), TRANSPORT_ENV: self.wanted_family,
               GDR_ENV: "1" if self.require_gdr else "", RATE_ENV: self.fabric_rate}
        # The NICs per node the job names, and how (NCCL_IB_HCA's list the verifier reads itself; it never comes
        # with --efa-resource: two fabrics are refused above).
        if self.fabric_nics:
            env[NICS_ENV], env[NICS_FROM_ENV] = str(self.fabric_nics), f"--fabric-nics {self.fabric_nics}"
        elif self.efa_devices:
            env[NICS_ENV] = str(self.efa_devices)
            env[NICS_FROM_ENV] = f"--efa-resource asks for {self.efa_devices} EFA device(s)"
        return {name: value for name, value in env.items() if value}

    def command(self, endpoint: str, rdzv_id: str, script_dir: str = MOUNT_DIR, *, ranked: bool = False) -> list[str]:
        """What every node runs: the verifier around the framework's check. RANKED: the scheduler ranks the nodes
        and reports node 0's outcome (a PyTorchJob), so node 0 must run rank 0 (Launcher.ranked_command)."""
        if self.check is None:
            raise ValueError("a job without a framework's check has no check command")
        script = f"{script_dir}/{self.check.script}"
        node = (self.launcher.ranked_command(self, endpoint, rdzv_id, script) if ranked
                else self.launcher.node_command(self, endpoint, rdzv_id, script))
        return ["python3", f"{script_dir}/{VERIFY_SCRIPT}", *node]

    @property
    def expect_env(self) -> dict[str, str]:
        """What the verifier checks the run against (the world size and backend asked for here), and NCCL's
        settings on GPUs."""
        # PYTHONUNBUFFERED: the check's own lines reach the job's log even when a process dies.
        expect = {"DDP_EXPECT_WORLD_SIZE": str(self.world_size), "DDP_EXPECT_BACKEND": self.backend,
                  "PYTHONUNBUFFERED": "1"}
        if self.gpus_per_node:
            expect |= {**self.nccl.env(), **self.fabric_env()}
        return expect

    @property
    def env(self) -> dict[str, str]:
        """The check's environment on every node: what its launcher's script reads, and expect_env."""
        return {**self.launcher.env(self), **self.expect_env}


def check_of(framework: Framework) -> MultiNodeCheck:
    """The framework's multi-node check; UserError when its folder declares none."""
    if framework.multinode is None:
        raise UserError(f"framework {framework.name} declares no multi-node check: add `multinode: {{script: ..., "
                        f"launcher: {'|'.join(LAUNCHERS)}}}` to image-tests/{framework.name}/framework.yaml")
    if framework.multinode.script in VERIFY_FILES:   # one folder holds both: the shipped file would replace it
        raise UserError(f"image-tests/{framework.name}/framework.yaml: multinode.script "
                        f"{framework.multinode.script!r} is the name of a file shipped beside the check "
                        f"({', '.join(VERIFY_FILES)}), which would replace it in the job; rename the script")
    return framework.multinode


def read_check_script(framework: Framework) -> str:
    """The text of the framework's multi-node check script (the load checked it is there)."""
    check = check_of(framework)
    if framework.scripts is None:
        raise UserError(f"framework {framework.name} has no folder to read {check.script} from")
    return (framework.scripts / check.script).read_text(encoding="utf-8")


def names_cell(tag: str, cell: Cell) -> bool:
    """Whether `tag` is one of the tags `cell` has: its version, a release or moving tag its templates
    make (a release that is a PEP 440 version), or a dev tag `<revision>-<version>`."""
    from buildtool.release.tag_plan import release_number

    if tag == cell.version or any(
            release_number(tag, template, cell) is not None if "{release}" in template
            else template.replace("{version}", cell.version) == tag
            for template in (*cell.release_tags, *cell.moving_tags)):
        return True
    dev = parse_dev_tag(tag, cell.version)
    if dev is None:
        return False
    try:
        check_revision(dev.revision)
    except ValueError:
        return False
    return True


def tag_forms(cells: list[Cell]) -> str:
    """The tags an image's cells accept, as a reader writes them: `<version>, <version>-<release>, latest
    or a dev tag <revision>-<version> (e.g. 0123456789ab-25.10)`."""
    plain = ["<version>", *(template.replace("{version}", "<version>").replace("{release}", "<release>")
                            for cell in cells for template in (*cell.release_tags, *cell.moving_tags))]
    example = next((c for c in cells if c.default), cells[0]).version
    return (f"{', '.join(dict.fromkeys(plain))} or a dev tag {dev_tag('<revision>', '<version>')} "
            f"(e.g. {dev_tag('0123456789ab', example)})")


def cell_for_image(matrix: Matrix, image: str) -> Cell | None:
    """The matrix cell an image reference names: `<registry>/<name>[-dev]:<tag>`, the tag one of the
    cell's own (`names_cell`). None when the repository is no image of the matrix (a foreign image);
    UserError naming it when the reference does not parse, names no tag, or its tag names no cell
    (never the image's default cell)."""
    ref = argcheck.reference("IMAGE", image)
    name = image_of_repo_path(ref.path)
    candidates = [c for c in matrix.cells if c.name == name]
    if not candidates:
        return None
    versions = ", ".join(c.version for c in candidates)
    if not ref.tag:
        raise UserError(f"{image} names no tag, so no cell of {name} in the matrix (its versions: {versions}); "
                        f"write the tag: a tag is {tag_forms(candidates)}")
    named = [c for c in candidates if names_cell(ref.tag, c)]
    if len(named) > 1:
        raise UserError(f"{image}: tag {ref.tag!r} names more than one cell of {name} "
                        f"({', '.join(c.key for c in named)}); use a tag of one of them")
    if not named:
        raise UserError(f"{image}: tag {ref.tag!r} names no cell of {name} in the matrix (its versions: {versions}); "
                        f"a tag is {tag_forms(candidates)}")
    return named[0]


def k8s_quantity(size: str) -> str:
    """Docker size (8g, 512m, 1048576) -> Kubernetes quantity (8Gi, 512Mi, 1048576); SizeError naming it."""
    parsed = parse_size(size)
    return f"{parsed.number}{ {'': '', 'b': '', 'k': 'Ki', 'm': 'Mi', 'g': 'Gi'}[parsed.unit] }"


def write_verifier(folder: Path) -> Path:
    """The verifier and the files it imports (VERIFY_FILES) written into FOLDER; the verifier's path."""
    for name, text in VERIFY_FILES.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder / VERIFY_SCRIPT
