"""The lock drift check of `buildtool check` (docs/contents.md, Locks): each cell's locks re-resolved as `make lock`
resolves them, compared entry by entry with the committed files.

The header's fingerprint only says the matrix values did not change; it cannot see a hand edit below the matrix
pins (a deleted `mpmath`, an added line, a transitive version or a hash changed). The re-resolution takes the
committed versions as constraints, so it is what `make lock` wrote for them whatever the index released since, and
any difference is a hand edit (compare's kind). An index that cannot be reached is an error naming it, never a pass.
NGC cells resolve against their base's own packages, which only a container of the base can tell: with BASE_MIRROR
set they are re-resolved against the mirrored base (or its stand-in), a base that cannot be asked being an error;
without it they are named as not re-resolved.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from buildtool.common.documents import plural
from buildtool.common.errors import FailedError, UserError
from buildtool.contracts.locks import LockFile, parse_lock
from buildtool.imagebuild import lock
from buildtool.imagebuild.pipconfig import HostPip
from buildtool.matrix.schema import Cell


def compare(committed: LockFile, resolved: LockFile) -> list[tuple[str, str, str]]:
    """(package, kind, detail) of each difference between a committed lock file and its re-resolution; kind is
    deleted, added, re-versioned or re-hashed."""
    found = []
    for name in sorted(set(committed.entries) | set(resolved.entries)):
        have, want = committed.entries.get(name), resolved.entries.get(name)
        if have is None:
            assert want is not None
            found.append((name, "deleted", f"the resolution needs {name} {want.version}"))
        elif want is None:
            found.append((name, "added", f"{have.version} is listed but nothing requires it"))
        elif have.version != want.version:
            found.append((name, "re-versioned", f"lock {have.version}, resolution {want.version}"))
        elif set(have.hashes) != set(want.hashes):
            if not set(have.hashes) & set(want.hashes):
                found.append((name, "re-versioned", f"the lock's hashes for {have.version} are none of "
                              f"{have.version}'s {plural(len(want.hashes), 'file')}"))
            else:
                extra, missing = set(have.hashes) - set(want.hashes), set(want.hashes) - set(have.hashes)
                found.append((name, "re-hashed", f"{have.version}: {len(extra)} hash(es) of no file of "
                              f"it, {len(missing)} of its files' hashes missing"))
    return found


def cell_drift(root: Path, cell: Cell, host: HostPip, log: Callable[[str], None],
               reachable: Callable[[str], bool] | None = None,
               bases: dict[str, lock.BaseFacts] | None = None) -> list[str]:
    """Problems of one cell's committed locks, each platform's, against their re-resolution for that platform
    (`bases`: what an NGC cell's base has on each platform, lock.platform_bases). FailedError when uv cannot
    resolve (an index it cannot reach, a pinned version gone)."""
    problems = []
    for platform in cell.platforms:
        committed = lock.read_locks(root, cell, platform)
        try:
            texts = lock.compile_cell(cell, host, lock.Pins(pinned=committed), base=(bases or {}).get(platform),
                                      log=log, reachable=reachable, platform=platform)
        except FailedError as exc:
            which = f"{platform} locks" if cell.multi_platform else "locks"
            raise FailedError(f"{cell.key}: cannot re-resolve its {which} to check them ({exc}); the "
                              "check needs the package index (PyPI and the cell's indexes); `buildtool check "
                              "--offline` checks only the matrix fingerprints") from None
        for name, path in lock.lock_paths(root, cell, platform).items():
            problems += [f"{path.relative_to(root)}: {package} {kind} by hand ({detail}); "
                         f"run `make lock FRAMEWORK={cell.key}`"
                         for package, kind, detail in compare(committed[name], parse_lock(texts[name]))]
    return problems


def check_cells(root: Path, cells: Sequence[Cell], log: Callable[[str], None], host: HostPip | None = None,
                base_refs: dict[str, str] | None = None,
                ask_base: Callable[..., lock.BaseFacts] = lock.base_facts) -> tuple[list[str], list[str]]:
    """(problems, cells not re-resolved). NGC cells are re-resolved only when `base_refs` names the base to
    ask (BASE_MIRROR's, as `make lock` uses). A cell whose locks are missing or broken is left to the
    offline check, which names it."""
    host = host if host is not None else HostPip.from_host()
    problems: list[str] = []
    skipped: list[str] = []
    for cell in cells:
        bases = None
        if lock.is_ngc(cell):
            ref = (base_refs or {}).get(cell.key)
            if not ref:
                skipped.append(cell.key)
                continue
            try:
                bases = lock.platform_bases(cell, ref, ask_base)
            except FailedError as exc:
                raise FailedError(f"{cell.key}: {exc}; the lock check asks the base as `make lock` does (`make bases "
                                  f"FRAMEWORK={cell.key}` fills a local mirror with its stand-in), or leave "
                                  "BASE_MIRROR unset to skip NGC cells") from None
        try:
            for platform in cell.platforms:
                lock.read_locks(root, cell, platform)
        except UserError:  # missing or broken: named by check_cell
            continue
        problems += cell_drift(root, cell, host, log, bases=bases)
    return problems, skipped
