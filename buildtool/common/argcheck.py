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


def reference(option: str, text: str, *, registry: bool = False) -> Reference:
    """An image reference (`registry`: one that names its registry host)."""
    try:
        parsed = parse_reference(text)
    except ReferenceError as exc:
        raise UserError(f"{option}: {exc}") from None
    if registry and not parsed.domain:
        raise UserError(f"{option}: {shown(text)} names no registry; name the image with its registry "
                        "(host/repository:tag or @digest)")
    return parsed


def references(option: str, texts: Iterable[str], *, registry: bool = False) -> list[Reference]:
    """Every reference, all checked before the first is used."""
    return [reference(option, text, registry=registry) for text in texts]


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
