"""Site checks (issue 54, buildtool/contracts/sitetests.py): a platform team's own image tests in a folder of
its own, named by the matrix (`validate.extra_tests`) or by `validate --extra-tests DIR`, run as one more test
group; they are part of the verdict's test code, and release refuses a verdict that did not run them."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from buildtool.common.errors import MatrixError, UserError
from buildtool.contracts import sitetests
from buildtool.contracts.verdict import parse_verdict
from buildtool.matrix.loader import load_matrix
from buildtool.release.testcode import KnownCode, known_code
from buildtool.validate.collect import image_tests_hash
from tests.conftest import FIXTURE_MATRIX, REPO, copy_fixture_image_tests, fixture_matrix
from tests.signing import CODE, KEY, result, trusted, verdict

CPU = next(c for c in fixture_matrix().cells if c.key == "pytorch-cpu:2.13")
D1 = "sha256:" + "1" * 64
SITE_TEST = "def test_site_ca(host):\n    assert host.file('/etc/ssl/certs').is_directory\n"


def site(root: Path, name: str = "site-acme") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "test_acme.py").write_text(SITE_TEST)
    return folder


def project(tmp_path: Path, extra_tests: str) -> Path:
    """The fixture matrix with pytorch-cpu naming `extra_tests`, beside a copy of the fixture's image-tests."""
    text = FIXTURE_MATRIX.read_text()
    anchor = "  - name: pytorch-cpu\n    framework: pytorch\n    accelerator: cpu\n"
    assert text.count(anchor) == 1, "pytorch-cpu moved in the fixture matrix"
    key = f"    validate:\n      extra_tests: {extra_tests}\n"
    (tmp_path / "matrix.yaml").write_text(text.replace(anchor, anchor + key))
    copy_fixture_image_tests(tmp_path / "image-tests")
    return tmp_path / "matrix.yaml"


def test_the_matrix_names_a_site_folder_and_its_group_is_the_cells_too(tmp_path: Path) -> None:
    site(tmp_path)
    cells = {c.key: c for c in load_matrix(project(tmp_path, "site-acme"), REPO / "templates").cells}
    cell = cells["pytorch-cpu:2.13"]
    assert cell.extra_tests == "site-acme" and cell.site_group == "site-acme"
    assert cell.groups == ("common", "pytorch", "site-acme")
    assert cells["pytorch-ngc:25.10"].groups == ("common", "pytorch")        # only the cell that names it


@pytest.mark.parametrize(("value", "cause"), [
    ("/etc/site", "must be a folder beside the matrix (a relative path without ..)"),
    ("../elsewhere", "must be a folder beside the matrix (a relative path without ..)"),
    ("site-gone", "no folder"),
    ("empty", "holds no test_*.py: a site folder holds the site's checks"),
    ("Site_ACME", "the folder's name 'Site_ACME' is its test group in the verdict: lower case letters"),
    ("elsewhere/common", "'common' is already image-tests/common"),
])
def test_a_site_folder_that_cannot_be_one_is_refused_at_load_naming_why(tmp_path: Path, value: str,
                                                                         cause: str) -> None:
    (tmp_path / "empty").mkdir()
    site(tmp_path, "Site_ACME")
    site(tmp_path / "elsewhere", "common")
    with pytest.raises(MatrixError) as refused:
        load_matrix(project(tmp_path, value), REPO / "templates")
    assert "validate.extra_tests" in str(refused.value) and cause in str(refused.value), str(refused.value)


def test_extra_tests_on_the_command_line_is_checked_the_same_way(tmp_path: Path) -> None:
    from buildtool.validate.runner import site_folder

    tests = copy_fixture_image_tests(tmp_path / "image-tests")
    matrix = fixture_matrix()
    assert site_folder(CPU, matrix, None, tests) is None
    assert site_folder(CPU, matrix, site(tmp_path), tests) == (tmp_path / "site-acme").resolve()
    with pytest.raises(UserError, match=r"^--extra-tests: .*'pytorch' is already image-tests/pytorch"):
        site_folder(CPU, matrix, site(tmp_path / "x", "pytorch"), tests)
    with pytest.raises(UserError, match=r"^--extra-tests: no folder"):
        site_folder(CPU, matrix, tmp_path / "nothing", tests)


def test_the_site_folder_is_part_of_the_test_code(tmp_path: Path) -> None:
    """The staged tree's hash is the verdict's test code: it differs from image-tests alone and follows every
    byte and the name of the site folder."""
    tests = copy_fixture_image_tests(tmp_path / "image-tests")
    acme = site(tmp_path)
    staged = sitetests.stage(tests, acme, tmp_path / "run" / "image-tests")
    assert (staged / "site-acme" / "test_acme.py").read_text() == SITE_TEST
    assert (staged / "common").is_dir() and (staged / "conftest.py").is_file()
    code = image_tests_hash(staged)
    assert code != image_tests_hash(tests)
    (acme / "test_acme.py").write_text(SITE_TEST + "# edited\n")
    assert image_tests_hash(sitetests.stage(tests, acme, tmp_path / "run2" / "image-tests")) != code
    shutil.copytree(acme, tmp_path / "other" / "site-other")
    (tmp_path / "other" / "site-other" / "test_acme.py").write_text(SITE_TEST)
    renamed = sitetests.stage(tests, tmp_path / "other" / "site-other", tmp_path / "run3" / "image-tests")
    assert image_tests_hash(renamed) != code                                  # same files, another group


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.email=t@e", "-c", "user.name=t", *args], check=True,
                          capture_output=True, text=True, timeout=30).stdout.strip()


def test_release_knows_only_image_tests_with_the_committed_site_folder_for_a_site_cell(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    tests = tmp_path / "image-tests"
    (tests / "common").mkdir(parents=True)
    (tests / "common/test_a.py").write_text("def test_a():\n    pass\n")
    (tmp_path / "matrix.yaml").write_text("schema: 1\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "no site folder yet")
    before = git(tmp_path, "rev-parse", "--short=12", "HEAD")
    acme = site(tmp_path)
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "the site's checks")
    staged = image_tests_hash(sitetests.stage(tests, acme, tmp_path.parent / f"{tmp_path.name}-staged"))
    known = known_code(tmp_path, [("the image's revision", before), ("the release commit", "HEAD")],
                       sites=("site-acme",))
    cell = dataclasses.replace(CPU, extra_tests="site-acme")
    assert set(known.for_cell(cell)) == {staged}                           # never image-tests alone
    assert image_tests_hash(tests) in known.for_cell(CPU)                  # a cell without a site folder
    where, folder = known.for_cell(cell)[staged]
    assert where.startswith("image-tests with the site folder site-acme at the release commit")
    assert folder is not None and (folder / "site-acme" / "test_acme.py").is_file()   # collected from there
    assert f"the image's revision {before}: no site folder site-acme" in known.describe()
    unknown = dataclasses.replace(CPU, extra_tests="site-other")           # a folder nobody looked up
    assert known.for_cell(unknown) == {}


SITE_CODE = "sha256:" + "5" * 64


def gate(monkeypatch: pytest.MonkeyPatch, body: dict) -> list[str]:  # type: ignore[type-arg]
    """Release's verdict gate for pytorch-cpu naming the site folder site-acme, on `body`, where git holds
    image-tests (CODE) and image-tests with site-acme (SITE_CODE)."""
    from buildtool.matrix.plan import CellPlan
    from buildtool.release import gather, promote
    from buildtool.release.model import Evidence
    from buildtool.validate import collect, verdicts

    cell = dataclasses.replace(CPU, extra_tests="site-acme")
    chosen = verdicts.Found(artifact="sha256:" + "a" * 64, verdict=parse_verdict(body, "test"),
                            keyid=KEY.public().keyid, referrer=None)
    monkeypatch.setattr(verdicts, "find_verdicts", lambda *args, **kwargs: verdicts.Findings(found=[chosen]))
    defined = {f"{g}/test_x.py::test_{g}": False for g in cell.groups}
    monkeypatch.setattr(collect, "defined_tests", lambda cell, tests_dir, code=None: defined)
    plan = CellPlan(cell=cell, revision="0123456789ab", dev_repo="127.0.0.1:5000/pytorch-cpu-dev",
                    dev_tag="0123456789ab-2.13", release_repo="127.0.0.1:5000/pytorch-cpu",
                    release_tags=("2.13-0.1.0",), moving_tags=(), base=cell.base)
    item = Evidence(D1)
    known = KnownCode({CODE: ("image-tests at the image's revision", None)},
                      sites={"site-acme": {SITE_CODE: ("image-tests with the site folder site-acme at the image's "
                                                       "revision", None)}})
    options = promote.ReleaseOptions("0.1.0", "0123456789ab", trusted=trusted(), known_code=known)
    gather._gate_verdict(None, item, plan, "pytorch-cpu-dev", options, False)  # type: ignore[arg-type]
    return item.problems


def site_verdict(tests: list | None = None, **changes: object) -> dict:  # type: ignore[type-arg]
    tests = tests or [result(f"{g}/test_x.py::test_{g}") for g in ("common", "pytorch", "site-acme")]
    return verdict(CPU, D1, tests=tests, **{"groups": ["common", "pytorch", "site-acme"], "test_code": SITE_CODE,
                                            **changes})


def test_a_verdict_that_ran_the_site_checks_passes_the_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    found = gate(monkeypatch, site_verdict())
    assert not [p for p in found if "image-tests" in p or "group" in p or "defined" in p], found


def test_a_runner_that_dropped_the_site_folder_gets_no_verdict_release_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The attack: a runner validates the image without the site folder (its own matrix without the key, or a
    validate that ignores it) and signs a passing verdict of image-tests alone. Its test code is image-tests'
    as committed, but for a cell whose matrix names a site folder that is other test code: refused, naming the
    site folder; and its groups lack the site group, refused again."""
    common = [result(f"{g}/test_x.py::test_{g}") for g in ("common", "pytorch")]
    found = gate(monkeypatch, verdict(CPU, D1, tests=common, test_code=CODE))
    said = next((p for p in found if p.startswith(f"the verdict ran image-tests {CODE}")), "")
    assert "neither image-tests with the site folder site-acme at the image's revision nor at the release commit" \
        in said and "site checks (site-acme) are part of its test code" in said, found
    forged = gate(monkeypatch, site_verdict(groups=["common", "pytorch"], tests=common,
                                            defined_tests=[t["id"] for t in common]))
    assert any("did not run the group(s) site-acme that the matrix gives pytorch-cpu:2.13" in p for p in forged), forged


def test_a_verdict_of_an_edited_site_folder_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    found = gate(monkeypatch, site_verdict(test_code="sha256:" + "6" * 64))
    assert any("which is neither image-tests with the site folder site-acme" in p for p in found), found


class Boom(Exception):
    """A step of the run that failed."""


def _site_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """A project with the site folder site-acme and a local CPU image whose run is stubbed up to staging: (matrix,
    image) for runner.validate_image."""
    from buildtool.contracts import label_keys
    from buildtool.validate import runner
    from buildtool.validate.containers import Resolved
    from buildtool.validate.probe import Inventory

    site(tmp_path)
    matrix = load_matrix(project(tmp_path, "site-acme"), REPO / "templates")
    image = Resolved(ref="pytorch-cpu-dev:t", run_ref="pytorch-cpu-dev:t", digest="sha256:" + "a" * 64, host=None,
                     repo=None, labels={label_keys.CELL: CPU.key})
    monkeypatch.setattr(runner, "gpu_inventory", lambda: Inventory([], problem="nvidia-smi not found"))
    monkeypatch.setattr(runner, "resolve", lambda *_a, **_k: image)
    monkeypatch.setattr(runner, "probe_flags", lambda _image, flags, *_a, **_k: (flags, []))
    monkeypatch.setattr("buildtool.validate.sbomref.verdict_sbom", lambda *_a: ("", "no registry"))
    return matrix, image


@pytest.mark.parametrize("step", ["_run", "cell_groups"])
def test_the_staged_tests_are_removed_however_the_run_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           step: str) -> None:
    """validate stages image-tests with the site folder (reports/<cell>/<digest12>/tests-<run_id>); a step that
    raises, after the staging (the run) or while planning on the staged tree, leaves no copy behind (it did)."""
    from buildtool.validate import runner
    from buildtool.validate.options import Options

    matrix, image = _site_run(tmp_path, monkeypatch)
    monkeypatch.setattr(runner, "label_checks", lambda *_a: [])
    staged: list[Path] = []
    real_groups = runner.cell_groups

    def groups(cell, tree: Path, names):  # type: ignore[no-untyped-def]
        if tree != tmp_path / "image-tests":
            staged.append(tree)
            if step == "cell_groups":
                raise Boom
        return real_groups(cell, tree, names)

    def run(plan, *_a: object) -> None:  # type: ignore[no-untyped-def]
        assert (plan.tree / "site-acme" / "test_acme.py").is_file()
        raise Boom
    monkeypatch.setattr(runner, "cell_groups", groups)
    monkeypatch.setattr(runner, "_run", run)
    with pytest.raises(Boom):
        runner.validate_image(image.ref, matrix, tmp_path, Options(store=False), print)
    [tree] = staged
    assert tree.name.startswith("tests-") and tree.parent.is_dir() and not tree.exists()
    assert (tmp_path / "image-tests").is_dir()


def test_a_staging_that_fails_midway_leaves_no_partial_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Staging copies image-tests, then the site folder: a copy of the site folder that fails (a file it cannot read,
    Ctrl-C) left the half-staged reports/<cell>/<digest12>/tests-<run_id> behind, a new one each run."""
    from buildtool.validate import runner
    from buildtool.validate.options import Options

    matrix, image = _site_run(tmp_path, monkeypatch)
    real_copy = shutil.copytree

    def copy(source: Path, into: Path, *args: object, **kwargs: object) -> Path:
        if Path(source).name == "site-acme":
            raise KeyboardInterrupt
        return real_copy(source, into, *args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(sitetests.shutil, "copytree", copy)
    with pytest.raises(KeyboardInterrupt):
        runner.validate_image(image.ref, matrix, tmp_path, Options(store=False), print)
    [folder] = (tmp_path / "reports").glob("*/*")
    assert not list(folder.glob("tests-*")), sorted(p.name for p in folder.iterdir())
    assert (tmp_path / "image-tests").is_dir()


def test_a_site_folder_whose_name_ends_in_a_line_break_is_refused(tmp_path: Path) -> None:
    """NAME_RE's `$` matched before a final line break: a folder `site\\n` passed and became a test group whose
    name (in test ids and the verdict) holds a line break."""
    folder = tmp_path / "site\n"
    folder.mkdir()
    (folder / "test_x.py").write_text("def test_x():\n    pass\n")
    assert sitetests.problem(folder).startswith("the folder's name 'site\\n' is its test group in the verdict")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "test_x.py").write_text("def test_x():\n    pass\n")
    assert sitetests.problem(tmp_path / "site") == ""
