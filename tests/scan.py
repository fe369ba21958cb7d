"""The toolkit's own source files, for tests that refuse a pattern outside the one module allowed it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path


def python_sources(root: Path, tops: Iterable[str], skip: Iterable[Path]) -> Iterator[tuple[Path, str]]:
    """(path relative to root, text) of every .py file under each of `tops`, but `skip` and any .venv."""
    skipped = set(skip)
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            if rel in skipped or ".venv" in rel.parts:
                continue
            yield rel, path.read_text(encoding="utf-8")
