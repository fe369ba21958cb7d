"""Load YAML keeping the line of every key and value, and refusing what a matrix never needs.

PyYAML's plain loader silently keeps the last of two equal keys and forgets where things
were; the matrix loader needs both to report `file:line: key: problem`. It also trusts its
input: an alias bomb expands without bound, a deeply nested flow collection is quadratic in
libyaml's scanner (and overflows the C stack of its composer). So the document is built here
from libyaml's event stream (the pure-Python parser when libyaml is missing), with bounds on
nesting and on alias expansion that stop as soon as they are crossed, at the line crossing them.
"""

from __future__ import annotations

import gc
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml import events as ev

from buildtool.common.errors import MatrixError

try:
    from yaml import CSafeLoader as _Loader

    LIBYAML = True
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]

    LIBYAML = False

Loc = tuple[str | int, ...]

MAX_BYTES = 16 << 20          # far above any real matrix; keeps every answer within seconds
MAX_DEPTH = 32                # the matrix nests 7 deep
MAX_ALIAS_VALUES = 10_000     # values that aliases may add; a "billion laughs" needs billions
_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_COLLECTION_TAGS = (None, "!", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")
# What YAML 1.1 allows in a stream (PyYAML's Reader): no other control characters.
_NOT_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_RESOLVER = yaml.resolver.Resolver()
_CONSTRUCTOR = yaml.constructor.SafeConstructor()


@dataclass
class Located:
    """The parsed document plus the 1-based line of each value in it.

    Lines are kept per container (`tables[id(container)]`: key or index -> line), not per
    path: building a path tuple for each of a big matrix's values would cost more than
    parsing them. A mapping's scalar value has its own line; a collection, its key's line.
    """

    data: Any
    path: str
    tables: dict[int, dict[str | int, int]] = field(default_factory=dict)
    root_line: int | None = None
    # Source text of scalars YAML read as something other than a string (`2.10` -> 2.1),
    # so advice can show the exact text to quote.
    raw: dict[Loc, str] = field(default_factory=dict)

    def line_of(self, loc: Loc) -> int | None:
        """Line of the deepest known prefix of `loc` (pydantic locs may go past the YAML)."""
        node, line = self.data, self.root_line
        for part in loc:
            table = self.tables.get(id(node))
            if table is None or part not in table:
                break
            line = table[part]
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                break
        return line

    def error(self, loc: Loc, message: str) -> MatrixError:
        """The MatrixError at `loc`: the file, the line of the deepest known part of `loc`, the key."""
        return MatrixError(self.path, self.line_of(loc), dotted(loc), message)


def dotted(loc: Loc) -> str:
    """`images[0].versions[1].run`: keys joined by dots, list indexes in brackets."""
    return "".join(f"[{part}]" if isinstance(part, int) else ("." if i else "") + str(part)
                   for i, part in enumerate(loc))


def _read(path: Path, shown: str) -> str:
    """The file's text; every way of not being a readable UTF-8 file is a one-line MatrixError."""
    def fail(message: str, line: int | None = None) -> MatrixError:
        return MatrixError(shown, line, "", message)

    unreadable = "cannot read it ({}); pass a readable matrix file with --matrix"
    try:
        info = path.stat()
    except FileNotFoundError:
        raise fail("file not found; pass --matrix or create it") from None
    except OSError as exc:
        raise fail(unreadable.format(exc.strerror or exc)) from None
    if stat.S_ISDIR(info.st_mode):
        raise fail(f"is a directory; pass the matrix file itself, e.g. --matrix {Path(shown) / 'matrix.yaml'}")
    if not stat.S_ISREG(info.st_mode):
        raise fail(f"is not a regular file ({path} is a device, pipe or socket); pass the matrix file")
    if info.st_size > MAX_BYTES:
        raise fail(f"is {info.st_size / 2**20:.1f} MiB; a matrix is at most {MAX_BYTES >> 20} MiB (split it or "
                   "remove generated content)")
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise fail(unreadable.format(exc.strerror or exc)) from None
    if len(data) > MAX_BYTES:
        raise fail(f"grew past the {MAX_BYTES >> 20} MiB a matrix may have while it was read (is it still being "
                   "written?); split it or remove generated content")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise fail(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at column {column}); save the file as UTF-8",
                   line) from None
    text = text.removeprefix("\ufeff")
    bad = _NOT_PRINTABLE.search(text)
    if bad is not None:
        line = text.count("\n", 0, bad.start()) + 1
        column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        raise fail(f"control character U+{ord(bad.group()):04X} at column {column}; YAML text has none (is this a "
                   "binary file?)", line)
    return text


class _Frame:
    """A mapping or sequence being filled."""

    __slots__ = ("loc", "data", "is_map", "anchor", "start_line", "size", "key", "key_line", "merging", "merges",
                 "lines")

    def __init__(self, loc: Loc, data: Any, anchor: str | None, start_line: int):
        self.loc, self.data, self.anchor, self.start_line = loc, data, anchor, start_line
        self.is_map = isinstance(data, dict)
        self.size = 1                       # values in this subtree, aliases expanded
        self.key: str | None = None         # mapping: the key whose value comes next
        self.key_line = 0
        self.merging = False                # the key is YAML's merge key (a plain <<), not the text '<<'
        self.merges: list[tuple[Any, int]] = []
        self.lines: dict[str | int, int] = {}


class _Builder:
    """Builds plain data from YAML events, recording lines, enforcing the bounds.

    `run` is the hot loop (a 5 MB matrix is about 450,000 events): plain scalars in
    mappings and sequences take the short path; anchors, aliases, tags, merge keys and
    errors the long one.
    """

    def __init__(self, doc: Located):
        self.doc = doc
        self.stack: list[_Frame] = []
        self.anchors: dict[str, tuple[Any, int]] = {}
        # Anchors whose most recent node (YAML 1.2, 3.2.2.2: the one an alias names) is a collection still open.
        self.open_anchors: dict[str, _Frame] = {}
        self.expanded = 0
        self.documents = 0
        self.root: Any = None
        self.seen_root = False

    def fail(self, line: int | None, loc: Loc, message: str) -> MatrixError:
        return MatrixError(self.doc.path, line, dotted(loc), message)

    def run(self, get_event: Any) -> None:
        stack = self.stack
        scalar_event, map_start, seq_start = ev.ScalarEvent, ev.MappingStartEvent, ev.SequenceStartEvent
        ends = (ev.MappingEndEvent, ev.SequenceEndEvent)
        resolved: dict[str, str] = {}       # plain scalar text -> tag (values repeat a lot)
        resolve = _RESOLVER.resolve
        scalar_node, plain = yaml.ScalarNode, (True, False)
        while (event := get_event()) is not None:
            kind = type(event)
            if kind is scalar_event and stack:
                top = stack[-1]
                line = event.start_mark.line + 1
                key = top.key
                if top.is_map and key is None:
                    key = event.value
                    if key in top.data or key in top.lines or key == "<<" or event.anchor or event.tag:
                        self._key(top, event, line)
                    else:
                        top.key, top.key_line = key, line
                    continue
                tag = event.tag
                # A merge key's value goes to the merges (`_attach`), which refuse a scalar.
                if event.anchor or (tag is not None and tag != "!") or len(stack) >= MAX_DEPTH or top.merging:
                    self._node(event, line)
                    continue
                value: Any = event.value
                if event.implicit[0]:
                    tag = resolved.get(value)
                    if tag is None:
                        tag = resolved[value] = resolve(scalar_node, value, plain)
                    if tag != _STR_TAG:
                        value = self._scalar(event, self._child_loc(top), line, tag)
                top.size += 1
                if top.is_map:
                    top.lines[key] = line  # type: ignore[index]
                    top.data[key] = value
                    top.key = None
                else:
                    top.lines[len(top.data)] = line
                    top.data.append(value)
            elif kind in ends:
                self._close(stack.pop())
            elif kind is map_start or kind is seq_start or kind is scalar_event or kind is ev.AliasEvent:
                line = event.start_mark.line + 1
                if stack and stack[-1].is_map and stack[-1].key is None:
                    self._key(stack[-1], event, line)
                else:
                    self._node(event, line)
            elif kind is ev.DocumentStartEvent:
                self.documents += 1
                if self.documents > 1:
                    raise self.fail(event.start_mark.line + 1, (), "a second YAML document (`---`); the matrix "
                                                                   "is one document")

    def _node(self, event: Any, line: int) -> None:
        """A value: a collection opening, an alias, or a scalar off the short path."""
        parent = self.stack[-1] if self.stack else None
        loc = self._child_loc(parent)
        if len(self.stack) >= MAX_DEPTH:
            raise self.fail(line, loc, f"nested more than {MAX_DEPTH} levels deep; the matrix needs at most 8")
        if isinstance(event, ev.CollectionStartEvent):
            if event.tag not in _COLLECTION_TAGS:
                raise self.fail(line, loc, f"YAML tag {event.tag} is not supported here; remove it")
            data: Any = {} if isinstance(event, ev.MappingStartEvent) else []
            self.stack.append(_Frame(loc, data, event.anchor, line))
            if event.anchor:
                self.open_anchors[event.anchor] = self.stack[-1]
            return
        if isinstance(event, ev.AliasEvent):
            if event.anchor in self.open_anchors:
                raise self.fail(line, loc, f"alias *{event.anchor} refers to a value that contains it; "
                                           "a value cannot include itself")
            if event.anchor not in self.anchors:
                raise self.fail(line, loc, f"alias *{event.anchor} has no anchor &{event.anchor} before it")
            value, size = self.anchors[event.anchor]
            self.expanded += size
            if self.expanded > MAX_ALIAS_VALUES:
                raise self.fail(line, loc, f"YAML aliases expand to more than {MAX_ALIAS_VALUES} values "
                                           "(an alias bomb?); write the values out or set them in `defaults`")
            self._attach(parent, value, size, line)
            return
        tag = event.tag
        if tag is None or tag == "!":
            tag = _RESOLVER.resolve(yaml.ScalarNode, event.value, event.implicit)
        value = self._scalar(event, loc, line, tag)
        if event.anchor:
            self.anchors[event.anchor] = (value, 1)
            self.open_anchors.pop(event.anchor, None)
        self._attach(parent, value, 1, line)

    def _child_loc(self, parent: _Frame | None) -> Loc:
        if parent is None:
            return ()
        if parent.is_map:
            return (*parent.loc, parent.key)  # type: ignore[arg-type]
        return (*parent.loc, len(parent.data))

    def _key(self, parent: _Frame, event: Any, line: int) -> None:
        if not isinstance(event, ev.ScalarEvent) or event.anchor or event.tag not in (None, "!", _STR_TAG):
            raise self.fail(line, parent.loc, "keys must be plain strings (no tags, anchors, aliases or collections)")
        key = event.value
        if key == "<<" and event.implicit[0] and _RESOLVER.resolve(yaml.ScalarNode, key, event.implicit) == _MERGE_TAG:
            parent.key, parent.key_line, parent.merging = "<<", line, True
            return
        if key in parent.data or key in parent.lines:
            raise self.fail(line, (*parent.loc, key), "duplicate key (already set on line "
                                                      f"{parent.lines.get(key)}); keep one")
        parent.key, parent.key_line = key, line

    def _scalar(self, event: Any, loc: Loc, line: int, tag: str) -> Any:
        """A scalar YAML reads as something other than a string (or tagged)."""
        if tag == _STR_TAG:
            return event.value
        constructor = _CONSTRUCTOR.yaml_constructors.get(tag)
        if constructor is None or tag == _MERGE_TAG:
            raise self.fail(line, loc, f"YAML tag {event.tag or tag} is not supported here; remove it")
        node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
        try:
            value = constructor(_CONSTRUCTOR, node)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError):
            raise self.fail(line, loc, f"{event.value!r} cannot be read as {tag.rsplit(':', 1)[-1]}; "
                                       "quote it if it is text") from None
        self.doc.raw[loc] = event.value
        return value

    def _attach(self, parent: _Frame | None, value: Any, size: int, line: int) -> None:
        """Put a finished value (scalar, alias or closed collection) into its parent."""
        if parent is None:
            self.root, self.seen_root = value, True
            self.doc.root_line = line
            return
        parent.size += size
        if not parent.is_map:
            parent.lines[len(parent.data)] = line
            parent.data.append(value)
            return
        if parent.merging:
            parent.merges.append((value, line))
            parent.merging = False
        else:
            parent.lines[parent.key] = line  # type: ignore[index]
            parent.data[parent.key] = value
        parent.key = None

    def _close(self, frame: _Frame) -> None:
        for value, line in frame.merges:
            sources = value if isinstance(value, list) else [value]
            if not all(isinstance(s, dict) for s in sources):
                raise self.fail(line, frame.loc, "`<<` merges a mapping (e.g. <<: *base); got something else")
            for source in sources:
                for key, item in source.items():
                    if key not in frame.data:
                        frame.data[key] = item
                        frame.lines[key] = line
        self.doc.tables[id(frame.data)] = frame.lines
        if frame.anchor and self.open_anchors.get(frame.anchor) is frame:   # not re-defined inside it
            del self.open_anchors[frame.anchor]
            self.anchors[frame.anchor] = (frame.data, frame.size)
        parent = self.stack[-1] if self.stack else None
        # A collection in a mapping is located at its key, in a sequence at its first line.
        line = parent.key_line if parent is not None and parent.is_map else frame.start_line
        self._attach(parent, frame.data, frame.size, line)


# What libyaml's terse problems usually mean in a matrix, and what to do.
_HINTS = (
    ("mapping values are not allowed", "quote a value that contains ': ' or ends with ':'"),
    ("cannot start any token", "quote a value that starts with @, `, %, ! or &"),
    ("tab character", "indent with spaces, not tabs"),
    ("could not find expected ':'", "each line of a mapping is `key: value`"),
    ("did not find expected key", "check the indentation of this line and the one before"),
    ("did not find expected '-' indicator", "align the `- ` entries of a list"),
)


# A quoted scalar from its opening quote to its closing one: `\x` escapes in "...", `''` is a quote in '...'.
# Possessive (`*+`): an unclosed quote never ends at an escaped one.
_QUOTED = {'"': re.compile(r'"(?:[^"\\]|\\.)*+"'), "'": re.compile(r"'(?:[^']|'')*+'")}


def _quote_problem(text: str, upto: int) -> tuple[int, str] | None:
    """A quote YAML misread, the usual cause of a syntax error lines later: the first line
    before `upto` where a quoted value opens and does not close, or text after a closing
    quote on line `upto` itself. Quotes inside plain text (`NVIDIA's`) do not count."""
    for number, line in enumerate(text.split("\n")[:upto], 1):
        i, prev, spaced = 0, "", True
        while i < len(line):
            char = line[i]
            starts_value = prev in ("", "[", "{", ",", "?") or (prev in (":", "-") and spaced)
            if char in "\"'" and starts_value:
                closed = _QUOTED[char].match(line, i)
                if closed is None:
                    return (number, "unclosed") if number < upto else None
                rest = line[closed.end():].lstrip()
                if number == upto and rest and rest[0] not in ",]}#:":
                    return number, "after"
                i, prev, spaced = closed.end(), "x", False
                continue
            if char == "#" and (i == 0 or line[i - 1] in " \t"):
                break
            if char in " \t":
                spaced = True
            else:
                prev, spaced = (char if char in ":-[{,?" else "x"), False
            i += 1
    return None


_KEY_WITH_VALUE = re.compile(r"^(\s*(?:- )?)([^\s#:][^:#]*):\s+([^\s#&!|>].*)$")


def _value_and_block(text: str, line: int) -> tuple[int, str] | None:
    """(line, key) when the line before `line` gives its key a value and `line` is indented
    under it as if the key held a mapping (`run: 8g` with `shm_size: ...` below): YAML
    reports the second line, the mistake is on the first."""
    lines = text.split("\n")
    if not 1 < line <= len(lines):
        return None
    indent = len(lines[line - 1]) - len(lines[line - 1].lstrip())
    for number in range(line - 1, 0, -1):
        before = lines[number - 1]
        if not before.strip() or before.lstrip().startswith("#"):
            continue
        match = _KEY_WITH_VALUE.match(before)
        if match and len(match.group(1)) < indent:
            return number, match.group(2).strip()
        return None
    return None


def _syntax_error(shown: str, exc: yaml.MarkedYAMLError, text: str) -> MatrixError:
    """YAML's own error, one line, at the line to fix: where an unclosed quote or bracket opened."""
    context = (exc.context or "").strip()
    problem = (exc.problem or context or "invalid YAML").strip()
    opened = context.startswith(("while parsing a flow", "while scanning a quoted", "while scanning a block scalar"))
    mark = exc.context_mark if opened and exc.context_mark is not None else (exc.problem_mark or exc.context_mark)
    line = mark.line + 1 if mark is not None else None
    detail = f"YAML syntax: {problem}"
    if opened and exc.problem_mark is not None and exc.context_mark is not None:
        detail += f" ({context} opened here; noticed on line {exc.problem_mark.line + 1})"
    elif context and context != problem:
        detail += f" ({context})"
    hint = next((advice for words, advice in _HINTS if words in problem), "")
    misread = _quote_problem(text, line) if line and not opened else None
    both = _value_and_block(text, line) if line and not opened and misread is None else None
    if both is not None and ("mapping values are not allowed" in problem or "expected key" in problem):
        line, key = both
        detail = f"YAML syntax: `{key}` has a value on this line and an indented block under it"
        hint = "keep one of the two (a mapping's keys go on the lines below, with nothing after the colon)"
    elif misread is not None and misread[1] == "unclosed":
        detail = (f"YAML syntax: a quote opens here and does not close on this line (YAML fails on line {line}: "
                  f"{problem})")
        line, hint = misread[0], "close the quote"
    elif misread is not None:
        hint = "text follows a closing quote: quote the whole value (inside '...' write '' for a ')"
    if hint:
        detail += f"; {hint}"
    return MatrixError(shown, line, "", " ".join(detail.split()))


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection while a matrix loads: it is a few hundred thousand small
    containers at most, none cyclic, and the collector's full passes over them would cost
    more than the parse itself (a 5 MB matrix: 8 s instead of 0.6 s in libyaml)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def parse_yaml(text: str, shown: str) -> Located:
    """Parse YAML text into a Located document (MatrixError for anything a matrix cannot be)."""
    doc = Located(data=None, path=shown)
    builder = _Builder(doc)
    loader = _Loader(text)
    try:
        with paused_gc():
            builder.run(loader.get_event)
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(shown, exc, text) from None
    except yaml.YAMLError as exc:
        raise MatrixError(shown, None, "", "YAML: " + " ".join(str(exc).split())) from None
    finally:
        loader.dispose()
    written = doc.raw.get((), "")    # the text of a null document: `~`, `null`; none after a bare `---`
    if not builder.seen_root or (builder.root is None and not written):
        raise MatrixError(shown, 1, "", "the file is empty; declare `images:`")
    if builder.root is None:
        raise MatrixError(shown, doc.root_line, "", f"the document is null (`{written}`), not a mapping; "
                                                    "declare `images:`")
    doc.data = builder.root
    return doc


def load_yaml(path: Path, display: str | None = None) -> Located:
    """Read and parse `path`; every problem is a MatrixError naming the file (and line)."""
    shown = display or str(path)
    return parse_yaml(_read(path, shown), shown)
