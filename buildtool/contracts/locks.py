"""The lock file format: PEP 751 `pylock.toml`, what `buildtool lock` writes beside each Dockerfile and what
the Dockerfile installs (`uv pip install -r pylock.<layer>.toml`: every file checked against its sha256).

Each package names its version and exactly the files of that version for the lock's wheel platform (file
name, URL, sha256), so no other build of it can be installed in its place; `buildtool lock` adds a
`[tool.dl-images]` table (PEP 751's place for a tool's own data) with what the lock was made from (`inputs`, the
matrix fingerprint, finds a stale lock without a network). A cell built for other platforms than the default
keeps one folder of locks per platform, named by its architecture (`platform_folder`). docs/contents.md
("Locks") says the rest.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from buildtool.common.errors import UserError
from buildtool.contracts import platforms

FRAMEWORK_LOCK = "pylock.framework.toml"
TOOLS_LOCK = "pylock.tools.toml"
LOCK_FILES = (FRAMEWORK_LOCK, TOOLS_LOCK)
UV_LOCK = "uv.lock"          # in templates/: the pinned uv every build installs its locks with
TOOL = "dl-images"           # the lock's [tool.dl-images] table
_SHA256 = re.compile(r"[0-9a-f]{64}")
T = TypeVar("T")


def platform_folder(cell_folder: Path, cell_key: str, cell_platforms: tuple[str, ...],
                    platform: str | None) -> tuple[platforms.Platform, Path]:
    """(platform, folder of its locks) of a cell whose Dockerfile is in `cell_folder`. `platform` None is
    the cell's only platform, and only on a cell built for the default platform alone; otherwise (and for
    a platform the cell is not built for) UserError naming the cell: never a guessed platform."""
    multi = cell_platforms != platforms.DEFAULT
    if platform is None:
        if multi:
            raise UserError(f"{cell_key} is built for {', '.join(cell_platforms)}: name the platform whose locks "
                            "to read (a bug in the caller, which read them as if it had one)")
        platform = cell_platforms[0]
    try:
        known = platforms.get(platform)
    except platforms.UnknownPlatform as exc:
        raise UserError(f"{cell_key}: {exc}") from None
    if platform not in cell_platforms:
        raise UserError(f"{cell_key} is not built for {platform} (its platforms: {', '.join(cell_platforms)}); "
                        "it has no locks for it")
    return known, (cell_folder / known.architecture if multi else cell_folder)


def normalize(name: str) -> str:
    """PEP 503 name: what pip, uv and importlib.metadata agree a distribution is called."""
    return re.sub(r"[-_.]+", "-", name).lower()


def marker_environment(platform: platforms.Platform, python: str) -> dict[str, str]:
    """The PEP 508 marker environment a lock was resolved for (uv's --python-platform and --python-version): what
    decides which of the matrix's requirements it holds (`foo==1; platform_machine == "aarch64"` only arm64's).
    Every variable is given, so nothing is read from the machine running the check."""
    full = python if python.count(".") >= 2 else f"{python}.0"
    return {"implementation_name": "cpython", "implementation_version": full, "os_name": "posix",
            "platform_machine": platform.machine, "platform_python_implementation": "CPython", "platform_release": "",
            "platform_system": "Linux", "platform_version": "", "python_full_version": full,
            "python_version": ".".join(python.split(".")[:2]), "sys_platform": "linux"}


@dataclass(frozen=True)
class File:
    """One file a lock admits: its name, where it is fetched from, its sha256 (hex)."""

    name: str
    url: str
    sha256: str


@dataclass(frozen=True)
class Entry:
    name: str                  # normalized
    version: str
    wheels: tuple[File, ...]
    sdist: File | None = None
    marker: str = ""           # PEP 751's `marker`: uv pip install skips the package where it is false

    def applies(self, environment: Mapping[str, str]) -> bool:
        """Whether uv installs this entry in `environment` (marker_environment): no marker, or a true one. uv pip
        install asks for no extras and no dependency groups (PEP 751's `extras`, `dependency_groups`: empty)."""
        from packaging.markers import Marker

        empty: frozenset[str] = frozenset()
        return not self.marker or Marker(self.marker).evaluate(
            {**environment, "extra": "", "extras": empty, "dependency_groups": empty})

    @property
    def hashes(self) -> tuple[str, ...]:
        """`sha256:<hex>` of every file the entry admits (its wheels, then its sdist)."""
        files = (*self.wheels, *((self.sdist,) if self.sdist else ()))
        return tuple(f"sha256:{f.sha256}" for f in files)


@dataclass(frozen=True)
class LockFile:
    entries: dict[str, Entry]          # normalized name -> entry
    inputs: str = ""                   # the fingerprint of the matrix values it came from ("" when missing)
    python: str = ""
    platform: str = ""                 # uv's --python-platform it was resolved for
    glibc: str = ""                    # an NGC cell's base glibc (major.minor), the cap of its wheels

    def versions(self) -> dict[str, str]:
        return {name: e.version for name, e in self.entries.items()}

    def skipped(self, platform: platforms.Platform, python: str) -> str:
        """Why `uv pip install` would leave out an entry on `platform` with the lock's Python (`python` where it names
        none): its marker is false there (PEP 751); "" when it installs every entry."""
        python = self.python or python
        environment = marker_environment(platform, python)
        left_out = [e for e in self.entries.values() if not e.applies(environment)]
        return "".join(f"{e.name} {e.version} has the marker {e.marker!r}, false on {platform.name} with Python "
                       f"{python}, so uv does not install it" for e in left_out[:1])


def exact_pins(entries: Iterable[Entry]) -> str:
    """Constraints that admit each entry's version only: `===V`, as `==V` is also met by a local build `V+cpu`
    a find-links folder offers (a local version, compared whole by `==`, stays `==`)."""
    return "".join(f"{e.name}{'==' if '+' in e.version else '==='}{e.version}\n" for e in entries)


def preferences(entries: Iterable[Entry]) -> str:
    """Previous pins as a pylock.toml output file, which uv keeps as preferences unless upgraded."""
    return 'lock-version = "1.0"\ncreated-by = "uv"\n' + "".join(
        f'\n[[packages]]\nname = {json.dumps(e.name)}\nversion = {json.dumps(e.version)}\n' for e in entries)


def parse_lock(text: str) -> LockFile:
    """Parse a pylock.toml; ValueError names the first thing that cannot be installed with hashes."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"not TOML ({exc})") from None
    if data.get("lock-version") != "1.0":
        raise ValueError(f"lock-version is {data.get('lock-version')!r}, not PEP 751's \"1.0\"")
    entries: dict[str, Entry] = {}
    for package in _typed(list, data.get("packages", []), "packages"):
        entry = _entry(_typed(dict, package, "a [[packages]] entry"))
        if entry.name in entries:
            raise ValueError(f"{entry.name} is listed twice")
        entries[entry.name] = entry
    tool = _typed(dict, _typed(dict, data.get("tool", {}), "tool").get(TOOL, {}), f"tool.{TOOL}")
    return LockFile(entries, **{key: _typed(str, tool.get(key, ""), f"tool.{TOOL}.{key}")
                                for key in ("inputs", "python", "platform", "glibc")})


def _entry(package: dict[str, Any]) -> Entry:
    name, version = package.get("name"), package.get("version")
    if not isinstance(name, str) or not isinstance(version, str):
        raise ValueError(f"a package without a name and version: {package.get('name')!r}")
    where = f"{name} {version}"
    wheels = tuple(_file(where, _typed(dict, w, f"{where}: a wheel"))
                   for w in _typed(list, package.get("wheels", []), f"{where}: wheels"))
    sdist = _file(where, _typed(dict, package["sdist"], f"{where}: sdist")) if "sdist" in package else None
    if not wheels and sdist is None:
        # A directory, VCS or archive source: nothing a hash pins.
        raise ValueError(f"{name} {version} has no wheel or sdist with a hash")
    return Entry(normalize(name), version, wheels, sdist, _marker(where, package.get("marker", "")))


def _marker(where: str, value: object) -> str:
    """A package's `marker` (PEP 508), as uv reads it before installing: one it cannot read is refused here."""
    from packaging.markers import InvalidMarker, Marker

    text = _typed(str, value, f"{where}: marker")
    try:
        Marker(text) if text else None
    except InvalidMarker as exc:
        raise ValueError(f"{where}: marker {text!r} is not a PEP 508 marker ({str(exc).splitlines()[0]})") from None
    return text


def _file(where: str, table: dict[str, Any]) -> File:
    # Each a string where given: `url = 5` is refused like `glibc = 2.30`, never read as "5" (nor `url = 0` as none).
    url, path, name = (_typed(str, table.get(key, ""), f"{where}: a file's {key}") for key in ("url", "path", "name"))
    url = url or path
    filename = name or unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    hashes = _typed(dict, table.get("hashes") or {}, f"{where}: {filename or 'a file'}: hashes")
    sha256 = _typed(str, hashes.get("sha256", ""), f"{where}: {filename or 'a file'}: hashes.sha256")
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"{where}: {filename or 'a file'} has no sha256")
    return File(filename, url, sha256)


# The TOML name of each type tomllib reads a value as (any other: a date or time).
_KINDS = {str: "a string", bool: "a boolean", int: "an integer", float: "a float", list: "an array", dict: "a table"}


# A hand-edited lock can hold any TOML type where a table or array belongs: a ValueError naming the field
# (what callers turn into "run make lock"), not an AttributeError from the first .get(). A string field is refused
# too, not turned into text (`glibc = 2.30`, a float, read 2.3).
def _typed(kind: type[T], value: object, what: str) -> T:
    if not isinstance(value, kind):
        raise ValueError(f"{what} is not {_KINDS[kind]} (found {_KINDS.get(type(value), 'a date or time')})")
    return value


def installed_files(python: Mapping[str, Mapping[str, object]], locks: Mapping[str, LockFile]) -> dict[str, str]:
    """name -> sha256 of the wheel a lock installed, for each locked distribution the image holds at the locked
    version whose entry lists several files for its platform (cryptography: abi3 and cp311, two manylinux
    levels; a wheel and the sdist uv builds where the wheel does not fit the base's glibc): the wheel whose file
    name's tags are the installed ones (its WHEEL file's, the probe's `wheel_tags`). None matching (built from the
    sdist), or several: left out (the SBOM says why). No index is asked: the lock names every file."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    from packaging.version import InvalidVersion

    found: dict[str, str] = {}
    for lock in locks.values():
        for name, entry in lock.entries.items():
            detail = python.get(name)
            if len(entry.hashes) < 2 or detail is None or detail.get("version") != entry.version:
                continue
            tags = detail.get("wheel_tags")
            wanted = frozenset(tags) if isinstance(tags, list) else frozenset()
            matching = set()
            for wheel in entry.wheels:
                try:
                    wheel_tags = parse_wheel_filename(wheel.name)[3]
                except (InvalidWheelFilename, InvalidVersion):
                    continue
                if wanted and frozenset(str(t) for t in wheel_tags) == wanted:
                    matching.add(wheel.sha256)
            if len(matching) == 1:
                found[name] = matching.pop()
    return found


_UV_PIN = re.compile(r"^uv==(?P<version>\S+)", re.M)
_UV_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


def uv_requirement(text: str) -> tuple[str, str]:
    """(version, one-line hashed requirement) of uv from templates/uv.lock (pip's hashed requirements: Debian's
    pip installs uv, and pip cannot read a pylock.toml), for the Dockerfiles."""
    pin = _UV_PIN.search(text)
    hashes = _UV_HASH.findall(text)
    if pin is None:
        raise ValueError("no uv entry")
    if not hashes:
        raise ValueError(f"uv=={pin['version']} has no --hash")
    return pin["version"], f"uv=={pin['version']} " + " ".join(f"--hash={h}" for h in hashes)
