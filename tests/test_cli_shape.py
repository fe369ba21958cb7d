"""The CLI stays thin: parse, call, print. No function in buildtool/cli/*.py runs past MAX_LINES lines
(the def line through its last line; decorators not counted), so a command whose logic grows has to
move it to the stage it belongs to, or at least into a named helper."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "buildtool" / "cli"
MAX_LINES = 60


def long_functions(source: str, where: str, limit: int = MAX_LINES) -> list[str]:
    """`where:line name: N lines` for every function (nested ones too) longer than LIMIT lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > limit:
                found.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    return sorted(found)


def test_no_cli_function_is_longer_than_the_limit() -> None:
    files = sorted(CLI.glob("*.py"))
    assert files, f"no modules under {CLI}"
    long = [line for path in files
            for line in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not long, f"functions over {MAX_LINES} lines in buildtool/cli (split them):\n" + "\n".join(long)


def test_the_check_counts_nested_functions_from_def_to_last_line() -> None:
    """Commands are defined inside register(): the walk reaches them; the decorator line does not count."""
    body = "\n".join(f"        x{i} = {i}" for i in range(58))
    source = f"def register(app):\n    @app.command()\n    def cmd():\n{body}\n"
    assert long_functions(source, "m.py", 59) == ["m.py:1 register: 61 lines"]
    assert long_functions(source, "m.py", 58) == ["m.py:1 register: 61 lines", "m.py:3 cmd: 59 lines"]
    assert long_functions(source, "m.py", 61) == []
