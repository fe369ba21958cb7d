"""Commands on a broken machine: a home that cannot be written, a full disk, a registry or engine that is down or
never answers. Each is stood in for here (a path through a file, a write that raises ENOSPC, a socket that accepts
and never answers); each must end in one line naming what is wrong and what to do, and leave nothing behind."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from buildtool.attest import dsse
from buildtool.attest.keys import signing_key
from buildtool.attest.verdict_statement import SIGNING_KEY_ENV, dev_key_path
from buildtool.common.errors import UserError
from buildtool.registry.client import RegistryClient, RegistryError, RetryPolicy
from buildtool.registry.transport import TransportConnectionError


def test_a_dev_key_that_cannot_be_made_is_one_line_naming_it(monkeypatch, tmp_path: Path) -> None:
    """XDG_CONFIG_HOME through a file (or read-only): validate and build --push, which make the dev key when none
    is there, ended in a NotADirectoryError/PermissionError traceback."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "file" / "config"))
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    with pytest.raises(UserError) as caught:
        signing_key(lambda _: None)
    message = str(caught.value)
    assert str(dev_key_path()) in message and "Not a directory" in message
    assert "XDG_CONFIG_HOME" in message and SIGNING_KEY_ENV in message and "\n" not in message


def test_a_dev_key_cut_short_by_a_full_disk_is_not_left_empty(monkeypatch, tmp_path: Path) -> None:
    """A full disk while the dev key was written ended in an OSError traceback and left an empty 0600 key file, which
    every later validate refused ('is not an unencrypted PEM private key'). Now one line, and no file."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    real = os.fdopen

    class Full:
        def __init__(self, fd: int, mode: str) -> None:
            self.handle = real(fd, mode)

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(dsse.os, "fdopen", Full)
    with pytest.raises(UserError) as caught:
        signing_key(lambda _: None)
    assert "No space left on device" in str(caught.value) and str(dev_key_path()) in str(caught.value)
    assert not dev_key_path().exists()
    monkeypatch.setattr(dsse.os, "fdopen", real)
    assert signing_key(lambda _: None).dev   # the next run makes the key


@pytest.fixture
def silent_registry() -> Iterator[str]:
    """A registry that takes every connection and never answers a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    taken: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                taken.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in taken:
        conn.close()
    server.close()


def test_a_registry_that_never_answers_is_named_with_the_time_waited(silent_registry: str) -> None:
    """A registry that accepts connections and never answers: validate, verify and release ended in
    'failed: GET http://...: Timeout after 5 attempts', naming neither how long each waited nor what to do."""
    client = RegistryClient(silent_registry, retry=RetryPolicy(attempts=2, timeout=0.3), sleep=lambda _: None)
    with pytest.raises(RegistryError) as caught:
        client.manifest_digest("pytorch-cpu", "2.13")
    message = str(caught.value)
    assert "no answer within 0.3 s, 2 attempts" in message and f"is {silent_registry} answering?" in message
    assert "REGISTRY" in message and "\n" not in message


def test_fetched_verdicts_a_full_disk_cuts_are_one_line_and_no_cut_file(project: Path, run_cli, monkeypatch,
                                                                         tmp_path: Path) -> None:
    """`report --fetch` wrote each fetched verdict in place: a full disk ended the command in an OSError traceback
    and left an empty <cell>.verdict.json in --verdicts (the folder the next night reads as its previous one).
    Now one line naming --verdicts, exit 2, and no cut file."""
    from buildtool.report import fetch

    def fetched(refs: dict, trusted: object = None, platforms: object = None) -> list[dict]:
        return [{"missing": True, "cell": cell, "image": ref, "reason": "no image"} for cell, ref in refs.items()]

    monkeypatch.setattr(fetch, "fetch_verdicts", fetched)
    real = os.fdopen

    def full(fd: int, mode: str = "r", *args: object, **kwargs: object) -> object:
        handle = real(fd, mode, *args, **kwargs)   # type: ignore[call-overload]
        if "w" in mode:
            def write(data: object) -> int:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            handle.write = write
        return handle

    monkeypatch.setattr(os, "fdopen", full)   # write_atomic's way
    monkeypatch.setattr(Path, "write_text", lambda self, *a, **k: full(os.open(self, os.O_WRONLY | os.O_CREAT),
                                                                          "w").write(""))   # write_text's
    folder = tmp_path / "verdicts"
    code, _, err = run_cli("report", "--fetch", "--framework", "pytorch-cpu:2.13", "--verdicts", str(folder),
                           "--out", str(tmp_path / "o"), "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith("error: --verdicts '") and ": cannot write there (No space left on device)" in err
    assert list(folder.iterdir()) == []


def test_a_checkout_where_the_release_files_cannot_go_is_refused_before_any_tag(project: Path, run_cli, monkeypatch,
                                                                                 no_registry_backoff: None) -> None:
    """A release wrote docs/releases/ after the tags moved: in a checkout where it cannot (read-only, a file in the
    way) the tags were promoted and the command ended in an OSError traceback. Now it is refused first (the
    registry here is unreachable: reaching it would be another error); a dry run, which writes nothing, is not."""
    monkeypatch.setenv("REGISTRY", "127.0.0.1:1")
    monkeypatch.delenv("RELEASE_REGISTRY", raising=False)
    (project / "docs").mkdir(exist_ok=True)
    (project / "docs/releases").write_text("a file in the way\n")
    args = ("release", "--version", "0.1.0", "-f", "pytorch-cpu", "--matrix", str(project / "matrix.yaml"))
    code, _, err = run_cli(*args)
    assert code == 2 and "Traceback" not in err and "unreachable" not in err, err
    assert f"cannot write the release files into {project / 'docs/releases'}" in err and "nothing was promoted" in err
    code, _, err = run_cli(*args, "--dry-run")
    assert code == 2 and "unreachable" in err, err


def test_release_files_a_full_disk_stops_are_one_line_saying_the_tags_moved(project: Path, monkeypatch,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A disk that filled while the notes were written, after the tags moved, was an OSError traceback. Now one
    line, exit 1, that says the tags are promoted and that the same command writes the files."""
    from buildtool.cli import release_run
    from buildtool.cli.console import find_project
    from buildtool.common import files
    from buildtool.common.errors import FailedError
    from buildtool.release import notes
    from buildtool.release.promote import ReleaseReport
    from tests.test_release_notes import item

    def full(path: Path, data: object, mode: object = None) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(notes, "write_atomic", full)
    found = find_project(project / "matrix.yaml")
    with pytest.raises(FailedError) as caught:
        release_run._finish(found, found.load(), ReleaseReport("0.2.0", "abc", [item()]), False, False)
    message = str(caught.value)
    assert message.startswith("release 0.2.0: the tags are promoted but its files could not be written (")
    assert "docs/releases/0.2.0.json" in message and "No space left on device" in message
    assert "run the same command again" in message and "\n" not in message
    # The release files written, the catalogue not: the same command would find nothing to write; it says what will.
    monkeypatch.undo()
    monkeypatch.setattr(files, "write_atomic", full)
    with pytest.raises(FailedError) as caught:
        release_run._finish(found, found.load(), ReleaseReport("0.2.0", "abc", [item()]), False, False)
    assert str(caught.value) == ("release 0.2.0: the tags are promoted and its files written, but docs/images.md "
                                 "could not be (No space left on device); free space there and run `buildtool "
                                 "catalogue`")


def test_a_base_registry_that_is_down_names_base_mirror_not_registry(monkeypatch, no_registry_backoff: None) -> None:
    """`make lock` without BASE_MIRROR reads each pip cell's Debian base from docker.io: with docker.io out of reach
    (no network) it said 'registry docker.io is unreachable; ... or set REGISTRY to a reachable registry', and
    REGISTRY is not where a base is read from. Now it names the base and BASE_MIRROR."""
    from buildtool.imagebuild import aptlock

    monkeypatch.setattr("buildtool.registry.client.RegistryClient._send",
                        lambda *a, **k: (_ for _ in ()).throw(TransportConnectionError("refused")))
    with pytest.raises(UserError) as caught:
        aptlock.platform_base("127.0.0.1:1/library/debian:bookworm-slim", "linux/amd64")
    message = str(caught.value)
    assert message.startswith("cannot read the base 127.0.0.1:1/library/debian:bookworm-slim: registry 127.0.0.1:1 "
                              "is unreachable; set BASE_MIRROR to a registry that holds the bases")
    assert "REGISTRY to" not in message.replace("BASE_MIRROR to", "")


def test_a_release_file_that_cannot_take_this_part_is_refused_before_any_tag(project: Path, run_cli, monkeypatch,
                                                                              no_registry_backoff: None) -> None:
    """An earlier part's docs/releases/<version>.json written before `source_commit` existed was found only when the
    files were written, after the tags moved (then a re-run found the tags in place and wrote nothing). Now it is
    refused first, dry run or not, naming the file (the registry here is unreachable: reaching it would be another
    error)."""
    import json

    from buildtool.release.notes import build_manifest
    from buildtool.release.promote import ReleaseReport
    from tests.test_release_notes import item

    monkeypatch.setenv("REGISTRY", "127.0.0.1:1")
    monkeypatch.delenv("RELEASE_REGISTRY", raising=False)
    legacy = build_manifest(ReleaseReport("0.1.0", "abc", [item("tensorflow-cpu:2.21")]))
    del legacy["source_commit"]
    del legacy["images"][0]["source_commit"]
    path = project / "docs/releases/0.1.0.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(legacy))
    args = ("release", "--version", "0.1.0", "-f", "pytorch-cpu", "--matrix", str(project / "matrix.yaml"))
    for extra in ((), ("--dry-run",)):
        code, _, err = run_cli(*args, *extra)
        assert code == 2 and "Traceback" not in err and "unreachable" not in err, err
        assert err.startswith(f"error: {path}: image(s) tensorflow-cpu:2.21 have no `source_commit`"), err
