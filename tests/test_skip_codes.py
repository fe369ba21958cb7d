"""Skip reasons are codes declared once (buildtool.contracts.skips): every code an image test skips
with is declared, every declared code is emitted by some image test (no rule that nothing can meet),
and no image test skips with free text the release gate cannot judge."""

from __future__ import annotations

import ast
from pathlib import Path

from buildtool.contracts import skips

IMAGE_TESTS = Path(__file__).resolve().parent.parent / "image-tests"


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
