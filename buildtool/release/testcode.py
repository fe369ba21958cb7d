"""Which image-tests code a verdict may have run: computed from git, never taken from the verdict.

A verdict's test_code (buildtool.validate.collect.image_tests_hash) and matrix digest (schema 6) count only
when they are image-tests and the matrix as committed at the image's own revision (the one its signed provenance
names, never a tag's or --from's: `CodeBook`, for release and verify alike) or at the release commit (HEAD of this
checkout): each tree is extracted with `git archive` and hashed the same way, and the defined
tests the gate compares with are collected from that very folder. A verdict made by any other test code (edited
on the runner, or from a branch nobody released from) is refused. A cell whose matrix names a site folder
(`validate.extra_tests`) is judged only against image-tests staged with that folder as committed at the same
revision (`KnownCode.for_cell`; image-tests/README.md, "Site checks").
"""

from __future__ import annotations

import atexit
import hashlib
import io
import shutil
import subprocess
import tarfile
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from buildtool.common.errors import UserError
from buildtool.common.git_clone import refusal, shallow

if TYPE_CHECKING:
    from buildtool.matrix.schema import Cell

GIT_TIMEOUT_S = 60
TESTS = "image-tests"


@dataclass
class KnownCode:
    """hash -> (where it comes from, the extracted image-tests folder; None only in the toolkit's tests)."""

    codes: dict[str, tuple[str, Path | None]] = field(default_factory=dict)
    looked_at: list[str] = field(default_factory=list)    # every revision asked, with its hash or why none
    # sha256 of the matrix as committed at each revision -> where: what a verdict's matrix_digest must be one of.
    matrices: dict[str, str] = field(default_factory=dict)
    # A site folder (as the matrix names it) -> the codes of image-tests staged with it, like `codes`.
    sites: dict[str, dict[str, tuple[str, Path | None]]] = field(default_factory=dict)

    def describe(self) -> str:
        return "; ".join(self.looked_at) or "no revision"

    def for_cell(self, cell: Cell) -> dict[str, tuple[str, Path | None]]:
        """The codes a verdict of `cell` may have run: image-tests, or image-tests with the cell's site folder
        (never image-tests alone for a cell that has one; none at all for a folder nobody looked up)."""
        return self.sites.get(cell.extra_tests, {}) if cell.extra_tests else self.codes


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    # The bytes as committed (what validate hashed in a runner's checkout), never this machine's line-ending
    # conversion: `git archive` converts as a checkout here would (core.autocrlf=true writes CRLF).
    return subprocess.run(["git", "-C", str(root), "-c", "core.autocrlf=false", "-c", "core.eol=lf", *args],
                          capture_output=True, timeout=GIT_TIMEOUT_S, check=False)


def _commit(root: Path, revision: str) -> str | None:
    """The full commit a revision names in this clone (the commit part of `<sha>-dirty.<hash>`)."""
    base = revision.split("-dirty.", 1)[0]
    proc = _git(root, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def _extract(root: Path, commit: str, into: Path, folder: str = TESTS) -> Path | None:
    """`folder` (default image-tests/) at `commit`, extracted under `into` (None when that commit has none)."""
    proc = _git(root, "archive", "--format=tar", commit, "--", folder)
    if proc.returncode != 0:
        return None
    target = into / commit
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(target, filter="data")
    return target / folder if (target / folder).is_dir() else None


def committed_sha256(root: Path, commit: str, path: str) -> str | None:
    """sha256 (hex) of `path` as committed at `commit`; None when the commit has no such file."""
    proc = _git(root, "show", f"{commit}:{path}")
    return hashlib.sha256(proc.stdout).hexdigest() if proc.returncode == 0 else None


def known_code(root: Path, revisions: list[tuple[str, str]], matrix_name: str = "matrix.yaml",
               sites: tuple[str, ...] = ()) -> KnownCode:
    """The image-tests hashes of each (label, revision) that git knows, e.g. [("the image's revision",
    "abc123"), ("the release commit", "HEAD")], and the matrix (`matrix_name`, relative to `root`) at each;
    for each site folder in `sites` (as the matrix names them, beside it), image-tests staged with it."""
    _check_checkout(root)
    workdir = _workdir()
    known = KnownCode()
    for n, (label, revision) in enumerate(revisions):
        _read_revision(root, workdir / str(n), known, label, revision, matrix_name, sites)
    return known


class CodeBook:
    """The image-tests code a verdict may have run, one rule for release and verify: image-tests (the matrix, each
    site folder) as committed at the revision the image's signed provenance names, or at the release commit (HEAD
    of this checkout). Each revision is read from git once, when first asked (a release of many images built at
    one commit walks git once for it), by any thread."""

    def __init__(self, root: Path, matrix_name: str = "matrix.yaml", sites: tuple[str, ...] = ()) -> None:
        _check_checkout(root)
        self.root, self.matrix_name, self.sites = root, matrix_name, sites
        self._workdir = _workdir()
        self._read: dict[tuple[str, str], KnownCode] = {}
        self._lock = threading.Lock()

    def _at(self, label: str, revision: str) -> KnownCode:
        with self._lock:
            if (label, revision) not in self._read:
                known = KnownCode()
                _read_revision(self.root, self._workdir / str(len(self._read)), known, label, revision,
                               self.matrix_name, self.sites)
                self._read[(label, revision)] = known
            return self._read[(label, revision)]

    def release_commit(self) -> KnownCode:
        return self._at("the release commit", "HEAD")

    def at(self, revision: str | None) -> KnownCode:
        """What a verdict of an image whose signed provenance names `revision` (None: no valid provenance names
        one) may have run: image-tests at that revision or at the release commit."""
        known = KnownCode()
        parts = [self.release_commit()]
        if revision is None:
            known.looked_at.append("the image's revision: none (no valid provenance names one)")
        else:
            parts.insert(0, self._at("the image's revision", revision))
        for part in parts:
            for code, where in part.codes.items():
                known.codes.setdefault(code, where)
            known.looked_at += part.looked_at
            for digest, where_matrix in part.matrices.items():
                known.matrices.setdefault(digest, where_matrix)
            for site, codes in part.sites.items():
                for code, where in codes.items():
                    known.sites.setdefault(site, {}).setdefault(code, where)
        return known


def _check_checkout(root: Path) -> None:
    proc = _git(root, "rev-parse", "--git-dir")
    if proc.returncode != 0:
        raise UserError(refusal(root, proc.stderr) or f"{root} is not a git checkout: release compares the verdict's "
                        "test code with image-tests as committed, and needs the repository")


def _workdir() -> Path:
    workdir = Path(tempfile.mkdtemp(prefix="buildtool-image-tests-"))
    atexit.register(shutil.rmtree, workdir, True)
    return workdir


def _read_revision(root: Path, workdir: Path, known: KnownCode, label: str, revision: str, matrix_name: str,
                   sites: tuple[str, ...]) -> None:
    """Add image-tests (the matrix, each site folder) as committed at `revision` to `known`, extracted under
    `workdir`."""
    from buildtool.contracts import sitetests
    from buildtool.validate.collect import image_tests_hash

    commit = _commit(root, revision)
    if commit is None:
        known.looked_at.append(f"{label} {revision}: not a commit of this clone{shallow(root)}")
        return
    matrix = committed_sha256(root, commit, matrix_name)
    if matrix is not None:
        known.matrices.setdefault(f"sha256:{matrix}", f"{matrix_name} at {label} {commit[:12]}")
    folder = _extract(root, commit, workdir)
    if folder is None:
        known.looked_at.append(f"{label} {commit[:12]}: no image-tests/")
        return
    code = image_tests_hash(folder)
    known.codes.setdefault(code, (f"image-tests at {label} {commit[:12]}", folder))
    known.looked_at.append(f"{label} {commit[:12]}: {code}")
    for site in sites:
        committed = _extract(root, commit, workdir, str(PurePosixPath(matrix_name).parent / site))
        if committed is None:
            known.looked_at.append(f"{label} {commit[:12]}: no site folder {site}")
            continue
        staged = sitetests.stage(folder, committed, workdir / commit / f"staged-{len(known.looked_at)}" / TESTS)
        code = image_tests_hash(staged)
        known.sites.setdefault(site, {}).setdefault(
            code, (f"image-tests with the site folder {site} at {label} {commit[:12]}", staged))
        known.looked_at.append(f"{label} {commit[:12]} with {site}: {code}")
