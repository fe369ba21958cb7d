"""common.files.write_changed: what it compares and writes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from buildtool.common.files import write_atomic, write_changed


def test_a_file_that_is_not_utf8_is_replaced_not_a_traceback(tmp_path: Path) -> None:
    """write_changed read each existing file as text in the locale's encoding: a lock that is not UTF-8 (saved in
    Latin-1, a merge tool's stray byte) made `make lock` end in a UnicodeDecodeError traceback instead of writing the
    lock it had just resolved. It is compared by its bytes now, and replaced."""
    lock = tmp_path / "pylock.toml"
    lock.write_bytes(b"caf\xe9\n")
    assert write_changed({lock: "café\n"}) == [lock]
    assert lock.read_bytes() == "café\n".encode()
    assert write_changed({lock: "café\n"}) == []   # the same text again: nothing written


def test_an_atomic_write_keeps_the_mode_of_the_file_it_replaces(tmp_path: Path) -> None:
    """write_atomic gave every file it wrote 0644: rewriting a private 0600 file (a launch script `--out` names,
    with its job's settings) made it readable by everyone, and a script lost its x bit; writing it in place keeps
    both. The replaced file's mode is kept now; a new file is 0644, and a mode given is the mode."""
    private, script, new = tmp_path / "job.sh", tmp_path / "run.sh", tmp_path / "new.txt"
    private.write_text("old\n")
    private.chmod(0o600)
    script.write_text("old\n")
    script.chmod(0o750)
    write_atomic(private, "new\n")
    write_atomic(script, b"new\n")
    write_atomic(new, "x")
    assert [stat.S_IMODE(p.stat().st_mode) for p in (private, script, new)] == [0o600, 0o750, 0o644]
    assert private.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["job.sh", "new.txt",
                                                                                              "run.sh"]
    write_atomic(private, "again\n", mode=0o640)
    assert stat.S_IMODE(private.stat().st_mode) == 0o640


def test_a_new_file_follows_the_umask_as_open_would(tmp_path: Path) -> None:
    """A new file was 0644 whatever the umask: a site's umask 077 (reports, verdicts, release files) was widened to
    world-readable, where open() would have made it 0600."""
    previous = os.umask(0o077)
    try:
        write_atomic(tmp_path / "private.json", "{}\n")
        os.umask(0o027)
        write_atomic(tmp_path / "group.json", "{}\n")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "group.json").stat().st_mode) == 0o640
