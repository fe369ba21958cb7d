"""What the code under test puts in a temporary folder of its own lands under the session's pytest folder, also
what a test module makes at collection (tests/conftest.py's fixture image-tests copy): a run leaves nothing in
TMPDIR, even when xdist kills a worker that is slow to exit before its exit handlers ran (CI found 23 folders)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.conftest import fixture_image_tests


def test_the_code_under_tests_temporary_folders_are_under_the_sessions_folder(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    session = tmp_path_factory.getbasetemp().resolve()
    assert Path(tempfile.gettempdir()).resolve().is_relative_to(session)
    assert fixture_image_tests().resolve().is_relative_to(session)
