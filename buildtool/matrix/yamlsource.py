"""Load YAML keeping the line of every key, and refusing duplicate keys.

PyYAML's plain loader silently keeps the last of two equal keys and forgets where
things were; the matrix loader needs both to report `file:line: key: problem`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from buildtool.common.errors import MatrixError

Loc = tuple[str | int, ...]


@dataclass
class Located:
    """The parsed document plus the 1-based line of each path in it."""

    data: Any
    path: str
    lines: dict[Loc, int] = field(default_factory=dict)

    def line_of(self, loc: Loc) -> int | None:
        """Line of the deepest known prefix of `loc` (pydantic locs may go past the YAML)."""
        for end in range(len(loc), -1, -1):
            if loc[:end] in self.lines:
                return self.lines[loc[:end]]
        return None


def _convert(node: yaml.Node, loc: Loc, doc: Located) -> Any:
    doc.lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise MatrixError(doc.path, key_node.start_mark.line + 1, _dotted(loc), "keys must be plain strings")
            key = key_node.value
            if key in out:
                raise MatrixError(doc.path, key_node.start_mark.line + 1, _dotted((*loc, key)),
                                  "duplicate key (already set on line "
                                  f"{doc.lines[(*loc, key)]}); keep one")
            doc.lines[(*loc, key)] = key_node.start_mark.line + 1
            out[key] = _convert(value_node, (*loc, key), doc)
            doc.lines[(*loc, key)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, (*loc, i), doc) for i, item in enumerate(node.value)]
    # Scalars: YAML's resolver decides the type (int, float, bool, null, str).
    return _SCALAR_LOADER.construct_object(node, deep=True)


_SCALAR_LOADER = yaml.SafeLoader("")


def _dotted(loc: Loc) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts)


dotted = _dotted


def load_yaml(path: Path, display: str | None = None) -> Located:
    """Parse `path`; syntax errors become MatrixError with the line YAML reports."""
    shown = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MatrixError(shown, None, "", "file not found; pass --matrix or create it") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise MatrixError(shown, line, "", f"YAML syntax: {exc.problem or exc.context}") from None
    doc = Located(data=None, path=shown)
    if node is None:
        raise MatrixError(shown, 1, "", "the file is empty; declare `images:`")
    doc.data = _convert(node, (), doc)
    return doc
