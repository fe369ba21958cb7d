"""The apt lock format: every Debian package a cell's apt step installs on top of its base, at one version.

`apt.lock` lives beside the cell's Dockerfile and pip locks; `buildtool lock` writes it from a simulated
install (`apt-get install -s --no-install-recommends`) run inside the cell's own base, and `buildtool render`
turns it into `apt-get install NAME=VERSION ...` for every entry. Format: `# key: value` header lines, then
one `name=version` line per package, sorted by name:

    # format: 1
    # inputs: sha256:...        fingerprint of the matrix values (named packages, base, architecture)
    # base: docker.io/library/debian:bookworm-slim
    # resolved-in: 127.0.0.1:5000/library/debian:bookworm-slim@sha256:... (mmdebstrap --variant=minbase bookworm, ...)
    # base-packages: sha256:... (88 in base.dpkg)
    # arch: amd64
    # entries: sha256:...       digest of the entry lines (a hand edit changes it)
    ca-certificates=20230311+deb12u1

`base.dpkg` beside it is the base's own `dpkg-query -W` list (`name=version`, sorted): the base the
lock sits on. Anything that does not parse is an error naming the line, never skipped.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

APT_LOCK = "apt.lock"
BASE_DPKG = "base.dpkg"
DEB_HASHES = "debs.sha256"      # the sha256 of each .deb of base.dpkg and apt.lock, as the archive listed it
NOT_SERVED = "-"                # in DEB_HASHES: the archive no longer served that version when `make lock` ran
APT_FORMAT = "1"
HEADER_KEYS = ("format", "inputs", "base", "resolved-in", "base-packages", "arch", "entries")
# Debian policy: a package name is [a-z0-9][a-z0-9+.-]+; a version [epoch:]upstream[-revision].
_NAME = r"[a-z0-9][a-z0-9+.-]+"
_VERSION = r"(?:[0-9]+:)?[0-9A-Za-z][0-9A-Za-z.+~:-]*"
_ENTRY = re.compile(rf"^(?P<key>{_NAME})=(?P<value>{_VERSION})$")
_HEADER = re.compile(r"^# (?P<key>[a-z-]+): (?P<value>\S.*)$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}\Z")
# `apt-get -s` lines: `Inst libssl3 [3.0.15-1~deb12u1] (3.0.17-1~deb12u2 Debian:12.12/stable [amd64])`; the
# bracket is the version being replaced (an upgrade of a base package: also on top of the base).
# A package of another architecture than the system's is named `name:arch` (`Inst libc6:i386 ...`).
_INST = re.compile(rf"^Inst (?P<name>{_NAME})(?::(?P<arch>\S+))? (?:\[[^\]]+\] )?\((?P<version>{_VERSION}) ")


def entries_digest(entries: dict[str, str]) -> str:
    """sha256 over the sorted `name=version` lines: what the lock's `entries` header records."""
    body = "".join(f"{n}={v}\n" for n, v in sorted(entries.items()))
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def _parse_lines(text: str, where: str, line_re: re.Pattern[str], form: str, width: int) -> dict[str, str]:
    """LINE_RE's `key` -> `value` of every line neither blank nor a comment; ValueError naming the first line
    that is not FORM, or whose key was listed before."""
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = line_re.match(line)
        if not match:
            raise ValueError(f"{where} {number}: {line[:width]!r} is not `{form}`")
        if match["key"] in found:
            raise ValueError(f"{where} {number}: {match['key']} is listed twice")
        found[match["key"]] = match["value"]
    return found


def parse_entries(text: str, what: str) -> dict[str, str]:
    """`name=version` lines (comments and blank lines aside); ValueError naming the first bad line."""
    return _parse_lines(text, f"{what} line" if what else "line", _ENTRY, "name=version", 80)


_HASH_LINE = re.compile(rf"^(?P<key>{_NAME}={_VERSION}) (?P<value>[0-9a-f]{{64}}|{re.escape(NOT_SERVED)})$")


def parse_deb_hashes(text: str, what: str) -> dict[str, str]:
    """`name=version sha256` lines of DEB_HASHES -> {"name=version": sha256 or NOT_SERVED}; ValueError naming
    the first bad line (a hash never defaults to anything)."""
    return _parse_lines(text, f"{what} line", _HASH_LINE, f"name=version <sha256 or {NOT_SERVED}>", 100)


def parse_package_records(output: str) -> dict[str, str]:
    """`apt-cache show` records -> {"name=version": SHA256}; a record without its SHA256 is left out, and so
    counts as not served."""
    found: dict[str, str] = {}
    for record in output.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in record.splitlines() if ": " in line and not line[0].isspace())
        if {"Package", "Version", "SHA256"} <= set(fields) and re.fullmatch(r"[0-9a-f]{64}", fields["SHA256"]):
            found.setdefault(f"{fields['Package']}={fields['Version']}", fields["SHA256"])
    return found


@dataclass(frozen=True)
class AptLock:
    header: dict[str, str]         # key -> value, every key of HEADER_KEYS
    entries: dict[str, str]        # package -> version

    @property
    def inputs(self) -> str:
        return self.header["inputs"]

    def pins(self) -> list[str]:
        """`name=version` for apt-get install, sorted by name."""
        return [f"{n}={v}" for n, v in sorted(self.entries.items())]

    def digest_matches(self) -> bool:
        """Whether the entries are the ones `buildtool lock` wrote (its `entries` digest)."""
        return self.header["entries"] == entries_digest(self.entries)


def parse_apt_lock(text: str) -> AptLock:
    """Parse apt.lock; ValueError naming the first line or header key that is wrong or missing."""
    header: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("#"):
            continue
        match = _HEADER.match(line)
        if match and match["key"] in HEADER_KEYS:
            if match["key"] in header:
                raise ValueError(f"line {number}: header `{match['key']}` is given twice")
            header[match["key"]] = match["value"]
    missing = [k for k in HEADER_KEYS if k not in header]
    if missing:
        raise ValueError(f"header lacks {', '.join(f'`# {k}:`' for k in missing)}")
    if header["format"] != APT_FORMAT:
        raise ValueError(f"format {header['format']!r} is not {APT_FORMAT} (the one this toolkit reads)")
    for key in ("inputs", "entries"):
        if not _DIGEST.match(header[key]):
            raise ValueError(f"header `{key}` {header[key]!r} is not sha256:<64 hex>")
    if not _DIGEST.match(header["base-packages"].split(" ", 1)[0]):
        raise ValueError(f"header `base-packages` {header['base-packages']!r} does not start with sha256:<64 hex>")
    entries = parse_entries(text, "")
    if not entries:
        raise ValueError("no `name=version` entries (an apt step always installs something)")
    return AptLock(header, entries)


def format_apt_lock(header: dict[str, str], entries: dict[str, str], preamble: list[str]) -> str:
    """The file `buildtool lock` writes: preamble comments, the header (entries digest filled in), the pins."""
    full = {**header, "format": APT_FORMAT, "entries": entries_digest(entries)}
    lines = [f"# {line}" for line in preamble] + [f"# {key}: {full[key]}" for key in HEADER_KEYS]
    return "\n".join(lines) + "\n" + "".join(f"{n}={v}\n" for n, v in sorted(entries.items()))


def parse_simulation(output: str, arch: str | None = None) -> dict[str, str]:
    """package -> version of every `Inst` line of `apt-get install -s`; ValueError on an Inst line it
    cannot read (never a package silently left out), on a package of another architecture than `arch` (the
    system's; None: any other than none) and on a package named twice: a lock pins one `name=version` per name,
    which apt installs for the system's architecture, so a foreign one would be locked as the native one."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        if not line.startswith("Inst "):
            continue
        match = _INST.match(line)
        if not match:
            raise ValueError(f"cannot read apt's simulated install line {line[:120]!r}")
        if match["arch"] is not None and match["arch"] != arch:
            raise ValueError(f"apt's simulated install adds {match['name']}:{match['arch']}, a package of another "
                             f"architecture than {arch or 'the system'}'s, which an apt lock cannot pin (its "
                             "`name=version` installs the system's own); remove the foreign architecture "
                             "(`dpkg --add-architecture`) from the base or the package from matrix.yaml")
        if match["name"] in found:
            raise ValueError(f"apt's simulated install names {match['name']} twice ({found[match['name']]} and "
                             f"{match['version']}), which an apt lock of one `name=version` each cannot pin")
        found[match["name"]] = match["version"]
    return found


def build_error(line: str) -> str | None:
    """apt's refusal of a locked version, as the one line a build summary shows (None: not that error)."""
    match = re.search(r"E: Version '([^']+)' for '([^']+)' was not found", line)
    if not match:
        return None
    return (f"{APT_LOCK} pins {match[2]}={match[1]}, which Debian no longer serves; run `make lock` "
            f"(FRAMEWORK=<cell>) and commit the new {APT_LOCK}")
