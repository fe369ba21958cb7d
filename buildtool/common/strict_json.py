"""JSON read with every object's keys named once: what anyone with push rights can put in an artifact (a signed
statement, its envelope, a Sigstore bundle, an SBOM) is refused when it repeats a key. Python's json keeps the last
of a repeated key, other JSON readers the first or none, so a document with one could read here as one thing and
elsewhere as another (a second `subject`, `digest` or `payload`)."""

from __future__ import annotations

import json
from typing import Any


class RepeatedKey(ValueError):
    """A JSON object names a key twice (the message: the key, as refs.shown shows it)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: the object, or RepeatedKey naming the first key it repeats."""
    from buildtool.common.refs import shown

    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise RepeatedKey(shown(key))
        found[key] = value
    return found


def loads(data: bytes | str) -> Any:
    """json.loads, refusing a repeated key (RepeatedKey, a ValueError, as json's own errors are) and JSON nested too
    deeply to decode (as bounded_loads)."""
    return bounded_loads(data, object_pairs_hook=unique_keys)


def bounded_loads(data: bytes | str, **options: Any) -> Any:
    """json.loads, JSON nested too deeply to decode (json's RecursionError) raised as a ValueError: its readers'
    one-line errors, never a traceback."""
    try:
        return json.loads(data, **options)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None
