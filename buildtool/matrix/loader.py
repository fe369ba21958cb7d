"""Loading the version matrix: a located YAML document validated by the schema (buildtool.matrix.schema), its
errors turned into one located line (buildtool.matrix.messages), expanded into cells (buildtool.matrix.cells).
Every error names file, line and key, and nothing is written before the matrix is known to be good."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from buildtool.common.errors import MatrixError, UserError
from buildtool.contracts import frameworks
from buildtool.matrix.cells import expand
from buildtool.matrix.messages import pydantic_error
from buildtool.matrix.schema import Matrix, MatrixFile
from buildtool.matrix.yamlsource import Located, load_yaml, paused_gc


def parse_matrix(doc: Located, templates_dir: Path | None = None, tests_dir: Path | None = None,
                 tests_display: str | None = None, matrix_dir: Path | None = None) -> Matrix:
    """Validate a located YAML document and expand it into cells (buildtool.matrix.cells). `templates_dir`,
    `tests_dir`: the folders a template and a test group must be in (None: not looked at; `load_matrix` always
    looks for the test groups); `tests_display`: how errors name `tests_dir`; `matrix_dir`: the folder a site
    folder (`validate.extra_tests`) is named from, looked at when given."""
    if not isinstance(doc.data, dict):
        raise MatrixError(doc.path, 1, "", "the top level must be a mapping with `schema`, `source` and `images`")
    if tests_dir is not None:
        if not tests_dir.is_dir():
            raise UserError(f"{doc.path}: no folder {tests_display or tests_dir}/ for its image tests: every framework "
                            "is a folder there (framework.yaml, its tests, its scripts), and so is every test group")
        try:
            frameworks.use(tests_dir)   # the frameworks are the folders of this matrix's image-tests
        except frameworks.TableError as exc:
            raise UserError(str(exc)) from None
    try:
        spec = MatrixFile.model_validate(doc.data, context={"templates_dir": templates_dir, "tests_dir": tests_dir,
                                                            "tests_display": tests_display,
                                                            "matrix_dir": matrix_dir})
    except ValidationError as exc:
        raise pydantic_error(doc, exc) from None
    return Matrix(path=doc.path, source=spec.source, cells=expand(doc, spec, templates_dir))


IMAGE_TESTS = "image-tests"


def tests_dir_for(path: Path, tests_dir: Path | None = None) -> tuple[Path, str]:
    """The image-tests folder of the matrix at `path` (beside it, unless named) and how errors show
    it: relative to the matrix's folder when inside it."""
    folder = tests_dir if tests_dir is not None else path.parent / IMAGE_TESTS
    try:
        shown = str(folder.resolve().relative_to(path.parent.resolve()))
    except ValueError:
        shown = str(folder)
    return folder, shown


def load_matrix(path: Path, templates_dir: Path | None = None, display: str | None = None,
                tests_dir: Path | None = None) -> Matrix:
    """Load and validate `matrix.yaml`; raises MatrixError (exit 2) naming file:line and key. Every
    test group a cell names must be a folder of `tests_dir` (default: image-tests/ beside the matrix)."""
    folder, shown = tests_dir_for(path, tests_dir)
    with paused_gc():
        return parse_matrix(load_yaml(path, display), templates_dir, folder, shown, path.parent)
