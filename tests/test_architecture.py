"""The package layout shows the pipeline, and dependencies run one way: a stage imports only
the stages before it (type-checking-only imports included: a type a lower stage needs belongs below it,
or is a Protocol in `contracts` that the real class satisfies), and no module imports itself back."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "buildtool"
# Earlier first. `contracts` is what stages agree on; `cli` is the thin shell over all of them.
LAYERS = ("common", "contracts", "matrix", "registry", "attest", "sbom", "render", "imagebuild", "validate",
          "release", "launch", "report", "cli")


def _runtime_imports(path: Path, typing: bool = False) -> list[tuple[str, bool]]:
    """(buildtool module imported, at module level?) for every import that runs; with `typing`, also those
    under `if TYPE_CHECKING:` (what mypy reads is a dependency too, only not one that can form a cycle)."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if not typing and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
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
    """Type-only imports count: `if TYPE_CHECKING: from buildtool.matrix.schema import Cell` in contracts is
    still contracts knowing about the matrix stage."""
    wrong = []
    for module, path in MODULES.items():
        src = _layer(module)
        if src is None:
            continue
        for imported, _ in _runtime_imports(path, typing=True):
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
    assert ("buildtool.cli", True) in _runtime_imports(bad, typing=True)


# HTML tags, Markdown table rows and links inside Python string literals. (Not `# ` lines: generated shell,
# YAML and lock files carry comments, and those are not documents.)
_MARKUP = (r"(?<!\?P)<(?:html|head|body|p|div|span|table|thead|tbody|tr|td|th|ul|ol|li|h[1-6]|pre|code|section|details"
           r"|img|a|br|small|strong)[\s>/]",
           r"^\|.*\|\s*$", r"^\|---", r"\]\((?:https?://|[\w./-]+\.md\b)")


def _string_literals(path: Path) -> list[tuple[int, str]]:
    """Every str constant (f-string parts included) in a module, with its line; docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_html_or_markdown_assembled_in_python() -> None:
    """Documents people read come from the Jinja2 templates beside each stage (buildtool/*/templates/),
    never from strings glued together in code, where escaping is forgotten one call at a time."""
    import re

    patterns = [re.compile(p, re.MULTILINE) for p in _MARKUP]
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {text[:60]!r}"
             for path in PACKAGE.rglob("*.py") for line, text in _string_literals(path)
             if any(p.search(text) for p in patterns)]
    assert not found, "\n".join(found)


def test_document_templates_ship_with_the_package() -> None:
    """Every template a stage renders is declared package data, so an installed wheel can render it."""
    import fnmatch
    import tomllib

    data = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["buildtool"]
    templates = [str(p.relative_to(PACKAGE)) for p in PACKAGE.glob("*/templates/*")]
    assert templates, "no document templates found"
    assert [t for t in templates if not any(fnmatch.fnmatch(t, g) for g in globs)] == []
