"""The matrix snapshot `release` starts from: the same values the real load gives, never stale."""

from __future__ import annotations

import dataclasses
import inspect
import shutil
from pathlib import Path

import pytest

from buildtool.cli.console import Project
from buildtool.common.errors import UserError
from buildtool.matrix import snapshot
from tests.conftest import FIXTURE_MATRIX, copy_fixture_image_tests

REPO = Path(__file__).resolve().parent.parent


def same(real: object, snap: object, where: str) -> None:
    """Every field, property and argument-less method of `real` has the same value on `snap`."""
    if dataclasses.is_dataclass(real):
        names = [f.name for f in dataclasses.fields(real)]
        for cls in type(real).__mro__[:-1]:
            for name, member in vars(cls).items():
                if name.startswith("_"):
                    continue
                if isinstance(member, property):
                    names.append(name)
                elif inspect.isfunction(member) and len(inspect.signature(member).parameters) == 1:
                    assert getattr(real, name)() == getattr(snap, name)(), f"{where}.{name}()"
        for name in names:
            same(getattr(real, name), getattr(snap, name), f"{where}.{name}")
    elif hasattr(type(real), "model_fields"):
        for name in type(real).model_fields:
            same(getattr(real, name), getattr(snap, name), f"{where}.{name}")
    elif isinstance(real, tuple | list):
        assert type(real) is type(snap) and len(real) == len(snap), where
        for i, (a, b) in enumerate(zip(real, snap, strict=True)):
            same(a, b, f"{where}[{i}]")
    else:
        assert real == snap, where


def _repo_project(tmp_path: Path, matrix: Path = REPO / "matrix.yaml") -> Project:
    """A project of MATRIX, the templates beside it (else the checkout's) and the checkout's image-tests (the groups
    cells name), under tmp_path/p."""
    root = tmp_path / "p"
    root.mkdir()
    shutil.copy2(matrix, root / "matrix.yaml")
    templates = matrix.parent / "templates"
    shutil.copytree(templates if templates.is_dir() else REPO / "templates", root / "templates")
    shutil.copytree(REPO / "image-tests", root / "image-tests")
    return Project(root=root, matrix_path=root / "matrix.yaml")


@pytest.mark.parametrize("matrix", [REPO / "matrix.yaml", REPO / "tests/fixtures/mini/matrix.yaml"])
def test_snapshot_gives_every_value_of_the_real_matrix(tmp_path: Path, matrix: Path) -> None:
    project = _repo_project(tmp_path, matrix)
    real = project.load()                          # writes the snapshot
    snap = project.load_fast()
    assert isinstance(snap, snapshot.MatrixSnapshot)
    same(real, snap, "matrix")
    for name in snapshot.selection_names(real):
        assert [c.key for c in snap.select(name)] == [c.key for c in real.select(name)]
    with pytest.raises(UserError, match="unknown FRAMEWORK='nope'"):
        snap.select("nope")                        # unknown names go to the real matrix


def test_a_changed_matrix_is_loaded_for_real(tmp_path: Path) -> None:
    project = _repo_project(tmp_path)
    root = project.root
    project.load()
    text = (root / "matrix.yaml").read_text().replace('shm_size: 8g', 'shm_size: 4g', 1)
    (root / "matrix.yaml").write_text(text)
    fresh = project.load_fast()
    assert not isinstance(fresh, snapshot.MatrixSnapshot)       # the key changed: a real load
    assert fresh.cells[0].run.shm_size == "4g"
    assert project.load_fast().cells[0].run.shm_size == "4g"    # and its snapshot from then on
    (snapshot.cache_dir()).mkdir(parents=True, exist_ok=True)
    for path in snapshot.cache_dir().glob("*.json"):
        path.write_text("{not json")                             # a broken cache is ignored
    assert project.load_fast().cells[0].run.shm_size == "4g"


def test_a_template_that_now_needs_a_field_is_loaded_for_real(tmp_path: Path) -> None:
    """A template's first line may name fields the matrix must set: a snapshot taken before the
    template said so must not let a release skip that check."""
    project = _repo_project(tmp_path)
    root = project.root
    project.load()
    assert isinstance(project.load_fast(), snapshot.MatrixSnapshot)
    template = root / "templates" / "images" / "ngc.Dockerfile.j2"
    template.write_text("{# needs: apt_packages #}\n" + template.read_text())
    with pytest.raises(UserError, match="needs apt_packages"):
        project.load_fast()


def test_a_change_past_byte_512_of_a_templates_first_line_is_loaded_for_real(tmp_path: Path) -> None:
    """The key hashed the first 512 bytes of each template's first line, which the load reads whole: a field
    named past them (a long `needs:` line) did not change the key, and release kept the stale snapshot. Both read
    the line through snapshot.template_first_line now."""
    project = _fixture_project(tmp_path)
    template = project.templates / "images" / "ngc.Dockerfile.j2"
    head = "{# needs: python" + " " * 600
    template.write_text(head + "#}\n" + template.read_text())
    project.load()
    key = snapshot.snapshot_key(project.matrix_path, project.templates, "matrix.yaml")
    assert isinstance(project.load_fast(), snapshot.MatrixSnapshot)
    template.write_text(template.read_text().replace(head + "#}", head + ", apt_packages #}", 1))
    assert snapshot.snapshot_key(project.matrix_path, project.templates, "matrix.yaml") not in ("", key)
    with pytest.raises(UserError, match="needs apt_packages"):
        project.load_fast()


def test_a_removed_test_group_folder_is_loaded_for_real(tmp_path: Path) -> None:
    """Every group a cell names must be a folder of image-tests: a snapshot taken while it was there
    must not let a release skip that check once it is gone."""
    project = _fixture_project(tmp_path)   # its frameworks: pytorch and tensorflow
    root = project.root
    project.load()
    assert isinstance(project.load_fast(), snapshot.MatrixSnapshot)
    shutil.rmtree(root / "image-tests" / "tensorflow")
    with pytest.raises(UserError, match=r"unknown framework 'tensorflow'; one of pytorch \(a new one is a folder"):
        project.load_fast()


def test_a_framework_folder_the_load_would_now_refuse_is_loaded_for_real(tmp_path: Path) -> None:
    """The load checks each framework.yaml against its folder (its test_*.py, its scripts): a snapshot taken while
    the folder passed must not let release use a matrix `buildtool plan` now refuses
    (tests/test_framework_folder.py tries every such change on the key)."""
    project = _fixture_project(tmp_path)
    project.load()
    assert isinstance(project.load_fast(), snapshot.MatrixSnapshot)
    for test in (project.root / "image-tests" / "tensorflow").glob("test_*.py"):
        test.unlink()
    with pytest.raises(UserError, match=r"^image-tests/tensorflow/framework\.yaml: tensorflow/ holds no test_\*\.py"):
        project.load_fast()


@pytest.mark.parametrize(("change", "cause"), [
    (lambda site: (site / "test_acme.py").unlink(), "holds no test_\\*.py"),
    (lambda site: shutil.rmtree(site), "no folder"),
], ids=["test-files-deleted", "folder-removed"])
def test_a_site_folder_the_load_would_now_refuse_is_loaded_for_real(tmp_path: Path, change, cause: str) -> None:
    """validate.extra_tests names a folder the load checks (contracts.sitetests): a snapshot taken while it passed
    must not let release or verify accept the matrix once it does not."""
    from tests.test_site_checks import project as site_project
    from tests.test_site_checks import site

    root = tmp_path / "p"
    root.mkdir()
    site_project(root, "site-acme")
    shutil.copytree(REPO / "templates", root / "templates")
    folder = site(root)
    project = Project(root=root, matrix_path=root / "matrix.yaml")
    project.load()
    assert isinstance(project.load_fast(), snapshot.MatrixSnapshot)
    change(folder)
    with pytest.raises(UserError, match=cause):
        project.load_fast()


def _with(path: tuple, value: object):
    """A damage: the snapshot with the value at `path` replaced (removed when `value` is _GONE)."""
    def damage(data: dict) -> object:
        node = data
        for part in path[:-1]:
            node = node[part]
        if value is _GONE:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return data
    return damage


_GONE = object()



def _fixture_project(tmp_path: Path) -> Project:
    """A project of the fixture matrix, the templates and the fixture image-tests, under tmp_path/p."""
    root = tmp_path / "p"
    root.mkdir()
    shutil.copy2(FIXTURE_MATRIX, root / "matrix.yaml")
    shutil.copytree(REPO / "templates", root / "templates")
    copy_fixture_image_tests(root / "image-tests")
    return Project(root=root, matrix_path=root / "matrix.yaml")


@pytest.mark.parametrize("damage", [
    lambda d: {"version": 1},
    lambda d: [d],
    _with(("version",), 2),
    _with(("cells",), _GONE),
    _with(("selections",), []),
    _with(("selections", "all"), [10**6]),
    _with(("selections", "all"), ["0"]),
    _with(("cells", 0), "cell"),
    _with(("matrix", "values"), []),
    _with(("cells", 0, "values", "run"), {"o": 5}),
    _with(("cells", 0, "values", "tests"), {"d": []}),
], ids=["only-version", "a-list", "other-version", "no-cells", "selections-a-list", "selection-out-of-range",
        "selection-not-an-index", "cell-not-a-record", "values-a-list", "inner-record-damaged", "inner-dict-damaged"])
def test_a_damaged_snapshot_is_loaded_for_real_and_rewritten(tmp_path: Path, damage) -> None:
    """A snapshot without the shape `write` gives it (edited, or written by other code) is never read:
    release and verify load the matrix for real, which writes a good one again."""
    import json

    project = _fixture_project(tmp_path)
    real = project.load()
    path = snapshot.cache_dir() / f"{snapshot.snapshot_key(project.matrix_path, project.templates, 'matrix.yaml')}.json"
    path.write_text(json.dumps(damage(json.loads(path.read_text()))))
    loaded = project.load_fast()
    assert not isinstance(loaded, snapshot.MatrixSnapshot)
    assert [c.key for c in loaded.cells] == [c.key for c in real.cells]
    assert isinstance(project.load_fast(), snapshot.MatrixSnapshot)   # the real load wrote it again


def test_no_snapshot_of_what_is_not_a_matrix_file(tmp_path: Path) -> None:
    """A directory, a pipe or a device is reported by the real load, never read for a key."""
    assert snapshot.snapshot_key(tmp_path, tmp_path / "templates", "x") == ""
    assert snapshot.snapshot_key(Path("/dev/zero"), tmp_path / "templates", "x") == ""
    assert snapshot.read("", lambda: None) is None


def test_an_unlistable_image_tests_folder_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image-tests/ that cannot be listed (no read permission: simulated, tests may run as root) gets no
    snapshot key; the real load names the folder in one line, no traceback from release or verify."""
    project = _fixture_project(tmp_path)
    iterdir = Path.iterdir

    def unlistable(self: Path):
        if self.name == "image-tests":
            raise PermissionError(13, "Permission denied", str(self))
        return iterdir(self)

    monkeypatch.setattr(Path, "iterdir", unlistable)
    assert snapshot.snapshot_key(project.matrix_path, project.templates, "matrix.yaml") == ""
    with pytest.raises(UserError, match=r"cannot list the framework folders of \S*/p/image-tests \("):
        project.load_fast()


def test_a_matrix_too_big_to_pay_off_gets_no_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every load writes a snapshot; past MAX_CELLS that would cost more than it saves."""
    project = _repo_project(tmp_path)
    root = project.root
    monkeypatch.setattr(snapshot, "MAX_CELLS", len(project.load().cells) - 1)
    (root / "matrix.yaml").write_text((root / "matrix.yaml").read_text() + "\n# changed\n")
    project.load()
    assert not isinstance(project.load_fast(), snapshot.MatrixSnapshot)
    monkeypatch.setattr(snapshot, "MAX_CELLS", 1000)
    project.load()
    assert isinstance(project.load_fast(), snapshot.MatrixSnapshot)


def test_a_matrix_saved_during_the_load_gets_no_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """matrix.yaml saved while a slow load reads it: the cells read before the save must not be stored under the
    saved file's key (release would reuse them); no snapshot then, and the next fast load is a real one."""
    from buildtool.matrix import loader

    project = _repo_project(tmp_path)
    root = project.root
    monkeypatch.setattr(snapshot, "cache_dir", lambda: tmp_path / "cache")   # none from other tests
    old_key = snapshot.snapshot_key(project.matrix_path, project.templates, "matrix.yaml")
    real_load = loader.load_matrix

    def saved_midway(*args, **kwargs):
        loaded = real_load(*args, **kwargs)    # read the old text; the user saves the file now
        text = (root / "matrix.yaml").read_text().replace("shm_size: 8g", "shm_size: 4g", 1)
        (root / "matrix.yaml").write_text(text)
        return loaded

    monkeypatch.setattr(loader, "load_matrix", saved_midway)
    assert project.load().cells[0].run.shm_size == "8g"
    monkeypatch.setattr(loader, "load_matrix", real_load)
    new_key = snapshot.snapshot_key(project.matrix_path, project.templates, "matrix.yaml")
    assert new_key not in ("", old_key)
    assert not (snapshot.cache_dir() / f"{old_key}.json").exists()
    assert not (snapshot.cache_dir() / f"{new_key}.json").exists()
    fresh = project.load_fast()
    assert not isinstance(fresh, snapshot.MatrixSnapshot)
    assert fresh.cells[0].run.shm_size == "4g"


@pytest.mark.parametrize("fault", [OSError(28, "No space left on device"), KeyboardInterrupt()],
                         ids=["disk-full", "ctrl-c"])
def test_a_snapshot_that_cannot_be_written_leaves_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    fault: BaseException) -> None:
    """The snapshot is written beside its name and renamed into place: a write that failed (a full disk, a cache the
    rename is refused in, Ctrl-C) left its `<key>.<pid>.tmp` in the cache folder, one more on every load."""
    import os

    project = _fixture_project(tmp_path)
    monkeypatch.setattr(snapshot, "cache_dir", lambda: tmp_path / "cache")

    def refused(*_args: object) -> None:
        raise fault
    monkeypatch.setattr(os, "replace", refused)
    if isinstance(fault, KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):
            project.load()
    else:
        project.load()    # no snapshot: the next load reads the matrix for real
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == []
