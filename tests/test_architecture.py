"""The package layout shows the pipeline, and dependencies run one way: a stage imports only
the stages before it (type-checking-only imports aside), and no module imports itself back."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "buildtool"
# Earlier first. `contracts` is what stages agree on; `cli` is the thin shell over all of them.
LAYERS = ("common", "contracts", "matrix", "registry", "render", "build", "validate", "release", "launch",
          "report", "cli")


def _runtime_imports(path: Path) -> list[tuple[str, bool]]:
    """(buildtool module imported, at module level?) for every import that runs (not under TYPE_CHECKING)."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.orelse:
                    visit(sub, top)
                continue
            if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("buildtool"):
                found.append((child.module, top))
                found.extend((f"{child.module}.{a.name}", top) for a in child.names)
            elif isinstance(child, ast.Import):
                found.extend((a.name, top) for a in child.names if a.name.startswith("buildtool"))
            inner = top and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            visit(child, inner)

    visit(ast.parse(path.read_text()), True)
    return found


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_subpackage_is_a_known_stage() -> None:
    found = {p.relative_to(PACKAGE).parts[0] for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE}
    assert found == set(LAYERS)


def test_stages_import_only_earlier_stages() -> None:
    wrong = []
    for module, path in MODULES.items():
        src = _layer(module)
        if src is None:
            continue
        for imported, _ in _runtime_imports(path):
            dst = _layer(imported)
            if dst is not None and LAYERS.index(dst) > LAYERS.index(src):
                wrong.append(f"{module} imports {imported} ({src} -> {dst})")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_between_modules() -> None:
    """Imports inside functions count too: a late import is still a dependency."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        graph[module] = {m for m, _ in _runtime_imports(path) if m in MODULES and m != module}
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := walk(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := walk(module)):
            raise AssertionError("import cycle: " + " -> ".join(cycle))


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """The import walker sees what a violation looks like (a render module importing release)."""
    bad = tmp_path / "bad.py"
    bad.write_text("from buildtool.release.promote import release\n"
                   "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from buildtool.cli import app\n"
                   "def f():\n    from buildtool.report import nightly\n")
    imports = _runtime_imports(bad)
    assert ("buildtool.release.promote", True) in imports
    assert ("buildtool.report", False) in imports
    assert not any(m.startswith("buildtool.cli") for m, _ in imports)
