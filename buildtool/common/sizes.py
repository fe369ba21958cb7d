"""Sizes as Docker's `--shm-size` writes them, the one grammar every stage parses them by.

    size := digits [ unit ]        unit := b | k | m | g   (either case; k, m, g are 1024, 1024², 1024³)

No sign, fraction, space or two-letter unit (`8gb`, `8Gi`): what does not match is a SizeError that
names the text. The matrix (/dev/shm of a run profile), the SLURM bundle and the Kubernetes launcher
read sizes here; the image tests hand the in-image scripts plain byte counts made here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SIZE_RE = re.compile(r"^([0-9]+)([bkmgBKMG]?)\Z")
UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


class SizeError(ValueError):
    """Not a size; the message names the text and the grammar."""


@dataclass(frozen=True)
class Size:
    number: int
    unit: str            # "", "b", "k", "m" or "g" (lower case)

    @property
    def bytes(self) -> int:
        return self.number * UNITS[self.unit]


def parse_size(text: object) -> Size:
    """`8g` -> Size(8, "g"); SizeError when `text` is not a whole number with an optional b, k, m or g."""
    match = SIZE_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise SizeError(f"{text!r} is not a size like 8g, 512m or 1073741824 (a whole number with b, k, m or g)")
    number, unit = match.groups()
    return Size(int(number), unit.lower())


def size_bytes(text: object) -> int:
    """`8g` -> 8589934592; SizeError (a ValueError) naming `text` when it is not a size."""
    return parse_size(text).bytes


MAX_SHM_BYTES = 1 << 50   # 1 PiB: more than any machine's memory


def shm_bytes(text: object) -> int:
    """A /dev/shm size in bytes, by the one rule every command's --shm-size and the matrix's run.shm_size share: a
    size, above 0 (a /dev/shm of 0 bytes holds no DataLoader batch or NCCL buffer), at most MAX_SHM_BYTES; SizeError
    naming `text` otherwise. The matrix asks more of a run profile (contracts.runprofile.MIN_SHM_SIZE)."""
    count = size_bytes(text)
    if count == 0:
        raise SizeError(f"{text!r} is a /dev/shm of 0 bytes: no room for DataLoader workers or NCCL; "
                        "give a size like 8g")
    if count > MAX_SHM_BYTES:
        raise SizeError(f"{text} is larger than any machine's memory")
    return count


def doubling(low: str, high: str) -> list[int]:
    """Byte counts LOW, 2*LOW, ... up to HIGH (`64k`, `1m` -> 65536 ... 1048576), as the bus-bandwidth
    measurement takes them; SizeError for a size that does not parse or a range that is empty."""
    first, last = size_bytes(low), size_bytes(high)
    if not 0 < first <= last:
        raise SizeError(f"sizes {low}..{high}: the first must be above 0 and at most the last")
    return [first << n for n in range((last // first).bit_length())]
