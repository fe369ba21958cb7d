"""What each matrix value is, checked by its own grammar.

One function per kind of value; each returns the value (normalised where it says so) or
raises ValueError with the sentence a user needs to fix it. The schema (schema.py) attaches
them to its fields, so the pydantic models stay the one description of the matrix.

Values end up in Dockerfiles (RUN lines, LABELs, comments), in tags and in CI files; the
grammars below admit no whitespace, quote or shell metacharacter where none can belong.
Templates quote every value that reaches a shell as well (render/dockerfiles.py).
"""

from __future__ import annotations

import difflib
import functools
import re
import string
import unicodedata
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from buildtool.common.refs import ReferenceError, parse_reference
from buildtool.common.sizes import SIZE_RE, SizeError, shm_bytes, size_bytes
from buildtool.common.urls import shown_url
from buildtool.contracts import names
from buildtool.contracts.runprofile import MIN_SHM_BYTES, MIN_SHM_SIZE

# PEP 508 distribution names.
_DIST_NAME_RE = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])\Z", re.IGNORECASE)
# Debian policy 5.6.1 (name), 5.6.12 (version), with an optional `:arch` qualifier.
_APT_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(?::[a-z0-9-]+)?(?:=[0-9][A-Za-z0-9.+~:-]*)?\Z")
_IMAGE_NAME_RE = re.compile(r"^[a-z0-9]+(?:[-.][a-z0-9]+)*\Z")
_CELL_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}\Z")
_PYTHON_RE = re.compile(r"^[0-9]+\.[0-9]+\Z")
_WORKDIR_RE = re.compile(r"^/[A-Za-z0-9._/-]*\Z")
_TEMPLATE_RE = re.compile(r"^[A-Za-z0-9._/-]+\Z")
# What a URL in the matrix may contain: RFC 3986 characters minus everything a shell,
# a Dockerfile or a YAML reader would treat specially.
_URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/%+=,@]")
SCHEMA_VERSION = 1
IMAGE_NAME_MAX = 128
ONE_LINE_MAX = 300
INDEX_SCHEMES = ("https", "http", "file")
# Release tags are checked at load time with this release in `{release}`: longer than any
# release version we expect (`buildtool release --version` takes PEP 440 versions).
PLAUSIBLE_RELEASE = "2026.12.31.post999.dev999"
# The longest dev-tag revision `git_revision` makes: 12 hex digits, `-dirty.` and 8 more.
PLAUSIBLE_REVISION = "0123456789ab-dirty.01234567"


# Every check below is a pure function of its text, cached: a big matrix repeats most values.


def suggest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """`; did you mean `versions`?` when `word` is close to one of `choices`, else ``."""
    close = (difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
             or [c for c in choices if c.lower() == word.lower()][:1])
    return f"; did you mean `{close[0]}`?" if close else ""


@functools.lru_cache(maxsize=65536)
def is_plain_word(text: str) -> bool:
    """Whether `text` can be shown as a bare YAML word in advice (no spaces, quotes, breaks)."""
    return bool(re.fullmatch(r"[A-Za-z0-9_.+/=:@-]{1,80}", text))


@functools.lru_cache(maxsize=65536)
def one_line(text: str, limit: int = ONE_LINE_MAX) -> str:
    """Free text (the `use` sentence): one line, printable, at most `limit` characters."""
    bad = next((c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") or c == "\u0085"), None)
    if bad is not None:
        if bad in "\n\r\u2028\u2029\u0085":
            what = "a line break"
        elif unicodedata.category(bad) == "Cf":
            # Invisible, and they reorder or hide what is shown (U+202E turns `jax` around): never in a value.
            what = f"the format character U+{ord(bad):04X} ({unicodedata.name(bad, 'unnamed')})"
        else:
            what = f"the control character {bad!r}"
        raise ValueError(f"contains {what}; write one line of plain text")
    if not text.strip():
        raise ValueError("is empty; write one line saying what the image is for")
    if len(text) > limit:
        raise ValueError(f"is {len(text)} characters; keep it to at most {limit}")
    return text


def _matching(pattern: re.Pattern[str], problem: str) -> Callable[[str], str]:
    """The grammar that is one regular expression: `text` when it matches, else ValueError `'text' <problem>`."""
    @functools.lru_cache(maxsize=65536)
    def check(text: str) -> str:
        if not pattern.match(text):
            raise ValueError(f"{text!r} {problem}")
        return text
    return check


# A PEP 508 distribution name (a key under `packages`).
dist_name = _matching(_DIST_NAME_RE, "is not a package name (letters, digits, '.', '_' and '-', starting and ending "
                                     "with a letter or digit)")
# A Debian package name, optionally `:arch` and `=version`.
apt_package = _matching(_APT_RE, "is not a Debian package name (lower-case letters, digits, '+', '-' and '.', at least "
                                 "two characters; optionally =VERSION)")
python_version = _matching(_PYTHON_RE, "is not a Python version like 3.11")


@functools.lru_cache(maxsize=65536)
def version(text: str) -> str:
    """A PEP 440 version, exactly as written (it is pinned as `name==version`)."""
    try:
        Version(text)
    except InvalidVersion:
        raise ValueError(f"{text!r} is not a version (PEP 440, e.g. 2.21.0)") from None
    if text != text.strip():
        raise ValueError(f"{text!r} has spaces around it; write {text.strip()!r}")
    return text


@functools.lru_cache(maxsize=65536)
def requirement(text: str) -> str:
    """A PEP 508 requirement that pins a version from the index: `torch==2.13.0+cpu`."""
    one_line(text)
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0].rstrip(".")
        raise ValueError(f"{text!r} is not a PEP 508 requirement ({reason}); write it like torch==2.13.0") from None
    if req.url:
        raise ValueError(f"{text!r} installs from a URL; pin a version from the package index instead, "
                         f"e.g. {req.name}==1.0")
    if not req.specifier:
        raise ValueError(f"{text!r} names no version; pin one, e.g. {req.name}==1.0")
    for spec in req.specifier:
        pinned = spec.version.removesuffix(".*") if spec.operator in ("==", "!=") else spec.version
        try:
            Version(pinned)
        except InvalidVersion:
            raise ValueError(f"{text!r}: {spec.version!r} is not a version (PEP 440, e.g. 2.13.0)") from None
    return text


# The digests Docker pulls by (go-digest's algorithms): the grammar admits any `algorithm:hex`, Docker refuses the rest.
_PULL_DIGESTS = {"sha256": 64, "sha384": 96, "sha512": 128}


def _digest_problem(digest: str) -> str:
    """Why Docker would not pull by `digest` when it is shaped `algorithm:hex`, else "" (the grammar's own message,
    or none). The name before the '@' is never shown: before a host it may be a user name."""
    algorithm, colon, hex_digits = digest.partition(":")
    if not (colon and re.fullmatch(r"[A-Za-z0-9]+(?:[+._-][A-Za-z0-9]+)*", algorithm)
            and re.fullmatch("[0-9A-Fa-f]+", hex_digits)):
        return ""
    if len(hex_digits) == _PULL_DIGESTS.get(algorithm) and not re.search("[A-F]", hex_digits):
        return ""
    known = ", ".join(f"{a}: {n}" for a, n in _PULL_DIGESTS.items())
    return (f"digest {algorithm}:<{len(hex_digits)} hex digits> is not one Docker pulls by ({known} lower-case hex "
            "digits); copy the digest whole, e.g. from `docker buildx imagetools inspect`")


@functools.lru_cache(maxsize=65536)
def reference(text: str) -> str:
    """An image reference by the OCI distribution grammar, pinned by a tag or a digest Docker pulls by."""
    name, at, digest = text.partition("@")
    if at and "/" not in name and _digest_problem(digest):
        raise ValueError(_digest_problem(digest))   # the grammar reads `debian@sha256:abc` as credentials
    try:
        ref = parse_reference(text)
    except ReferenceError as exc:
        raise ValueError(str(exc)) from None
    if not ref.tag and not ref.digest:
        raise ValueError(f"{text!r} names no tag or digest; pin it, e.g. {text}:TAG or {text}@sha256:DIGEST")
    if ref.digest and _digest_problem(ref.digest):
        raise ValueError(f"{text!r}: {_digest_problem(ref.digest)}")
    return text


def _url_of(schemes: tuple[str, ...], what: str) -> Callable[[str], str]:
    """The grammar of a URL with one of `schemes`; `what` names it in errors."""
    @functools.lru_cache(maxsize=65536)
    def check(text: str) -> str:
        bad = next((c for c in text if not _URL_CHARS.match(c)), None)
        # Never the userinfo, query or fragment of the URL as written: a token there reached the error, and the log.
        given = repr(shown_url(text) if bad in ("?", "#") or "@" in text else text)
        if bad is not None:
            shown = "a space" if bad == " " else repr(bad)
            raise ValueError(f"{given} contains {shown}; {what} is a plain URL with no whitespace, quotes or "
                             "shell metacharacters (percent-encode the character if the URL really has it)")
        credentials = (f"{given} carries credentials; never put them in the matrix: the host's pip configuration "
                       "supplies them to builds as secrets")
        # An `@` past the scheme is userinfo, as common.urls reads it: a token with an unescaped `/`
        # (`https://tok/en@host/simple`) ends the authority early for a URL parser (which saw no user, or a port).
        scheme, sep, rest = text.partition("://")
        if sep and scheme != "file" and "@" in rest:
            raise ValueError(credentials)
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"{given} is not a URL ({exc})") from None
        if parts.scheme not in schemes:
            starts = [s + "://" for s in schemes]
            raise ValueError(f"{given}: {what} must start with {', '.join(starts[:-1])} or {starts[-1]}")
        if parts.scheme != "file" and not parts.hostname:
            raise ValueError(f"{given} names no host; write it like "
                             f"{parts.scheme or 'https'}://pypi.example.org/simple")
        if parts.username is not None or parts.password is not None:
            raise ValueError(credentials)
        if parts.scheme == "file" and not parts.path.startswith("/"):
            raise ValueError(f"{text!r}: a file URL needs an absolute path, e.g. file:///srv/wheels")
        if parts.scheme == "file" and parts.netloc not in ("", "localhost"):
            # file://srv/wheels is the folder /wheels on a host named srv, not /srv/wheels.
            raise ValueError(f"{text!r}: a file URL names a folder on this machine, with no host: three slashes, "
                             f"e.g. file:///{parts.netloc}{parts.path}")
        del port
        return text
    return check


index_url = _url_of(INDEX_SCHEMES, "an index URL")           # `index.url`, `index.extra_urls`
source_url = _url_of(("https", "http"), "the source")        # the project's (`source`, an OCI label)
web_url = _url_of(("https", "http"), "a web page's URL")     # a page an OCI label points to (`oci.url`, ...)


@functools.lru_cache(maxsize=65536)
def spdx_expression(text: str) -> str:
    """`oci.licenses`: an SPDX license expression (packaging's parser, the SPDX license list), written
    as that parser spells it (`apache-2.0` is refused with `Apache-2.0` suggested)."""
    from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression

    try:
        canonical = canonicalize_license_expression(text)
    except InvalidLicenseExpression as exc:
        raise ValueError(f"{text!r} is not an SPDX license expression ({exc}); e.g. Apache-2.0, "
                         "BSD-3-Clause AND MIT, or LicenseRef-<name> for a license SPDX does not list") from None
    if canonical != text:
        raise ValueError(f"{text!r} is not spelt as SPDX spells it; write {canonical!r}")
    return text


@functools.lru_cache(maxsize=65536)
def image_name(text: str) -> str:
    if not _IMAGE_NAME_RE.match(text):
        raise ValueError(f"{text!r} is not a valid image name (lower case, digits, '-' and '.')")
    if len(text) > IMAGE_NAME_MAX:
        raise ValueError(f"{text!r} is {len(text)} characters; an image name has at most {IMAGE_NAME_MAX}")
    if text.endswith(names.DEV_SUFFIX):
        # <name>-dev is where the dev images of <name> go, and every reader of a repository takes it so
        # (contracts.names.image_of_repo_path): this image's releases would be read as another image's dev images.
        other = text.removesuffix(names.DEV_SUFFIX)
        raise ValueError(f"{text!r} ends in {names.DEV_SUFFIX!r}: {text} is the repository of the dev images of "
                         f"{other}, and is read so; choose a name that does not end in {names.DEV_SUFFIX!r}")
    return text


@functools.lru_cache(maxsize=65536)
def cell_version(text: str) -> str:
    """A cell's version: PEP 440 (so versions order) and usable inside an image tag."""
    try:
        Version(text)
    except InvalidVersion:
        raise ValueError(f"{text!r} does not parse as a version (PEP 440, e.g. 25.10 or 2.13)") from None
    if not _CELL_VERSION_RE.match(text):
        raise ValueError(f"{text!r} cannot be used in an image tag (letters, digits, '_', '.', '+', '-'; "
                         "at most 64 characters)")
    return text


@functools.lru_cache(maxsize=65536)
def workdir(text: str) -> str:
    if not _WORKDIR_RE.match(text) or ".." in PurePosixPath(text).parts:
        raise ValueError(f"{text!r} is not an absolute path like /workspace (letters, digits, '.', '_', '-', '/')")
    return text


def template_path(text: str, templates_dir: Path | None) -> str:
    """A template inside templates/: relative, no `..`, and (when the folder is known) a file there."""
    if not _TEMPLATE_RE.match(text) or text.startswith("/") or ".." in PurePosixPath(text).parts:
        raise ValueError(f"{text!r} is not a path inside templates/ (relative, no '..', e.g. "
                         "images/pip.Dockerfile.j2)")
    if templates_dir is None:
        return text
    if len(text) > 255:
        raise ValueError(f"template path is {len(text)} characters; name a template file inside templates/")
    root = templates_dir.resolve()
    if not root.is_dir():
        raise ValueError(f"template {text!r}: there is no templates/ folder beside the matrix; run from the "
                         "project or pass the project's matrix.yaml with --matrix")
    try:
        target = (root / text).resolve()
        is_file = target.is_file()
    except OSError as exc:
        raise ValueError(f"template {text!r} cannot be opened ({exc.strerror}); name a file inside templates/") \
            from None
    if not target.is_relative_to(root):
        raise ValueError(f"{text!r} leads outside templates/ (through a link); use a template inside it")
    if not is_file:
        choices = sorted(str(p.relative_to(root)) for p in root.rglob("*.j2") if p.is_file())
        raise ValueError(f"template {text!r} not found under templates/{suggest(text, choices)}")
    return text


@functools.lru_cache(maxsize=65536)
def tag_template(text: str) -> str:
    """A release tag template: only `{version}` and `{release}`, no format specs."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"tag template {text!r} is malformed ({exc}); use {{version}} and {{release}}") from None
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if field not in names.RELEASE_PLACEHOLDERS:
            raise ValueError(f"unknown placeholder {{{field}}} in tag template {text!r}; "
                             f"use {{version}} and {{release}}{suggest(field, names.RELEASE_PLACEHOLDERS)}")
        if spec or conversion:
            raise ValueError(f"placeholder in {text!r} takes no format or conversion; write {{{field}}}")
    if not text:
        raise ValueError("tag template is empty; write e.g. {version}-{release}")
    return text


@functools.lru_cache(maxsize=65536)
def rendered_tag(template: str, cell_version_text: str) -> str:
    """Fill a tag template for a cell with the longest plausible release; ValueError when
    the result is not a Docker tag."""
    tag = names.expand_tag(template, cell_version_text, PLAUSIBLE_RELEASE)
    if names.TAG_RE.match(tag):
        return tag
    if len(tag) > 128:
        raise ValueError(f"tag template {template!r} renders to {len(tag)} characters for version "
                         f"{cell_version_text} with {{release}} as long as {PLAUSIBLE_RELEASE!r} (the longest "
                         "plausible release); a Docker tag has at most 128")
    raise ValueError(f"tag template {template!r} renders to {tag!r}, which is not a Docker tag (letters, digits, "
                     "'_', '.', '-'; not starting with '.' or '-'; no '/', ':' or spaces)")


@functools.lru_cache(maxsize=65536)
def dev_tag(cell_version_text: str) -> str:
    tag = names.dev_tag(PLAUSIBLE_REVISION, cell_version_text)
    if not names.TAG_RE.match(tag):
        raise ValueError(f"the dev tag {tag!r} (longest revision) is not a Docker tag; shorten the version")
    return tag


def schema_version(value: object) -> int:
    """`schema: 1`, the only matrix format there is (not `true`, `1.0` or "1")."""
    if type(value) is not int or value != SCHEMA_VERSION:
        hint = " (write it unquoted)" if value == str(SCHEMA_VERSION) else ""
        raise ValueError(f"must be {SCHEMA_VERSION}, the matrix format this buildtool reads; got {value!r}{hint}")
    return value


def _size_hint(text: str) -> str:
    """The Docker size grammar users write (8GB, 8Gi, 1.5g) in this matrix's form."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]?)[iI]?[bB]?\s*", text)
    if not match:
        return "8g"
    units = ("", "k", "m", "g", "t")
    number, scale = float(match.group(1)), units.index(match.group(2).lower())
    while scale > 0 and number != int(number):
        number, scale = number * 1024, scale - 1
    if scale == 4:
        number, scale = number * 1024, 3
    return f"{int(number)}{units[scale]}"


def shm_size(value: object) -> str:
    """/dev/shm size: a string like 8g (or a whole number of bytes), at least the checks' minimum."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"must be a size like 8g (at least {MIN_SHM_SIZE}); got {value!r}")
    if isinstance(value, int) and value < 0:
        raise ValueError(f"{value} is not a size; write a size of at least {MIN_SHM_SIZE} for /dev/shm, "
                         "e.g. shm_size: 8g (there is no unlimited /dev/shm)")
    text = str(value)
    if not SIZE_RE.match(text):
        raise ValueError(f"{text!r} is not a size; write it like shm_size: {_size_hint(text)} "
                         "(a whole number with k, m or g)")
    if size_bytes(text) < MIN_SHM_BYTES:
        raise ValueError(f"{text} is below the {MIN_SHM_SIZE} of /dev/shm the image checks need (DataLoader "
                         f"workers, NCCL); write at least shm_size: {MIN_SHM_SIZE}, e.g. shm_size: 8g")
    try:
        shm_bytes(text)   # the rule of every --shm-size too
    except SizeError as exc:
        raise ValueError(f"{exc}; write e.g. shm_size: 8g") from None
    return text


def ulimit(value: object) -> int:
    """A ulimit value for `docker run --ulimit`: a whole number, -1 for unlimited."""
    if isinstance(value, bool) or not isinstance(value, int):
        hint = "; write -1 for unlimited" if str(value).lower() in ("unlimited", "infinity", "inf") else ""
        raise ValueError(f"must be a whole number (-1 for unlimited); got {value!r}{hint}")
    if value < -1 or value >= 1 << 63:
        raise ValueError(f"{value} is out of range; write -1 (unlimited) or a number from 0 to 2^63-1")
    return value
