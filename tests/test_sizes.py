"""The one size grammar (buildtool.common.sizes) at its boundaries: what every stage accepts as a size
(the matrix's /dev/shm, the SLURM bundle, the Kubernetes launcher, the bus-bandwidth sizes the image
tests hand to ddp_train.py as byte counts)."""

from __future__ import annotations

from pathlib import Path

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


@pytest.mark.parametrize("text", ["0", "0m", "00g", "0b"])
def test_a_shm_size_of_zero_is_refused_naming_it(text: str) -> None:
    from buildtool.common.sizes import shm_bytes  # new: the one rule of --shm-size and run.shm_size

    with pytest.raises(SizeError, match=f"^{text!r} is a /dev/shm of 0 bytes: no room for DataLoader workers or NCCL"):
        shm_bytes(text)
    assert shm_bytes("1m") == 1 << 20 and shm_bytes("1048576g") == 1 << 50
    with pytest.raises(SizeError, match="larger than any machine's memory"):
        shm_bytes("1048577g")


REPO = Path(__file__).resolve().parent.parent
SHM_COMMANDS = [
    ["k8s", "127.0.0.1:5000/pytorch-ngc-dev:0123456789ab-25.01", "--nodes", "2"],
    ["slurm", "/shared/x.sif", "--framework", "pytorch"],
    ["bundle", "127.0.0.1:5000/pytorch-ngc-dev:0123456789ab-25.01", "/nonexistent/bundle"],
    ["scaling", "--launcher", "slurm", "--runtime", "apptainer", "--image", "/shared/x.sif"],
]


@pytest.mark.parametrize("command", SHM_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("shm", ["0", "0m", "1048577g"])
def test_every_shm_size_option_refuses_zero_and_past_any_memory(run_cli, command: list[str], shm: str) -> None:
    """--shm-size took any size: 0 became a Kubernetes sizeLimit '0', an sbatch SHM_BYTES=0, a bundle's tmpfs of 0
    bytes, where DataLoader workers and NCCL die. Refused now, one line, before anything is made."""
    code, out, err = run_cli(*command, "--shm-size", shm, "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: --shm-size: ") and ("0 bytes" in err or "larger than any" in err), err
