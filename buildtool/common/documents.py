"""Documents people read (the report page, the catalogue, release notes) rendered from Jinja2 templates.

Each stage keeps its templates in its own package folder (`buildtool/<stage>/templates/*.j2`), so the
words and layout of a document are changed in one file, apart from the code that gathers its data.
HTML templates are autoescaped: any value from a verdict, a label or the matrix reaches the page as
text, never as markup. Markdown has no escaping of its own; table cells go through the `md` filter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import jinja2


def markdown_cell(value: Any) -> str:
    """A value safe inside one Markdown table cell or list line: no column break, no line break."""
    return str(value).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def code_span(value: Any) -> str:
    """Inline code in Markdown; a value holding a backtick gets a longer fence (CommonMark)."""
    text = str(value)
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def plural(count: int, word: str) -> str:
    """`1 image`, `2 images`."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


@cache
def _environment(package: str) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader(package, "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "html.j2"), default_for_string=False),
        undefined=jinja2.StrictUndefined,     # a misspelt field fails the render instead of printing nothing
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["md"] = markdown_cell
    env.filters["code"] = code_span
    env.filters["plural"] = plural
    return env


def render_document(package: str, template: str, filters: Mapping[str, Callable[..., str]] | None = None,
                    **context: Any) -> str:
    """Render `<package>/templates/<template>` with `context`; `filters` are the stage's own formatting
    helpers (sizes, durations), so a template formats a value the way the rest of the stage does."""
    env = _environment(package)
    env.filters.update(filters or {})
    return env.get_template(template).render(**context)
