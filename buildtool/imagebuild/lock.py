"""`buildtool lock`: per-cell locks of everything a cell installs on top of its base (docs/contents.md, Locks).

One `uv pip compile` resolution per platform, written by uv as `pylock.framework.toml` and `pylock.tools.toml`
(PEP 751; buildtool.contracts.locks). NGC cells have no framework lock: what their base has (asked in one
throw-away container) constrains the resolution and is left out of the lock, so torch and the CUDA stack are never
replaced. Each file fingerprints the matrix values it came from, so `buildtool check` finds a stale lock offline.
Unreachable remote indexes are left out with a note: the hashes decide what may be installed, an index only where
it is downloaded from.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from buildtool.common.errors import FailedError, UserError
from buildtool.common.files import write_changed
from buildtool.contracts import frameworks, platforms
from buildtool.contracts import versions as version_rules
from buildtool.contracts.image_labels import LabelError, standin_flag
from buildtool.contracts.locks import (
    FRAMEWORK_LOCK,
    LOCK_FILES,
    TOOL,
    TOOLS_LOCK,
    UV_LOCK,
    LockFile,
    exact_pins,
    marker_environment,
    normalize,
    parse_lock,
    platform_folder,
    preferences,
    uv_requirement,
)
from buildtool.imagebuild.cell_inputs import scrub, secret_strings
from buildtool.imagebuild.pipconfig import UV_INDEX_ENV, UV_LOCATION_ENV, HostPip, answers, redact, uv_index_env
from buildtool.matrix.schema import Cell

LOCK_FORMAT = 2   # 2: PEP 751 pylock.toml (1: uv's requirements output)
# The files a lock lists: every wheel of the resolved versions up to the newest glibc uv names (manylinux_2_40),
# so the install picks what its base's glibc allows (xprof 2.21.6 on aarch64 has only a manylinux_2_35 wheel
# besides a py-none-any one that carries a Windows .pyd: a lock of 2_28 files alone installs that one).
NEWEST_MANYLINUX = "manylinux_2_40"
UV_TIMEOUT = 600

Log = Callable[[str], None]


# -- what a cell locks ------------------------------------------------------------------------

def is_ngc(cell: Cell) -> bool:
    """Cells whose base brings Python and the framework (NGC and its stand-ins)."""
    return not cell.framework_requirements


def framework_requirements(cell: Cell) -> list[str]:
    return list(cell.framework_requirements)


def tool_requirements(cell: Cell) -> list[str]:
    """The matrix's tool pins, plus pip on cells that make their own venv (so pip is locked too)."""
    reqs = [f"{name}=={version}" for name, version in cell.packages]
    if not is_ngc(cell):
        reqs.append("pip")
    return reqs


def requirement_lines(reqs: list[str]) -> str:
    """The requirements file uv reads, one requirement a line. The matrix schema admits only
    PEP 508 requirements; a value that got past it with a line break or a leading '-' would
    add lines or options of its own choosing here, so it is refused again."""
    for req in reqs:
        if not req.strip() or req.lstrip().startswith("-") or any(c in req for c in "\r\n\x00"):
            raise UserError(f"requirement {req!r} is not one PEP 508 requirement; fix it in matrix.yaml")
    return "\n".join(reqs) + "\n"


def cell_platform(cell: Cell, platform: str | None) -> platforms.Platform:
    """The platform of `cell` whose locks are meant (None: its only one; refused on a multi-platform cell)."""
    return platform_folder(Path(cell.dockerfile).parent, cell.key, cell.platforms, platform)[0]


def fingerprint(cell: Cell, part: str = TOOLS_LOCK, platform: str | None = None) -> str:
    """What a lock file depends on in the matrix: a change here makes it stale. The tools lock
    comes from the whole resolution; the framework lock only from the framework's inputs, so a
    tool bump that leaves the framework's closure alone leaves pylock.framework.toml byte-identical.
    The platform is its wheel platform, so a lock of one platform is stale in another's folder."""
    data = {
        "format": LOCK_FORMAT,
        "framework": framework_requirements(cell),
        "tools": tool_requirements(cell) if part == TOOLS_LOCK else None,
        "python": cell.python,
        "platform": cell_platform(cell, platform).wheel_platform,
        "base": cell.base,
        "index_url": cell.index_url,
        "extra_index_urls": list(cell.extra_index_urls),
    }
    return "sha256:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def lock_paths(root: Path, cell: Cell, platform: str | None = None) -> dict[str, Path]:
    """The cell's lock files of `platform` (None: its only platform; refused on a multi-platform cell)."""
    folder = platform_folder((root / cell.dockerfile).parent, cell.key, cell.platforms, platform)[1]
    names = (TOOLS_LOCK,) if is_ngc(cell) else LOCK_FILES
    return {name: folder / name for name in names}


def read_locks(root: Path, cell: Cell, platform: str | None = None) -> dict[str, LockFile]:
    """The committed locks of a cell for `platform` (None: its only platform; refused on a multi-platform
    cell); UserError naming the file when one is missing, broken or made for another platform."""
    wheel_platform = cell_platform(cell, platform).wheel_platform
    found = {}
    for name, path in lock_paths(root, cell, platform).items():
        rel = path.relative_to(root)
        if not path.is_file():
            raise UserError(f"{rel} is missing; run `make lock FRAMEWORK={cell.key}`")
        try:
            found[name] = parse_lock(path.read_text())
        except ValueError as exc:
            raise UserError(f"{rel}: {exc}; run `make lock FRAMEWORK={cell.key}`") from None
        named = found[name].platform
        if named != wheel_platform:
            raise UserError(f"{rel} is a lock for {named or 'no named platform'}, not {wheel_platform}; "
                            f"run `make lock FRAMEWORK={cell.key}`")
        # PEP 751: uv skips an entry whose marker is false; read as installed, it would be in the labels and the check.
        if skipped := found[name].skipped(cell_platform(cell, platform), cell.python):
            raise UserError(f"{rel}: {skipped}; run `make lock FRAMEWORK={cell.key}`")
    return found


def locked_versions(root: Path, cell: Cell, platform: str | None = None) -> dict[str, str]:
    """name -> version of every package the cell's locks of `platform` install."""
    merged = {n: v for lock in read_locks(root, cell, platform).values() for n, v in lock.versions().items()}
    return dict(sorted(merged.items()))


def check_cell(root: Path, cell: Cell) -> list[str]:
    """Problems with a cell's committed locks, every platform's (empty: up to date and consistent)."""
    return [problem for platform in cell.platforms for problem in _check_platform(root, cell, platform)]


def _check_platform(root: Path, cell: Cell, platform: str) -> list[str]:
    try:
        locks = read_locks(root, cell, platform)
    except UserError as exc:
        return [str(exc)]
    paths = lock_paths(root, cell, platform)
    problems = [f"{paths[name].relative_to(root)} is stale (matrix inputs changed); "
                f"run `make lock FRAMEWORK={cell.key}`"
                for name, lock in locks.items() if lock.inputs != fingerprint(cell, name, platform)]
    if FRAMEWORK_LOCK in locks:
        overlap = set(locks[FRAMEWORK_LOCK].entries) & set(locks[TOOLS_LOCK].entries)
        if overlap:
            problems.append(f"{cell.key}: {', '.join(sorted(overlap))} in both lock files")
    versions = {n: v for lock in locks.values() for n, v in lock.versions().items()}
    if not is_ngc(cell):
        problems += build_problems(cell, versions)
    # A requirement whose marker is false on this lock's platform and python is one uv left out of it.
    python = locks[TOOLS_LOCK].python or cell.python
    environment = marker_environment(platforms.get(platform), python)
    for text in framework_requirements(cell) + tool_requirements(cell):
        req = requirement(text)
        if req.marker is not None and not req.marker.evaluate(environment):
            continue
        have = versions.get(normalize(req.name))
        if have is None:
            problems.append(f"{cell.key}: the lock has no {req.name}; run `make lock FRAMEWORK={cell.key}`")
        elif not _satisfies(req, have):
            problems.append(f"{cell.key}: the matrix pins {text} but the lock has {have}; "
                            f"run `make lock FRAMEWORK={cell.key}`")
    return problems


def requirement(text: str) -> Requirement:
    """A matrix requirement as pip and uv read it (packaging, as the matrix checked it): `jax[cpu]>=0.10` names
    the distribution jax."""
    try:
        return Requirement(text)
    except InvalidRequirement as exc:   # the matrix refuses these: a cell made some other way
        raise UserError(f"{text!r} is not a PEP 508 requirement ({str(exc).splitlines()[0]})") from None


def _satisfies(req: Requirement, have: str) -> bool:
    """Whether the locked version `have` is what `req` asks for: in its range, and for an exact pin (`==V`,
    `===V`) V as written (`==2.13.0` also admits a local build 2.13.0+cpu, which is another wheel)."""
    exact = [s.version for s in req.specifier if s.operator in ("==", "===") and not s.version.endswith(".*")]
    return all(have == v for v in exact) and req.specifier.contains(have, prereleases=True)


# CUDA runtime wheels: `nvidia-cuda-runtime` (CUDA 13 on) or `nvidia-cuda-runtime-cu12`; their version starts
# with the CUDA release they are (13.0.96 is CUDA 13.0).
_CUDA_RUNTIME = re.compile(r"^nvidia-cuda-runtime(?:-cu[0-9]+)?\Z")


def build_problems(cell: Cell, versions: dict[str, str]) -> list[str]:
    """Whether the locked framework is the build the matrix promises (contracts.versions): `+cpu` on a
    CPU cell, `+cu130` on a CUDA 13.0 one. A version without a local part where one is promised is
    accepted only as PyPI's CUDA wheel (PyPI refuses local versions, so its torch 2.13.0 is a plain
    `2.13.0` that reports `+cu130` inside), and only when the lock's CUDA runtime wheel is the cell's CUDA."""
    framework = frameworks.get(cell.framework)
    try:
        rule = version_rules.expectation(cell.framework_version, scheme=framework.local_versions,
                                         accelerator=cell.accelerator, cuda=cell.cuda, ngc=None)
    except ValueError as exc:
        return [f"{cell.key}: {exc}"]
    problems = []
    for dist in framework.distributions:
        have = versions.get(normalize(dist))
        if have is None:
            continue  # not installed by this cell (tensorflow-cpu, not tensorflow); a missing pin is named below
        local = version_rules.split(have)[1]
        if re.fullmatch(rule.local_pattern, local):
            continue
        fix = f"run `make lock FRAMEWORK={cell.key}` against an index that has that build"
        if local:
            problems.append(f"{cell.key}: the lock has {dist} {have}, not the cell's {rule.local_text}; {fix}")
            continue
        runtimes = {v for n, v in versions.items() if _CUDA_RUNTIME.match(n)}
        cuda = {".".join(v.split(".")[:2]) for v in runtimes}
        if cell.accelerator == "cuda" and cell.cuda and cuda == {cell.cuda}:
            continue
        found = (f"its CUDA runtime wheel is CUDA {', '.join(sorted(cuda))}" if cuda
                 else "it has no CUDA runtime wheel to tell which build it is")
        problems.append(f"{cell.key}: the lock has {dist} {have} without a local version where the matrix promises "
                        f"{rule.local_text}, and {found}; {fix}")
    return problems


# -- resolving ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class BaseFacts:
    """What the base image already has (NGC cells): never replaced, left out of the lock."""

    python: str
    packages: dict[str, str] = field(default_factory=dict)   # normalized name -> version
    constraints: str = ""          # the text of the base's PIP_CONSTRAINT file(s)
    standin: bool = False
    ref: str = ""
    glibc: str = ""                # the base's C library (major.minor): the cap of the wheels installed into it


def uv_binary() -> str:
    """The pinned uv installed beside this interpreter (requirements.lock pins it)."""
    candidate = Path(sys.executable).parent / "uv"
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("uv")
    if not found:
        raise UserError("uv is not installed; run `bash scripts/setup.sh` (installs the pinned uv into .venv)")
    return found


def index_args(host: HostPip, index_url: str | None, extra_index_urls: tuple[str, ...],
               reachable: Callable[[str], bool]) -> tuple[list[str], list[str]]:
    """uv arguments for the cell's and the host's indexes; unreachable remote ones are left out
    (with the reason): a lock's hashes decide what is installed, the index only where it comes from."""
    urls = (*extra_index_urls, *host.extra_index_urls)
    skipped = [url for url in urls if "://" in url and not url.startswith("file:") and not reachable(url)]
    index = index_url or host.index_url
    args = ["--index-strategy", "unsafe-best-match", *(["--index-url", index] if index else [])]
    args += [a for url in urls if url not in skipped for a in ("--extra-index-url", url)]
    args += [a for link in host.find_links for a in ("--find-links", link)]
    return args + (["--no-index"] if host.no_index else []), skipped


def _run_uv(argv: list[str], env: dict[str, str], cwd: Path) -> None:
    command, index_env = uv_index_env(argv)   # the index URLs (credentials) in its environment, not in `ps`
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=UV_TIMEOUT, cwd=cwd,
                             env={**{k: v for k, v in env.items() if k not in UV_LOCATION_ENV}, **index_env},
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise FailedError(f"uv pip compile timed out after {UV_TIMEOUT}s") from None
    if run.returncode != 0:
        lines = [ln.strip() for ln in run.stderr.splitlines() if ln.strip()]
        # The URL it could not fetch (an unreachable index) comes first, above the causes' tail.
        fetch = [ln for ln in lines[:-4] if "Failed to fetch" in ln][:1]
        said = " | ".join(fetch + lines[-4:])
        # uv masks a URL's password, not a token in its query (`?token=...`): each index's secrets are scrubbed.
        urls = tuple(argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in UV_INDEX_ENV)
        said = scrub(said, secret_strings(HostPip(extra_index_urls=urls)))
        raise FailedError("uv pip compile failed: " + said[:600])


@dataclass(frozen=True)
class Pins:
    """What an earlier resolution holds a new one to. `upgrade` None: move every package to its newest allowed
    version; a tuple: keep the `previous` pins except those packages. `pinned` (the drift check): the versions
    of these locks are constraints, so the resolution is the one `make lock` made whatever the index has
    released since; a pin nothing requires is simply not in it."""

    previous: dict[str, LockFile] = field(default_factory=dict)
    upgrade: tuple[str, ...] | None = None
    pinned: dict[str, LockFile] | None = None


def compile_cell(cell: Cell, host: HostPip, pins: Pins, *, base: BaseFacts | None, log: Log,
                 reachable: Callable[[str], bool] | None = None, platform: str | None = None) -> dict[str, str]:
    """Resolve a cell for `platform` (None: its only one) held to `pins`; returns lock file name -> text. Three
    runs of uv, each writing PEP 751: the whole resolution (versions for the platform's lower cap,
    Platform.wheel_platform), then at its versions with every file up to NEWEST_MANYLINUX the framework's
    closure and everything else (its packages and the base's not emitted)."""
    python = base.python if base else cell.python
    target = cell_platform(cell, platform)
    # None: asked through the host's CA, as uv will fetch from it (SSL_CERT_FILE below).
    args, skipped = index_args(host, cell.index_url, cell.extra_index_urls,
                               reachable or (lambda url: answers(url, host.cert)))
    for url in skipped:
        log(f"[{cell.key}] index {redact(url)} cannot be reached from here; left out (hashes decide what is "
            "installed)")
    env = {**os.environ, "UV_NO_CONFIG": "1", **({"SSL_CERT_FILE": host.cert} if host.cert else {})}
    common = [uv_binary(), "pip", "compile", "--quiet", "--format", "pylock.toml", "--no-header",
              "--python-version", python, *args]
    with tempfile.TemporaryDirectory(prefix="buildtool-lock-") as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "matrix.in").write_text(requirement_lines(framework_requirements(cell) + tool_requirements(cell)))
        constraints: list[str] = []
        if base is not None:
            (tmpdir / "base-constraints.txt").write_text(
                base.constraints + "\n" + "\n".join(f"{n}=={v}" for n, v in sorted(base.packages.items())) + "\n")
            constraints = ["--constraint", "base-constraints.txt"]
        if pins.pinned:
            (tmpdir / "committed-pins.txt").write_text(exact_pins(e for lock in pins.pinned.values()
                                                                 for e in lock.entries.values()))
            constraints += ["--constraint", "committed-pins.txt"]
        full = tmpdir / "pylock.full.toml"
        upgrade, previous = pins.upgrade, pins.previous
        if upgrade is not None and previous:
            # uv keeps what the output file already pins (its preferences) unless upgraded.
            full.write_text(preferences(e for lock in previous.values() for e in lock.entries.values()))
        upgrade_args = ["--upgrade"] if upgrade is None else [a for p in upgrade for a in ("--upgrade-package", p)]
        _run_uv([*common, "--python-platform", target.wheel_platform, *constraints, *upgrade_args,
                 "-o", full.name, "matrix.in"], env, tmpdir)
        (tmpdir / "resolved.txt").write_text(exact_pins(parse_lock(full.read_text()).entries.values()))
        at_versions = [*common, "--python-platform", f"{target.machine}-{NEWEST_MANYLINUX}", *constraints,
                       "--constraint", "resolved.txt"]
        texts: dict[str, str] = {}
        omit = set(base.packages) if base else set()
        if framework_requirements(cell):
            (tmpdir / "framework.in").write_text(requirement_lines(framework_requirements(cell)))
            _run_uv([*at_versions, "-o", FRAMEWORK_LOCK, "framework.in"], env, tmpdir)
            texts[FRAMEWORK_LOCK] = (tmpdir / FRAMEWORK_LOCK).read_text()
            omit |= set(parse_lock(texts[FRAMEWORK_LOCK]).entries)
        no_emit = [a for name in sorted(omit) for a in ("--no-emit-package", name)]
        _run_uv([*at_versions, *no_emit, "-o", TOOLS_LOCK, "matrix.in"], env, tmpdir)
        texts[TOOLS_LOCK] = (tmpdir / TOOLS_LOCK).read_text()
    return {name: _header(cell, base, target, name) + text + _table(cell, base, platform, name, python)
            for name, text in texts.items()}


def _header(cell: Cell, base: BaseFacts | None, target: platforms.Platform, name: str) -> str:
    part = "framework" if name == FRAMEWORK_LOCK else "tools"
    lines = [
        f"# GENERATED FILE - DO NOT EDIT. Refresh with `make lock FRAMEWORK={cell.key}` (all packages) or "
        f"`make lock FRAMEWORK={cell.key} PACKAGE=<name>` (one).",
        f"# Lock of cell {cell.key}, {part} layer (PEP 751, written by uv pip compile --format pylock.toml): "
        f"versions resolved for {target.wheel_platform}, every wheel of them up to {NEWEST_MANYLINUX}; "
        "installed with uv pip install -r, every file checked against its sha256.",
    ]
    if base is not None:
        what = "a local stand-in for " + cell.base if base.standin else cell.base
        lines.append(f"# Resolved against the base ({what}): its {len(base.packages)} Python packages"
                     + (" and its PIP_CONSTRAINT file" if base.constraints.strip() else "")
                     + " are constraints and not listed here.")
        if base.standin:
            lines.append("# STAND-IN: re-run `make lock` where the real NGC base can be pulled before building on it.")
    return "\n".join(lines) + "\n"


def _table(cell: Cell, base: BaseFacts | None, platform: str | None, name: str, python: str) -> str:
    """The lock's [tool.dl-images] table: what it was made from (contracts.locks.LockFile)."""
    target = cell_platform(cell, platform)
    values = {"inputs": fingerprint(cell, name, platform), "python": python,
              "platform": target.wheel_platform}
    if cell.multi_platform:
        values["target"] = target.name
        if base is not None:
            # The native install's wheel platform (render.dockerfiles.wheel_platforms): this base's glibc.
            values["glibc"] = base.glibc
    return f"\n[tool.{TOOL}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items())


# What a base already has, asked inside it (stdlib only): Python, its distributions and the
# text of the files its PIP_CONSTRAINT names.
BASE_PROBE = r"""
import importlib.metadata as md, json, os, platform, re, sys
packages = {}
for dist in md.distributions():
    name = dist.metadata["Name"]
    if name:
        packages.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
texts = []
libc, version = platform.libc_ver()
for path in os.environ.get("PIP_CONSTRAINT", "").split():
    try:
        texts.append(open(path).read())
    except OSError as exc:
        texts.append("# unreadable %s: %s" % (path, exc))
print(json.dumps({"python": "%d.%d" % sys.version_info[:2], "packages": packages,
                  "constraints": "\n".join(texts), "glibc": version if libc == "glibc" else ""}))
"""


def parse_base_probe(output: str, *, ref: str, standin: bool) -> BaseFacts:
    """BASE_PROBE's last line; FailedError naming the base where it is not the JSON the probe prints."""
    try:
        data = json.loads(output.strip().splitlines()[-1])
        packages = {normalize(k): str(v) for k, v in data["packages"].items()}
        python = str(data["python"])
    except (ValueError, IndexError, KeyError, TypeError, AttributeError) as exc:
        said = (output.strip().splitlines() or ["nothing"])[-1][:120]
        raise FailedError(f"cannot read what the base {ref} has: its package probe printed {said!r} "
                          f"({type(exc).__name__}), not the probe's JSON") from None
    # Constraint lines that are not plain pins (comments, URLs, markers) are passed through as they are.
    glibc = re.match(r"[0-9]+\.[0-9]+", str(data.get("glibc") or ""))
    return BaseFacts(python=python, packages=packages, constraints=str(data.get("constraints", "")), standin=standin,
                     ref=ref, glibc=glibc.group(0) if glibc else "")


def base_facts(base_ref: str, platform: str | None = None) -> BaseFacts:
    """Ask the base image itself (pulled when missing) what it already has. `platform` (os/arch): its image
    of that platform (`base_ref` a registry reference whose index has it; run under QEMU where that is not
    this machine's); None: the base as it is."""
    from buildtool.imagebuild import engine
    from buildtool.imagebuild.aptlock import platform_base

    ref = platform_base(base_ref, platform) if platform else base_ref
    placed = {"platform": platform} if platform else {}
    # A base asked under QEMU (another platform's image) starts Python emulated: minutes, not seconds.
    emulated = platform is not None and platform != platforms.host().name
    try:
        if engine.image_attrs(ref) is None:
            engine.pull(ref, **placed)
        output = engine.run_output(ref, ["python", "-c", BASE_PROBE], timeout=900 if emulated else 120, **placed)
    except RuntimeError as exc:
        raise FailedError(f"cannot ask the base {ref} for its packages: {str(exc)[:200]}") from None
    try:
        standin = standin_flag(engine.image_labels(ref))
    except LabelError as exc:
        raise UserError(f"base {ref}: {exc}") from None
    return parse_base_probe(output, ref=ref, standin=standin)


def platform_bases(cell: Cell, base_ref: str, ask: Callable[..., BaseFacts] | None = None) -> dict[str, BaseFacts]:
    """What an NGC cell's base has on each of its platforms (its image of each, asked on its own). The native
    install writes every platform's tools with the build machine's Python (bytecode, scripts), so the bases
    must agree on the Python version and each must name its glibc: otherwise a UserError naming them.
    `ask`: base_facts (looked up when called, so a test's stand-in for it is used)."""
    ask = ask or base_facts
    if not cell.multi_platform:
        return {cell.platforms[0]: ask(base_ref)}
    found = {p: ask(base_ref, p) for p in cell.platforms}
    pythons = {p: f.python for p, f in found.items()}
    if len(set(pythons.values())) > 1:
        raise UserError(f"{cell.key}: the base {base_ref} has Python "
                        f"{', '.join(f'{v} on {p}' for p, v in pythons.items())}; a cell built for several platforms "
                        "needs one Python version on all of them (its tools are installed natively for each)")
    unnamed = [p for p, f in found.items() if not f.glibc]
    if unnamed:
        raise UserError(f"{cell.key}: the base {base_ref} names no glibc version on {', '.join(unnamed)}, so its "
                        "wheels' platform is unknown; a cell built for several platforms needs a glibc base")
    return found


@dataclass(frozen=True)
class LockResult:
    cell: str
    changed: list[str]
    packages: int
    texts: dict[Path, str]     # every lock file of the cell, path -> text (written unless write=False)


def _locked_and_known(root: Path, cell: Cell) -> tuple[dict[str, dict[str, LockFile]], set[str]]:
    """The cell's committed locks by platform, and every package they or its requirements name."""
    previous: dict[str, dict[str, LockFile]] = {platform: {} for platform in cell.platforms}
    for platform in cell.platforms:
        for name, path in lock_paths(root, cell, platform).items():
            with suppress(OSError, ValueError):   # a missing or broken lock holds no pins
                previous[platform][name] = parse_lock(path.read_text())
    known = {n for locks in previous.values() for lock in locks.values() for n in lock.entries} | {
        normalize(requirement(r).name) for r in framework_requirements(cell) + tool_requirements(cell)}
    return previous, known


def lock_cells(root: Path, cells: list[Cell], base_refs: dict[str, str], packages: tuple[str, ...],
               log: Log, host: HostPip | None = None, write: bool = True) -> list[LockResult]:
    """Refresh the locks of `cells`: every package (no `packages`) or only the named ones.
    `base_refs` maps NGC cells to the base reference to ask (their mirror or stand-in). `write=False`: nothing is
    written (and `changed` is empty); the caller writes each result's `texts`."""
    host = host if host is not None else HostPip.from_host()
    wanted = tuple(normalize(p) for p in packages)
    found = {cell.key: _locked_and_known(root, cell) for cell in cells}
    # A --package no selected cell lists (a typo) upgrades nothing: refused before anything is resolved.
    unknown = [p for p in wanted if not any(p in known for _, known in found.values())]
    if unknown and len(cells) == 1:
        raise UserError(f"--package {', '.join(unknown)}: not in the lock of {cells[0].key}; name a package "
                        "it lists (or leave --package out to refresh all)")
    if unknown:
        keys = [c.key for c in cells]
        raise UserError(f"--package {', '.join(unknown)}: in the lock of none of the {len(cells)} selected cells "
                        f"({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}); name a package one of them "
                        "lists (or leave --package out to refresh all)")
    results = []
    for cell in cells:
        previous, known = found[cell.key]
        bases: dict[str, BaseFacts] = {}
        if is_ngc(cell):
            ref = base_refs[cell.key]
            log(f"[{cell.key}] asking the base {ref} what it has"
                + (f" (on {', '.join(cell.platforms)})" if cell.multi_platform else ""))
            bases = platform_bases(cell, ref)
        upgrade = None if not wanted else tuple(p for p in wanted if p in known)
        written: dict[Path, str] = {}
        count = 0
        for platform in cell.platforms:
            if cell.multi_platform:
                log(f"[{cell.key}] resolving for {platform}")
            # Never another platform's pins as preferences: uv drops a preference whose hashes match none of
            # this platform's files and then resolved older versions (measured: numpy 2.4.5, not 2.4.6).
            texts = compile_cell(cell, host, Pins(previous[platform], upgrade), base=bases.get(platform),
                                 log=log, platform=platform)
            written.update({path: texts[name] for name, path in lock_paths(root, cell, platform).items()})
            count = max(count, sum(len(parse_lock(t).entries) for t in texts.values()))
        changed = write_changed(written) if write else []
        results.append(LockResult(cell.key, [str(p.relative_to(root)) for p in changed], count, written))
    return results


def uv_version() -> str:
    try:
        run = subprocess.run([uv_binary(), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"uv does not run ({exc}); run `bash scripts/setup.sh`") from None
    match = re.match(r"uv (\S+)", run.stdout)
    if not match:
        raise UserError(f"cannot tell uv's version from {run.stdout.strip()!r}; run `bash scripts/setup.sh`")
    return match.group(1)


def write_uv_lock(templates: Path, host: HostPip | None = None) -> Path | None:
    """templates/uv.lock: the uv every build installs, the same version as this project's, with the
    hashes of all its wheels. Returns the path when it changed."""
    host = host if host is not None else HostPip.from_host()
    version = uv_version()
    env = {**os.environ, "UV_NO_CONFIG": "1", **({"SSL_CERT_FILE": host.cert} if host.cert else {})}
    args, _ = index_args(host, None, (), lambda url: True)
    with tempfile.TemporaryDirectory(prefix="buildtool-lock-") as tmp:
        (Path(tmp) / "uv.in").write_text(f"uv=={version}\n")
        _run_uv([uv_binary(), "pip", "compile", "--quiet", "--generate-hashes", "--no-header", "--no-annotate",
                 *args, "-o", "uv.txt", "uv.in"], env, Path(tmp))
        body = (Path(tmp) / "uv.txt").read_text()
    text = ("# GENERATED FILE - DO NOT EDIT. The uv every image build installs its locks with; refreshed by "
            "`make lock`\n# (the version pinned in requirements.lock). Hashes of every wheel of that release.\n" + body)
    changed = write_changed({templates / UV_LOCK: text})
    return changed[0] if changed else None


def uv_pin_problems(root: Path) -> list[str]:
    """templates/uv.lock must pin the uv the toolkit installs (requirements.lock's exact pin, the one
    `lock` resolves with)."""
    try:
        pinned = next((line.split("==", 1)[1].strip() for line in (root / "requirements.lock").read_text().splitlines()
                       if normalize(line.split("==", 1)[0]) == "uv" and "==" in line), None)
        version, _ = uv_requirement((root / "templates" / UV_LOCK).read_text())
    except (OSError, ValueError) as exc:
        return [f"templates/{UV_LOCK}: {exc}; run `make lock`"]
    if not pinned:   # nothing to follow: the uv the toolkit installs is unknown
        return [f"requirements.lock pins no uv (a `uv==` line; templates/{UV_LOCK} has uv {version}): pin the uv the "
                "toolkit installs, then run `make lock`"]
    if pinned != version:
        return [f"templates/{UV_LOCK} pins uv {version} but requirements.lock pins {pinned}; run `make lock`"]
    return []
