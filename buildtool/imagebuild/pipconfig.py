"""The host's pip settings, handed to a build as BuildKit secrets and never as layers (docs/commands.md, Behind
a proxy or offline).

The secrets, mounted only while a `RUN` step runs: `pip.conf` (the host's indexes, which may carry a token,
find-links and trusted hosts, `cert = /run/secrets/pip-ca`, few retries so an unreachable extra index costs seconds,
not minutes), `pip-ca` (the host's CA bundle; uv reads it as SSL_CERT_FILE), `uv.toml` (the same locations: uv does
not read pip.conf) and `lock-urls` (render_lock_urls: the sed script that maps each served folder's `file://` URLs
in a lock to its loopback URL; the sha256 in the lock, not the URL, decides what is installed). Local folders cannot
be reached from a build container, and copying them into the context would put them in a layer: `PipSecrets` serves
them read-only over a loopback HTTP server for the duration of the build (builds run with `--network host`).
"""

from __future__ import annotations

import ast
import http.server
import json
import os
import re
import socketserver
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from urllib.parse import unquote, urlsplit

from buildtool.common.errors import UserError
from buildtool.common.urls import public_url

SECRET_CONF = "pip.conf"
SECRET_UV = "uv.toml"
SECRET_CA = "pip-ca"
SECRET_LOCK_URLS = "lock-urls"
CA_IN_BUILD = "/run/secrets/pip-ca"
_SECTIONS = ("global", "install", ":env:")  # later wins: what pip install reads (pip/_internal/cli/parser.py)
# pip's booleans (pip/_internal/utils/misc.py strtobool, any case); pip refuses any other value of a flag.
_PIP_TRUE = ("y", "yes", "t", "true", "on", "1")
_PIP_FALSE = ("n", "no", "f", "false", "off", "0")


def _pip_flag(key: str, value: str, section: str) -> bool:
    """VALUE of pip's boolean setting KEY (set in SECTION) as pip reads it; UserError for any other value, which
    pip install refuses (never read as false: `no-index = t` is true to pip)."""
    if value.lower() in _PIP_TRUE + _PIP_FALSE:
        return value.lower() in _PIP_TRUE
    where = (f"PIP_{key.upper().replace('-', '_')} in the environment" if section == ":env:"
             else f"`{section}.{key}` in pip's configuration")
    raise UserError(f"pip's {key} setting {value[:40]!r} ({where}) is no boolean: pip reads "
                    f"{', '.join(_PIP_TRUE)} or {', '.join(_PIP_FALSE)} and refuses anything else; fix it "
                    "(`pip config list` shows where it is set)")


def _unrepr(value: str) -> str:
    """A value `pip config list` wrote with %r: its escapes (a line break, a quote, a backslash) read back as pip
    holds them; the text between the quotes as it is where it is no such literal."""
    try:
        found = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value[1:-1]
    return found if isinstance(found, str) else value[1:-1]


@dataclass(frozen=True)
class HostPip:
    """The pip settings a build needs, as the host resolves them."""

    index_url: str = ""
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    cert: str = ""
    trusted_hosts: tuple[str, ...] = ()
    no_index: bool = False

    @classmethod
    def parse(cls, listing: str) -> HostPip:
        """Parse `pip config list` output (`section.key=<the value's Python repr>` lines: a value written over several
        lines of pip.conf, one location a line, is listed as `'\\nhttps://a/simple\\nhttps://b/simple'`)."""
        merged: dict[str, dict[str, str]] = {}
        for line in listing.splitlines():
            name, sep, raw = line.partition("=")
            if not sep or "." not in name:
                continue
            section, _, key = name.rpartition(".")
            value = raw.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = _unrepr(value)
            if value:   # pip ignores an empty value: an earlier section's stands (PIP_NO_INDEX= clears nothing)
                merged.setdefault(key, {})[section] = value
        source = {key: s for key, by_section in merged.items() for s in _SECTIONS if s in by_section}
        chosen = {key: merged[key][section] for key, section in source.items()}

        def many(key: str) -> tuple[str, ...]:
            return tuple(chosen.get(key, "").split())

        return cls(
            index_url=chosen.get("index-url", ""),
            extra_index_urls=many("extra-index-url"),
            find_links=many("find-links"),
            cert=chosen.get("cert", ""),
            trusted_hosts=many("trusted-host"),
            no_index="no-index" in chosen and _pip_flag("no-index", chosen["no-index"], source["no-index"]),
        )

    @classmethod
    def from_host(cls, python: str | None = None) -> HostPip:
        """Ask the host's pip (config files and PIP_* environment) what it would use: nothing where that Python
        has no pip; UserError where pip refuses its own configuration (pip install would refuse it too)."""
        try:
            run = subprocess.run([python or sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                                 text=True, timeout=60, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        except (OSError, subprocess.TimeoutExpired):
            return cls()
        if run.returncode == 0:
            return cls.parse(run.stdout).checked()
        if "No module named pip" in run.stderr:
            return cls()
        # Never read as "PyPI, no CA": the host's own settings would be dropped. pip's first line, and the line
        # naming the file where it gives one (not the offending line it quotes, which may hold an index token).
        lines = [line.strip() for line in run.stderr.splitlines() if line.strip()]
        where = [line[:600] for line in lines[1:] if line.startswith("file: ")]   # a long path is never cut short
        said = " ".join([*(line[:200] for line in lines[:1]), *where])
        raise UserError(f"the host's pip configuration is refused by pip (`pip config list`: "
                        f"{said or f'exit {run.returncode}'}); fix that file (or PIP_CONFIG_FILE, PIP_* settings)")

    def checked(self) -> HostPip:
        """These settings, or a UserError naming a CA bundle that does not exist (requests and uv would fail on it
        with a traceback or quietly take their own bundle) or is a folder (the build mounts one file as its CA, and
        uv reads SSL_CERT_FILE: a folder was left out of the build without a word)."""
        if not self.cert:
            return self
        setting = "PIP_CERT" if os.environ.get("PIP_CERT") == self.cert else "`cert` in pip's configuration"
        if not os.path.exists(self.cert):
            raise UserError(f"pip's CA bundle {self.cert} ({setting}) does not exist; point {setting} at an existing "
                            "CA bundle file, or unset it (`pip config list` shows where it is set)")
        if os.path.isdir(self.cert):
            raise UserError(f"pip's CA bundle {self.cert} ({setting}) is a folder; point {setting} at one CA bundle "
                            "file (the folder's PEM certificates put together), or unset it (`pip config list` shows "
                            "where it is set)")
        return self


def package_indexes(host: HostPip, cell_urls: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """Each location the build's pip and uv settings name (the host's index, extra indexes and find-links, then
    the cell's own index URLs), as the provenance records them: without credentials, query or fragment
    (common.urls.public_url; a local folder as its file:// URL), each once, in that order."""
    found: dict[str, str] = {}
    named = [(host.index_url, "index-url"), *((u, "extra-index-url") for u in host.extra_index_urls),
             *((u, "find-links") for u in host.find_links), *((u, "cell-index-url") for u in cell_urls)]
    for location, role in named:
        if not location:
            continue
        url = public_url(location if "://" in location else Path(location).resolve().as_uri())
        if url:
            found.setdefault(url, role)
    return [{"url": url, "role": role} for url, role in found.items()]


def redact(url: str) -> str:
    """A URL fit for a log line: any password replaced by ****, and a user name alone (`https://TOKEN@host`,
    how GitHub and GitLab tokens are often given, or `https://TOKEN:@host`, Gemfury's) too; the query and
    fragment, where a token may ride (`?token=...`, common.urls), are left out. Everything up to the last `@`
    is user info: a password with an unescaped `/`, `?` or `#` ends the authority early for a URL parser."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo, at, location = rest.rpartition("@")
    location = re.split(r"[?#]", location, maxsplit=1)[0]
    if not at:
        return f"{scheme}://{location}"
    user, _, password = userinfo.partition(":")
    return f"{scheme}://{user}:****@{location}" if password else f"{scheme}://****@{location}"


@cache
def answers(url: str, cert: str = "", timeout: float = 10.0) -> bool:
    """Whether a remote index answers at all (any HTTP status): asked once per process. uv, unlike
    pip, fails on an index it cannot connect to, so such an index is left out of its settings;
    the locks' hashes decide what may be installed, an index only where it comes from. `cert`: the host's
    pip CA (HostPip.cert), trusted as pip and uv trust it (an intercepting proxy's); "": the default bundle."""
    if url.startswith("file:") or "://" not in url:
        return True
    import requests

    try:
        requests.head(url, timeout=timeout, allow_redirects=False, verify=cert or True)
    except requests.RequestException:
        return False
    return True


def reachable(urls: tuple[str, ...], log: Callable[[str], None], cert: str = "") -> tuple[str, ...]:
    found = []
    for url in urls:
        if answers(url, cert):
            found.append(url)
        else:
            log(f"index {redact(url)} cannot be reached from here; left out of uv's settings (the locks' hashes "
                "decide what is installed)")
    return tuple(found)


# The variable uv reads each index option of its command line from (where the option is not given), and what
# separates the values of one (None: it holds one value).
UV_INDEX_ENV = {"--index-url": ("UV_INDEX_URL", None), "--extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
                "--find-links": ("UV_FIND_LINKS", ",")}
# Every variable that names a package location to uv: the host's own are never read (as UV_NO_CONFIG keeps its
# uv.toml out): the indexes are the host's pip settings' and the cell's, which uv_index_env sets, and a token in an
# index only uv was given was never masked in its errors (redact, cell_inputs.secret_strings know pip's alone).
UV_LOCATION_ENV = ("UV_INDEX", "UV_DEFAULT_INDEX", *(name for name, _ in UV_INDEX_ENV.values()))


def uv_index_env(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """`argv` without its index options, and the variables of UV_INDEX_ENV that give uv the same locations in the
    same order: a command line is readable by every local user (/proc/<pid>/cmdline, `ps`), a process's
    environment by its own user only, so index credentials never ride on uv's command line. UserError naming a
    location that holds its variable's separator (uv would split it into others)."""
    command: list[str] = []
    given: dict[str, list[str]] = {}
    args = iter(argv)
    for arg in args:
        if arg in UV_INDEX_ENV:
            given.setdefault(arg, []).append(next(args))
        else:
            command.append(arg)
    env = {}
    for option, values in given.items():
        name, separator = UV_INDEX_ENV[option]
        if separator is None and len(values) > 1:
            raise ValueError(f"{option} given {len(values)} times")   # uv takes one
        for value in values:
            if separator and separator in value:
                raise UserError(f"package location {redact(value)} holds {separator!r}, which separates the "
                                f"locations uv reads from {name} (where they are kept off its command line): "
                                "rename it, or percent-encode the character in a URL")
        env[name] = (separator or "").join(values)
    return command, env


def _local_path(location: str) -> Path | None:
    if location.startswith("file:"):
        return Path(unquote(urlsplit(location).path))
    if "://" not in location:
        return Path(location)
    return None


def _mapped(location: str, url_of: dict[str, str]) -> str:
    """A location as a build sees it: a local folder served on loopback as its URL there."""
    local = _local_path(location)
    return location if local is None else url_of.get(str(local), location)


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Read-only file server over several folders mounted at /m<N>/ prefixes."""

    def __init__(self, *args: object, mounts: dict[str, Path], **kwargs: object) -> None:
        self.mounts = mounts
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def translate_path(self, path: str) -> str:
        path = unquote(urlsplit(path).path)
        prefix, _, rest = path.lstrip("/").partition("/")
        root = self.mounts.get(prefix)
        # No hidden file or folder: none is a package or an index page, and the folder above a local index may be a
        # home folder (~/.docker/config.json, ~/.netrc, ~/.ssh), served to every local user while the build runs.
        if root is None or any(part.startswith(".") for part in rest.split("/")):
            return "/nonexistent-pip-mount"
        target = (root / rest).resolve()
        if not target.is_relative_to(root):  # no escape through `..` or links
            return "/nonexistent-pip-mount"
        return str(target)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass


@dataclass
class PipSecrets:
    """The secrets of one build session: files to pass as `--secret id=..,src=..`."""

    files: dict[str, Path]
    served: dict[str, str] = field(default_factory=dict)  # local folder -> loopback URL
    file_urls: dict[str, str] = field(default_factory=dict)  # file URL of a served root -> its loopback URL


def render_conf(host: HostPip, url_of: dict[str, str], *, has_ca: bool) -> str:
    """The pip.conf a build sees: local folders replaced by their loopback URLs."""
    lines = ["[global]"]
    if host.index_url:
        lines.append(f"index-url = {_mapped(host.index_url, url_of)}")
    if host.extra_index_urls:
        lines.append("extra-index-url = " + " ".join(_mapped(u, url_of) for u in host.extra_index_urls))
    if host.find_links:
        lines.append("find-links = " + " ".join(_mapped(u, url_of) for u in host.find_links))
    if host.no_index:
        lines.append("no-index = true")
    trusted = [*host.trusted_hosts, *(["127.0.0.1"] if url_of else [])]  # the loopback server speaks plain HTTP
    if trusted:
        lines.append("trusted-host = " + " ".join(dict.fromkeys(trusted)))
    if has_ca:
        lines.append(f"cert = {CA_IN_BUILD}")
    # An unreachable extra index (e.g. download.pytorch.org offline) must cost seconds.
    lines += ["retries = 1", "timeout = 20", "disable-pip-version-check = true"]
    return "\n".join(lines) + "\n"


def render_uv_toml(host: HostPip, url_of: dict[str, str]) -> str:
    """The uv configuration a build sees (secret `uv.toml`): the same indexes, find-links and
    loopback URLs as its pip.conf. uv cannot take a CA path in its config: the build exports
    SSL_CERT_FILE=/run/secrets/pip-ca. Best match across indexes, as pip does: the locks'
    hashes decide which file is acceptable, so no index can substitute another."""
    lines = []
    if host.index_url:
        if not answers(host.index_url, host.cert):   # left out, uv would quietly take PyPI in its place
            raise UserError(f"the pip index-url {redact(host.index_url)} does not answer from here, and uv would "
                            "use PyPI in its place: make it reachable, or unset it (`pip config list` shows where)")
        lines.append(f"index-url = {json.dumps(_mapped(host.index_url, url_of))}")
    extra = [_mapped(u, url_of) for u in host.extra_index_urls if _local_path(u) or answers(u, host.cert)]
    if extra:
        lines.append(f"extra-index-url = {json.dumps(list(dict.fromkeys(extra)))}")
    if host.find_links:
        lines.append(f"find-links = {json.dumps([_mapped(u, url_of) for u in host.find_links])}")
    if host.no_index:
        lines.append("no-index = true")
    insecure = [*host.trusted_hosts, *(["127.0.0.1"] if url_of else [])]
    if insecure:
        lines.append(f"allow-insecure-host = {json.dumps(list(dict.fromkeys(insecure)))}")
    lines += ['index-strategy = "unsafe-best-match"', "concurrent-downloads = 8"]
    return "\n".join(lines) + "\n"


def render_lock_urls(file_urls: dict[str, str]) -> str:
    """The `lock-urls` secret: a sed script that turns each served folder's file URLs in a pylock.toml
    (`"file:///opt/wheels/...`) into its loopback URL, every character taken literally."""

    def literal(text: str, special: str) -> str:
        if "\n" in text:
            raise ValueError(f"a folder name with a line break cannot be served to a build: {text!r}")
        return "".join("\\" + c if c in special else c for c in text)

    return "".join('s|"' + literal(source, _SED_PATTERN) + '|"' + literal(target, _SED_REPLACEMENT) + '|g\n'
                   for source, target in sorted(file_urls.items()))


_SED_PATTERN = "\\.*[]^$|"        # special in a basic regular expression, and the delimiter
_SED_REPLACEMENT = "\\&|"


@contextmanager
def pip_secrets(host: HostPip | None = None) -> Iterator[PipSecrets]:
    """Generate the secrets and serve local folders on loopback while the context is open."""
    host = (host if host is not None else HostPip.from_host()).checked()   # its CA a file, or none
    named = (_local_path(url) for url in (host.index_url, *host.extra_index_urls, *host.find_links) if url)
    folders = list(dict.fromkeys(local for local in named if local is not None and local.is_dir()))
    url_of: dict[str, str] = {}
    file_urls: dict[str, str] = {}
    server: socketserver.TCPServer | None = None
    thread: threading.Thread | None = None
    with tempfile.TemporaryDirectory(prefix="buildtool-pip-") as tmp:   # mode 0700, as mkdtemp makes it
        try:
            if folders:
                # An index folder's pages link to `../../files/...`: serve the folder above `simple/`.
                indexes = {_local_path(u) for u in (host.index_url, *host.extra_index_urls) if u}
                mounts = {f"m{n}": f.resolve().parent if f in indexes else f.resolve() for n, f in enumerate(folders)}
                server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), partial(_Handler, mounts=mounts))
                server.daemon_threads = True
                port = server.server_address[1]
                for n, folder in enumerate(folders):
                    resolved = folder.resolve()
                    root = mounts[f"m{n}"]
                    suffix = resolved.name + "/" if root != resolved else ""
                    url_of[str(folder)] = f"http://127.0.0.1:{port}/m{n}/{suffix}"
                    # A lock names the files as uv found them: under the folder as configured or resolved.
                    for above in {root, folder.parent if root != resolved else folder}:
                        file_urls[f"file://{above.absolute()}/"] = f"http://127.0.0.1:{port}/m{n}/"
                thread = threading.Thread(target=server.serve_forever, name="pip-file-server", daemon=True)
                thread.start()
            files: dict[str, Path] = {}
            has_ca = bool(host.cert)
            if has_ca:
                files[SECRET_CA] = Path(host.cert)
            for secret, text in ((SECRET_CONF, render_conf(host, url_of, has_ca=has_ca)),
                                 (SECRET_UV, render_uv_toml(host, url_of)),
                                 (SECRET_LOCK_URLS, render_lock_urls(file_urls))):
                files[secret] = Path(tmp) / secret
                with os.fdopen(os.open(files[secret], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
                    handle.write(text)
            yield PipSecrets(files=files, served=url_of, file_urls=file_urls)
        finally:
            if server is not None and thread is not None and thread.is_alive():
                server.shutdown()   # waits for serve_forever: only a thread that started runs it
                thread.join(timeout=10)
            if server is not None:
                server.server_close()
