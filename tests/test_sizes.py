"""The one size grammar (buildtool.common.sizes) at its boundaries: what every stage accepts as a size
(the matrix's /dev/shm, the SLURM bundle, the Kubernetes launcher, the bus-bandwidth sizes the image
tests hand to ddp_train.py as byte counts)."""

from __future__ import annotations

import pytest

from buildtool.common.sizes import Size, SizeError, parse_size, size_bytes

ACCEPTED = [
    ("0", 0), ("1", 1), ("4096", 4096), ("007", 7),
    ("1b", 1), ("1B", 1), ("1k", 1 << 10), ("1K", 1 << 10), ("512m", 512 << 20), ("512M", 512 << 20),
    ("8g", 8 << 30), ("8G", 8 << 30), ("1125899906842624", 1 << 50),
]
REJECTED = ["", " ", "g", "b", "-1", "+1", "1.5g", "1,5g", "8 g", " 8g", "8g ", "8g\n", "8gb", "8GB", "8Gi",
            "8kib", "8t", "8T", "8e3", "0x10", "١٢", "8g8", "g8", "8gg"]


@pytest.mark.parametrize(("text", "expected"), ACCEPTED)
def test_a_size_is_a_whole_number_and_one_unit(text: str, expected: int) -> None:
    assert size_bytes(text) == expected


@pytest.mark.parametrize("text", REJECTED)
def test_anything_else_is_an_error_naming_it(text: str) -> None:
    with pytest.raises(SizeError, match="is not a size like 8g") as caught:
        size_bytes(text)
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize("value", [8, 8.0, None, b"8g", ["8g"]])
def test_a_size_is_text(value: object) -> None:
    with pytest.raises(SizeError, match="is not a size"):
        size_bytes(value)


def test_the_parsed_size_keeps_its_unit() -> None:
    assert parse_size("512M") == Size(512, "m") and parse_size("512M").bytes == 512 << 20
    assert parse_size("4096") == Size(4096, "")
