"""The verdict as a typed contract: parsed once where it enters, strictly, with a schema number that
readers check (the current one and the two before are read); no raw dict reads of it downstream."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from buildtool.attest.verdict_statement import read_statement, statement
from buildtool.contracts import verdict as contract
from buildtool.contracts.verdict import READ_SCHEMAS, SCHEMA, VerdictError, parse_verdict
from buildtool.matrix.loader import load_matrix
from tests.signing import verdict

REPO = Path(__file__).resolve().parent.parent
CPU = next(c for c in load_matrix(REPO / "matrix.yaml", REPO / "templates").cells if c.key == "pytorch-cpu:2.13")
D1 = "sha256:" + "1" * 64
COLD = {"image": "x", "seconds": 56.0, "cpu_s": 9.1, "read_bytes": 1_700_000_000,
        "imports": [{"module": "torch", "seconds": 54.7, "read_bytes": 1_650_000_000, "rchar": 0, "error": ""}],
        "error": ""}


def refused(body: object) -> str:
    with pytest.raises(VerdictError) as info:
        parse_verdict(body, "where.json")
    return str(info.value)


def test_validate_writes_the_current_schema_and_readers_read_it_and_the_two_before() -> None:
    assert SCHEMA == 6 and READ_SCHEMAS == (4, 5, 6)
    typed = parse_verdict(verdict(CPU, D1, cold_start=COLD, platform="linux/arm64", emulated=True), "x")
    assert typed.schema_ == 6 and typed.sbom.startswith("sha256:")
    assert (typed.platform, typed.emulated) == ("linux/arm64", True)
    assert typed.matrix_digest == "sha256:" + "c" * 64 and typed.libraries == {}
    assert typed.cold_start is not None and typed.cold_start.imports[0].module == "torch"
    assert parse_verdict(typed.to_json(), "again") == typed            # what validate writes reads back as it was
    assert json.loads(statement("r", D1, typed.to_json()))["predicateType"].endswith("/verdict/v6")


def test_a_schema_4_verdict_is_read_and_names_no_platform() -> None:
    body = verdict(CPU, D1, schema=4, cold_start=COLD)
    typed = parse_verdict(body, "x")
    assert typed.schema_ == 4 and typed.sbom.startswith("sha256:") and typed.platform == ""
    assert read_statement(statement("r", D1, body), D1) == typed


def test_a_schema_3_verdict_is_no_longer_read() -> None:
    assert "unsupported verdict schema 3 (this toolkit reads schemas 4, 5 and 6)" in refused(
        {**verdict(CPU, D1, schema=4), "schema": 3})


@pytest.mark.parametrize(("change", "cause"), [
    ({"platform": "linux/riscv64"}, "`platform`: unknown platform 'linux/riscv64'"),
    ({"platform": ""}, "`platform`: unknown platform ''"),
    ({"schema": 4}, "`platform` and `emulated` are schema-5 fields, not of schema 4"),
])
def test_the_platform_fields_are_checked_naming_the_cause(change: dict, cause: str) -> None:
    """Schema 5 names the platform manifest's os/arch, one the platform table knows; older schemas have none."""
    message = refused({**verdict(CPU, D1), **change})
    assert cause in message, message


@pytest.mark.parametrize(("change", "cause"), [
    ({"sbom": ""}, "exactly one of `sbom` (the SBOM's digest) and `sbom_problem` (why there is none) is set"),
    ({"sbom_problem": "none attached"}, "exactly one of `sbom`"),
    ({"sbom": "sha256:abc"}, "`sbom` 'sha256:abc' is not a sha256:<64 hex> digest"),
])
def test_the_sbom_fields_are_checked_naming_the_cause(change: dict, cause: str) -> None:
    """Schema 4 names the signed SBOM validate read, or says why there was none: never both, never neither."""
    message = refused({**verdict(CPU, D1), **change})
    assert cause in message, message


@pytest.mark.parametrize(("body", "cause"), [
    ({**verdict(CPU, D1), "schema": 7},
     "where.json: unsupported verdict schema 7 (this toolkit reads schemas 4, 5 and 6)"),
    ({**verdict(CPU, D1), "schema": 2}, "where.json: unsupported verdict schema 2 "),
    ({**verdict(CPU, D1), "schema": 1}, "where.json: unsupported verdict schema 1 "),
    ({**verdict(CPU, D1), "schema": "5"}, "where.json: unsupported verdict schema '5'"),
    ({**verdict(CPU, D1), "schema": True}, "where.json: unsupported verdict schema True"),
    ({k: v for k, v in verdict(CPU, D1).items() if k != "schema"}, "where.json: not a verdict (no schema number)"),
    ([verdict(CPU, D1)], "where.json: not a verdict (a JSON list, not an object)"),
])
def test_an_unknown_or_absent_schema_number_is_refused_naming_it(body: object, cause: str) -> None:
    assert cause in refused(body)


@pytest.mark.parametrize(("change", "cause"), [
    ({"started": None}, "`started`: input should be a valid string (got NoneType 'None')"),
    ({"pytest_exit": "0"}, "`pytest_exit`: input should be a valid integer (got str '0')"),     # strict: no coercion
    ({"duration_s": True}, "`duration_s`: input should be a valid number (got bool 'True')"),
    ({"result": "pass"}, "`result`: input should be 'passed', 'failed' or 'incomplete'"),
    ({"runner": {"hostname": "ci", "gpus_usable": "yes"}}, "`runner.gpus_usable`: input should be a valid boolean"),
    ({"tests": [{"id": "common/a.py::t", "group": "common", "result": "passed", "gpu": 1}]},
     "`tests[0].gpu`: input should be a valid boolean (got int '1')"),
    ({"selection": {"expression": None, "deselected": "common/a.py::t"}}, "`selection.deselected`: input should be"),
    ({"cold_start": {"imports": [{"module": "torch"}]}}, "`cold_start.imports[0].seconds` is missing"),
    ({"verdict": "passed"}, "`verdict` is not a field of this schema"),
])
def test_a_field_of_the_wrong_type_or_unknown_is_refused_naming_it(change: dict, cause: str) -> None:
    message = refused({**verdict(CPU, D1), **change})
    assert message.startswith("where.json: malformed schema-6 verdict: ") and cause in message, message


@pytest.mark.parametrize(("change", "cause"), [
    ({"duration_s": float("nan")}, "`duration_s`: input should be a finite number (got float 'nan')"),
    ({"deadline_s": float("inf")}, "`deadline_s`: input should be a finite number (got float 'inf')"),
    ({"tests": [{"id": "common/a.py::t", "group": "common", "result": "passed", "duration_s": float("-inf")}]},
     "`tests[0].duration_s`: input should be a finite number (got float '-inf')"),
    ({"cold_start": {"imports": [{"module": "torch", "seconds": float("nan")}]}},
     "`cold_start.imports[0].seconds`: input should be a finite number"),
])
def test_a_time_of_nan_or_infinity_is_refused_naming_it(change: dict, cause: str) -> None:
    """JSON's NaN and Infinity (json.loads reads them) passed as times, so the report showed `nan min` as a
    verdict's duration and `inf s` as a check's; now a VerdictError names the field."""
    message = refused({**verdict(CPU, D1), **change})
    assert message.startswith("where.json: malformed schema-6 verdict: ") and cause in message, message


@pytest.mark.parametrize("field", ["digest", "cell", "result", "started", "test_code", "runner", "groups",
                                   "defined_tests", "pytest_exit", "tests"])
def test_a_verdict_missing_a_required_field_is_refused_naming_it(field: str) -> None:
    body = verdict(CPU, D1)
    del body[field]
    assert f"`{field}` is missing" in refused(body)


def test_errors_beyond_three_are_counted_not_dropped() -> None:
    message = refused({"schema": 4})
    assert "`digest` is missing; `image` is missing; `cell` is missing (and " in message and "more)" in message


# -- no raw reads of a verdict downstream of where it is parsed ---------------------------------------

FIELDS = {f.alias or name for model in (contract.Verdict, contract.TestResult, contract.Runner, contract.Gpu,
                                        contract.ColdStart, contract.ColdImport, contract.Selection)
          for name, f in model.model_fields.items()}
# OCI descriptors (a manifest's config and layers) have a `digest` too, and an index's entries (`child`,
# `descriptor`) a `platform`: not verdicts.
NOT_VERDICTS = {("config", "digest"), ("layer", "digest"), ("child", "platform"), ("descriptor", "platform")}


def raw_verdict_reads(source: str) -> list[str]:
    """Every `x.get("<a verdict field>")` in `source`, as `x.get("field")`, except OCI descriptors."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in FIELDS
                and (ast.unparse(node.func.value), node.args[0].value) not in NOT_VERDICTS):
            found.append(f"{ast.unparse(node.func.value)}.get({node.args[0].value!r}) line {node.lineno}")
    return found


def test_the_scan_finds_a_raw_verdict_read() -> None:
    found = raw_verdict_reads('v = verdict.get("result")\nr = (v.get("runner") or {}).get("hostname")')
    assert sorted(found) == ["v.get('runner') line 2", "v.get('runner') or {}.get('hostname') line 2",
                             "verdict.get('result') line 1"]
    assert raw_verdict_reads('d = layer.get("digest")') == []
    assert raw_verdict_reads('p = child.get("platform")') == []      # an index entry's os/arch
    assert raw_verdict_reads('p = verdict.get("platform")') == ["verdict.get('platform') line 1"]


@pytest.mark.parametrize("package", ["release", "report"])
def test_release_and_report_read_verdicts_only_through_the_typed_model(package: str) -> None:
    """Gates, promotion, notes and the report get a Verdict (parsed where it entered); a `.get` of a
    verdict field on a dict means a consumer went back to raw JSON."""
    found = {path.name: reads for path in sorted((REPO / "buildtool" / package).glob("*.py"))
             if (reads := raw_verdict_reads(path.read_text(encoding="utf-8")))}
    assert found == {}



@pytest.mark.parametrize(("change", "cause"), [
    ({"matrix_digest": ""}, "`matrix_digest` '' is not a sha256:<64 hex> digest"),
    ({"matrix_digest": "sha256:abc"}, "`matrix_digest` 'sha256:abc' is not a sha256:<64 hex> digest"),
    ({"schema": 5, "matrix_digest": "sha256:" + "c" * 64}, "`matrix_digest` and `libraries` are schema-6 fields"),
    ({"schema": 5, "libraries": {"cudnn": "9.7.0.66"}}, "`matrix_digest` and `libraries` are schema-6 fields"),
])
def test_the_binding_fields_are_checked_naming_the_cause(change: dict, cause: str) -> None:
    """Schema 6 binds the verdict to the matrix it read and the library promises it checked (issue 48)."""
    assert cause in refused({**verdict(CPU, D1), **change})


@pytest.mark.parametrize(("figures", "cause"), [
    ({"busbw_GBps": float("nan")}, "`figures.busbw_GBps` is nan, which JSON cannot carry"),
    ({"allreduce_busbw": {"sizes": [{"busbw_GBps": 1.0}, {"busbw_GBps": float("inf")}]}},
     "`figures.allreduce_busbw.sizes[1].busbw_GBps` is inf, which JSON cannot carry"),
])
def test_a_figure_of_nan_or_infinity_is_refused_naming_it(figures: dict, cause: str) -> None:
    """Figures are free-form (what the image's tests measured) and JSON's NaN and Infinity passed into them: the
    report showed `nan` as a figure, and the signed statement carried a NaN that JSON.parse (tools/sigstore-verify,
    any other verifier) refuses. Now a VerdictError names the figure."""
    message = refused({**verdict(CPU, D1), "figures": figures})
    assert message.startswith("where.json: malformed schema-6 verdict: ") and cause in message, message
