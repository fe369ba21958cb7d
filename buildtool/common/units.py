"""How sizes and digests are shown to people (tables, reports, notes)."""

from __future__ import annotations


def human_size(size: int | None, missing: str = "-") -> str:
    """Decimal units, as registries and `docker images` show them: 1.33 GB."""
    if not size:
        return missing
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1000
    return f"{value:.2f} GB"


def short_digest(digest: str, missing: str = "") -> str:
    """`sha256:` and the first 12 hex digits."""
    algo, _, hexdigest = digest.partition(":")
    return f"{algo}:{hexdigest[:12]}" if hexdigest else (digest or missing)
