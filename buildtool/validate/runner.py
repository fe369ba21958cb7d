"""Validate an image: run image-tests/ inside it and record a verdict by its digest.

Flow: resolve the reference to a digest (registry manifest, pulled so the engine runs exactly
that digest) -> find its matrix cell (label label_keys.CELL) -> the cell's test groups and
run profile -> `pytest image-tests/<groups>` with a target file -> JUnit XML + JSON verdict
under reports/ -> the verdict (buildtool.contracts.verdict: what ran, what the groups define, what
a selection left out) signed and attached to the image digest in its registry repository (buildtool.validate.verdicts).

GPUs: the matrix says whether a cell needs them, the runner says what it has (`nvidia-smi`:
model, count, driver, the CUDA the driver supports) and the engine says whether containers get
them (a throwaway `docker run --gpus`). GPU tests run only where the cell's containers have
GPUs; elsewhere they are skipped with the reason and the verdict of a GPU cell is `incomplete`
(contracts.verdict.derive_result), never `passed`. A runner that lists GPUs the engine cannot
give to containers (no NVIDIA Container Toolkit, a driver too old for the image's CUDA), or a
runner declared a GPU runner (--require-gpu, DL_IMAGES_REQUIRE_GPU) that cannot see its GPUs,
fails with exit 1 and a message naming the fix, before any test runs.

Bounded in time: the cell's `validate.deadline_s` (matrix) is the image's whole budget. The image
tests cut every probe to what is left of it (less RESERVE_S for teardown) and report a hang as
the step that hung; pytest itself is stopped at the deadline as a backstop, and the tests it did
not finish are failed, never passed. Validation then goes on with the next image.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildtool.common.errors import FailedError, UserError
from buildtool.common.refs import has_registry, split_repo
from buildtool.contracts import frameworks, gpu, label_keys, versions
from buildtool.contracts.rendezvous import JOIN_TIMEOUT_S
from buildtool.contracts.target import Expectations, FrameworkInfo, Target, write_target
from buildtool.contracts.verdict import (
    SCHEMA,
    ColdStart,
    Gpu,
    Runner,
    Selection,
    TestResult,
    Verdict,
    VerdictError,
    derive_result,
    parse_verdict,
)
from buildtool.matrix.schema import Cell, Matrix
from buildtool.registry.client import NotFound, RegistryClient
from buildtool.validate.collect import PLUGIN, cell_groups, image_tests_hash
from buildtool.validate.labels import label_checks

DOCKER = os.environ.get("IMAGETEST_DOCKER", "docker")
DEFAULT_JOIN_TIMEOUT_S = float(JOIN_TIMEOUT_S)
PULL_TIMEOUT_S = 1800
# The tests' probes stop this long before the image's deadline: removing containers and writing
# results fit in it, so a validation that hangs still ends by its deadline. pytest is stopped at
# the deadline itself (SIGTERM, as Ctrl-C), and killed if it still runs TEARDOWN_GRACE_S later.
RESERVE_S = 30
TEARDOWN_GRACE_S = 60

Log = Callable[[str], None]


@dataclass(frozen=True)
class Resolved:
    """An image reference pinned to a digest, with its labels."""

    ref: str             # what the user named
    run_ref: str         # what containers are started from (repo@digest when in a registry)
    digest: str          # registry manifest digest, or the local image id when not in a registry
    host: str | None     # registry host; None for a local-only image
    repo: str | None
    labels: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)   # the image config's Env


@dataclass
class Options:
    store: bool = True
    select: str | None = None
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    missing_peer_timeout_s: float = 10.0
    peers: dict[str, str] = field(default_factory=dict)
    reports: Path = Path("reports")
    cell: str | None = None
    # Fault injection for the toolkit's own tests: flags appended after the run profile's.
    extra_run_flags: list[str] = field(default_factory=list)
    peer_run_flags: list[str] = field(default_factory=list)
    ddp_master_addr: str = "127.0.0.1"
    ddp_timeout_s: float = 60.0
    deadline_s: float | None = None   # overrides the cell's validate.deadline_s
    # A declared GPU runner: fail (exit 1) unless its GPUs are seen and usable.
    require_gpu: bool = False
    # Folders of earlier verdicts (verdict.json, *.verdict.json) to compare bus bandwidth with;
    # the reports folder is always searched too.
    baselines: list[Path] = field(default_factory=list)


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise UserError(f"docker client {DOCKER!r} not found; install Docker or set IMAGETEST_DOCKER") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"`docker {args[0]}` did not answer within {timeout:.0f}s; is the engine running?") from None


def _inspect(ref: str) -> dict[str, Any] | None:
    proc = _docker("image", "inspect", ref, timeout=60)
    if proc.returncode != 0:
        if "Cannot connect" in proc.stderr or "Is the docker daemon running" in proc.stderr:
            raise UserError(f"the Docker engine is not reachable ({proc.stderr.strip()}); start it (make setup)")
        return None
    return json.loads(proc.stdout)[0]


def _config(attrs: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, env) of an inspected image."""
    config = attrs.get("Config") or {}
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    return config.get("Labels") or {}, env


def resolve(ref: str, log: Log) -> Resolved:
    """Pin `ref` to a digest and make sure the engine holds exactly that image."""
    if not has_registry(ref):
        attrs = _inspect(ref)
        if attrs is None:
            raise UserError(f"image {ref!r} not found locally; build it or name it with its registry")
        return Resolved(ref, ref, attrs["Id"], None, None, *_config(attrs))
    host, repo, tag_or_digest = split_repo(ref)
    client = RegistryClient(host)
    client.ping()  # RegistryUnreachable (exit 2) when nothing answers
    digest = tag_or_digest if tag_or_digest.startswith("sha256:") else client.manifest_digest(repo, tag_or_digest)
    if digest is None:
        raise UserError(f"image {ref} not found in registry {host}; build and push it first (make push)")
    run_ref = f"{host}/{repo}@{digest}"
    attrs = _inspect(run_ref)
    if attrs is None:
        log(f"pulling {run_ref}")
        proc = _docker("pull", run_ref, timeout=PULL_TIMEOUT_S)
        if proc.returncode != 0:
            raise UserError(f"cannot pull {run_ref}: {proc.stderr.strip()[-300:]}")
        attrs = _inspect(run_ref)
        if attrs is None:
            raise UserError(f"pulled {run_ref} but the engine does not show it")
    return Resolved(ref, run_ref, digest, host, repo, *_config(attrs))


@dataclass(frozen=True)
class Inventory:
    """The runner's GPUs as nvidia-smi on the host reports them."""

    gpus: list[Gpu]
    driver: str = ""
    cuda_driver: str = ""
    problem: str = ""     # why nvidia-smi gave no GPUs (missing, failing), "" when it listed some

    def as_dicts(self) -> list[dict[str, str]]:
        return [{"index": g.index, "name": g.name, "driver": g.driver} for g in self.gpus]


NVIDIA_SMI_TIMEOUT_S = 30
_CUDA_VERSION_RE = re.compile(r"CUDA Version\s*:\s*([0-9]+\.[0-9]+)")


def _nvidia_smi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)


def gpu_inventory() -> Inventory:
    """Model, count, driver and the driver's CUDA version of this host's GPUs (nvidia-smi first on PATH)."""
    try:
        proc = _nvidia_smi("--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader,nounits")
    except FileNotFoundError:
        return Inventory([], problem="nvidia-smi not found (no NVIDIA driver on this runner)")
    except subprocess.TimeoutExpired:
        return Inventory([], problem=f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT_S}s")
    if proc.returncode != 0:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        return Inventory([], problem=f"nvidia-smi failed (exit {proc.returncode}): {said[0] if said else 'no output'}")
    gpus = []
    for line in proc.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            memory = int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else None
            gpus.append(Gpu(index=parts[0], name=parts[1], driver=parts[2], memory_mib=memory))
    if not gpus:
        return Inventory([], problem="nvidia-smi lists no GPU")
    cuda_driver = ""
    try:
        header = _nvidia_smi()
        match = _CUDA_VERSION_RE.search(header.stdout)
        cuda_driver = match.group(1) if match else ""
    except (OSError, subprocess.TimeoutExpired):
        pass
    return Inventory(gpus, driver=gpus[0].driver, cuda_driver=cuda_driver)


def runner_gpus() -> tuple[list[dict[str, str]], str]:
    """GPUs on this host as nvidia-smi sees them (none when it is missing or failing) and the driver."""
    found = gpu_inventory()
    return found.as_dicts(), found.driver


def require_gpus(inventory: Inventory) -> None:
    """A declared GPU runner that cannot see its GPUs fails at once (exit 1), before any test."""
    if not inventory.gpus:
        raise FailedError(f"this runner is declared a GPU runner (--require-gpu or {gpu.REQUIRE_GPU_ENV}) but has "
                          f"no usable GPU: {inventory.problem}; fix the NVIDIA driver (nvidia-smi must list the "
                          "GPUs; after a kernel or driver update, reboot or reload the nvidia modules)")


def find_cell(matrix: Matrix, labels: dict[str, str], override: str | None, ref: str) -> Cell:
    key = override or labels.get(label_keys.CELL)
    if not key:
        raise UserError(f"image {ref} has no {label_keys.CELL} label; pass --cell NAME:VERSION")
    for cell in matrix.cells:
        if cell.key == key:
            return cell
    raise UserError(f"image {ref} names cell {key!r}, which is not in the matrix; pass --cell or update matrix.yaml")


def run_flags(cell: Cell, labels: dict[str, str], gpus: list[dict[str, str]], log: Log) -> list[str]:
    """The cell's run profile as docker flags; `--gpus` only where this runner has GPUs."""
    label = labels.get(label_keys.RUN_PROFILE)
    if label:
        try:
            built = json.loads(label)
            if built.get("shm_size") not in (None, cell.run.shm_size):
                log(f"note: the image was built with run profile shm_size={built.get('shm_size')}, "
                    f"the matrix now says {cell.run.shm_size}; testing the matrix's")
        except (ValueError, AttributeError):
            log(f"note: label {label_keys.RUN_PROFILE} is not JSON; ignored")
    flags = [f for f in cell.run.docker_flags() if not f.startswith("--gpus")]
    if gpus and cell.run.gpus != "none":
        flags.append(f"--gpus={cell.run.gpus}")
    return flags


def gpu_start_problem(stderr: str, cuda: str | None) -> str:
    """What a refused `docker run --gpus` means, with the fix."""
    said = stderr.strip().splitlines()[-1][:300] if stderr.strip() else "no message"
    lower = stderr.lower()
    if any(marker in lower for marker in gpu.NO_RUNTIME_MARKERS):
        return f"the Docker engine has no NVIDIA runtime for --gpus ({said}): {gpu.TOOLKIT_FIX}"
    if any(marker in lower for marker in gpu.DRIVER_TOO_OLD_MARKERS):
        need = f"NVIDIA driver {gpu.min_driver(cuda)} or newer (CUDA {cuda})" if cuda else "a newer NVIDIA driver"
        return f"the host's NVIDIA driver is too old for this image ({said}): install {need}"
    return f"containers cannot be started with their GPUs ({said}); check the NVIDIA driver and Container Toolkit"


def probe_flags(image: str, flags: list[str], log: Log, cuda: str | None = None) -> tuple[list[str], list[str]]:
    """Start a throwaway container with `flags`; drop ulimits the engine cannot grant.

    Some engines (rootless, nested, locked-down hosts) cannot raise a hard limit such as
    memlock=-1. The run then goes on with the engine's default for that limit, and the
    deviation is recorded so the ulimit test reports it as skipped, never as passed.
    GPU flags are probed on their own afterwards: an engine that cannot give containers their
    GPUs is a failure of this runner (FailedError, exit 1) that names the fix.
    """
    # `--entrypoint true`: only the engine's answer to the flags matters here, and an image whose
    # entrypoint ignores its command or hangs must not stall validation (the tests report it).
    # Exit 125 is the engine refusing to start the container; any other code means it started.
    def start(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return _docker("run", "--rm", "--network", "none", "--entrypoint", "true", *args, image, timeout=timeout)

    gpu_flags = [f for f in flags if f.startswith("--gpus")]
    plain = [f for f in flags if not f.startswith("--gpus")]
    proc = start(*plain)
    kept, dropped = list(plain), []
    if proc.returncode == 125:
        if "rlimit" not in proc.stderr:
            raise UserError(f"cannot start {image} with its run profile ({' '.join(plain)}): "
                            f"{proc.stderr.strip()[-300:]}")
        kept = []
        for flag in plain:
            if flag.startswith("--ulimit") and start(flag).returncode == 125:
                dropped.append(flag.split("=", 1)[1].split("=")[0])
                log(f"note: this engine cannot grant {flag}; running with its default and reporting the check "
                    "as skipped")
            else:
                kept.append(flag)
    if gpu_flags:
        proc = start(*kept, *gpu_flags, timeout=300)
        if proc.returncode == 125:
            raise FailedError(f"this runner lists GPUs but {image} cannot be started with them: "
                              + gpu_start_problem(proc.stderr, cuda))
    return kept + gpu_flags, dropped


def check_cell_gpus(cell: Cell, inventory: Inventory) -> None:
    """A GPU cell on a runner that lists GPUs: its driver must support the cell's CUDA (exit 1 if not)."""
    if cell.needs_gpu and inventory.gpus and cell.cuda:
        problem = gpu.driver_problem(cell.cuda, inventory.driver, inventory.cuda_driver)
        if problem:
            raise FailedError(f"cannot validate {cell.key} here: {problem}")


def expectations(cell: Cell, labels: dict[str, str]) -> dict[str, Any]:
    """What the image claims to contain: from its matrix cell and its labels."""
    standin = labels.get(label_keys.STANDIN) == "true"
    module = frameworks.get(cell.framework).module
    expect: dict[str, Any] = {"packages": dict(cell.packages), "standin": standin}
    try:
        # An empty label is no label (a derived image cannot delete one, only empty it).
        locked = json.loads(labels[label_keys.PACKAGES]) if labels.get(label_keys.PACKAGES) else None
    except ValueError:
        raise UserError(f"label {label_keys.PACKAGES} of the image is not JSON; rebuild it with `buildtool build`") \
            from None
    expect["locked"] = locked if isinstance(locked, dict) else None
    if standin:
        value = labels.get(label_keys.STANDIN_FRAMEWORK)
        if not value:
            raise UserError(f"stand-in image without {label_keys.STANDIN_FRAMEWORK}; rebuild it with `buildtool build`")
        expect["framework_claims"] = [{
            "source": f"stand-in label {label_keys.STANDIN_FRAMEWORK}", "value": value,
            "note": (f"stand-in image: compared against the stand-in's {module}, "
                     f"not the cell's {cell.framework_version}"),
        }]
        expect["python"] = labels.get(label_keys.STANDIN_PYTHON, "")
        expect["python_skip_reason"] = (f"stand-in image: its Python comes from the stand-in base, "
                                        f"the cell's Python {cell.python} does not apply")
    else:
        claims = [{"source": f"matrix cell {cell.key}", "value": cell.framework_version}]
        if labels.get(label_keys.FRAMEWORK_VERSION):
            claims.append({"source": f"label {label_keys.FRAMEWORK_VERSION}",
                           "value": labels[label_keys.FRAMEWORK_VERSION]})
        expect["framework_claims"] = claims
        expect["python"] = cell.python
    scheme = frameworks.get(cell.framework).local_versions
    for claim in expect["framework_claims"]:
        # A stand-in is a CPU build of the framework, whatever the cell it stands in for.
        rule = versions.expectation(claim["value"], scheme=scheme,
                                    accelerator="cpu" if standin else cell.accelerator,
                                    cuda=cell.cuda, ngc=None if standin else versions.ngc_release(cell.base))
        claim.update(local_pattern=rule.local_pattern, local_text=rule.local_text)
    return expect


def framework_info(framework: frameworks.Framework) -> FrameworkInfo:
    return FrameworkInfo(name=framework.name, module=framework.module, gpu_count_expr=framework.gpu_count_expr,
                         events_writer=list(framework.events_writer), shm_workers=framework.shm_workers,
                         cuda_build_expr=framework.cuda_build_expr,
                         container_version_env=framework.container_version_env)


def shm_fix(cell: Cell, matrix: Matrix) -> str:
    """Where the /dev/shm promise is made, for messages that tell what to change."""
    line = f", line {cell.line}" if cell.line else ""
    return f"run.shm_size of {cell.key} in {Path(matrix.path).name}{line}"


def remove_run_containers(run_id: str) -> None:
    """Remove every container a test run started (a safety net behind the fixtures)."""
    proc = _docker("ps", "-aq", "--filter", f"label={label_keys.IMAGETEST_RUN}={run_id}", timeout=60)
    ids = proc.stdout.split()
    if ids:
        _docker("rm", "-f", "-v", *ids, timeout=120)


def _stop_group(pgid: int, fired: list[bool] | None = None) -> None:
    """SIGTERM a process group (pytest tears its containers down on it); SIGKILL if it lingers."""
    if fired is not None:
        fired.append(True)
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return

    def _kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)

    later = threading.Timer(TEARDOWN_GRACE_S, _kill)
    later.daemon = True
    later.start()


def _run_pytest(argv: list[str], cwd: Path, log_path: Path, timeout: float, log: Log,
                fired: list[bool] | None = None) -> int:
    """Run pytest, streaming its output to the log; stopped (whole group) after `timeout`."""
    with log_path.open("w") as sink:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        timer = threading.Timer(timeout, _stop_group, args=(proc.pid, fired))
        timer.daemon = True
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sink.write(line)
                log(line.rstrip("\n"))
            return proc.wait()
        except BaseException:
            # Ctrl-C reaches only us (pytest runs in its own session): let pytest tear down.
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            timer.cancel()


def overall_result(pytest_exit: int, tests: list[dict[str, Any]]) -> str:
    """Passed only when pytest succeeded, something passed and nothing failed: skips never count."""
    failed = any(t["result"] not in ("passed", "skipped") for t in tests)
    passed = any(t["result"] == "passed" for t in tests)
    return "passed" if pytest_exit == 0 and passed and not failed else "failed"


BASELINE_GLOBS = ("verdict.json", "*.verdict.json")   # as validate and `buildtool report --fetch` write them


def busbw_baseline(folders: list[Path], cell: str, inventory: Inventory) -> dict[str, Any]:
    """The newest earlier verdict of `cell` on the same GPU model and count whose bus-bandwidth
    check passed: its peak, where it comes from and when ({} when there is none)."""
    if not inventory.gpus:
        return {}
    model, count = inventory.gpus[0].name, len(inventory.gpus)
    best: dict[str, Any] = {}
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted({p for pattern in BASELINE_GLOBS for p in folder.rglob(pattern)}):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(data, dict):
                data.pop("size_bytes", None)       # what `buildtool report --fetch` adds to a verdict
            try:
                earlier = parse_verdict(data, str(path))
            except VerdictError:
                continue                           # not a verdict (a missing record, another schema): no baseline
            if earlier.cell != cell:
                continue
            gpus = earlier.runner.gpus
            peak = gpu.busbw_peak(earlier.figures)
            checked = any(t.gpu and "busbw" in t.id and t.result == "passed" for t in earlier.tests)
            if peak is None or not checked or len(gpus) != count or gpus[0].name != model:
                continue
            started = earlier.started
            if not best or started > best["started"]:
                best = {"peak_GBps": peak, "started": started, "digest": earlier.digest,
                        "gpu_model": model, "gpus": count, "source": f"{path} ({started})"}
    return best


def probes_dir(out_dir: Path, run_id: str) -> Path:
    """A fresh folder for this run's probe files; earlier runs' are dropped where we may (containers
    running as another user may have left files we cannot remove: those stay)."""
    root = out_dir / "probes"
    if root.is_dir():
        for old in root.iterdir():
            if old.is_symlink() or not old.is_dir():
                old.unlink(missing_ok=True)
            else:
                shutil.rmtree(old, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    return root / run_id


def deadline_problem(deadline_s: float, fired: bool, results: dict[str, Any] | None, rc: int) -> str:
    """What to say when the run did not end by itself ('' when it did)."""
    if fired:
        running = [t["id"] for t in (results or {}).get("tests", [])
                   if t.get("message", "").startswith("interrupted while running")]  # image-tests/conftest.py
        during = f" while {', '.join(running)} ran" if running else ""
        return (f"the image's validation deadline of {deadline_s:.0f}s ran out{during}; the tests were stopped "
                f"(raise validate.deadline_s in matrix.yaml only if the image is healthy but slow)")
    if results is None:
        return f"image-tests wrote no results (pytest exit {rc})"
    if results.get("interrupted"):
        return f"image-tests were interrupted ({results['interrupted']})"
    return ""


def validate_image(ref: str, matrix: Matrix, root: Path, options: Options, log: Log) -> dict[str, Any]:
    """Run the cell's image-tests against `ref`; returns the verdict (stored when possible)."""
    inventory = gpu_inventory()
    if options.require_gpu:
        require_gpus(inventory)
    image = resolve(ref, log)
    if options.store and image.host is None:
        raise UserError(f"image {ref} is not in a registry, so its verdict cannot be stored by digest; "
                        "push it, or pass --no-store")
    cell = find_cell(matrix, image.labels, options.cell, ref)
    key = None
    if options.store:
        from buildtool.validate.keys import signing_key

        key = signing_key(log)   # a bad DL_IMAGES_SIGNING_KEY is said now, not after the tests ran
    tests_dir = root / "image-tests"
    groups = cell_groups(cell, tests_dir)     # all of the cell's groups: one without its folder is exit 2
    deadline_s = float(options.deadline_s or cell.validate_deadline_s)
    started = time.monotonic()
    check_cell_gpus(cell, inventory)
    seen = inventory.as_dicts()
    flags, not_granted = probe_flags(image.run_ref, run_flags(cell, image.labels, seen, log), log, cell.cuda)
    # The tests get GPUs only where this cell's containers were started with them (probed above).
    usable = seen if any(f.startswith("--gpus") for f in flags) else []
    gpu_problem = inventory.problem if cell.needs_gpu and not usable else ""
    floor = gpu.floor_for(dict(cell.busbw_floor_GBps), usable[0]["name"]) if usable else None
    run_id = uuid.uuid4().hex[:12]
    out_dir = (root / options.reports / cell.name / image.digest.split(":")[-1][:12]).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    baseline = busbw_baseline([root / options.reports, *options.baselines], cell.key, inventory) if usable else {}
    framework = frameworks.get(cell.framework)
    target = Target(
        image=image.run_ref, ref=ref, digest=image.digest, cell=cell.key,
        framework=cell.framework, framework_info=framework_info(framework),
        peer_frameworks={f.name: framework_info(f) for f in frameworks.others(cell.framework)},
        accelerator=cell.accelerator, needs_gpu=cell.needs_gpu, labels=image.labels, image_env=image.env,
        run_flags=flags, ulimits=dict(cell.run.ulimits), ulimits_not_granted=not_granted,
        extra_run_flags=options.extra_run_flags, peer_run_flags=options.peer_run_flags,
        shm_promised=cell.run.shm_size, shm_expected_bytes=cell.run.shm_bytes, shm_fix=shm_fix(cell, matrix),
        expect=Expectations.model_validate({**expectations(cell, image.labels), "labels": label_checks(
            matrix, cell, image.labels, root / "templates")}), runner_gpus=usable,
        gpu_problem=gpu_problem, cuda=cell.cuda or "",
        busbw_floor_GBps=floor[1] if floor else None, busbw_floor_model=floor[0] if floor else "",
        busbw_baseline=baseline,
        rdzv_join_timeout_s=options.join_timeout_s, missing_peer_timeout_s=options.missing_peer_timeout_s,
        ddp_master_addr=options.ddp_master_addr, ddp_timeout_s=options.ddp_timeout_s,
        peers=options.peers, run_id=run_id,
        deadline_s=deadline_s, probe_budget_s=max(1.0, deadline_s - (time.monotonic() - started) - RESERVE_S),
    )
    write_target(out_dir / "target.json", target)
    results_path, junit = out_dir / "results.json", out_dir / "junit.xml"
    defined_path = out_dir / "defined.json"
    results_path.unlink(missing_ok=True)
    defined_path.unlink(missing_ok=True)
    # --rootdir: test ids must not depend on where the target and reports are (pytest derives its
    # rootdir from every path on its command line).
    argv = [sys.executable, "-m", "pytest", *[str(tests_dir / g) for g in groups], "--rootdir", str(tests_dir),
            "-c", str(tests_dir / "pytest.ini"), "--target",
            str(out_dir / "target.json"), "--results", str(results_path), "--junitxml", str(junit),
            "-o", "junit_family=xunit2", "-o", f"junit_suite_name={cell.key}", "-rs", "-q",
            "-p", PLUGIN, "--defined-tests", str(defined_path),
            # What every probe wrote (records, outputs, results) stays beside the verdict for a post-mortem.
            "--basetemp", str(probes_dir(out_dir, run_id))]
    if options.select:
        argv += ["-k", options.select]
    gpu_note = (f"{len(usable)}x {usable[0]['name']}" if usable else
                f"none usable ({inventory.problem or 'CPU cell'}); GPU paths will be skipped")
    log(f"validating {ref} ({image.digest}) as {cell.key}: groups {', '.join(groups)}; "
        f"run flags {' '.join(target.run_flags) or '(none)'}; deadline {deadline_s:.0f}s; "
        f"GPUs: {gpu_note}")
    started_at = dt.datetime.now(dt.UTC)
    fired: list[bool] = []
    try:
        rc = _run_pytest(argv, root, out_dir / "pytest.log", max(1.0, deadline_s - (time.monotonic() - started)),
                         log, fired)
    finally:
        remove_run_containers(run_id)
    duration = time.monotonic() - started
    try:
        results = json.loads(results_path.read_text())
    except (OSError, ValueError):
        results = None
    problem = deadline_problem(deadline_s, bool(fired), results, rc)
    made = make_verdict(image, cell, started_at, duration, tests_dir, groups, inventory, usable, gpu_problem,
                        options.require_gpu, target.run_flags, rc, results or {"tests": []}, defined_path,
                        options.select, problem, deadline_s)
    verdict = made.to_json()
    (out_dir / "verdict.json").write_text(json.dumps(verdict, indent=1))
    verdict["reports"] = str(out_dir)
    if key is not None and image.host and image.repo:
        from buildtool.validate.verdicts import attest

        try:
            artifact = attest(RegistryClient(image.host), image.repo, image.digest, made, key)
        except NotFound as exc:
            raise UserError(f"cannot store the verdict: {exc}") from None
        verdict["stored"] = artifact.digest
        verdict["signed_by"] = key.key.keyid
        log(f"verdict signed with {key.source} (key {key.key.keyid[:16]}) and attached to {image.digest} "
            f"as {artifact.digest}")
    return verdict


def make_verdict(image: Resolved, cell: Cell, started_at: dt.datetime, duration: float, tests_dir: Path,
                 groups: list[str], inventory: Inventory, usable: list[dict[str, str]], gpu_problem: str,
                 gpu_runner: bool, run_flags: list[str], rc: int, results: dict[str, Any], defined_path: Path,
                 select: str | None, problem: str = "", deadline_s: float = 0.0) -> Verdict:
    """The verdict (schema SCHEMA): what ran, what the groups define (the collect plugin's file), what a
    selection left out, the runner's GPUs, and the result with why it is not `passed`;
    `problem`: why the run did not end by itself (its deadline ran out, it was interrupted)."""
    tests = [TestResult.model_validate(t) for t in results["tests"]]
    try:
        collected = json.loads(defined_path.read_text())
    except (OSError, ValueError):
        collected = {"defined": [], "deselected": []}
    defined = [str(d["id"]) for d in collected["defined"]]
    gpu_tests = [str(d["id"]) for d in collected["defined"] if d.get("gpu")]
    deselected = sorted(set(collected["deselected"]))
    result, reasons = derive_result(rc, results["tests"], defined=defined, deselected=deselected, expression=select,
                                    gpu_cell=cell.needs_gpu, gpu_tests=gpu_tests, gpu_problem=gpu_problem)
    if problem:
        result, reasons = "failed", [problem]
    return Verdict(
        schema=SCHEMA, digest=image.digest, image=image.ref, cell=cell.key, result=result,
        started=started_at.isoformat(timespec="milliseconds"), duration_s=round(duration, 2),
        test_code=image_tests_hash(tests_dir),
        runner=Runner(hostname=socket.gethostname(), gpu_runner=gpu_runner, gpus=inventory.gpus,
                      driver=inventory.driver, cuda_driver=inventory.cuda_driver,
                      gpus_usable=bool(usable) if cell.needs_gpu else None,
                      gpu_problem=gpu_problem or inventory.problem),
        groups=groups, defined_tests=defined, gpu_tests=gpu_tests,
        selection=Selection(expression=select or None, deselected=deselected),
        incomplete=reasons if result == "incomplete" else [],
        framework_version=str((results.get("facts") or {}).get("framework_version") or ""),
        cold_start=ColdStart.model_validate(cold) if (cold := (results.get("facts") or {}).get("cold_start")) else None,
        run_flags=run_flags, pytest_exit=rc, tests=tests, figures=results.get("figures", {}), problem=problem,
        deadline_s=deadline_s)
