"""Command-line arguments checked before anything outside the process is called (DESIGN: "every argument is
checked before anything outside the process is called").

Each check takes the option's name and its value and returns the value or raises UserError (exit 2) with one
line that names the option and shows the value as `refs.shown` does: cut, non-ASCII and control characters
escaped; a reference that carries credentials is refused without echoing them (refs.parse_reference).
Commands call these first, before the registry, the engine, git or any other program.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from buildtool.common.errors import UserError
from buildtool.common.refs import Reference, ReferenceError, parse_reference, shown

# Kubernetes label syntax (k8s.io/apimachinery validation): a name of at most 63 characters, alphanumeric at
# both ends, `-`, `_`, `.` between; a key may carry a DNS-subdomain prefix `example.com/`; a value is a name
# or empty.
_LABEL_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*\Z")


def count(option: str, value: int, minimum: int = 1, maximum: int | None = None) -> int:
    """A whole number of things (`--nodes`, `--steps`): at least `minimum`, at most `maximum` when given."""
    if value < minimum:
        raise UserError(f"{option} must be at least {minimum}, not {value}")
    if maximum is not None and value > maximum:
        raise UserError(f"{option} must be at most {maximum}, not {value}")
    return value


def reference(option: str, text: str) -> Reference:
    """An image reference."""
    try:
        return parse_reference(text)
    except ReferenceError as exc:
        raise UserError(f"{option}: {exc}") from None


def label_key(option: str, key: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if (slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix))) \
            or not _LABEL_NAME_RE.match(name):
        raise UserError(f"{option}: {shown(key)} is not a Kubernetes label key ([prefix/]name: a name of at most 63 "
                        "letters, digits, '-', '_', '.', alphanumeric at both ends; a DNS-subdomain prefix)")
    return key


def label_value(option: str, value: str) -> str:
    if value and not _LABEL_NAME_RE.match(value):
        raise UserError(f"{option}: {shown(value)} is not a Kubernetes label value (at most 63 letters, digits, "
                        "'-', '_', '.', alphanumeric at both ends, or empty)")
    return value


def node_selectors(option: str, items: Iterable[str]) -> dict[str, str]:
    """KEY=VALUE pairs, each a Kubernetes label key and value; a key given twice is refused."""
    found: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"{option} {shown(item)} is not KEY=VALUE")
        label_key(option, key)
        label_value(option, value)
        if key in found:
            raise UserError(f"{option}: {shown(key)} is given twice")
        found[key] = value
    return found


# --- Grammars of the other kinds of argument (the table of every option is buildtool.contracts.arguments) ---

PATH_MAX = 4096
TEXT_MAX = 512
_UNSEEN = ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")   # control, format (U+202E ...), separators, unassigned


def plain(option: str, text: str, limit: int = TEXT_MAX) -> str:
    """Text a person typed: at most `limit` characters, no control or format character (a newline, U+202E)."""
    import unicodedata

    if len(text) > limit:
        raise UserError(f"{option}: {shown(text)} is longer than {limit} characters")
    bad = next((c for c in text if unicodedata.category(c) in _UNSEEN), None)
    if bad is not None:
        raise UserError(f"{option}: {shown(text)} contains the control or format character {ascii(bad)}")
    return text


def word(option: str, text: str, pattern: re.Pattern[str], what: str, *, empty: bool = False) -> str:
    """Text matching `pattern` (ASCII grammars: a look-alike letter is refused, shown escaped); `what` says it."""
    if empty and text == "":
        return text
    plain(option, text)
    if not pattern.match(text):
        raise UserError(f"{option} {shown(text)} is not {what}")
    return text


def choice(option: str, text: str, values: Iterable[str]) -> str:
    allowed = list(values)
    if text not in allowed:
        raise UserError(f"{option} must be one of {', '.join(v for v in allowed if v)}, not {shown(text)}")
    return text


def seconds(option: str, value: float, minimum: float, maximum: float) -> float:
    """A time in seconds: a finite number between `minimum` and `maximum` (nan, inf refused)."""
    import math

    if not math.isfinite(value) or not minimum <= value <= maximum:
        raise UserError(f"{option} must be a number of seconds from {minimum:g} to {maximum:g}, not {value}")
    return value


def path(option: str, value: object, kind: str) -> str:
    """A path: at most PATH_MAX characters, no control or format character, and by `kind`: `file` (must exist as
    a file), `dir` (must exist as a folder), `out-file` (not an existing folder), `out-dir` (not an existing
    file), `any` (only the text; empty allowed: an option's "not given")."""
    from pathlib import Path

    text = str(value)
    plain(option, text, PATH_MAX)
    if text == "" and kind == "any":
        return text
    if text == "":
        raise UserError(f"{option}: the path is empty")
    p = Path(text)
    try:   # a name past the file system's limit (ENAMETOOLONG) or a folder on the way this user cannot search
        is_file, is_dir, exists = p.is_file(), p.is_dir(), p.exists()
    except OSError as exc:
        raise UserError(f"{option}: {shown(text)} cannot be looked up ({exc.strerror or exc}); name a path this "
                        "user can reach") from None
    if kind == "file" and not is_file:
        why = " (a folder)" if is_dir else " (it does not exist)"
        raise UserError(f"{option}: {shown(text)} is not a file{why}")
    if kind == "dir" and not is_dir:
        raise UserError(f"{option}: {shown(text)} " + ("is a file, not a folder" if exists else "does not exist"))
    if kind == "out-file" and is_dir:
        raise UserError(f"{option}: {shown(text)} is a folder; name a file to write")
    if kind == "out-dir" and exists and not is_dir:
        raise UserError(f"{option}: {shown(text)} is a file, not a folder")
    return text


def count_list(option: str, text: str, minimum: int, maximum: int, words: Iterable[str] = ()) -> list[int]:
    """A comma list of whole numbers (`1,2,4`), each from `minimum` to `maximum`, or one of `words`."""
    if text in words:
        return []
    plain(option, text)
    numbers = []
    for part in text.split(","):
        if not re.match(r"^[0-9]{1,9}\Z", part.strip()):
            extra = f" or one of {', '.join(words)}" if words else ""
            raise UserError(f"{option}: {shown(text)} is not a comma list of whole numbers (e.g. 1,2,4){extra}")
        if not minimum <= int(part) <= maximum:
            raise UserError(f"{option} {shown(text)}: each count must be from {minimum} to {maximum}")
        numbers.append(int(part))
    return numbers
