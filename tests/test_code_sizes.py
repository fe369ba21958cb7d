"""The house stays small (issue 51): no module of buildtool/ over MAX_MODULE_LINES lines, no function over
MAX_FUNCTION_LINES lines (def line to last line, nested functions too), no function over MAX_PARAMETERS parameters
(state that travels together is one object). The one exception: a typer command's function, whose options typer
reads from its parameters (each checked by contracts.arguments before anything runs); they are named here, and
a command that is not one cannot hide among them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "buildtool"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_PARAMETERS = 8
# cli/<module>.py: the typer command functions (every parameter an option of the command).
COMMANDS = {"k8s.py": "k8s", "slurm.py": "slurm", "scaling.py": "scaling", "validate.py": "validate",
            "build.py": "build", "bundle.py": "bundle", "release_run.py": "run_release"}


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) + bool(args.vararg) + bool(args.kwarg)
    return count - (1 if args.args and args.args[0].arg in ("self", "cls") else 0)


def oversized(source: str, where: str, command: str | None = None) -> list[str]:
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{where}: {lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > MAX_FUNCTION_LINES:
            found.append(f"{where}:{node.lineno} {node.name}: {length} lines (at most {MAX_FUNCTION_LINES})")
        if parameters(node) > MAX_PARAMETERS and node.name != command:
            found.append(f"{where}:{node.lineno} {node.name}: {parameters(node)} parameters (at most "
                         f"{MAX_PARAMETERS}: pass what travels together as one object)")
    return found


def test_no_module_function_or_parameter_list_is_over_its_limit() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        command = COMMANDS.get(path.name) if path.parent.name == "cli" else None
        found += oversized(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), command)
    assert not found, "over the size limits (split them):\n" + "\n".join(found)


def test_the_commands_named_are_typer_commands_and_the_checks_can_fail() -> None:
    for module, name in COMMANDS.items():
        tree = ast.parse((PACKAGE / "cli" / module).read_text(encoding="utf-8"))
        assert any(isinstance(n, ast.FunctionDef) and n.name == name for n in ast.walk(tree)), (module, name)
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    assert oversized(f"def f(a, b, c, d, e, f, g, h, i):\n{body}\n", "m.py") == [
        "m.py:1 f: 81 lines (at most 80)",
        "m.py:1 f: 9 parameters (at most 8: pass what travels together as one object)"]
    assert oversized("class A:\n    def f(self, a, b, c, d, e, f, g, h):\n        pass\n", "m.py") == []
    assert oversized("x = 1\n" * 601, "m.py") == ["m.py: 601 lines (at most 600)"]
