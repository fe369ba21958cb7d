"""The CLI's plumbing without typer: consoles, JSON output, the project. Imported by every command
module through buildtool.cli.options, and directly by the fast path of `release` (buildtool.cli),
which must not pay for importing typer."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildtool.common.errors import UserError

if TYPE_CHECKING:
    from rich.console import Console

    from buildtool.matrix.schema import Matrix


class _LazyConsole:
    """A rich Console made on first use: importing rich costs more than `buildtool --help` may take."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            if self._stderr:
                self._console = Console(stderr=True, soft_wrap=True)
            else:   # wide output when piped (CI logs), the terminal's width otherwise
                self._console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
        return getattr(self._console, name)


out: Console = _LazyConsole(stderr=False)  # type: ignore[assignment]
err: Console = _LazyConsole(stderr=True)  # type: ignore[assignment]

_JSON_EMITTED: list[bool] = []


def emit_json(document: object) -> None:
    """Print the command's one JSON document on stdout (and remember that it was printed)."""
    import json

    sys.stdout.write(json.dumps(document, indent=2) + "\n")
    sys.stdout.flush()
    _JSON_EMITTED.append(True)


def json_emitted() -> bool:
    return bool(_JSON_EMITTED)


def reset_json() -> None:
    _JSON_EMITTED.clear()


def log(message: str) -> None:
    """Progress and notes: stderr, verbatim (no rich: nothing to import, nothing interpreted)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


@contextmanager
def writing(option: str, target: Path) -> Iterator[None]:
    """Where a command writes what OPTION names (a folder or a file): an OSError on the way (a folder that cannot be
    made, no permission, a full disk) is one line naming the option, the path and why (UserError, exit 2)."""
    try:
        yield
    except OSError as exc:
        from buildtool.common.refs import shown

        where = f"{shown(str(exc.filename))}: " if exc.filename is not None and str(exc.filename) != str(target) else ""
        raise UserError(f"{option} {shown(str(target))}: cannot write there ({where}{exc.strerror or exc}); "
                        "name a place this user can write") from None


def printable(text: str) -> str:
    """TEXT as a log line shows it as it is: each control or format character (the ESC of an ANSI sequence, a line
    break, U+202E) escaped as Python writes it (`\\x1b`), so a value an image or a registry gave cannot colour,
    hide or forge lines of a CI log."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def say(message: str) -> None:
    """A result line: stdout, verbatim."""
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


@dataclass(frozen=True)
class Project:
    """Where the matrix, templates and generated files are."""

    root: Path
    matrix_path: Path

    @property
    def templates(self) -> Path:
        return self.root / "templates"

    def load(self) -> Matrix:
        from buildtool.matrix import snapshot
        from buildtool.matrix.loader import load_matrix

        display = self._display()
        # The key before and after the load: a file it covers saved meanwhile would store the old cells
        # under the new file's key (release would reuse them); then no snapshot, the next load writes one.
        key = snapshot.snapshot_key(self.matrix_path, self.templates, display)
        loaded = load_matrix(self.matrix_path, self.templates, display=display)
        if key == snapshot.snapshot_key(self.matrix_path, self.templates, display):
            snapshot.write(loaded, key, snapshot.selection_names(loaded))
        return loaded

    def load_fast(self) -> Matrix:
        """The matrix from its snapshot when one is fresh (no pydantic), else loaded (buildtool.matrix.snapshot)."""
        from buildtool.contracts import frameworks
        from buildtool.matrix import snapshot

        key = snapshot.snapshot_key(self.matrix_path, self.templates, self._display())
        found = snapshot.read(key, self.load, self.matrix_path.parent)
        if found is None:
            return self.load()
        frameworks.point_at(self.matrix_path.parent / "image-tests")   # the table the snapshot was made with
        return found  # type: ignore[return-value]

    def _display(self) -> str:
        return (str(self.matrix_path.relative_to(self.root))
                if self.matrix_path.is_relative_to(self.root) else str(self.matrix_path))

    def revision(self, override: str | None = None) -> str:
        """The revision dev images are tagged with: `override` (checked) or the work tree's."""
        from buildtool.matrix.plan import git_revision, resolve_revision

        return resolve_revision(self.root, override, git_revision)


def find_project(matrix: Path | None) -> Project:
    if matrix is not None:
        matrix = matrix.resolve()
        return Project(root=matrix.parent, matrix_path=matrix)
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "matrix.yaml").is_file():
            return Project(root=folder, matrix_path=folder / "matrix.yaml")
    raise UserError("no matrix.yaml in this folder or above; run from the project or pass --matrix")


def project_or_none(matrix: Path | None) -> Project | None:
    """The project, or None outside a checkout (where nothing knows the image's cell or trusted keys)."""
    try:
        return find_project(matrix)
    except UserError:
        return None


def path_of(flag: str) -> Callable[[str | Path], Path]:
    """The `parser` of a path argument or option named FLAG: typer's own makes '' the current folder (Path('') is
    Path('.')), so `--out ""` (an unset variable) wrote keys into the checkout and `bundle IMAGE "" --force` would
    have replaced it; '' is refused in one line naming FLAG (exit 2)."""
    def parse(value: str | Path) -> Path:
        if isinstance(value, str) and value == "":
            raise UserError(f"{flag}: the path is empty; name a file or folder ('.' for this one)")
        return Path(value)

    return parse
