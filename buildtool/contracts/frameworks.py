"""The framework table: everything the pipeline needs to know about a framework, one folder each.

A framework is the folder image-tests/<name>/, and that folder is all that is specific to it:
  framework.yaml   its row of this table (the fields of `Framework` below)
  test_*.py        its image-tests group
  scripts/         its in-image writers and probes (mounted beside image-tests/scripts at /imagetests)
  *.j2             template parts only it needs (`template_parts`), included in every image of it
Image templates (templates/images/) are per install method and shared by all frameworks. The table
is read from the image-tests folder of the matrix being loaded (`use`); anything in a row that does
not parse, or names a file the folder does not hold, is an error naming the file, never a default.

Three keys choose a kind from a fixed set, each kind one entry of one table, which says what it means
(docs/images.md's "Frameworks" section lists them, generated from these tables):
  multinode.launcher  LAUNCHERS below: how the multi-node check starts on every node (its behaviour is the
                      module buildtool/launch/launchers/<name>.py, found by its name)
  local_versions      contracts.versions.SCHEMES: how builds mark themselves in __version__'s local part
  shm_workers         SHM_WORKERS below: how image-tests/scripts/shm_workers.py passes batches through
                      /dev/shm (its function `<name>_mode` there, found by its name)
A name that is in none of them is an error naming the file and the known kinds, never a default.

The multi-node check (`multinode`, optional: a framework without it has none, and `buildtool k8s` /
`buildtool slurm` refuse its images): `script`, a file in the framework's scripts/, run on every node
by the `launcher` (LAUNCHERS says how). Process (rank) 0 prints one line `DDP_RESULT {json}` with
  backend      "nccl" (GPUs) or "gloo" (CPU), the collectives it really used
  world_size   processes that took part: nodes x the launcher's processes per node
  identical    true when every process ended with the same parameters
  first_loss, last_loss   the loss at the start and at the end (it must fall)
and exits non-zero when it failed. The launchers' verifier (launch/multinode.py) fails the job
unless backend and world_size are what the launcher asked for, identical is true and the loss fell.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from collections.abc import Collection, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml

from buildtool.contracts.versions import SCHEMES

FRAMEWORK_FILE = "framework.yaml"
SCRIPTS = "scripts"
COMMON_GROUP = "common"
DEFAULT_TESTS_DIR = Path(__file__).resolve().parents[2] / "image-tests"

_NAME = r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*"
_SCRIPT = r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.py"
_PART = r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.j2"


# multinode.launcher's kinds (module docstring): what runs on every node. contracts cannot import their modules in
# buildtool/launch/launchers/; tests/test_launchers.py keeps the two in step.
LAUNCHERS: dict[str, str] = {
    "torchrun": "one torchrun per node (`--nproc-per-node` = the node's GPUs, 1 on CPU), c10d rendezvous on the "
                "first node; the script is torchrun's, its ranks from torchrun's environment",
    "coordinator": "one process per node, using all its GPUs: `python3 SCRIPT --coordinator HOST:PORT "
                   "--num-processes N --process-id I --steps S --init-timeout SECONDS`, HOST the first node "
                   "(process 0's), I this node's index in the job's node list, resolved on the node itself "
                   "(as `jax.distributed` wants it)",
}

# shm_workers' kinds (module docstring): the workers each runs (failure messages name them so). Its `<name>_mode`
# runs in the image and cannot import this module.
SHM_WORKERS: dict[str, str] = {
    "torch": "a DataLoader with 2 workers (torch.utils.data)",
    "python": "2 worker processes (multiprocessing.shared_memory)",
}


class TableError(ValueError):
    """A framework folder that does not make a row (callers turn it into exit 2)."""


@dataclass(frozen=True)
class MultiNodeCheck:
    """A framework's multi-node check (its framework.yaml `multinode`; the module docstring says
    what the launchers run and what the script must print)."""

    framework: str
    script: str                     # a file in the framework's scripts/
    launcher: str                   # a key of LAUNCHERS


@dataclass(frozen=True)
class Framework:
    name: str                       # the matrix's `framework:` value; also its image-tests group and folder
    module: str                     # the import whose __version__ proves the framework's version
    distributions: tuple[str, ...]  # pip names that carry it, at least one (a stand-in's requirement is found by these)
    gpu_count_expr: str             # Python, evaluated in the image with `module` imported: GPUs it sees
    events_writer: tuple[str, ...]  # its scripts/ command that writes TensorBoard scalars "loss"
    title: str = ""                 # how documents and Dockerfile comments name it (PyTorch)
    shm_workers: str = "python"     # how shm_workers.py loads batches through /dev/shm: a key of SHM_WORKERS
    cuda_build_expr: str = "''"     # Python, in the image: the CUDA version the framework was built with, '' if none
    container_version_env: str = "" # what an NGC container of this framework sets to its release (25.10)
    local_versions: str = "plain"   # how builds mark themselves in __version__'s local part (versions.SCHEMES)
    template_parts: tuple[str, ...] = ()  # its *.j2 parts, as templates name them (framework/<name>/<file>)
    multinode: MultiNodeCheck | None = None  # its multi-node check; None: it has none
    folder: Path | None = None      # image-tests/<name>/

    @property
    def scripts(self) -> Path | None:
        return self.folder / SCRIPTS if self.folder is not None else None


@functools.cache
def _row_model() -> Any:
    """framework.yaml, strictly: every key known, every value of its type. Built on first use, so a
    command that never reads a row (a release from a matrix snapshot) never imports pydantic."""
    from pydantic import BaseModel, ConfigDict, Field, StrictStr

    class MultiNode(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

        script: Annotated[StrictStr, Field(pattern=f"^{_SCRIPT}$")]
        launcher: StrictStr                     # a key of LAUNCHERS (checked by load_row, naming them)

    class Row(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

        name: Annotated[StrictStr, Field(pattern=f"^{_NAME}$", max_length=40)]
        title: Annotated[StrictStr, Field(min_length=1, max_length=40, pattern=r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]+$")]
        module: Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]
        # At least one: a stand-in's requirement and framework_requirements are found by these.
        distributions: Annotated[tuple[Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")], ...],
                                 Field(min_length=1)]
        gpu_count: Annotated[StrictStr, Field(min_length=1)]
        cuda_build: Annotated[StrictStr, Field(min_length=1)] = "''"
        events_writer: Annotated[tuple[StrictStr, ...], Field(min_length=1)]
        shm_workers: StrictStr = "python"       # a key of SHM_WORKERS
        local_versions: StrictStr = "plain"     # a key of versions.SCHEMES
        ngc_version_env: Annotated[StrictStr, Field(pattern=r"^([A-Z][A-Z0-9_]*)?$")] = ""
        template_parts: tuple[Annotated[StrictStr, Field(pattern=f"^{_PART}$")], ...] = ()
        multinode: MultiNode | None = None

    return Row


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a duplicate key, and an alias inside the collection its anchor names (SafeLoader
    builds a value that contains itself, refused later with no word of the alias)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        open_anchors: set[str] = self.__dict__.setdefault("_open_anchors", set())
        if isinstance(event, yaml.AliasEvent) and event.anchor in open_anchors:
            why = f"alias *{event.anchor} refers to a value that contains it; a value cannot include itself"
            raise yaml.composer.ComposerError(None, None, why, event.start_mark)  # type: ignore[arg-type]
        anchor = None if isinstance(event, yaml.AliasEvent) else event.anchor
        if anchor is not None:
            open_anchors.add(anchor)
            # Defined again: legal YAML, the alias names the most recent node (as matrix.yaml's loader reads it).
            self.anchors.pop(anchor, None)
        try:
            return super().compose_node(parent, index)
        finally:
            if anchor is not None:
                open_anchors.discard(anchor)

    def flatten_mapping(self, node: Any) -> None:
        """Refuse a key written twice in `node`, before its merge keys (`<<`, merged as in matrix.yaml) add theirs:
        once per node, as flattening a merged mapping adds keys that its own may override."""
        if not getattr(node, "keys_checked", False):
            node.keys_checked, seen = True, set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                if not isinstance(key, Hashable):   # construct_mapping refuses it, naming it
                    continue
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        super().flatten_mapping(node)


MAX_ROW_BYTES = 16 << 20    # a matrix file's limit (buildtool/matrix/yamlsource.py MAX_BYTES), far above any row


@functools.lru_cache(maxsize=64)
def _parse_row(text: str) -> Any:
    """A framework.yaml's data, parsed once per text: the table is read afresh from the files on every load,
    and a matrix is loaded several times in one command (and hundreds in the toolkit's tests); the same text
    parses to the same data (a text that does not parse raises, and is not remembered)."""
    return yaml.load(text, Loader=_StrictLoader)   # noqa: S506 - a SafeLoader


def _compiles(expr: str, what: str, where: str) -> None:
    try:
        compile(expr, where, "eval")
    except SyntaxError as exc:
        raise TableError(f"{where}: {what} {expr!r} is not a Python expression ({exc.msg})") from None


def _one_of(value: str, kinds: Collection[str], key: str, where: str, table: str) -> None:
    if value not in kinds:
        raise TableError(f"{where}: {key}: {value!r} is none of the known kinds ({', '.join(kinds)}); a new kind is "
                         f"an entry of {table}")


# Python's bytecode caches (a script run or imported from either scripts/ folder) are nothing load_row looks at.
NOT_INPUTS = frozenset({"__pycache__"})


def row_inputs(folder: Path) -> tuple[Path, ...]:
    """What load_row reads of a framework `folder` besides its framework.yaml's text: the folders whose entries
    (their names, and whether each is a file) its checks look at: the folder (test_*.py, template parts), its
    scripts/ (events writer, multinode script) and the common scripts/ (name clashes). A matrix snapshot is keyed
    by these (buildtool.matrix.snapshot): a check that looks anywhere else must name that place here
    (tests/test_framework_folder.py holds load_row to it)."""
    return (folder, folder / SCRIPTS, folder.parent / SCRIPTS)


def load_row(folder: Path) -> Framework:
    """The row in `folder`/framework.yaml, checked against the folder: its name is the folder's, its
    events writer and template parts are files there, its scripts shadow no common script."""
    path = folder / FRAMEWORK_FILE
    where = f"{folder.parent.name}/{folder.name}/{FRAMEWORK_FILE}"
    try:
        with path.open("rb") as handle:
            raw, size = handle.read(MAX_ROW_BYTES + 1), os.fstat(handle.fileno()).st_size
        if len(raw) > MAX_ROW_BYTES:
            raise TableError(f"{where}: is {max(size, len(raw)) / 2**20:.1f} MiB; a framework.yaml is at most "
                             f"{MAX_ROW_BYTES >> 20} MiB (remove generated content)")
        data = copy.deepcopy(_parse_row(raw.decode("utf-8")))
    except (OSError, UnicodeDecodeError) as exc:
        raise TableError(f"{where}: cannot read it ({exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        said = " ".join(str(getattr(exc, "problem", None) or exc).split())    # a reader's error has a newline
        raise TableError(f"{where}{line}: not valid YAML ({said})") from None
    if not isinstance(data, dict):
        raise TableError(f"{where}: must be a mapping of the framework's fields")
    from pydantic import ValidationError

    try:
        row: Any = _row_model().model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "(top)"
        msg = "required key is missing" if first["type"] == "missing" else first["msg"]
        raise TableError(f"{where}: {key}: {msg}") from None
    if row.name != folder.name:
        raise TableError(f"{where}: name {row.name!r} is not its folder's ({folder.name!r}); a framework's folder "
                         "is named after it")
    if not any(p.is_file() for p in folder.glob("test_*.py")):
        raise TableError(f"{where}: {folder.name}/ holds no test_*.py, so its image-tests group would collect no "
                         "test and every image of it would pass untested; add its tests there")
    _one_of(row.local_versions, SCHEMES, "local_versions", where, "buildtool/contracts/versions.py SCHEMES")
    _one_of(row.shm_workers, SHM_WORKERS, "shm_workers", where, "buildtool/contracts/frameworks.py SHM_WORKERS")
    if row.multinode is not None:
        _one_of(row.multinode.launcher, LAUNCHERS, "multinode.launcher", where,
                "buildtool/contracts/frameworks.py LAUNCHERS (its module in buildtool/launch/launchers/)")
    _compiles(row.gpu_count, "gpu_count", where)
    _compiles(row.cuda_build, "cuda_build", where)
    scripts = folder / SCRIPTS
    writer = row.events_writer[0]
    if not re.fullmatch(_SCRIPT, writer) or not (scripts / writer).is_file():
        raise TableError(f"{where}: events_writer {writer!r} is not a script in {folder.name}/{SCRIPTS}/")
    if row.multinode is not None and not (scripts / row.multinode.script).is_file():
        raise TableError(f"{where}: multinode.script {row.multinode.script!r} is not a script in "
                         f"{folder.name}/{SCRIPTS}/")
    for part in row.template_parts:
        if not (folder / part).is_file():
            raise TableError(f"{where}: template part {part!r} is not a file in {folder.name}/")
    common = folder.parent / SCRIPTS
    if scripts.is_dir() and common.is_dir():
        clash = sorted(p.name for p in scripts.iterdir() if p.name not in NOT_INPUTS and (common / p.name).exists())
        if clash:
            raise TableError(f"{where}: {folder.name}/{SCRIPTS}/ has {', '.join(clash)}, also in {SCRIPTS}/; both are "
                             "mounted at /imagetests, so rename the framework's")
    return Framework(
        name=row.name, title=row.title, module=row.module, distributions=row.distributions,
        gpu_count_expr=row.gpu_count, cuda_build_expr=row.cuda_build, events_writer=row.events_writer,
        shm_workers=row.shm_workers, local_versions=row.local_versions, container_version_env=row.ngc_version_env,
        template_parts=tuple(f"framework/{row.name}/{p}" for p in row.template_parts),
        multinode=(MultiNodeCheck(framework=row.name, script=row.multinode.script, launcher=row.multinode.launcher)
                   if row.multinode is not None else None),
        folder=folder.resolve())


def load_table(tests_dir: Path) -> dict[str, Framework]:
    """Every framework folder of `tests_dir` (a folder with a framework.yaml), by name."""
    try:
        folders = sorted(p for p in tests_dir.iterdir() if p.is_dir() and (p / FRAMEWORK_FILE).is_file())
    except OSError as exc:
        raise TableError(f"cannot list the framework folders of {tests_dir} ({exc})") from None
    return {row.name: row for row in map(load_row, folders)}


_TABLE: dict[str, Framework] = {}
_LOADED_FROM: list[Path] = []
_PENDING: list[Path] = []


def point_at(tests_dir: Path) -> None:
    """Read the table from `tests_dir` when it is first needed (a matrix from its snapshot)."""
    _PENDING[:] = [tests_dir.resolve()]
    _LOADED_FROM.clear()


def use(tests_dir: Path) -> None:
    """Make the frameworks of `tests_dir` the table (loading a matrix does this for its image-tests).
    Read afresh every time: a folder added or edited since is what counts."""
    resolved = tests_dir.resolve()
    table = load_table(resolved)
    _TABLE.clear()
    _TABLE.update(table)
    _LOADED_FROM[:] = [resolved]
    _PENDING.clear()


def use_checkout() -> None:
    """The table of this checkout's image-tests (what a matrix load beside it gives)."""
    if _LOADED_FROM != [DEFAULT_TESTS_DIR]:
        use(DEFAULT_TESTS_DIR)


def _table() -> dict[str, Framework]:
    if not _LOADED_FROM:
        use(_PENDING[0]) if _PENDING else use_checkout()
    return _TABLE


def names() -> tuple[str, ...]:
    return tuple(_table())


def get(name: str) -> Framework:
    try:
        return _table()[name]
    except KeyError:
        raise KeyError(f"unknown framework {name!r}; known: {', '.join(_table())}") from None


def test_groups() -> tuple[str, ...]:
    """Every image-tests group a cell may list: common and each framework's (named after it)."""
    return (COMMON_GROUP, *_table())


def others(name: str) -> tuple[Framework, ...]:
    """The frameworks a cross-framework check pairs `name` with."""
    return tuple(f for f in _table().values() if f.name != name)
