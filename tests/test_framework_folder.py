"""A framework is one folder (image-tests/<name>/): its table row, template parts, in-image scripts
and image-tests group. Adding one is that folder plus its matrix entry; the generated files follow
from `make render`. Anything in the folder that does not make a row is an error naming the file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.contracts import frameworks
from buildtool.matrix.loader import load_matrix
from buildtool.validate.collect import defined_tests

REPO = Path(__file__).resolve().parent.parent
FIXTURE_FW = REPO / "tests" / "fixtures" / "frameworks" / "fixturefw"
# Its entry, appended to a matrix.yaml (under `images:`).
MATRIX_ENTRY = "\n" + (FIXTURE_FW.parent / "fixturefw.matrix.yaml").read_text()
# What `make render` writes for a matrix: Dockerfiles, the catalogue, the CI workflows.
GENERATED = ("dockerfiles/", "docs/images.md", ".github/workflows/")


def _changed(root: Path) -> set[str]:
    proc = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-uall"], capture_output=True,
                          text=True, check=True, timeout=30)
    return {line[3:] for line in proc.stdout.splitlines()}


def add_fixture_framework(project: Path) -> None:
    shutil.copytree(FIXTURE_FW, project / "image-tests" / "fixturefw")
    (project / "matrix.yaml").write_text((project / "matrix.yaml").read_text() + MATRIX_ENTRY)


def shipped_frameworks(root: Path = REPO) -> list[str]:
    """The frameworks of a checkout: its image-tests folders with a framework.yaml (never a list written here)."""
    return sorted(p.parent.name for p in (root / "image-tests").glob(f"*/{frameworks.FRAMEWORK_FILE}"))


def test_the_shipped_frameworks_are_the_folders_with_a_framework_yaml() -> None:
    folders = shipped_frameworks()
    frameworks.use_checkout()
    assert list(frameworks.names()) == folders and folders
    for name in folders:
        row = frameworks.get(name)
        assert row.folder == REPO / "image-tests" / name
        assert (row.scripts / row.events_writer[0]).is_file()


def test_a_new_framework_is_one_folder_and_its_matrix_entry(project: Path, run_cli) -> None:
    code, _, err = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 0 and not _changed(project), (err, _changed(project))   # the fixture project is rendered
    add_fixture_framework(project)
    edited = _changed(project)
    assert edited == {"matrix.yaml", *(f"image-tests/fixturefw/{p.relative_to(FIXTURE_FW)}"
                                      for p in FIXTURE_FW.rglob("*") if p.is_file())}

    code, _, err = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 0, err
    generated = _changed(project) - edited
    assert generated and all(path.startswith(GENERATED) for path in generated), generated
    dockerfile = (project / "dockerfiles/fixturefw/fixturefw-img/1.0/Dockerfile").read_text()
    # The shared pip template, the framework's title, and its own template part.
    assert "rendered from templates/images/pip.Dockerfile.j2" in dockerfile
    assert "# FixtureFW 2.0.9 (cpu) and its dependencies (pylock.framework.toml)." in dockerfile
    assert "\nENV FIXTUREFW_HOME=/opt/fixturefw\n" in dockerfile
    assert "fixturefw-img" in (project / "docs/images.md").read_text()

    code, out, err = run_cli("plan", "--json", "-f", "fixturefw", "--matrix", str(project / "matrix.yaml"))
    assert code == 0, err
    [planned] = json.loads(out)["include"]
    assert planned["framework"] == "fixturefw" and planned["tests"] == ["common", "fixturefw"]

    matrix = load_matrix(project / "matrix.yaml", project / "templates")
    [cell] = matrix.select("fixturefw")
    defined = defined_tests(cell, project / "image-tests")
    assert "fixturefw/test_fixturefw.py::test_fixture_framework_module_answers" in defined
    assert any(test.startswith("common/test_cross_tensorboard.py::") for test in defined)
    # The other frameworks pair with it in the cross-framework check (the table is its folders).
    assert "fixturefw" in {f.name for f in frameworks.others("pytorch")}


def _folder(tmp_path: Path) -> Path:
    suite = tmp_path / "image-tests"
    shutil.copytree(REPO / "image-tests" / "scripts", suite / "scripts")
    shutil.copytree(FIXTURE_FW, suite / "fixturefw")
    return suite / "fixturefw"


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


WHERE = "image-tests/fixturefw/framework.yaml"

# Changes to the fixture's folder that load_row refuses, with the start of its message.
ROW_REFUSALS = [
    (lambda f: (f / "framework.yaml").write_text(_edit((f / "framework.yaml").read_text(), "title: FixtureFW\n",
                                                      "title: FixtureFW\ntitel: typo\n")),
     f"{WHERE}: titel: Extra inputs are not permitted"),
    (lambda f: (f / "framework.yaml").write_text(_edit((f / "framework.yaml").read_text(), "module: json\n", "")),
     f"{WHERE}: module: required key is missing"),
    (lambda f: (f / "framework.yaml").write_text(_edit((f / "framework.yaml").read_text(), "name: fixturefw",
                                                      "name: otherfw")),
     f"{WHERE}: name 'otherfw' is not its folder's ('fixturefw'); a framework's folder is named after it"),
    (lambda f: (f / "scripts" / "fixture_events.py").unlink(),
     f"{WHERE}: events_writer 'fixture_events.py' is not a script in fixturefw/scripts/"),
    (lambda f: (f / "env.j2").unlink(),
     f"{WHERE}: template part 'env.j2' is not a file in fixturefw/"),
    (lambda f: (f / "scripts" / "probe_io.py").write_text("# shadows the common one\n"),
     f"{WHERE}: fixturefw/scripts/ has probe_io.py, also in scripts/; both are mounted at /imagetests, so rename "
     "the framework's"),
    (lambda f: (f / "framework.yaml").write_text(_edit((f / "framework.yaml").read_text(), 'gpu_count: "0"',
                                                      'gpu_count: "len("')),
     f"{WHERE}: gpu_count 'len(' is not a Python expression ("),
    (lambda f: (f / "framework.yaml").write_text((f / "framework.yaml").read_text() + "module: yaml\n"),
     f"{WHERE}:"),   # a duplicate key: never the last one silently
    (lambda f: (f / "framework.yaml").write_text("- just\n- a list\n"),
     f"{WHERE}: must be a mapping of the framework's fields"),
    # The three kinds a row chooses: each a key of its table, the error naming the known ones and the table.
    (lambda f: (f / "framework.yaml").write_text((f / "framework.yaml").read_text() + "shm_workers: jax\n"),
     f"{WHERE}: shm_workers: 'jax' is none of the known kinds (torch, python); a new kind is an entry of "
     "buildtool/contracts/frameworks.py SHM_WORKERS"),
    (lambda f: (f / "framework.yaml").write_text((f / "framework.yaml").read_text() + "local_versions: nightly\n"),
     f"{WHERE}: local_versions: 'nightly' is none of the known kinds (torch, plain, source); a new kind is an "
     "entry of buildtool/contracts/versions.py SCHEMES"),
    (lambda f: (f / "framework.yaml").write_text((f / "framework.yaml").read_text() + "local_versions: [torch]\n"),
     f"{WHERE}: local_versions: Input should be a valid string"),
    (lambda f: (f / "framework.yaml").write_text(_edit((f / "framework.yaml").read_text(), "gpu_count: \"0\"",
                                                      "gpu_count: 0")),
     f"{WHERE}: gpu_count: Input should be a valid string"),
    # The multi-node check: its script is a file of the folder's scripts/, its launcher one the launchers know.
    (lambda f: (f / "scripts" / "fixture_train.py").unlink(),
     f"{WHERE}: multinode.script 'fixture_train.py' is not a script in fixturefw/scripts/"),
    (lambda f: (f / "framework.yaml").write_text(_edit((f / "framework.yaml").read_text(), "launcher: coordinator",
                                                      "launcher: mpirun")),
     f"{WHERE}: multinode.launcher: 'mpirun' is none of the known kinds (torchrun, coordinator); a new kind is an "
     "entry of buildtool/contracts/frameworks.py LAUNCHERS (its module in buildtool/launch/launchers/)"),
    (lambda f: (f / "framework.yaml").write_text(_edit((f / "framework.yaml").read_text(), "launcher: coordinator",
                                                      "launcher: coordinator, port: 1")),
     f"{WHERE}: multinode.port: Extra inputs are not permitted"),
    (lambda f: (f / "framework.yaml").write_text(_edit((f / "framework.yaml").read_text(),
                                                      "{script: fixture_train.py, ", "{")),
     f"{WHERE}: multinode.script: required key is missing"),
]


@pytest.mark.parametrize(("change", "message"), ROW_REFUSALS)
def test_a_folder_that_does_not_make_a_row_is_an_error_naming_its_file(tmp_path: Path, change, message) -> None:
    folder = _folder(tmp_path)
    frameworks.load_row(folder)   # the fixture itself is a row
    change(folder)
    with pytest.raises(frameworks.TableError) as caught:
        frameworks.load_row(folder)
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_row_without_distributions_is_refused_where_the_table_is_read(project: Path, run_cli) -> None:
    """distributions: [] carries the framework in no pip name: refused naming the file, never an IndexError when a
    template needs framework_requirements (its example names the first distribution)."""
    row = project / "image-tests/pytorch/framework.yaml"
    row.write_text(_edit(row.read_text(), "distributions: [torch]", "distributions: []"))
    text = (project / "matrix.yaml").read_text()
    for line in ('        framework_requirements: ["torch==2.13.0+cpu"]\n',
                 '        framework_requirements: ["torch===2.13.0"]\n'):
        text = _edit(text, line, "")   # the pip template needs it: needs() names an example requirement
    (project / "matrix.yaml").write_text(text)
    code, out, err = run_cli("plan", "-f", "pytorch-cpu:2.13", "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and out == "", err
    assert err.startswith("error: image-tests/pytorch/framework.yaml: distributions: ") and "at least 1" in err, err
    assert len(err.strip().splitlines()) == 1


def test_selecting_a_framework_no_cell_uses_says_it_has_no_cells(project: Path, run_cli) -> None:
    """A framework folder no image of the matrix uses: `-f fixturefw` said "unknown FRAMEWORK='fixturefw'; choose
    one of: ..., fixturefw, ...; did you mean `fixturefw`?". It says the framework has no cells, and offers only
    frameworks some cell is of."""
    shutil.copytree(FIXTURE_FW, project / "image-tests" / "fixturefw")   # the folder, no matrix entry
    code, out, err = run_cli("plan", "-f", "fixturefw", "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and out == "", err
    assert err.strip() == ("error: FRAMEWORK='fixturefw': the framework fixturefw has no cells in matrix.yaml (no "
                           "image there has `framework: fixturefw`); add one, or choose one of: all, pytorch, "
                           "tensorflow, pytorch-ngc, tensorflow-ngc, pytorch-cpu, pytorch-cuda, tensorflow-cpu"), err
    code, _, err = run_cli("plan", "-f", "fixturefx", "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and "unknown FRAMEWORK='fixturefx'" in err and "fixturefw" not in err, err


def test_a_framework_folder_without_a_test_file_is_refused_at_load(project: Path, run_cli) -> None:
    """Issue 37: such a folder rendered with exit 0 and its group collected 0 tests (every image passed untested)."""
    add_fixture_framework(project)
    (project / "image-tests/fixturefw/test_fixturefw.py").rename(project / "image-tests/fixturefw/fixturefw_notes.py")
    with pytest.raises(frameworks.TableError) as caught:
        frameworks.load_row(project / "image-tests/fixturefw")
    assert str(caught.value) == ("image-tests/fixturefw/framework.yaml: fixturefw/ holds no test_*.py, so its "
                                 "image-tests group would collect no test and every image of it would pass untested; "
                                 "add its tests there")
    code, out, err = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and out == "" and "fixturefw/ holds no test_*.py" in err
    assert not (project / "dockerfiles/fixturefw").exists()


def test_a_duplicate_key_is_refused_with_its_line(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    text = (folder / "framework.yaml").read_text()
    (folder / "framework.yaml").write_text(text + "module: yaml\n")
    with pytest.raises(frameworks.TableError, match=r"framework\.yaml:\d+: not valid YAML \(duplicate key 'module'\)"):
        frameworks.load_row(folder)


def test_bytecode_caches_in_both_script_folders_are_no_clash(tmp_path: Path) -> None:
    """Python writes scripts/__pycache__ where a script is run or imported from (with bytecode writing on), in the
    common folder and a framework's alike: that is no script shadowing another (the table refused every matrix)."""
    folder = _folder(tmp_path)
    for scripts in (folder / "scripts", folder.parent / "scripts"):
        (scripts / "__pycache__").mkdir(exist_ok=True)
        (scripts / "__pycache__" / "probe_io.cpython-311.pyc").write_bytes(b"")
    assert frameworks.load_row(folder).name == "fixturefw"


def test_a_broken_framework_folder_stops_the_matrix_load_naming_it(project: Path, run_cli) -> None:
    add_fixture_framework(project)
    (project / "image-tests/fixturefw/framework.yaml").write_text("name: fixturefw\n")
    code, out, err = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and out == ""
    assert err.strip() == "error: image-tests/fixturefw/framework.yaml: title: required key is missing", err
    assert not (project / "dockerfiles/fixturefw").exists()


def test_the_harness_mounts_the_frameworks_scripts_beside_the_common_ones() -> None:
    sys.path.insert(0, str(REPO / "image-tests"))
    try:
        import harness
    finally:
        sys.path.remove(str(REPO / "image-tests"))
    staged = harness.scripts_for("pytorch")
    names = {p.name for p in staged.iterdir()}
    assert {"ddp_train.py", "torch_events.py", "probe_io.py", "supervise.py"} <= names
    assert "tf_write.py" not in names
    common = {p.name for p in harness.scripts_for(None).iterdir()}
    assert "probe_io.py" in common and "ddp_train.py" not in common
    assert (staged / "ddp_train.py").read_bytes() == (REPO / "image-tests/pytorch/scripts/ddp_train.py").read_bytes()


def test_a_matrix_snapshot_goes_stale_when_a_framework_row_changes(tmp_path: Path) -> None:
    """A release reads the matrix from a snapshot; a row edited since must mean a real load."""
    from buildtool.matrix.snapshot import snapshot_key

    root = tmp_path / "p"
    shutil.copytree(REPO / "templates", root / "templates")
    shutil.copytree(REPO / "image-tests", root / "image-tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "matrix.yaml", root / "matrix.yaml")
    before = snapshot_key(root / "matrix.yaml", root / "templates", "matrix.yaml")
    row = root / "image-tests" / "tensorflow" / "framework.yaml"
    row.write_text(row.read_text().replace("[tensorflow, tensorflow-cpu]", "[tensorflow]"))
    assert snapshot_key(root / "matrix.yaml", root / "templates", "matrix.yaml") not in ("", before)


def _replace_by_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _link_to_nothing(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.parent / "gone.py")


@pytest.mark.parametrize(("change", "message"), [
    *ROW_REFUSALS,
    (lambda f: (f / "test_fixturefw.py").unlink(), f"{WHERE}: fixturefw/ holds no test_*.py"),
    (lambda f: _replace_by_folder(f / "test_fixturefw.py"), f"{WHERE}: fixturefw/ holds no test_*.py"),
    (lambda f: _link_to_nothing(f / "scripts" / "fixture_events.py"), f"{WHERE}: events_writer"),
    (lambda f: shutil.rmtree(f / "scripts"), f"{WHERE}: events_writer"),
    (lambda f: (f.parent / "scripts" / "fixture_train.py").write_text("# takes the framework's name\n"),
     f"{WHERE}: fixturefw/scripts/ has fixture_train.py, also in scripts/"),
])
def test_every_change_the_row_refuses_makes_a_matrix_snapshot_stale(tmp_path: Path, change, message) -> None:
    """`buildtool release` starts from a matrix snapshot while its key is unchanged: every change to a framework
    folder that a real load refuses must change the key, or release would use a matrix `buildtool plan` refuses."""
    from buildtool.matrix.snapshot import snapshot_key

    root = tmp_path / "p"
    folder = _folder(root)
    (root / "templates").mkdir()
    (root / "matrix.yaml").write_text("schema: 1\n")   # the key hashes it; only the load reads it
    before = snapshot_key(root / "matrix.yaml", root / "templates", "matrix.yaml")
    frameworks.load_row(folder)
    change(folder)
    with pytest.raises(frameworks.TableError) as caught:
        frameworks.load_row(folder)
    assert str(caught.value).startswith(message), str(caught.value)
    assert snapshot_key(root / "matrix.yaml", root / "templates", "matrix.yaml") not in ("", before)


def test_load_row_looks_only_at_what_a_matrix_snapshot_is_keyed_by(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot's key covers framework.yaml's text and the entries of frameworks.row_inputs (their names and
    kinds): a check added to load_row that looks anywhere else, or reads another file's content, fails here
    until row_inputs (and so the key) covers it."""
    folder = _folder(tmp_path)
    frameworks.load_row(folder)   # the row's model built, outside what is watched
    looked, read = [], []

    def watch(name: str, into: list) -> None:
        method = getattr(Path, name)

        def watched(self: Path, *args, **kwargs):
            into.append(self)
            return method(self, *args, **kwargs)
        monkeypatch.setattr(Path, name, watched)

    for name in ("stat", "lstat", "exists", "is_file", "is_dir", "is_symlink", "iterdir", "glob", "rglob"):
        watch(name, looked)
    for name in ("open", "read_text", "read_bytes"):
        watch(name, read)
    frameworks.load_row(folder)
    inputs = set(frameworks.row_inputs(folder))
    assert looked and all(p in inputs or p.parent in inputs for p in looked), \
        sorted({str(p) for p in looked if p not in inputs and p.parent not in inputs})
    assert set(read) == {folder / frameworks.FRAMEWORK_FILE}, read


def _real_matrix_frameworks() -> list[str]:
    import yaml

    return sorted({image["framework"] for image in yaml.safe_load((REPO / "matrix.yaml").read_text())["images"]})


@pytest.mark.parametrize("gone", _real_matrix_frameworks())
def test_the_real_matrix_without_a_framework_folder_is_refused_at_load(tmp_path: Path, run_cli, gone: str) -> None:
    """A shipped framework's folder gone (a bad merge, a sparse checkout): the matrix does not load, naming
    the framework and where a framework lives; nothing is rendered. Each folder in turn: the list is the folders'."""
    root = tmp_path / "checkout"
    shutil.copytree(REPO / "templates", root / "templates")
    shutil.copytree(REPO / "image-tests", root / "image-tests", ignore=shutil.ignore_patterns("__pycache__", gone))
    shutil.copy2(REPO / "matrix.yaml", root / "matrix.yaml")
    code, out, err = run_cli("render", "--matrix", str(root / "matrix.yaml"))
    assert code == 2 and out == ""
    others = ", ".join(name for name in shipped_frameworks() if name != gone)
    assert "images[" in err and f".framework: unknown framework {gone!r}; one of {others} (a new one is a " \
        "folder image-tests/<name>/ with its framework.yaml)" in err, err
    assert not (root / "dockerfiles").exists()


def test_a_recursive_alias_in_a_row_is_named_at_its_line(tmp_path: Path) -> None:
    """An alias inside its own anchored collection (`distributions: &d [fixturefw, *d]`) made a list that contains
    itself, refused as 'distributions.1: Input should be a valid string' (no line, no word of the alias); now the
    loader refuses the alias itself, at its line, naming the recursion."""
    folder = _folder(tmp_path)
    row = folder / "framework.yaml"
    text = _edit(row.read_text(), "distributions: [fixturefw]", "distributions: &d [fixturefw, *d]")
    row.write_text(text)
    line = text[: text.index("distributions: &d")].count("\n") + 1
    with pytest.raises(frameworks.TableError) as caught:
        frameworks.load_row(folder)
    assert str(caught.value) == (f"{WHERE}:{line}: not valid YAML (alias *d refers to a value that contains it; "
                                 "a value cannot include itself)")


def test_a_merge_key_in_a_row_merges_as_in_the_matrix(tmp_path: Path) -> None:
    """A YAML merge key (`<<: {...}`, `<<: *m`), which matrix.yaml's loader merges, was refused in a framework.yaml
    as "not valid YAML (could not determine a constructor for the tag 'tag:yaml.org,2002:merge')" (the duplicate-key
    check constructed the `<<` key); now it merges there too, the keys written beside it winning."""
    folder = _folder(tmp_path)
    row = folder / "framework.yaml"
    row.write_text(_edit(row.read_text(), "title: FixtureFW\n",
                         "title: FixtureFW\n<<: {title: Merged, cuda_build: \"'12.8'\"}\n"))
    loaded = frameworks.load_row(folder)
    assert (loaded.title, loaded.cuda_build_expr) == ("FixtureFW", "'12.8'")
    row.write_text(row.read_text() + "module: yaml\n")
    with pytest.raises(frameworks.TableError, match=r"framework\.yaml:\d+: not valid YAML \(duplicate key 'module'\)"):
        frameworks.load_row(folder)
    # A merged mapping that merges another and overrides its key is no duplicate, wherever it is aliased again.
    assert frameworks._parse_row("y: &y {k: 0}\nc: {<<: &x {<<: *y, k: 1}}\nd: *x\n") == \
        {"y": {"k": 0}, "c": {"k": 1}, "d": {"k": 1}}


def test_a_collection_as_a_key_is_refused_with_its_line(tmp_path: Path) -> None:
    """A collection written as a key (`? [a]`) went into the duplicate-key check's set: a TypeError traceback
    (unhashable type: 'list'); now it is the one-line refusal PyYAML gives it, at its line."""
    folder = _folder(tmp_path)
    row = folder / "framework.yaml"
    text = row.read_text()
    row.write_text(text + "? [a]\n: 1\n")
    with pytest.raises(frameworks.TableError) as caught:
        frameworks.load_row(folder)
    line = text.count("\n") + 1
    assert str(caught.value) == f"{WHERE}:{line}: not valid YAML (found unhashable key)"


def test_a_re_defined_anchor_in_a_row_is_the_most_recent_as_in_the_matrix(tmp_path: Path) -> None:
    """An anchor defined twice (legal YAML: an alias names the most recent node of its anchor, and matrix.yaml's
    loader reads it so) was refused as "not valid YAML (second occurrence)", naming no anchor and no fix; now the
    alias is the most recent node, as in matrix.yaml."""
    folder = _folder(tmp_path)
    row = folder / "framework.yaml"
    text = _edit(row.read_text(), "title: FixtureFW\n", "title: &x FixtureFW\n")
    row.write_text(_edit(text, 'gpu_count: "0"\n', 'gpu_count: &x "0"\ncuda_build: *x\n'))
    loaded = frameworks.load_row(folder)
    assert (loaded.title, loaded.cuda_build_expr) == ("FixtureFW", "0")
    assert frameworks._parse_row("a: &a [&a [1], *a]\nb: *a\nc: &c [&c 2, *c]\n") == \
        {"a": [[1], [1]], "b": [1], "c": [2, 2]}


def test_a_framework_yaml_over_the_matrix_size_limit_is_refused_naming_it(tmp_path: Path) -> None:
    """Before, load_row read framework.yaml whole whatever its size (matrix.yaml's loader stops at MAX_BYTES): a
    file of gigabytes (generated content, a runaway write) was read and parsed in full."""
    from buildtool.matrix import yamlsource

    folder = _folder(tmp_path)
    row = folder / "framework.yaml"
    row.write_text(row.read_text() + "#" * (16 << 20) + "\n")
    with pytest.raises(frameworks.TableError) as caught:
        frameworks.load_row(folder)
    assert str(caught.value) == (f"{WHERE}: is 16.0 MiB; a framework.yaml is at most 16 MiB (remove generated "
                                 "content)")
    assert frameworks.MAX_ROW_BYTES == yamlsource.MAX_BYTES     # the same limit as a matrix file's


@pytest.mark.parametrize("char", ["\\u2028", "\\u2029", "\\x85", "\\N", "\\x9b"])   # YAML's escapes
def test_a_title_with_a_line_break_or_c1_control_is_refused_where_the_row_is_read(tmp_path: Path, char: str) -> None:
    """The title's pattern kept out C0 controls and DEL only: U+2028, U+2029 and C1 controls (NEL, CSI), written
    with YAML's escapes in a quoted title, passed the row, and only the Dockerfile render refused them; every other
    reader (docs, reports, a terminal) took them as they were. The row itself now refuses them, naming the key."""
    folder = _folder(tmp_path)
    path = folder / "framework.yaml"
    path.write_text(_edit(path.read_text(), "title: FixtureFW\n", f'title: "Fixture{char}FW"\n'), encoding="utf-8")
    with pytest.raises(frameworks.TableError) as caught:
        frameworks.load_row(folder)
    assert str(caught.value).startswith(f"{WHERE}: title: String should match pattern"), str(caught.value)


def test_a_character_yaml_does_not_allow_is_refused_on_one_line(tmp_path: Path) -> None:
    """A raw C1 control in framework.yaml (YAML refuses it: PyYAML's ReaderError) gave a two-line error, the
    reader's own text with its newline: the message must be one line, as matrix.yaml's loader writes it."""
    folder = _folder(tmp_path)
    path = folder / "framework.yaml"
    path.write_text(_edit(path.read_text(), "title: FixtureFW\n", "title: Fixture\x9bFW\n"), encoding="utf-8")
    with pytest.raises(frameworks.TableError) as caught:
        frameworks.load_row(folder)
    assert str(caught.value).startswith(f"{WHERE}: not valid YAML (unacceptable character #x009b: special "
                                        "characters are not allowed in "), str(caught.value)
    assert "\n" not in str(caught.value)
