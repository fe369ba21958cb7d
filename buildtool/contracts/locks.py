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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FRAMEWORK_LOCK = "framework.lock"
TOOLS_LOCK = "tools.lock"
LOCK_FILES = (FRAMEWORK_LOCK, TOOLS_LOCK)
UV_LOCK = "uv.lock"          # in templates/: the pinned uv every build installs its locks with
_ENTRY = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?(?P<op>===|==)(?P<version>[^\s;\\]+)")
_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")
_INPUTS = re.compile(r"^# inputs: (sha256:[0-9a-f]{64})$", re.M)


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
