"""The release gate's fixtures, by name: each builds a dev image in an in-memory registry (tests/memregistry.py)
in one state the gate must judge (an attack, a broken registry, a valid release). The gate's tests
(tests/test_gate_*.py) register theirs with `@scenario`; tests/test_gate_agreement.py walks every one through
`release --dry-run` and `verify` and asserts the same outcome for the same causes."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.test_release_platforms import Dev

SCENARIOS: dict[str, Callable[[], Dev]] = {}


def scenario(name: str) -> Callable[[Callable[[], Dev]], Callable[[], Dev]]:
    """Register a builder of a gate fixture under `name` (unique)."""
    def register(build: Callable[[], Dev]) -> Callable[[], Dev]:
        assert name not in SCENARIOS, f"two gate scenarios are named {name}"
        SCENARIOS[name] = build
        return build
    return register


def same_clock(problems: list[str]) -> list[str]:
    """`problems` with the reader's clock, which a refusal of a future-dated provenance or verdict shows to the second,
    written as one value: release and verify read it moments apart (once across a second: the two texts differed)."""
    import re

    return [re.sub(r"this machine's clock \([^)]*\)", "this machine's clock (now)", p) for p in problems]
