"""What the image tests are told (pure): the image's matrix cell, what it claims to contain, the
framework's facts, and the target file's contents; and the pytest command line that runs them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from buildtool.common.errors import UserError
from buildtool.contracts import busbw, frameworks, label_keys, versions
from buildtool.contracts.target import Expectations, Target
from buildtool.matrix.schema import Cell, Matrix
from buildtool.validate import network
from buildtool.validate.collect import PLUGIN, framework_info
from buildtool.validate.labels import image_standin
from buildtool.validate.run_plan import RunPlan, promised_libraries


def find_cell(matrix: Matrix, labels: dict[str, str], override: str | None, ref: str) -> Cell:
    """The image's cell: its cell label, or `override` (--cell) for an image without one. An override its label
    contradicts is refused: the signed verdict would claim a cell the image says it is not."""
    label = labels.get(label_keys.CELL)
    if override and label and override != label:
        raise UserError(f"image {ref} is labelled cell {label!r} ({label_keys.CELL}), not {override!r}: --cell is for "
                        "an image without a cell label; drop --cell, or pass the image built for that cell")
    key = override or label
    if not key:
        raise UserError(f"image {ref} has no {label_keys.CELL} label; pass --cell NAME:VERSION")
    for cell in matrix.cells:
        if cell.key == key:
            return cell
    raise UserError(f"image {ref} names cell {key!r}, which is not in the matrix; pass --cell or update matrix.yaml")


def expectations(cell: Cell, labels: dict[str, str]) -> dict[str, Any]:
    """What the image claims to contain: from its matrix cell and its labels."""
    standin = image_standin(labels)
    module = frameworks.get(cell.framework).module
    expect: dict[str, Any] = {"packages": dict(cell.packages), "standin": standin}
    try:
        # An empty label is no label (a derived image cannot delete one, only empty it).
        locked = json.loads(labels[label_keys.PACKAGES]) if labels.get(label_keys.PACKAGES) else None
    except ValueError:
        raise UserError(f"label {label_keys.PACKAGES} of the image is not JSON; rebuild it with `buildtool build`") \
            from None
    # Read as the build and release read it (contracts.image_labels): an object of text versions, or refused.
    if labels.get(label_keys.PACKAGES) and not isinstance(locked, dict):
        raise UserError(f"label {label_keys.PACKAGES} of the image is {labels[label_keys.PACKAGES][:80]!r}, not a JSON "
                        "object of package versions; rebuild it with `buildtool build`")
    if locked is not None and not all(isinstance(v, str) for v in locked.values()):
        raise UserError(f"label {label_keys.PACKAGES} of the image: every version must be text "
                        f"({labels[label_keys.PACKAGES][:80]!r}); rebuild it with `buildtool build`")
    expect["locked"] = locked
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
    if cell.libraries is not None:   # what the base's notes promise (checked on the base, not a stand-in)
        expect["libraries"] = promised_libraries(cell)
        expect["libraries_source"] = cell.libraries.source
    scheme = frameworks.get(cell.framework).local_versions
    for claim in expect["framework_claims"]:
        # A stand-in is a CPU build of the framework, whatever the cell it stands in for.
        rule = versions.expectation(claim["value"], scheme=scheme,
                                    accelerator="cpu" if standin else cell.accelerator,
                                    cuda=cell.cuda, ngc=None if standin else versions.ngc_release(cell.base))
        claim.update(local_pattern=rule.local_pattern, local_text=rule.local_text, source_dev=rule.source_dev)
    return expect


def shm_fix(cell: Cell, matrix: Matrix) -> str:
    """Where the /dev/shm promise is made, for messages that tell what to change."""
    line = f", line {cell.line}" if cell.line else ""
    return f"run.shm_size of {cell.key} in {Path(matrix.path).name}{line}"


def build_target(plan: RunPlan, baseline: dict[str, Any], probe_budget_s: float, expect: dict[str, Any]) -> Target:
    """The target file's contents: the image, its cell and claims, the run flags the engine granted,
    the GPUs the tests may use, the budgets, and what the image claims (`expect`: `expectations` and
    what its labels must say)."""
    image, cell, options, usable, inventory = plan.image, plan.cell, plan.options, plan.usable, plan.inventory
    floor = busbw.runner_floor([g["name"] for g in usable], inventory.interconnect, inventory.interconnect_problem,
                               inventory.interconnect_seen).as_target() if usable else {}
    framework = frameworks.get(cell.framework)
    return Target(
        image=image.run_ref, ref=plan.ref, digest=image.digest, cell=cell.key,
        framework=cell.framework, framework_info=framework_info(framework),
        peer_frameworks={f.name: framework_info(f) for f in frameworks.others(cell.framework)},
        accelerator=cell.accelerator, needs_gpu=cell.needs_gpu, labels=image.labels, image_env=image.env,
        run_flags=plan.flags, ulimits=dict(cell.run.ulimits), ulimits_not_granted=plan.not_granted,
        extra_run_flags=options.extra_run_flags, peer_run_flags=options.peer_run_flags,
        shm_promised=cell.run.shm_size, shm_expected_bytes=cell.run.shm_bytes, shm_fix=shm_fix(cell, plan.matrix),
        expect=Expectations.model_validate(expect),
        runner_gpus=usable,
        gpu_problem=plan.gpu_problem, cuda=cell.cuda or "",
        **floor, busbw_baseline=baseline,
        rdzv_join_timeout_s=options.join_timeout_s, missing_peer_timeout_s=options.missing_peer_timeout_s,
        ddp_master_addr=options.ddp_master_addr, ddp_timeout_s=options.ddp_timeout_s,
        peers=options.peers, run_id=plan.run_id, network=network.name_for(plan.run_id) if plan.run_id else "",
        deadline_s=plan.deadline_s, probe_budget_s=probe_budget_s,
        slowdown=cell.emulation_factor if image.emulated else 1,
    )


def check_selection(select: str | None) -> None:
    """A `-k` expression pytest would refuse is bad input (exit 2), said before anything runs: pytest would exit 4
    after the image was pulled and probed, and the verdict stored as `failed`."""
    if not select:
        return
    try:
        from _pytest.mark.expression import Expression
    except ImportError:     # another pytest: it says so itself
        return
    try:
        Expression.compile(select)
    except Exception as exc:  # noqa: BLE001 - pytest's parser raises SyntaxError (ParseError before pytest 8)
        offset = getattr(exc, "offset", None)
        column = f"at column {offset}: " if isinstance(offset, int) else ""
        raise UserError(f"-k {select!r} is not a pytest selection expression ({column}"
                        f"{getattr(exc, 'msg', None) or exc}); test names joined by and, or, not and parentheses"
                        ) from None


def pytest_argv(tests_dir: Path, groups: list[str], out_dir: Path, cell_key: str, basetemp: Path,
                select: str | None, jobs: int = 1) -> list[str]:
    """The pytest command line of a run: the cell's groups, the target file, where results go, and
    `jobs` pytest-xdist workers (a test file per worker at a time, so its fixtures run once; 1: none).
    A `-k` selection runs on one worker: it picks a few tests, and a second worker would start a second
    container and warm it up (imports, ranks) for little or nothing to overlap."""
    # --rootdir: test ids must not depend on where the target and reports are (pytest derives its
    # rootdir from every path on its command line).
    if select:
        jobs = 1
    if jobs > 1:
        # The framework's groups hold the long probes (DDP, rendezvous, profiler): handed out first, so the
        # short common checks fill the gaps at the end (xdist hands out test files in this order).
        groups = sorted(groups, key=lambda g: g == "common")
    argv = [sys.executable, "-m", "pytest", *[str(tests_dir / g) for g in groups], "--rootdir", str(tests_dir),
            "-c", str(tests_dir / "pytest.ini"), "--target",
            str(out_dir / "target.json"), "--results", str(out_dir / "results.json"), "--junitxml",
            str(out_dir / "junit.xml"), "-o", "junit_family=xunit2", "-o", f"junit_suite_name={cell_key}", "-rs", "-q",
            "-p", PLUGIN, "--defined-tests", str(out_dir / "defined.json"),
            # What every probe wrote (records, outputs, results) stays beside the verdict for a post-mortem.
            "--basetemp", str(basetemp)]
    if select:
        argv += ["-k", select]
    if jobs > 1:
        if importlib.util.find_spec("xdist") is None:
            raise UserError(f"--jobs {jobs} runs the image tests on pytest-xdist workers, which is not installed: "
                            "pip install -e '.[dev]' (requirements.lock pins it), or pass --jobs 1")
        argv += ["-n", str(jobs), "--dist", "loadscope", "--no-loadscope-reorder"]
    else:
        argv += ["-p", "no:xdist"]
    return argv
