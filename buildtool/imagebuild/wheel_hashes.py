"""Which of a lock entry's files an image installed, for the SBOM's hashes.

A lock pins a package to every file of its version (a wheel per platform, the sdist: markupsafe has
151 hashes) and the installer records none of them in the image. The installed distribution's WHEEL
file names its tags; the indexes the cell installs from name each file and its sha256. The file whose
sha256 the lock admits and whose tags are exactly the installed ones is the file installed. When the
indexes list no such file, or more than one, nothing is claimed: the SBOM says the hash is not recorded.

Sources are the ones the build installs from: the cell's index (else the host's, else PyPI), the
extra indexes, the host's find-links; local folders and file:// indexes are read (and hashed where a
page gives no hash), remote PEP 503/691 pages are fetched with the host's CA bundle and a timeout.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from buildtool.contracts.locks import LockFile
from buildtool.imagebuild.pipconfig import HostPip, redact

PYPI = "https://pypi.org/simple"
TIMEOUT_S = 20
Log = Callable[[str], None]
# (location, project, is a find-links page) -> {filename: sha256}: what one source lists for a project
Fetch = Callable[[str, str, bool], dict[str, str]]


@dataclass(frozen=True)
class Sources:
    indexes: tuple[str, ...]        # PEP 503 simple index roots
    find_links: tuple[str, ...]     # folders or pages of links
    cert: str = ""

    @classmethod
    def for_cell(cls, host: HostPip, index_url: str | None, extra_index_urls: Iterable[str]) -> Sources:
        indexes = () if host.no_index else (index_url or host.index_url or PYPI, *extra_index_urls,
                                             *host.extra_index_urls)
        return cls(tuple(dict.fromkeys(indexes)), host.find_links, host.cert)


def installed_file(name: str, version: str, tags: Iterable[str], admitted: Iterable[str],
                   listed: Mapping[str, str]) -> str | None:
    """The sha256 (hex) of the one listed file that is this distribution's wheel with exactly `tags`
    and a hash the lock admits; None when there is not exactly one."""
    wanted = frozenset(tags)
    allowed = {h.removeprefix("sha256:") for h in admitted}
    try:
        exact = Version(version)
    except InvalidVersion:
        return None
    found = set()
    for filename, sha256 in listed.items():
        try:
            wheel_name, wheel_version, _, wheel_tags = parse_wheel_filename(filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue          # an sdist or a stray file: no tags to compare
        if (wheel_name == canonicalize_name(name) and wheel_version == exact
                and frozenset(str(t) for t in wheel_tags) == wanted and sha256 in allowed):
            found.add(sha256)
    return found.pop() if len(found) == 1 else None


def identify(python: Mapping[str, Mapping[str, object]], locks: Mapping[str, LockFile], sources: Sources,
             log: Log, fetch: Fetch | None = None) -> dict[str, str]:
    """name -> sha256 of the installed file, for each locked distribution whose entry admits several
    files and whose file the sources identify (single-hash entries need no lookup)."""
    fetch = fetch or _Fetcher(sources.cert, log).files
    found: dict[str, str] = {}
    for lock in locks.values():
        for name, entry in sorted(lock.entries.items()):
            detail = python.get(name)
            if len(entry.hashes) < 2 or detail is None or detail.get("version") != entry.version:
                continue
            tags = detail.get("wheel_tags") or []
            if not isinstance(tags, list) or not tags:
                continue      # not installed from a wheel (or an older probe): nothing to match
            listed: dict[str, str] = {}
            for location in sources.indexes:
                listed.update(fetch(location, name, False))
            for location in sources.find_links:
                listed.update(fetch(location, name, True))
            sha256 = installed_file(name, entry.version, tags, entry.hashes, listed)
            if sha256:
                found[name] = sha256
    return found


class _Links(HTMLParser):
    """Anchors of a PEP 503 page or a find-links page: (href, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self.links.append((self._href, data.strip()))
            self._href = None


class _Fetcher:
    """Each source's files for a project, read once per process."""

    def __init__(self, cert: str, log: Log) -> None:
        self.cert = cert
        self.log = log
        self.pages: dict[str, dict[str, str]] = {}
        self.unreachable: set[str] = set()     # sources asked once: one log line, not one per package

    def files(self, location: str, name: str, flat: bool) -> dict[str, str]:
        key = f"{location}\0{name}\0{flat}"
        if key not in self.pages:
            self.pages[key] = self._read(location, canonicalize_name(name), flat)
        return self.pages[key]

    def _read(self, location: str, project: str, flat: bool) -> dict[str, str]:
        local = _local(location)
        if local is None:
            return self._remote(location, location if flat else location.rstrip("/") + f"/{project}/")
        if flat and local.is_dir():
            return _folder(local, project)
        page = local if flat else local / project / "index.html"
        return _page(page.read_text(errors="replace"), page.as_uri()) if page.is_file() else {}

    def _remote(self, location: str, url: str) -> dict[str, str]:
        import requests

        if location in self.unreachable:
            return {}
        try:
            response = requests.get(url, timeout=TIMEOUT_S, verify=self.cert or True,
                                    headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
        except requests.RequestException as exc:
            self.unreachable.add(location)
            self.log(f"wheel hashes: {redact(location)} cannot be reached ({type(exc).__name__}); files only it "
                     "lists keep no hash in the SBOM")
            return {}
        if response.status_code == 404:
            return {}
        if response.status_code != 200:
            self.log(f"wheel hashes: {redact(url)} answered {response.status_code}; its files stay unknown")
            return {}
        if response.headers.get("Content-Type", "").startswith("application/vnd.pypi.simple.v1+json"):
            return {f["filename"]: f["hashes"]["sha256"] for f in response.json().get("files", [])
                    if isinstance(f.get("hashes"), dict) and f["hashes"].get("sha256")}
        return _page(response.text, url)


def _local(location: str) -> Path | None:
    if location.startswith("file:"):
        return Path(unquote(urlsplit(location).path))
    return None if "://" in location else Path(location)


def _page(html: str, base: str) -> dict[str, str]:
    """filename -> sha256 of a page's links; a local file without a #sha256= fragment is hashed."""
    parser = _Links()
    parser.feed(html)
    found = {}
    for href, text in parser.links:
        target, _, fragment = href.partition("#")
        filename = text or unquote(target.rsplit("/", 1)[-1])
        match = re.fullmatch(r"sha256=([0-9a-f]{64})", fragment)
        if match:
            found[filename] = match.group(1)
            continue
        local = _local(urljoin(base, target))
        if local is not None and local.is_file():
            found[filename] = _sha256(local)
    return found


def _folder(folder: Path, project: str) -> dict[str, str]:
    found = {}
    for path in sorted(folder.glob("*.whl")):
        try:
            if parse_wheel_filename(path.name)[0] == project:
                found[path.name] = _sha256(path)
        except (InvalidWheelFilename, InvalidVersion):
            continue
    return found


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
