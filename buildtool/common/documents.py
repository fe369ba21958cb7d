"""Documents people read (the report page, the catalogue, release notes) rendered from Jinja2 templates.

Each stage keeps its templates in its own package folder (`buildtool/<stage>/templates/*.j2`), so the
words and layout of a document are changed in one file, apart from the code that gathers its data.
HTML templates are autoescaped: any value from a verdict, a label or the matrix reaches the page as
text, never as markup. Markdown has no escaping of its own; table cells go through the `md` filter.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from buildtool.common.files import cache_root

if TYPE_CHECKING:
    import jinja2


def markdown_cell(value: Any) -> str:
    """A value safe inside one Markdown table cell or list line: no column break, no line break, and no link, image
    or raw HTML (a failure message or a GPU name from a verdict renders as the text it is)."""
    text = str(value).replace("\\", "\\\\")
    for char in "|[]<>":
        text = text.replace(char, "\\" + char)
    return text.replace("\r", " ").replace("\n", " ")


def code_span(value: Any) -> str:
    """Inline code in Markdown on one line; a value holding backticks gets a fence longer than its longest run of
    them (CommonMark: a run as long as the fence closes the span, and what follows would be Markdown)."""
    import re

    text = str(value).replace("\r", " ").replace("\n", " ")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {text} {fence}" if longest else f"`{text}`"


def plural(count: int, word: str, words: str = "") -> str:
    """`1 image`, `2 images`, `0 images` (`words`: a plural that is not WORD + s, `1 process`, `2 processes`): every
    count printed with its noun, in documents and messages alike."""
    return f"{count} {word}" if count == 1 else f"{count} {words or word + 's'}"


_ENVIRONMENTS: dict[str, jinja2.Environment] = {}
_ENVIRONMENTS_LOCK = threading.Lock()   # `preload` may build one in a thread while another renders


def _environment(package: str) -> jinja2.Environment:
    import jinja2  # here, not at the top: `release --dry-run` and `--help` never render a document

    with _ENVIRONMENTS_LOCK:
        if package not in _ENVIRONMENTS:
            env = jinja2.Environment(
                loader=jinja2.PackageLoader(package, "templates"),
                autoescape=jinja2.select_autoescape(enabled_extensions=("html", "html.j2"), default_for_string=False),
                undefined=jinja2.StrictUndefined,     # a misspelt field fails the render instead of printing nothing
                trim_blocks=True,
                lstrip_blocks=True,
                keep_trailing_newline=True,
                # Compiling a template costs more than a whole release to a loopback registry; the cache is keyed
                # by each template's source checksum, so an edited template is compiled again.
                bytecode_cache=_bytecode_cache(),
            )
            env.filters.update(md=markdown_cell, code=code_span, plural=plural)
            _ENVIRONMENTS[package] = env
        return _ENVIRONMENTS[package]


def preload(package: str, *templates: str) -> None:
    """Import Jinja2 and load `templates` (compiled, or read from the bytecode cache) before they are
    rendered: release does it in a thread while it waits on the registry. Best effort: a template
    that cannot be loaded here fails again, with its message, where it is rendered."""
    with contextlib.suppress(Exception):
        env = _environment(package)
        for template in templates:
            env.get_template(template)


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    import jinja2

    class Cache(jinja2.FileSystemBytecodeCache):
        """A cache that cannot be read or written (read-only home, full disk) only costs a compile."""

        def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            with contextlib.suppress(OSError):
                super().load_bytecode(bucket)

        def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            with contextlib.suppress(OSError):
                super().dump_bytecode(bucket)

    folder = cache_root() / "templates"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return Cache(str(folder))


def render_document(package: str, template: str, filters: Mapping[str, Callable[..., str]] | None = None,
                    **context: Any) -> str:
    """Render `<package>/templates/<template>` with `context`; `filters` are the stage's own formatting
    helpers (sizes, durations), so a template formats a value the way the rest of the stage does."""
    env = _environment(package)
    env.filters.update(filters or {})
    return env.get_template(template).render(**context)
