"""The verdict: what validate says about one image digest, and what release and report read.

Typed here once; `validate` builds it, the registry stores it by digest, `release` gates on
it and `report` shows it. Every reader parses a verdict once, where it enters (a signed
statement, a file), with `parse_verdict`, and reads the typed object's attributes from there on;
what does not parse is a `VerdictError` naming where, the field and what is wrong, never a default.

Schemas (`schema`): validate writes SCHEMA; readers accept READ_SCHEMAS, the current one and the two before
it, and refuse any other number naming it; release takes only the current one. What each schema adds is in
docs/release-trust.md's table of verdict schemas (4: `sbom`, or `sbom_problem` saying why no signed SBOM
verified, exactly one of the two; 5: `platform` and `emulated`; 6: `matrix_digest` and `libraries`, what the
run was bound to, issue 48).

The result (`derive_result`): `failed` when a test failed, pytest did not succeed, or nothing
passed; `incomplete` when nothing failed but the verdict does not cover the cell: a defined test
neither ran nor was deselected (the run stopped early), a selection (-k) removed tests, or a GPU
cell's GPU tests (marked `gpu`) did not all pass, i.e. no GPU could be used; `passed` otherwise. A GPU cell
validated where no GPU could be used is therefore never `passed`, whatever the options.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from buildtool.common.documents import plural
from buildtool.contracts import platforms

SCHEMA: Literal[6] = 6
# The report reads a history of nights; release needs SCHEMA's binding (buildtool.release.gates.binding_problems).
READ_SCHEMAS = (4, 5, 6)
SBOM_DIGEST_RE = r"^sha256:[0-9a-f]{64}$"
Result = Literal["passed", "failed", "incomplete"]
TestOutcome = Literal["passed", "failed", "skipped"]


def when(value: str) -> dt.datetime | None:
    """A signed `started` time, None when it does not parse as an ISO 8601 time: the one parse every reader that
    orders verdicts by time uses (release, verify, the report, validate's bus-bandwidth window). In UTC: a time whose
    offset takes it past year 9999 or before year 1 (9999-12-31T23:00:00-05:00) places nowhere and is None too."""
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        return parsed.astimezone(dt.UTC) if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    except (ValueError, OverflowError):
        return None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)   # JSON's NaN and Infinity are no times or counts


class TestResult(_Model):
    id: str                      # `<group>/<file>::<test>[param]`, relative to image-tests/, never to a rootdir
    group: str                   # the image-tests group (first path part of the id)
    result: TestOutcome
    duration_s: float = 0.0
    message: str = ""            # first line: the cause, as the console prints it
    skip_code: str = ""          # contracts.skips code of a skip ("" when the skip carried none)
    skip_subject: str = ""
    skip_reason: str = ""        # the skip's text, without its code
    gpu: bool = False            # marked `gpu`: it needs a GPU to run


class Gpu(_Model):
    index: str
    name: str
    driver: str = ""
    memory_mib: int | None = None


class Runner(_Model):
    hostname: str
    gpu_runner: bool = False         # declared a GPU runner (--require-gpu or DL_IMAGES_REQUIRE_GPU)
    gpus: list[Gpu] = Field(default_factory=list)   # what nvidia-smi lists on the host
    driver: str = ""                 # NVIDIA driver version
    cuda_driver: str = ""            # CUDA version the driver supports
    driver_rule: str = ""            # the rule that admitted the driver for the cell (contracts.driver_rules)
    interconnect: str = ""           # NVLink or PCIe between the GPUs (nvidia-smi topo -m); "" unknown
    # Whether the cell's containers got the GPUs (probed with the engine); None: not asked (CPU cell).
    gpus_usable: bool | None = None
    gpu_problem: str = ""            # why GPUs could not be used, when they could not


class ColdImport(_Model):
    module: str                      # a module, or "tensorboard_plugins" (every TensorBoard plugin entry point)
    seconds: float                   # the import alone, timed inside the image
    read_bytes: int = 0              # bytes it read from storage (0 when the page cache held everything)
    rchar: int = 0                   # bytes it read through read() calls, page cache included
    error: str = ""                  # why the import failed (the checks that need the module name it too)


class ColdStart(_Model):
    """The first import of the framework (and TensorBoard) in a new container of the image, before
    any check: what a cold page cache costs (a fresh runner that just pulled the image)."""

    image: str = ""
    imports: list[ColdImport] = Field(default_factory=list)
    seconds: float = 0.0             # the whole probe, Python start-up included
    cpu_s: float = 0.0
    read_bytes: int = 0              # everything its processes read from storage
    error: str = ""                  # why the probe did not end cleanly ('' when it did)


class Selection(_Model):
    expression: str | None = None    # pytest -k, when one was given
    deselected: list[str] = Field(default_factory=list)


class Verdict(_Model):
    schema_: Literal[4, 5, 6] = Field(SCHEMA, alias="schema")
    digest: str
    image: str
    cell: str
    result: Result
    started: str
    duration_s: float
    test_code: str                   # sha256 over image-tests/
    runner: Runner
    groups: list[str]
    defined_tests: list[str]         # every test the cell's groups define, before any selection
    gpu_tests: list[str] = Field(default_factory=list)   # the defined tests marked `gpu`
    incomplete: list[str] = Field(default_factory=list)  # why the result is `incomplete` (else empty)
    framework_version: str = ""      # the framework's __version__ in the image, as it reports it
    cold_start: ColdStart | None = None  # the first import in a new container (None: it never ran)
    selection: Selection = Field(default_factory=Selection)
    run_flags: list[str] = Field(default_factory=list)
    pytest_exit: int
    tests: list[TestResult]
    figures: dict[str, Any] = Field(default_factory=dict)
    problem: str = ""                # why the run did not end by itself (deadline ran out, interrupted)
    deadline_s: float = 0.0          # the image's validation deadline (matrix validate.deadline_s or --deadline)
    sbom: str = ""                   # schema 4: digest of the signed SBOM validate read ("" none: sbom_problem)
    sbom_problem: str = ""           # schema 4: why no signed SBOM verified ("" when `sbom` names one)
    platform: str = ""               # schema 5: os/arch of the manifest validated (contracts.platforms)
    emulated: bool = False           # schema 5: it ran under QEMU on a runner of another architecture
    matrix_digest: str = ""          # schema 6: sha256 of the matrix file validate read
    libraries: dict[str, str] = Field(default_factory=dict)   # schema 6: the NVIDIA library promises checked

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    @model_validator(mode="after")
    def _fields(self) -> Verdict:
        if self.schema_ < 5 and (self.platform or self.emulated):
            raise ValueError(f"`platform` and `emulated` are schema-5 fields, not of schema {self.schema_}")
        if self.schema_ >= 5:
            try:
                platforms.get(self.platform)
            except platforms.UnknownPlatform as exc:
                raise ValueError(f"`platform`: {exc}") from None
        if self.schema_ < 6 and (self.matrix_digest or self.libraries):
            raise ValueError(f"`matrix_digest` and `libraries` are schema-6 fields, not of schema {self.schema_}")
        if self.schema_ >= 6 and not re.fullmatch(SBOM_DIGEST_RE, self.matrix_digest):
            raise ValueError(f"`matrix_digest` {self.matrix_digest[:80]!r} is not a sha256:<64 hex> digest")
        if self.sbom and not re.fullmatch(SBOM_DIGEST_RE, self.sbom):
            raise ValueError(f"`sbom` {self.sbom[:80]!r} is not a sha256:<64 hex> digest")
        if where := non_finite(self.figures, "figures"):
            raise ValueError(f"{where}, which JSON cannot carry (a figure is a finite number)")
        if bool(self.sbom) == bool(self.sbom_problem):
            raise ValueError("exactly one of `sbom` (the SBOM's digest) and `sbom_problem` (why there is none) "
                             "is set in a schema-4 verdict")
        return self

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def counts(self) -> dict[str, int]:
        return {k: sum(t.result == k for t in self.tests) for k in ("passed", "failed", "skipped")}


def non_finite(value: Any, path: str) -> str:
    """`` `<path>` is nan `` for the first NaN or Infinity in `value` (JSON as Python reads it, which takes both), where
    none: ''. Iterative: no RecursionError, however deep the figure is nested."""
    stack = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"`{where[:200]}` is {item!r}"
        if isinstance(item, dict):
            stack += reversed([(f"{where}.{key}", v) for key, v in item.items()])
        elif isinstance(item, list):
            stack += reversed([(f"{where}[{i}]", v) for i, v in enumerate(item)])
    return ""


# A run's probes folder, reports/<cell>/<digest12>/probes (pytest's basetemp): the containers of the image under test
# write there (/imagetests-out and the shared folder, world-writable) and earlier runs' files outlive them.
PROBES_DIR = "probes"


def verdict_paths(folder: Path) -> list[Path]:
    """Every verdict file under `folder`, in path order: validate writes <cell>/<digest>/verdict.json, `buildtool
    report --fetch` <cell>.verdict.json. None under a probes folder: a verdict there is the tested image's word,
    and the busbw baseline and the report would take it for a night of ours."""
    found: list[Path] = []
    for top, dirs, files in os.walk(folder):   # symlinked folders are not followed, as rglob did not
        dirs[:] = [d for d in dirs if d != PROBES_DIR]
        found += [Path(top, f) for f in files if f == "verdict.json" or f.endswith(".verdict.json")]
    return sorted(found)


class VerdictError(ValueError):
    """A verdict that does not parse; the message names where, the field (or schema number) and why."""


def _cause(error: Any) -> str:
    kind, path = error["type"], ""
    for part in error["loc"]:     # pydantic's location -> `tests[0].result`
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    path = path or "(the verdict)"
    if kind == "missing":
        return f"`{path}` is missing"
    if kind == "extra_forbidden":
        return f"`{path}` is not a field of this schema"
    if kind == "value_error":     # a check across fields (Verdict._fields)
        return str(error["msg"]).removeprefix("Value error, ")
    return f"`{path}`: {error['msg'][0].lower()}{error['msg'][1:]} (got {type(error['input']).__name__} " \
           f"{str(error['input'])[:40]!r})"


def parse_verdict(data: Any, where: str) -> Verdict:
    """A verdict (JSON-decoded) -> Verdict, strictly: no coercion ("1" is not 1), no unknown field,
    a schema number in READ_SCHEMAS. Anything else is a VerdictError naming `where` and the cause."""
    if not isinstance(data, dict):
        raise VerdictError(f"{where}: not a verdict (a JSON {type(data).__name__}, not an object)")
    schema = data.get("schema")
    if "schema" not in data:
        raise VerdictError(f"{where}: not a verdict (no schema number)")
    if type(schema) is not int or schema not in READ_SCHEMAS:    # 6.0 and True equal numbers but are none
        raise VerdictError(f"{where}: unsupported verdict schema {schema!r} (this toolkit reads schemas "
                           f"{', '.join(map(str, READ_SCHEMAS[:-1]))} and {READ_SCHEMAS[-1]})")
    try:
        return Verdict.model_validate(data, strict=True)
    except ValidationError as exc:
        errors = exc.errors()
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        raise VerdictError(f"{where}: malformed schema-{schema} verdict: "
                           + "; ".join(_cause(e) for e in errors[:3]) + more) from None


def split_size(data: Any, where: str) -> tuple[Any, int | None]:
    """A verdict file's JSON without the image size `report --fetch` adds to it (`size_bytes`), and that size: an
    integer or null, anything else a VerdictError naming `where`. The one rule of every reader of verdict files
    (the report, validate's bus-bandwidth baseline), so that a file one refuses the other does not use."""
    if not isinstance(data, dict) or "size_bytes" not in data:
        return data, None
    data = dict(data)
    size = data.pop("size_bytes")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool)):
        raise VerdictError(f"{where}: `size_bytes` (the image size the report adds) must be an integer or null, "
                           f"not {size!r}")
    return data, size


def recorded_failure(verdict: Verdict, subject: str = "it") -> str:
    """Why a verdict that does not say `failed` failed by its own record ("" when it did not, or says so): validate
    says `failed` whenever a test failed, pytest exited non-zero or the run did not end by itself
    (contracts.verdict.derive_result, validate.run_plan.make_verdict), so a `passed` that its results contradict is
    no pass, whoever signed it. `subject`: what the reason calls the verdict."""
    if verdict.result == "failed":
        return ""
    failed = [t.id for t in verdict.tests if t.result == "failed"]
    if failed:
        return f"{subject} says {verdict.result}, but {len(failed)} test(s) failed: {', '.join(failed[:3])}"
    if verdict.pytest_exit != 0:
        return f"{subject} says {verdict.result}, but pytest exited with {verdict.pytest_exit}"
    if verdict.problem:
        return f"{subject} says {verdict.result}, but the run did not end by itself ({verdict.problem[:200]})"
    return ""


def gpu_pass_problem(verdict: Verdict) -> str:
    """Why a `passed` verdict of a GPU cell contradicts what it records of its GPU tests ("" when it does not): a GPU
    cell (validate records whether its containers got GPUs, `runner.gpus_usable`, for a GPU cell only) is `passed`
    only when every GPU test passed and nothing ran emulated (derive_result). For the readers of verdicts that are
    not validate's own run (the report, verify): never a GPU pass that no GPU ran."""
    if verdict.result != "passed" or verdict.runner.gpus_usable is None:
        return ""
    if verdict.emulated:
        return "a GPU cell's tests ran under emulation (an emulated GPU run is not a GPU run)"
    outcome = {t.id: t.result for t in verdict.tests}
    gpu_tests = dict.fromkeys([*verdict.gpu_tests, *(t.id for t in verdict.tests if t.gpu)])   # listed or marked
    if not gpu_tests:
        return "it records no GPU test of this GPU cell (the cell needs a GPU)"
    not_on_gpu = [i for i in gpu_tests if outcome.get(i) != "passed"]
    if not_on_gpu:
        why = f" ({verdict.runner.gpu_problem})" if verdict.runner.gpu_problem else ""
        return (f"{len(not_on_gpu)} GPU test(s) of this GPU cell did not pass on a GPU{why}: "
                + ", ".join(i.rsplit("::", 1)[-1] for i in not_on_gpu[:3]))
    return ""


def derive_result(pytest_exit: int, tests: list[dict[str, Any]], *, defined: list[str], selection: Selection,
                  gpu_cell: bool, gpu_tests: list[str], gpu_problem: str = "",
                  emulated: bool = False) -> tuple[Result, list[str]]:
    """(result, reasons): see the module docstring. Reasons explain `failed` and `incomplete`."""
    deselected, expression = selection.deselected, selection.expression
    outcome = {str(t["id"]): t["result"] for t in tests}
    failed = [i for i, r in outcome.items() if r not in ("passed", "skipped")]   # "running": interrupted
    if failed:
        return "failed", [f"{len(failed)} test(s) failed: {', '.join(failed[:3])}"]
    if pytest_exit != 0:
        return "failed", [f"pytest exited with {pytest_exit}"]
    if "passed" not in outcome.values():
        return "failed", ["no test passed (skips never count as passes)"]
    reasons = []
    missing = [i for i in defined if i not in outcome and i not in deselected]
    if missing or not defined:
        # The run stopped early (a crash, a timeout), or nothing says what the groups define.
        reasons.append(f"{len(missing)} defined test(s) neither ran nor were deselected: {', '.join(missing[:3])}"
                       if missing else "no list of the tests the cell's groups define")
    if deselected:
        reasons.append(f"{len(deselected)} of the cell's {plural(len(defined), 'test')} deselected"
                       + (f" by -k {expression!r}" if expression else ""))
    if gpu_cell and emulated:
        reasons.append("a GPU cell's tests ran under emulation (an emulated GPU run is not a GPU run); validate "
                       "this platform on a native runner of its architecture")
    elif gpu_cell:
        not_on_gpu = [i for i in gpu_tests if outcome.get(i) != "passed"]
        if not_on_gpu:
            why = f" ({gpu_problem})" if gpu_problem else ""
            reasons.append(f"{len(not_on_gpu)} GPU test(s) of this GPU cell did not pass on a GPU{why}: "
                           + ", ".join(i.rsplit("::", 1)[-1] for i in not_on_gpu))
        if not gpu_tests:
            reasons.append("the cell needs a GPU but its groups define no GPU test")
    return ("incomplete", reasons) if reasons else ("passed", [])
