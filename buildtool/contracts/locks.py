"""The lock file format: what `buildtool lock` writes beside each Dockerfile and what the
Dockerfile installs with hashes required.

A lock is uv's requirements output: one exact pin per package, every entry with its `--hash`
lines (and `# via` comments), under a header whose `# inputs:` line fingerprints the matrix
values it was made from (so a stale lock is found without a network). Exact means the pin admits
one version only: `name==1.0+cu130` (a local version is compared as a whole), or `name===1.0`
where uv wrote `name==1.0`, because `==1.0` is also satisfied by any local build `1.0+cpu` that
a find-links folder offers: uv prefers that one and the hash check then fails the build. Each cell has
`framework.lock` (the framework and its dependency closure; pip-installed cells only) and
`tools.lock` (everything else it installs); `templates/uv.lock` pins the installer itself.

Where: a cell built for the default platform only keeps its locks beside its Dockerfile; a cell with
other platforms (matrix `platforms:`) keeps one folder per platform, named by its architecture
(`amd64/`, `arm64/`: BuildKit's TARGETARCH, which selects them in the one Dockerfile), each holding the
same file names (the pip locks and the apt lock, base list and .deb hashes of that platform). Readers name
the platform; only a single-platform cell may leave it out (see `platform_folder`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from buildtool.common.errors import UserError
from buildtool.contracts import platforms

FRAMEWORK_LOCK = "framework.lock"
TOOLS_LOCK = "tools.lock"
LOCK_FILES = (FRAMEWORK_LOCK, TOOLS_LOCK)
UV_LOCK = "uv.lock"          # in templates/: the pinned uv every build installs its locks with
_ENTRY = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?(?P<op>===|==)(?P<version>[^\s;\\]+)")
_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")
_INPUTS = re.compile(r"^# inputs: (sha256:[0-9a-f]{64})$", re.M)


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


_PLATFORM_LINE = re.compile(r"^# python \S+, platform (?P<platform>\S+)", re.M)


def header_platform(header: str) -> str | None:
    """The wheel platform a lock's header names (`# python 3.11, platform aarch64-manylinux_2_28`)."""
    found = _PLATFORM_LINE.search(header)
    return found["platform"] if found else None


_GLIBC_LINE = re.compile(r"^# base glibc (?P<glibc>[0-9]+\.[0-9]+)$", re.M)


def header_glibc(header: str) -> str | None:
    """The glibc of the base an NGC cell's lock was resolved against (`# base glibc 2.36`): the cap of the
    wheel platform its files are installed for (render.dockerfiles.wheel_platforms). None: not recorded."""
    found = _GLIBC_LINE.search(header)
    return found["glibc"] if found else None


def normalize(name: str) -> str:
    """PEP 503 name: what pip, uv and importlib.metadata agree a distribution is called."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Entry:
    name: str                  # normalized
    version: str
    hashes: tuple[str, ...]
    text: str                  # the entry as written (requirement, hashes, `# via` comments)
    operator: str = "=="       # `==` or `===`

    @property
    def exact(self) -> bool:
        """Whether the pin admits this version only (not also a local build of it)."""
        return self.operator == "===" or "+" in self.version

    def pinned_exactly(self) -> Entry:
        """The entry with a pin no other build can satisfy: `==1.0` becomes `===1.0`."""
        if self.exact:
            return self
        match = _ENTRY.match(self.text)
        assert match is not None
        text = self.text[:match.start("op")] + "===" + self.text[match.end("op"):]
        return Entry(self.name, self.version, self.hashes, text, "===")

    def uv_preference(self) -> str:
        """The entry as uv's own output spells it (`==`): uv keeps a pin of an existing output
        file only when it reads `==` (measured with uv 0.13.9: a `===` pin there is upgraded)."""
        match = _ENTRY.match(self.text)
        assert match is not None
        return self.text[:match.start("op")] + "==" + self.text[match.end("op"):]


@dataclass(frozen=True)
class LockFile:
    inputs: str                        # the header's fingerprint, "" when missing
    entries: dict[str, Entry]          # normalized name -> entry
    header: str = ""

    def versions(self) -> dict[str, str]:
        return {name: e.version for name, e in self.entries.items()}


def parse_lock(text: str) -> LockFile:
    """Parse a lock; ValueError names the first entry that cannot be installed with hashes."""
    header_lines: list[str] = []
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if not blocks and (line.startswith("#") or not line.strip()):
            header_lines.append(line)
        elif line and not line[0].isspace() and not line.startswith("#"):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    entries: dict[str, Entry] = {}
    for block in blocks:
        match = _ENTRY.match(block[0])
        if not match:
            raise ValueError(f"not a pinned requirement: {block[0].split()[0]!r}")
        joined = "\n".join(block).rstrip()
        hashes = tuple(_HASH.findall(joined))
        name = normalize(match["name"])
        if not hashes:
            raise ValueError(f"{match['name']}=={match['version']} has no --hash")
        if name in entries:
            raise ValueError(f"{name} is listed twice")
        entries[name] = Entry(name, match["version"], hashes, joined, match["op"])
    header = "\n".join(header_lines)
    found = _INPUTS.search(header)
    return LockFile(inputs=found.group(1) if found else "", entries=entries, header=header)


def uv_requirement(text: str) -> tuple[str, str]:
    """(version, one-line hashed requirement) of uv from templates/uv.lock, for the Dockerfiles."""
    entry = parse_lock(text).entries.get("uv")
    if entry is None:
        raise ValueError("no uv entry")
    return entry.version, f"uv=={entry.version} " + " ".join(f"--hash={h}" for h in entry.hashes)
