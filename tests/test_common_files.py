"""common.files.write_changed: what it compares and writes."""

from __future__ import annotations

from pathlib import Path

from buildtool.common.files import write_changed


def test_a_file_that_is_not_utf8_is_replaced_not_a_traceback(tmp_path: Path) -> None:
    """write_changed read each existing file as text in the locale's encoding: a lock that is not UTF-8 (saved in
    Latin-1, a merge tool's stray byte) made `make lock` end in a UnicodeDecodeError traceback instead of writing the
    lock it had just resolved. It is compared by its bytes now, and replaced."""
    lock = tmp_path / "pylock.toml"
    lock.write_bytes(b"caf\xe9\n")
    assert write_changed({lock: "café\n"}) == [lock]
    assert lock.read_bytes() == "café\n".encode()
    assert write_changed({lock: "café\n"}) == []   # the same text again: nothing written
