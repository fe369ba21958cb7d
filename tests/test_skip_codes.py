"""Skip reasons are codes declared once (buildtool.contracts.skips): every code an image test skips
with is declared, every declared code is emitted by some image test (no rule that nothing can meet),
and no image test skips with free text the release gate cannot judge."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from buildtool.contracts import skips

IMAGE_TESTS = Path(__file__).resolve().parent.parent / "image-tests"


@functools.cache   # parsed once per process: every test here reads them all, and none changes a tree
def _modules() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text()) for p in IMAGE_TESTS.rglob("*.py")}


def _emitted() -> dict[str, list[str]]:
    """Declared-code names (`skips.X`) passed to harness.skip, with where."""
    found: dict[str, list[str]] = {}
    for path, tree in _modules().items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "skip"
                    and node.args and isinstance(node.args[0], ast.Attribute)
                    and isinstance(node.args[0].value, ast.Name) and node.args[0].value.id == "skips"):
                found.setdefault(node.args[0].attr, []).append(f"{path.relative_to(IMAGE_TESTS)}:{node.lineno}")
    return found


def test_every_skip_an_image_test_emits_is_a_declared_code() -> None:
    declared = {name for name, value in vars(skips).items() if isinstance(value, skips.SkipCode)}
    assert set(_emitted()) <= declared
    assert {getattr(skips, name).code for name in declared} == set(skips.CODES)


def test_every_declared_code_is_emitted_by_an_image_test() -> None:
    emitted = {getattr(skips, name).code for name in _emitted()}
    assert set(skips.CODES) - emitted == set(), "a skip rule no image test can meet"


def test_no_image_test_skips_without_a_code() -> None:
    """pytest.skip / skipif / importorskip carry prose only; harness.skip is the one door."""
    raw = []
    for path, tree in _modules().items():
        functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)]
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("skip", "skipif", "importorskip", "xfail") \
                    and ast.unparse(node.value) in ("pytest", "pytest.mark"):
                inside = [f.name for f in functions if f.lineno <= node.lineno <= (f.end_lineno or f.lineno)]
                raw.append(f"{path.relative_to(IMAGE_TESTS)}:{'.'.join(inside) or node.lineno}")
    assert raw == ["harness.py:skip"], raw


def test_a_skip_message_round_trips() -> None:
    text = skips.skip_text(skips.ULIMIT_NOT_GRANTED, "engine refused", "memlock")
    assert skips.parse_skip(text) == ("ulimit-not-granted", "memlock", "engine refused")
    assert skips.parse_skip("free text") == ("", "", "free text")


@pytest.mark.parametrize("subject", ["a]b", "a b", "memlock\n", "a:b"])
def test_a_subject_a_skip_message_cannot_carry_is_refused_when_written(subject: str) -> None:
    """A subject is what a waiver (`--accept-skip CODE:SUBJECT`) names: one it cannot name is refused when the skip
    is written, never read back as another (`a]b` read back as subject 'a', text 'b] ...')."""
    with pytest.raises(ValueError, match=r"^skip subject .* is not one a waiver can name"):
        skips.skip_text(skips.ULIMIT_NOT_GRANTED, "not granted", subject)


def _gpu_marked(function: ast.FunctionDef) -> bool:
    return any("mark.gpu" in ast.unparse(d) for d in function.decorator_list)


def _tests_emitting() -> list[tuple[str, str, bool, str]]:
    """(code name, test id prefix `file::function`, marked gpu, where) for every skip an image test can
    emit: from its own body, or from a fixture it asks for (a fixture of its module, or of a conftest).
    A skip in a pytest hook is returned with the test id `<hook>`."""
    modules = _modules()
    functions = {path: [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)] for path, tree in modules.items()}
    fixtures: dict[tuple[Path, str], ast.FunctionDef] = {}
    for path, found in functions.items():
        for f in found:
            if any("fixture" in ast.unparse(d) for d in f.decorator_list):
                fixtures[(path, f.name)] = f
    out = []
    for name, places in _emitted().items():
        for place in places:
            file, line = place.rsplit(":", 1)
            path = IMAGE_TESTS / file
            inside = [f for f in functions[path] if f.lineno <= int(line) <= (f.end_lineno or f.lineno)]
            outer = inside[0] if inside else None
            assert outer is not None, f"{place}: a skip outside any function"
            if outer.name.startswith("test_"):
                out.append((name, f"{file}::{outer.name}", _gpu_marked(outer), place))
            elif outer.name.startswith("pytest_"):
                out.append((name, f"<{outer.name}>", False, place))
            else:
                assert (path, outer.name) in fixtures, f"{place}: a skip in {outer.name}, neither test nor fixture"
                users = [(p, f) for p, fs in functions.items() for f in fs if f.name.startswith("test_")
                         and outer.name in [a.arg for a in f.args.args]
                         and (p == path or path.name == "conftest.py")]
                assert users, f"{place}: fixture {outer.name} is used by no test"
                out += [(name, f"{p.relative_to(IMAGE_TESTS)}::{f.name}", _gpu_marked(f), place) for p, f in users]
    return out


def test_every_emitted_code_is_emitted_only_from_tests_it_is_allowed_for() -> None:
    """Issue 20, hole 4: the gate refuses a code on a test that may not carry it, so the image tests
    must never emit one there: every test that can skip with a code (itself or through a fixture it
    asks for) is among those the code declares, and GPU codes only from tests marked gpu. A pytest
    hook may emit only GPU codes, and only for items it finds marked gpu."""
    wrong = []
    for name, test_id, gpu, place in _tests_emitting():
        code = getattr(skips, name)
        if test_id.startswith("<"):
            hook = next(f for f in ast.walk(ast.parse((IMAGE_TESTS / place.rsplit(":", 1)[0]).read_text()))
                        if isinstance(f, ast.FunctionDef) and f"<{f.name}>" == test_id)
            if not (code.gpu_only and "get_closest_marker('gpu')" in ast.unparse(hook)):
                wrong.append(f"{place}: {code.code} in hook {test_id}")
        elif not code.allows(test_id, gpu):
            wrong.append(f"{place}: {code.code} from {test_id} (gpu={gpu}); it may come only from {code.who()}")
    assert wrong == []
    assert {t for _, t, _, _ in _tests_emitting()} >= {
        "pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw",                       # in the test itself
        "common/test_cross_tensorboard.py::test_other_tensorboard_reads_our_events",  # through a fixture
        "common/test_contents.py::test_gpus_visible"}                                 # through a conftest fixture
