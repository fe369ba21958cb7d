"""The grammar of every command-line argument, one table, checked before anything outside the process is called
(issue 37: "every command checks every argument ... before it calls the registry, the engine or anything else").

`ARGUMENTS[command][parameter] = (flag, grammar)`: every parameter of every `buildtool` subcommand (the
parameter's Python name, the flag or metavar a message names, and what its values must be). A command's first
statement is `check_arguments("<command>", locals())`; it checks every given value (None, an option left out,
is not checked) and raises UserError (exit 2) with one line naming the flag, the value shown as `refs.shown`
does (cut, escaped; a reference with credentials never echoed). tests/test_cli_args_first.py walks the click
command tree and fails for a parameter missing here, and feeds each one hostile values.

The grammars are `(flag, value)` checks raising that UserError (a value a grammar accepts may still be refused
later, by what it means: a cell the matrix lacks). Most are a regular expression over ASCII with the words its
refusal names (`_word`), a range (count, seconds) or a few words (choice); the others parse with the module that
owns the format (names.check_revision, packaging's Version, sizes.parse_size, skips.parse_waiver, ...). Besides:
- FLAG: an on/off flag; it carries no value, nothing to check.
- REFERENCE: an image reference (refs.parse_reference: at most 512 characters, no credentials, no whitespace);
  IMAGE_OR_FILE also takes an absolute path (a .sif or bundle folder on the cluster's shared file system, maybe not
  on this machine: its text only); a relative one (`./x.sif`) is refused, as the launchers take only `/...` for a
  path and would have read it as a reference.
- TEXT: free text (a pytest -k expression, a regular expression): at most 512 characters, no control or format
  character.
- path kinds: FILE (exists, a file), DIR (exists, a folder), OUT_FILE (not a folder), OUT_DIR (not a file),
  PATH (the text only: a path on another machine, a program, the matrix whose loader says what is wrong with it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from buildtool.common import argcheck
from buildtool.common.errors import UserError
from buildtool.common.refs import shown
from buildtool.contracts import busbw

Grammar = Callable[[str, Any], object]


def _re(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern + r"\Z")


def _word(pattern: str, what: str, *, empty: bool = False) -> Grammar:
    compiled = _re(pattern)
    return lambda option, value: argcheck.word(option, value, compiled, what, empty=empty)


def _each(grammar: Grammar) -> Grammar:
    return lambda option, values: [grammar(option, v) for v in values]


def count(lo: int, hi: int) -> Grammar:
    return lambda option, value: argcheck.count(option, value, lo, hi)


def seconds(lo: float, hi: float) -> Grammar:
    return lambda option, value: argcheck.seconds(option, value, lo, hi)


def choice(*values: str) -> Grammar:
    return lambda option, value: argcheck.choice(option, value, values)


def _path(kind: str) -> Grammar:
    return lambda option, value: argcheck.path(option, value, kind)


def _sif_or_reference(option: str, value: str) -> object:
    if value.startswith("/"):   # a path on the cluster's shared file system: maybe not on this machine
        return argcheck.path(option, value, "any")
    if value.startswith("."):   # the launchers read anything but `/...` as an image reference
        argcheck.plain(option, value, argcheck.PATH_MAX)
        raise UserError(f"{option}: {shown(value)} is a relative path; name the .sif file or bundle folder by its "
                        "absolute path on the cluster (e.g. /shared/images/pytorch.sif)")
    return argcheck.reference(option, value)


def _optional_sif_or_reference(option: str, value: str) -> object:
    return value if value == "" else _sif_or_reference(option, value)


def _parsed(option: str, value: str, parse: Callable[[str], object], refusal: str,
            limit: int = argcheck.TEXT_MAX) -> object:
    """Plain text of at most `limit` characters that `parse` reads; its ValueError is the UserError `refusal`
    (a format of `option`, the `value` shown, the `exc` it raised)."""
    argcheck.plain(option, value, limit)
    try:
        return parse(value)
    except ValueError as exc:
        raise UserError(refusal.format(option=option, value=shown(value), exc=exc)) from None


def _revision(option: str, value: str) -> object:
    from buildtool.contracts.names import check_revision

    return _parsed(option, value, check_revision, "{option}: {value} cannot be part of an image tag (letters, "
                   "digits, '.', '_', '-'; no '__')", 128)


def _version(option: str, value: str) -> object:
    from packaging.version import Version  # its InvalidVersion is a ValueError

    return _parsed(option, value, Version, "{option} {value} is not a version like 0.1.0", 64)


def _platform(option: str, value: str) -> object:
    from buildtool.contracts import platforms

    if value not in platforms.KNOWN:
        raise UserError(f"{option}: unknown platform {shown(value)}; one of {', '.join(platforms.KNOWN)}")
    return value


def _platforms(option: str, value: str) -> object:
    return [_platform(option, part.strip()) for part in value.split(",") if part.strip()] or _platform(option, value)


def _tsa_url(option: str, value: str) -> object:
    """A timestamp authority's http(s) URL, without credentials (common.tsa)."""
    from buildtool.common.tsa import url_problem
    from buildtool.common.urls import shown_url

    problem = url_problem(value) if len(value) <= 512 else "is longer than 512 characters"
    if problem:
        raise UserError(f"{option}: {shown(shown_url(value))} {problem}")
    return value


def _size(option: str, value: str) -> object:
    from buildtool.common.sizes import parse_size

    return _parsed(option, value, parse_size, "{option}: {value} is not a size like 8g, 512m or 1048576", 64)


def _shm_size(option: str, value: str) -> object:
    """A /dev/shm size: a size (refused as _size refuses it), above 0 and not past any memory (sizes.shm_bytes, the
    matrix's rule for run.shm_size less its floor for the image checks)."""
    from buildtool.common.sizes import shm_bytes

    _size(option, value)
    return _parsed(option, value, shm_bytes, "{option}: {exc}", 64)


def _skip_waiver(option: str, value: str) -> object:
    from buildtool.contracts import skips

    return _parsed(option, value, skips.parse_waiver, "{option} {value}: {exc}")


def _counts(lo: int, hi: int, *words: str) -> Grammar:
    return lambda option, value: argcheck.count_list(option, value, lo, hi, words)


def _strategies(option: str, value: str) -> object:
    """A comma list of the strategies contracts.strategies names (`ddp,fsdp`), each known."""
    from buildtool.contracts.strategies import parse_strategies

    argcheck.plain(option, value)
    return parse_strategies(value)


def _fraction(option: str, value: float) -> object:
    import math

    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise UserError(f"{option} must be a fraction from 0 to 1, not {value}")
    return value


FLAG: Grammar = lambda option, value: value   # noqa: E731 - a flag carries no value
TEXT: Grammar = lambda option, value: argcheck.plain(option, value)  # noqa: E731
REFERENCE: Grammar = argcheck.reference
PATH, FILE, DIR, OUT_FILE, OUT_DIR = (_path(k) for k in ("any", "file", "dir", "out-file", "out-dir"))
NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?"
# The matrix says which selectors exist (read here: no call out); the grammar keeps out what no name has.
SELECTORS = _word(r"[A-Za-z0-9_.:,+-]{1,512}", "an image, a cell (image:version), a framework or all (comma list)")


def _selector(option: str, value: str) -> object:
    """One image, cell, framework or all, as the README says FRAMEWORK is: only release takes a comma list
    (release_run._cells); elsewhere `a,b` was refused as one unknown name, naming the list."""
    if "," in value:
        raise UserError(f"{option} {shown(value)}: this command takes one image, cell, framework or all, not a comma "
                        "list (only release takes several); run it once for each")
    return SELECTORS(option, value)


SELECTOR: Grammar = _selector
FRAMEWORK_NAME = _word(r"[a-z0-9](?:[a-z0-9_-]{0,62}[a-z0-9])?", "a framework name (a folder image-tests/<name>/)")
_DNS_LABEL_RE, _DNS_LABEL_WHAT = (r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?", "a Kubernetes name (at most 63 lower-case "
                                  "letters, digits, '-', alphanumeric at both ends)")
DNS_LABEL = _word(_DNS_LABEL_RE, _DNS_LABEL_WHAT, empty=True)   # --namespace '': the kubectl context's
K8S_NAME = _word(_DNS_LABEL_RE, _DNS_LABEL_WHAT)   # --name names every object: never empty
QUANTITY = _word(r"[0-9]{1,12}(?:\.[0-9]{1,6})?(?:m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?",
                 "a Kubernetes quantity (e.g. 16, 500m, 64Gi)", empty=True)
TOLERATION = _word(r"(?:[a-z0-9.-]{1,253}/)?[A-Za-z0-9._-]{1,63}(?:=[A-Za-z0-9._-]{0,63})?"
                   r":(?:NoSchedule|PreferNoSchedule|NoExecute)", "KEY[=VALUE]:EFFECT (e.g. nvidia.com/gpu:NoSchedule)")
_RESOURCE_NAME = _re(r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


def _rdma_resource(option: str, item: str) -> object:
    """NAME[=COUNT]: an extended resource name (label-key grammar), COUNT from 1 to 9999."""
    argcheck.plain(option, item)
    name, sep, number = item.partition("=")
    if not _RESOURCE_NAME.match(name):
        raise UserError(f"{option} {shown(item)} is not a resource name ([prefix/]name, e.g. rdma/ib_device)")
    if sep and not re.match(r"^[1-9][0-9]{0,3}\Z", number):
        raise UserError(f"{option} {shown(item)}: COUNT must be a positive whole number (at most 9999)")
    return item


def _efa_resource(option: str, item: str) -> object:
    """NAME=COUNT: the COUNT is how many EFA devices a node has (the bus-bandwidth floor), never a default of 1."""
    _rdma_resource(option, item)
    if "=" not in item:
        raise UserError(f"{option} {shown(item)} names no COUNT: give NAME=COUNT, the EFA devices of a node "
                        "(e.g. vpc.amazonaws.com/efa=32)")
    return item


# An NCCL_* value as NCCL reads it, literally: numbers, interface lists, paths, and free text with spaces and `;`
# (NCCL_NET="AWS Libfabric", aws-ofi-nccl's plugin name; NCCL_ALGO="allreduce:tree;broadcast:ring"). Printable
# ASCII; no `$`: NCCL expands nothing, and Kubernetes would read `$(NAME)` in a pod's env as a reference.
NCCL_VALUE = _re(r"[ -#%-~]{1,256}")
NCCL_VALUE_WHAT = "printable ASCII, spaces allowed, no '$' (NCCL takes it literally); at most 256 characters"


def _nccl_env(option: str, item: str) -> object:
    """NCCL_NAME=VALUE (launch.multinode.NcclSettings carries the value into the job unchanged)."""
    argcheck.plain(option, item)
    name, sep, value = item.partition("=")
    if not sep:
        raise UserError(f"{option} {shown(item)} is not NAME=VALUE")
    if not re.match(r"^NCCL_[A-Z0-9_]{1,64}\Z", name):
        raise UserError(f"{option} {shown(item)}: the name must be an NCCL_* variable")
    if value and not NCCL_VALUE.match(value):
        raise UserError(f"{option} {shown(item)}: the value of {name} is not {NCCL_VALUE_WHAT}")
    return item


def _cpus_per_task(option: str, value: int) -> object:
    if value < 0:
        raise UserError(f"{option} must be 0 (the partition's default) or more, not {value}")
    return argcheck.count(option, value, 0, 4096)


NCCL_LIST = _word(r"\^?=?[A-Za-z0-9_.:-]{1,64}(?:,[A-Za-z0-9_.:-]{1,64}){0,31}",
                  "a comma list of interfaces or devices (e.g. ^lo,docker or mlx5_0:1)", empty=True)
ULIMIT = _word(r"[a-z]{1,16}=(?:-1|unlimited|[0-9]{1,19})(?::(?:-1|unlimited|[0-9]{1,19}))?",
               "NAME=SOFT[:HARD] (e.g. memlock=-1)")
SLURM_WORD = _word(r"[A-Za-z0-9_.-]{1,64}", "a SLURM name (letters, digits, '_', '.', '-')", empty=True)
SLURM_JOB_NAME = _word(r"[A-Za-z0-9_.-]{1,64}", "a SLURM job name (letters, digits, '_', '.', '-')")   # never ''
# sbatch --constraint: features joined by & (and), | (or), with counts [gh200*2] (SLURM's sbatch manual).
SLURM_CONSTRAINT = _word(r"[A-Za-z0-9_.&|*\[\]-]{1,128}", "SLURM node features (letters, digits, '_', '.', '-', "
                         "joined by & or |)", empty=True)
SLURM_TIME = _word(r"(?:[0-9]{1,3}-)?[0-9]{1,4}(?::[0-9]{2}){0,2}", "a SLURM time limit ([D-]HH:MM:SS or MM)")
KEY_NAME = _word(NAME, "a key name (letters, digits, '.', '_', '-'; at most 128)")
# lock --package names Python distributions (what uv resolves): PEP 508 names, one or a comma list.
PYTHON_PACKAGES = _word(rf"{NAME}(?:,{NAME}){{0,63}}", "a Python package name (PEP 508: letters, digits, '.', "
                        "'_', '-'; a comma list for several)")
MIRROR = _word(r"[A-Za-z0-9.-]{1,253}(?::[0-9]{1,5})?(?:/[a-z0-9._-]{1,128}){0,8}",
               "a registry host[:port][/path] (e.g. 127.0.0.1:5000)")
# plan names a release whose tag is no Docker tag itself (it has the matrix's tag templates).
TAG_TEMPLATE = _word(r"[!-~]{1,128}", "a release (printable ASCII, no space; at most 128)")
_PEER_FRAMEWORK = _re(r"[a-z0-9][a-z0-9_-]{0,62}")


def _peer(option: str, value: str) -> object:
    """FRAMEWORK=IMAGE, the IMAGE an image reference (refs.parse_reference: no credentials, no shell text)."""
    argcheck.plain(option, value)
    framework, sep, image = value.partition("=")
    if not sep or not _PEER_FRAMEWORK.match(framework):
        raise UserError(f"{option} {shown(value)} is not framework=IMAGE")
    return argcheck.reference(option, image)


PEER: Grammar = _peer
CRON = _word(r"[0-9*/,-]{1,64}(?: [0-9*/,-]{1,64}){4}", "a cron schedule of five fields (e.g. 17 2 * * *)")
LABEL_LIST = _word(r"[A-Za-z0-9_.-]{1,64}(?:,[A-Za-z0-9_.-]{1,64}){0,31}", "a comma list of runner labels")
GIT_REF = _word(r"(?!.*\.\.)(?!.*//)[A-Za-z0-9][A-Za-z0-9._/+-]{0,254}",
                "a git commit, branch or tag (letters, digits, '.', '_', '/', '+', '-')")
CELL = _word(r"[A-Za-z0-9_.-]{1,128}:[A-Za-z0-9_.+-]{1,128}", "a cell (image:version)", empty=True)
_CELL_LIST = _re(r"[A-Za-z0-9_.:,+-]*")


def _cell_list(option: str, value: str) -> object:
    """`workflows ci-matrix --cells`: the plan job's list of every cell of its workflow, past one selector's 512
    characters once a matrix has some 20 cells (an empty item is ci-matrix's to refuse)."""
    argcheck.plain(option, value, limit=65_536)
    if not _CELL_LIST.match(value):
        raise UserError(f"{option} {shown(value)} is not a comma list of cells (image:version)")
    return value


IMAGE_OR_FILE: Grammar = _sif_or_reference

MATRIX = ("--matrix", PATH)   # the text; the loader names a missing file, a folder, a pipe (read here, no call out)
REV = ("--revision", _revision)
JSON = ("--json", FLAG)
_NCCL = {"nccl_debug": ("--nccl-debug", choice("", "VERSION", "WARN", "INFO", "TRACE")),
         "nccl_socket_ifname": ("--nccl-socket-ifname", NCCL_LIST), "nccl_ib_hca": ("--nccl-ib-hca", NCCL_LIST),
         "nccl_env": ("--nccl-env", _each(_nccl_env))}
# The fabric a GPU job across nodes must run on (launch.multinode.MultiNodeJob; the rates: contracts.busbw).
_FABRIC = {"fabric_rate": ("--fabric-rate", choice("", *busbw.LINK_RATES)),
           "fabric_nics": ("--fabric-nics", count(0, 64)), "require_gdr": ("--require-gdr", FLAG)}
_RUN = {"join_timeout": ("--join-timeout", count(1, 86_400)), "rdzv_port": ("--rdzv-port", count(1, 65_535)),
        "max_restarts": ("--max-restarts", count(0, 100)), "steps": ("--steps", count(3, 1_000_000)),
        "framework": ("--framework", FRAMEWORK_NAME), "out_file": ("--out", OUT_FILE),
        "shm_size": ("--shm-size", _shm_size),
        "nodes": ("--nodes", count(1, 10_000)), "gpus_per_node": ("--gpus-per-node", count(0, 64)), "matrix": MATRIX}

@dataclass(frozen=True)
class Option:
    """One command-line option, declared once: its flags, the parameter it fills, how it is given (`value`,
    `append`: repeatable, `flag`), the environment variable it defaults from, its help, and its grammar. The
    typer command (buildtool.cli.release) and the fast parser (buildtool.cli.release_run) are both made from it."""

    flags: tuple[str, ...]
    dest: str
    kind: str
    grammar: Grammar
    help: str = ""
    envvar: str | None = None
    required: bool = False


# `buildtool release`: parsed without typer on its fast path (start-up time), and with typer for --help.
RELEASE_OPTIONS: tuple[Option, ...] = (
    Option(("--version",), "version", "value", _version, "Release version, e.g. 0.1.0 (tags <version>-<release>).",
           envvar="VERSION", required=True),
    Option(("--from", "--revision"), "from_sha", "value", GIT_REF,
           "Git sha (or the revision given to `build --revision`) whose dev images to promote (default: HEAD, as "
           "`buildtool build` names it).", envvar="REVISION"),
    Option(("--framework", "-f"), "framework", "append", _each(SELECTORS),
           "An image, a cell, a framework or all (repeatable, or comma list)."),
    Option(("--dry-run",), "dry_run", "flag", FLAG, "Check gates and show the tag plan; write nothing."),
    Option(("--force",), "force", "flag", FLAG,
           "Move the matrix's moving tags (e.g. latest) even to an older release. Never moves version tags."),
    Option(("--accept-skip",), "accept_skip", "append", _each(_skip_waiver),
           "Accept skipped tests of this skip code (CODE, or CODE:SUBJECT for one subject, e.g. "
           "ulimit-not-granted:memlock) although the matrix expects them to run; only codes marked waivable (a "
           "runner's limits). Recorded as a waiver in the release notes. Never covers GPU tests of GPU images."),
    Option(("--trust-local-key",), "trust_local_key", "flag", FLAG,
           "Also trust verdicts signed by this machine's local dev key (made by validate when DL_IMAGES_SIGNING_KEY "
           "is unset); only for a loopback registry, never for real releases."),
    Option(("--json",), "as_json", "flag", FLAG, "Print JSON for machines instead of a table."),
    Option(("--matrix",), "matrix", "value", MATRIX[1],
           "The version matrix (default: matrix.yaml at the project root)."),
)

ARGUMENTS: dict[str, dict[str, tuple[str, Grammar]]] = {
    "bases": {"framework": ("--framework", SELECTOR), "force": ("--force", FLAG), "mirror": ("--mirror", MIRROR),
              "matrix": MATRIX},
    "build": {"framework": ("--framework", SELECTOR), "push": ("--push", FLAG), "force": ("--force", FLAG),
              "jobs": ("--jobs", count(1, 64)), "fill": ("--fill-bases", FLAG), "log_dir": ("--log-dir", OUT_DIR),
              "registry_cache": ("--registry-cache", FLAG),
              "push_with": ("--push-with", choice("auto", "engine", "skopeo")),
              "platform": ("--platform", _each(_platforms)), "tsa": ("--tsa", _tsa_url), "revision": REV,
              "as_json": JSON, "matrix": MATRIX},
    "bundle": {"image": ("IMAGE", REFERENCE), "dest": ("DEST", OUT_DIR), "shm_size": ("--shm-size", _shm_size),
               "ulimit": ("--ulimit", _each(ULIMIT)), "hosts": ("--hosts", FILE), "jobs_dir": ("--jobs-dir", PATH),
               "writable": ("--writable", FLAG), "force": ("--force", FLAG), "platform": ("--platform", _platform),
               "json_out": JSON, "matrix": MATRIX},
    "catalogue": {"matrix": MATRIX},
    "check": {"matrix": MATRIX, "offline": ("--offline", FLAG)},
    "diff": {"image_a": ("IMAGE_A", REFERENCE), "image_b": ("IMAGE_B", REFERENCE), "as_json": JSON,
             "probe_timeout": ("--probe-timeout", count(1, 86_400))},
    "k8s": {"image": ("IMAGE", REFERENCE), **_RUN, **_NCCL, **_FABRIC,
            "variant": ("--variant", choice("", "pytorchjob", "job")), "name": ("--name", K8S_NAME),
            "namespace": ("--namespace", DNS_LABEL), "backoff_limit": ("--backoff-limit", count(0, 100)),
            "cpu": ("--cpu", QUANTITY), "memory": ("--memory", QUANTITY),
            "node_selector": ("--node-selector", argcheck.node_selectors),
            "toleration": ("--toleration", _each(TOLERATION)), "gpu_resource": ("--gpu-resource", argcheck.label_key),
            "deadline": ("--deadline", count(1, 30 * 86_400)),
            "rdma_resource": ("--rdma-resource", _each(_rdma_resource)), "ipc_lock": ("--ipc-lock", FLAG),
            "efa_resource": ("--efa-resource", _efa_resource),
            "platform": ("--platform", _platform)},
    "keys": {"name": ("--name", KEY_NAME), "out_dir": ("--out", OUT_DIR),
             "role": ("--role", _each(choice("builder", "tester"))), "dev": ("--dev", FLAG)},
    "lock": {"framework": ("--framework", SELECTOR), "package": ("--package", _each(PYTHON_PACKAGES)),
             "matrix": MATRIX},
    "plan": {"framework": ("--framework", SELECTOR), "as_json": JSON, "release": ("--release", TAG_TEMPLATE),
             "revision": REV, "matrix": MATRIX},
    "release": {o.dest: (o.flags[0], o.grammar) for o in RELEASE_OPTIONS},
    "render": {"matrix": MATRIX, "prune_stale": ("--prune", FLAG)},
    "report": {"verdicts": ("--verdicts", PATH), "previous": ("--previous", DIR), "fetch": ("--fetch", FLAG),
               "framework": ("--framework", SELECTOR), "revision": REV, "scaling": ("--scaling", _each(DIR)),
               "out_dir": ("--out", OUT_DIR), "matrix": MATRIX},
    "sbom": {"image": ("IMAGE", REFERENCE)},
    "scaling": {"counts": ("--counts", _counts(1, 4096, "gpus")), "image": ("--image", _optional_sif_or_reference),
                "cell": ("--cell", CELL),
                "launcher": ("--launcher", choice("auto", "docker", "host", "slurm")), "python": ("--python", PATH),
                "samples": ("--samples", count(1, 1_000_000_000)), "epochs": ("--epochs", count(1, 10_000)),
                "batch": ("--batch", count(1, 1_000_000)), "unit": ("--unit", choice("processes", "gpus")),
                "timeout": ("--timeout", count(1, 7 * 86_400)), "nodes": ("--nodes", _counts(1, 10_000)),
                "runtime": ("--runtime", choice("apptainer", "pyxis", "oci")), "gpus_per_node": _RUN["gpus_per_node"],
                "partition": ("--partition", SLURM_WORD), "account": ("--account", SLURM_WORD),
                "time_limit": ("--time", SLURM_TIME), "shm_size": _RUN["shm_size"], "rdzv_port": _RUN["rdzv_port"],
                "out_dir": ("--out", OUT_DIR), "strategy": ("--strategy", _strategies),
                "min_efficiency": ("--min-efficiency", _fraction), "revision": REV, "matrix": MATRIX},
    "slurm": {"image": ("IMAGE", IMAGE_OR_FILE), **_RUN, **_NCCL, **_FABRIC,
              "runtime": ("--runtime", choice("apptainer", "pyxis", "oci")), "name": ("--name", SLURM_JOB_NAME),
              "partition": ("--partition", SLURM_WORD), "account": ("--account", SLURM_WORD),
              "constraint": ("--constraint", SLURM_CONSTRAINT),
              "time_limit": ("--time", SLURM_TIME), "cpus_per_task": ("--cpus-per-task", _cpus_per_task),
              "scripts_dir": ("--scripts-dir", PATH)},
    "validate": {"images": ("IMAGES", _each(REFERENCE)), "framework": ("--framework", SELECTOR),
                 "all_cells": ("--all", FLAG), "store": ("--store", FLAG), "select": ("-k", TEXT),
                 "peer": ("--peer", _each(PEER)), "cell": ("--cell", SELECTOR),
                 "rdzv_join_timeout": ("--rdzv-join-timeout", seconds(1, 86_400)),
                 "deadline": ("--deadline", seconds(1, 30 * 86_400)), "reports": ("--reports", OUT_DIR),
                 "require_gpu": ("--require-gpu", FLAG), "baseline": ("--baseline", _each(DIR)),
                 "busbw_window": ("--busbw-window", count(1, 365)), "jobs": ("--jobs", count(1, 64)),
                 "platform": ("--platform", _each(_platforms)), "extra_tests": ("--extra-tests", DIR),
                 "rerun": ("--rerun", FLAG), "tsa": ("--tsa", _tsa_url), "revision": REV, "as_json": JSON,
                 "matrix": MATRIX},
    "verify": {"image": ("IMAGE", REFERENCE), "trust_local_key": ("--trust-local-key", FLAG),
               "keys": ("--keys", FILE), "accept_skip": ("--accept-skip", _each(_skip_waiver)), "as_json": JSON,
               "matrix": MATRIX},
    "workflows ci-matrix": {"plan": ("--plan", FILE), "cells": ("--cells", _cell_list)},
    "workflows write": {"gpu_labels": ("--gpu-labels", LABEL_LIST), "cron": ("--cron", CRON),
                        "out_dir": ("--out", OUT_DIR), "matrix": MATRIX},
}


def check_argument(command: str, parameter: str, value: Any) -> None:
    """One value of one parameter; None (left out) is not checked."""
    flag, grammar = ARGUMENTS[command][parameter]
    if value is not None:
        grammar(flag, value)


def check_arguments(command: str, values: Mapping[str, Any]) -> None:
    """Every parameter of `command` (its function's `locals()` at its first line), in the order the table has
    them. A name the table does not have is not checked here (tests/test_cli_args_first.py fails for a
    parameter of the click command tree missing from the table)."""
    table = ARGUMENTS[command]
    for parameter in table:
        if parameter in values:
            check_argument(command, parameter, values[parameter])
