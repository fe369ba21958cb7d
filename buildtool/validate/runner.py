"""Validate an image: run image-tests/ inside it and record a verdict by its digest.

Flow: resolve the reference to a digest (registry manifest, pulled so the engine runs exactly
that digest) -> find its matrix cell (label label_keys.CELL) -> the cell's test groups and
run profile -> `pytest image-tests/<groups>` with a target file -> JUnit XML + JSON verdict
under reports/ -> the verdict (buildtool.contracts.verdict: what ran, what the groups define, what
a selection left out) signed and attached to the image digest in its registry repository (buildtool.validate.verdicts).

GPUs (docs/gpu.md): GPU tests run only where the cell's containers have GPUs, else a GPU cell's verdict is
`incomplete` (contracts.verdict.derive_result); a runner at fault fails with exit 1 before any test runs.

Bounded in time: the cell's `validate.deadline_s` (matrix) is the image's whole budget. The image
tests cut every probe to what is left of it (less RESERVE_S for teardown) and report a hang as
the step that hung; pytest itself is stopped at the deadline as a backstop, and the tests it did
not finish are failed, never passed. Validation then goes on with the next image.

This module only orders the steps; each capability has its module: validate.options (what is asked),
validate.containers (the image pinned by digest, its containers), validate.probe (GPUs, run flags, what
the engine grants), validate.targets (what the tests are told: pure), validate.pytest_run (the run and
its deadline), validate.run_plan (the run planned, and its verdict: pure), validate.verdicts (storing it).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from buildtool.common.errors import UserError
from buildtool.common.files import sha256_file, write_atomic
from buildtool.common.refs import has_registry
from buildtool.contracts import emulation, platforms, sitetests
from buildtool.contracts.target import write_target
from buildtool.matrix.schema import Cell, Matrix
from buildtool.registry.client import NotFound, RegistryClient
from buildtool.validate import network, reports_lock
from buildtool.validate.collect import cell_groups, image_tests_hash
from buildtool.validate.containers import Log, Resolved, pin, remove_run_containers, resolve
from buildtool.validate.labels import label_checks
from buildtool.validate.options import Options
from buildtool.validate.probe import (
    Inventory,
    busbw_baseline,
    check_cell_gpus,
    gpu_inventory,
    gpu_start_problem,
    probe_flags,
    require_gpus,
    run_flags,
)
from buildtool.validate.pytest_run import RESERVE_S, _run_pytest, deadline_problem, probes_dir, read_results
from buildtool.validate.run_plan import (
    RunOutcome,
    RunPlan,
    gpu_cell,
    make_verdict,
    overall_result,
    promised_libraries,
)
from buildtool.validate.targets import build_target, check_selection, expectations, find_cell, pytest_argv

# Importable from here as before the split (each lives in the module of its capability).
__all__ = ["Inventory", "Options", "Resolved", "busbw_baseline", "deadline_problem",
           "expectations", "find_cell", "gpu_inventory", "gpu_start_problem", "make_verdict", "overall_result",
           "probe_flags", "require_gpus", "resolve", "run_flags", "validate_image"]


def matrix_digest(matrix: Matrix, root: Path) -> str:
    """sha256 of the matrix file as read (what the verdict is bound to; the provenance's is the same sum). Its path
    is relative to the project root (absolute when outside it): joined to `root`, as from another folder it named
    no file (`validate` from docs/ could not read the matrix)."""
    try:
        return "sha256:" + sha256_file(root / matrix.path)
    except OSError as exc:
        raise UserError(f"the matrix {matrix.path} cannot be read ({exc.strerror})") from None


def site_folder(cell: Cell, matrix: Matrix, extra_tests: Path | None, tests_dir: Path) -> Path | None:
    """The folder of site checks a run of `cell` adds (contracts.sitetests): --extra-tests, else the matrix's
    `validate.extra_tests` (beside the matrix), else none. One that cannot be a site folder is exit 2 naming why."""
    folder = extra_tests if extra_tests is not None else \
        (tests_dir.parent / matrix.path).parent / cell.extra_tests if cell.extra_tests else None
    if folder is None:
        return None
    folder = folder.resolve()
    wrong = sitetests.problem(folder, tests_dir)
    if wrong:
        where = "--extra-tests" if extra_tests is not None else f"validate.extra_tests of {cell.key}"
        raise UserError(f"{where}: {wrong}")
    return folder


def validate_image(ref: str, matrix: Matrix, root: Path, options: Options, log: Log,
                   platform: str | None = None) -> dict[str, Any]:
    """Run the cell's image-tests against `ref` (of an image index: its `platform` manifest); returns the
    verdict (stored when possible), which names the platform and whether it ran emulated."""
    check_selection(options.select)
    # The matrix as read now, before anything runs: a matrix file edited during the run is not the one it read.
    bound = options.matrix_digest or matrix_digest(matrix, root)
    inventory = gpu_inventory()
    if options.require_gpu:
        require_gpus(inventory)
    if options.reuses() and has_registry(ref):
        reused = _reused(ref, matrix, root, options, log, platform, inventory, bound)
        if reused is not None:
            return reused
    image = resolve(ref, log, platform)
    if image.emulated:
        problem = platforms.binfmt_problem(image.platform)
        if problem:
            raise UserError(f"cannot validate {ref} ({image.platform}): {problem}")
    if options.store and image.host is None:
        raise UserError(f"image {ref} is not in a registry, so its verdict cannot be stored by digest; "
                        "push it, or pass --no-store")
    cell = find_cell(matrix, image.labels, options.cell, ref)
    key = None
    if options.store:
        from buildtool.attest.keys import signing_key
        from buildtool.common.tsa import check_writer

        key = signing_key(log)   # a bad DL_IMAGES_SIGNING_KEY is said now, not after the tests ran
        check_writer(None, writes=True)   # as is a bundle that would carry no timestamp DL_IMAGES_TSA_CERTS asks for
    from buildtool.validate.sbomref import verdict_sbom

    sbom = verdict_sbom(image, root, log)
    # One run at a time per folder: two would overwrite each other's reports (validate.reports_lock).
    with reports_lock.hold(run_folder(root, options, cell, image), f"buildtool validate of {ref}"):
        started = time.monotonic()
        plan = _plan(RunPlan(ref, image, cell, matrix, options, inventory, flags=[]), root, log)
        try:
            baseline = (busbw_baseline([root / options.reports, *options.baselines], cell.key, plan.inventory,
                                       options.busbw_window) if plan.usable else {})
            for line in baseline.get("left_out", []):   # a time that does not parse is no night of the window
                log(f"bus-bandwidth baseline of {cell.key}: {line}")
            expect = {**expectations(cell, image.labels), "labels": label_checks(matrix, cell, image.labels,
                                                                                 root / "templates")}
            left_s = max(1.0, plan.deadline_s - (time.monotonic() - started) - RESERVE_S)
            target = build_target(plan, baseline, left_s, expect)
            write_target(plan.out_dir / "target.json", target)
            run = _run(plan, root, log, started)
            made = make_verdict(plan, run, sbom, bound)
        finally:
            _remove_staged(plan.tree, root)
        verdict = made.to_json()
        # Beside and renamed: a write that fails midway (a full disk) leaves no truncated verdict for the report and
        # the bus-bandwidth baseline to meet, and an older verdict of this digest and cell as it was.
        write_atomic(plan.out_dir / "verdict.json", json.dumps(verdict, indent=1))
    verdict["reports"] = str(plan.out_dir)
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


def _plan(plan: RunPlan, root: Path, log: Log) -> RunPlan:
    """The run planned for its image and cell (`plan`: those given): the deadline, the run flags the engine grants,
    the GPUs the tests get, the folder and test tree of the run."""
    image, cell, options = plan.image, plan.cell, plan.options
    tests_dir = root / "image-tests"
    cell_groups(cell, tests_dir, cell.tests)  # all of the cell's groups: one without its folder is exit 2
    site = site_folder(cell, plan.matrix, options.extra_tests, tests_dir)
    deadline_s = float(options.deadline_s or cell.validate_deadline_s)
    if image.emulated:
        # The same tests under QEMU: the matrix says how much slower (validate.emulation_factor).
        deadline_s *= cell.emulation_factor
    inventory = plan.inventory
    rule = check_cell_gpus(cell, inventory)
    if rule:
        log(f"{cell.key}: {rule}")
        inventory = dataclasses.replace(inventory, driver_rule=rule)
    seen = [{"index": g.index, "name": g.name, "driver": g.driver} for g in inventory.gpus]
    # An emulated GPU run is not a GPU run: no GPUs for containers of another architecture.
    wanted = run_flags(cell, image.labels, [] if image.emulated else seen, log)
    flags, not_granted = probe_flags(image.run_ref, wanted, log, cell.cuda)
    # The tests get GPUs only where this cell's containers were started with them (probed above).
    usable = seen if any(f.startswith("--gpus") for f in flags) else []
    gpu_problem = inventory.problem if gpu_cell(cell) and not usable else ""
    if gpu_cell(cell) and image.emulated:
        gpu_problem = f"{image.platform} runs emulated on this {platforms.host().name} runner"
    run_id = uuid.uuid4().hex[:12]
    out_dir = run_folder(root, options, cell, image)
    out_dir.mkdir(parents=True, exist_ok=True)
    # With a site folder the run is image-tests with it as one more group, staged (its hash is the test code).
    tree = out_dir / f"tests-{run_id}" if site else tests_dir
    try:
        if site:   # a copy that fails midway (a file it cannot read, Ctrl-C) is removed as well
            sitetests.stage(tests_dir, site, tree)
        groups = cell_groups(cell, tree, (*cell.tests, site.name) if site else cell.tests)
        # The test code the verdict names, as it is now: the checkout's image-tests may change while pytest runs.
        code = image_tests_hash(tree)
        if image.emulated:
            # An arm64 CPU's identity where QEMU shows this host's (buildtool.contracts.emulation).
            flags = [*flags, *emulation.run_flags(image.platform, out_dir / "cpu-sysfs")]
    except BaseException:
        _remove_staged(tree, root)
        raise
    return dataclasses.replace(plan, inventory=inventory, flags=flags, not_granted=not_granted, usable=usable,
                               gpu_problem=gpu_problem, run_id=run_id, deadline_s=deadline_s, tree=tree,
                               test_code=code, groups=groups, out_dir=out_dir)


def run_folder(root: Path, options: Options, cell: Cell, image: Resolved) -> Path:
    """The reports folder of a run: reports/<cell>/<digest12>/, the same for every run of the digest and cell."""
    return (root / options.reports / cell.name / image.digest.split(":")[-1][:12]).resolve()


def _remove_staged(tree: Path, root: Path) -> None:
    """The staged copy of the tests with the site folder (reports/<cell>/<digest12>/tests-<run_id>), however the run
    ended: it is a copy of image-tests, no record of the run. image-tests itself is never removed."""
    if tree != root / "image-tests":
        shutil.rmtree(tree, ignore_errors=True)


def _run(plan: RunPlan, root: Path, log: Log, started: float) -> RunOutcome:
    """pytest over the plan's groups, on its own bridge network, within what is left of the deadline; the run's
    containers removed however it ends."""
    options, out_dir, usable = plan.options, plan.out_dir, plan.usable
    results_path, defined_path = out_dir / "results.json", out_dir / "defined.json"
    # The reports of an earlier run of this digest and cell (the same folder): a run that dies before writing its own
    # must leave none of them to be read as its own (the JUnit XML included: CI tools read it).
    for stale in (results_path, defined_path, out_dir / "junit.xml"):
        stale.unlink(missing_ok=True)
    argv = pytest_argv(plan.tree, plan.groups, out_dir, plan.cell.key, probes_dir(out_dir, plan.run_id),
                       options.select, options.jobs)
    gpu_note = (f"{len(usable)}x {usable[0]['name']}" if usable else
                f"none usable ({plan.inventory.problem or 'CPU cell'}); GPU paths will be skipped")
    image = plan.image
    where = f"{image.platform}{', emulated' if image.emulated else ''}"
    log(f"validating {plan.ref} ({where}: {image.digest}) as {plan.cell.key}: groups {', '.join(plan.groups)}; "
        f"run flags {' '.join(plan.flags) or '(none)'}; deadline {plan.deadline_s:.0f}s; jobs {options.jobs}; "
        f"GPUs: {gpu_note}")
    started_at = dt.datetime.now(dt.UTC)
    fired: list[bool] = []
    with network.run_network(plan.run_id, log):
        try:
            rc = _run_pytest(argv, root, out_dir / "pytest.log",
                             max(1.0, plan.deadline_s - (time.monotonic() - started)), log, fired)
        finally:
            # A warning, not an error: containers left behind do not undo what the run found, nor hide the error
            # that ended it (the warning names how to remove them).
            remove_run_containers(plan.run_id, log)
            shutil.rmtree(out_dir / f"lanes-{plan.run_id}", ignore_errors=True)   # the tests' lock files (lanes.py)
    results, wrong = read_results(results_path)
    problem = deadline_problem(plan.deadline_s, bool(fired), results, rc)
    if wrong and not fired:   # the deadline, when it ran out, says why first
        problem = f"{wrong} (pytest exit {rc})"
    return RunOutcome(started_at=started_at.isoformat(timespec="milliseconds"),
                      duration_s=time.monotonic() - started, rc=rc, results=results or {"tests": []},
                      defined_path=defined_path, problem=problem)


def _reused(ref: str, matrix: Matrix, root: Path, options: Options, log: Log, platform: str | None,
            inventory: Inventory, bound: str) -> dict[str, Any] | None:
    """The verdict the registry already holds for exactly this run (buildtool.validate.reuse), as validate returns
    a verdict, with `reused` naming it; None (and why, on the log) when the tests must run. Reads the registry only:
    nothing is pulled, run, stored or written. `bound`: the matrix digest a run would record."""
    from buildtool.attest.keys import signing_key
    from buildtool.validate import reuse
    from buildtool.validate.sbomref import verdict_sbom

    image = pin(ref, platform)
    if image.host is None or image.repo is None:
        return None
    cell = find_cell(matrix, image.labels, options.cell, ref)
    check_cell_gpus(cell, inventory)       # a driver the cell cannot use fails here, reused or not
    key = signing_key(log)
    sbom, _ = verdict_sbom(image, root, lambda _line: None)
    want = reuse.Wanted(
        digest=image.digest, cell=cell.key, platform=image.platform, emulated=image.emulated,
        test_code=_test_code(cell, matrix, root, options), matrix_digest=bound,
        libraries=promised_libraries(cell), sbom=sbom,
        runner_class=reuse.runner_class(inventory.gpus, inventory.driver, inventory.cuda_driver),
        has_peer=bool(options.peers))
    trusted = reuse.reuse_trust(root, image.host, key)
    found, why = reuse.find_reusable(RegistryClient(image.host), image.repo, want, trusted)
    if found is None:
        log(f"no verdict of {image.digest} to reuse ({why}): running the image tests")
        return None
    return {**found.verdict.to_json(), "image": ref, "reused": found.artifact,
            "signed_by": trusted.describe(found.keyid), "runner_class": want.runner_class}


def _test_code(cell: Cell, matrix: Matrix, root: Path, options: Options) -> str:
    """The test code a run here would record (Verdict.test_code): the hash of the tree it would run, the cell's
    site checks staged in as one more group (contracts.sitetests) where it has them."""
    tests_dir = root / "image-tests"
    site = site_folder(cell, matrix, options.extra_tests, tests_dir)
    if site is None:
        return image_tests_hash(tests_dir)
    with tempfile.TemporaryDirectory(prefix="buildtool-reuse-") as tmp:
        return image_tests_hash(sitetests.stage(tests_dir, site, Path(tmp) / "tree"))
