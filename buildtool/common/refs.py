"""Image references, parsed once, by the OCI distribution reference grammar.

    reference  := name [ ":" tag ] [ "@" digest ]
    name       := [ domain "/" ] path-component { "/" path-component }
    domain     := host [ ":" port ]            (the first part is a domain when it has a '.'
                                                or ':' or is `localhost`, as Docker decides)
    path-component := [a-z0-9]+ ( ( "." | "_" | "__" | "-"+ ) [a-z0-9]+ )*
    tag        := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest     := algorithm ":" hex             (sha256, sha384, sha512: 64, 96, 128 lower-case hex digits)

Every module that needs a registry host, a repository path, a tag or a digest out of a
reference gets it here; nothing else splits references on ':' or '/'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
# Docker's reference rules (distribution/reference normalize.go): `index.docker.io` is Docker Hub's legacy name
# and normalises to docker.io; its registry API answers at registry-1.docker.io (the one map of Docker Hub's
# hosts: the registry client, credentials and the builder read these).
LEGACY_DOCKER_HUB = "index.docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
DOCKER_HUB_HOSTS = (DOCKER_HUB, LEGACY_DOCKER_HUB, DOCKER_HUB_API)
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
# An IPv6 host as distribution's regexp.go writes it, `\[(?:[a-fA-F0-9:]+)\]`: hex and colons only (IPv4-mapped
# `[::ffff:1.2.3.4]` and zones are refused there, deliberately).
_DOMAIN_RE = re.compile(rf"^(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?\Z")
_PATH_COMPONENT_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*\Z")
# Docker's tag grammar, the only copy (contracts.names builds its tags against it).
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
_DIGEST_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}\Z")
# An image ID: distribution's ParseNormalizedNamed refuses it as a name ("cannot specify 64-byte hexadecimal strings").
_IDENTIFIER_RE = re.compile(r"[a-f0-9]{64}\Z")
# The algorithms a digest may name and their lengths in hex, as distribution's digest.Parse takes them (go-digest's
# available algorithms): another name, or a length that is not the algorithm's, names no content.
DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
NAME_MAX = 255
_HOST_PORT_RE = re.compile(r"\[(?P<bracketed>[^\]]*)\](?::[0-9]+)?|(?P<named>[^:]*):[0-9]+")


class ReferenceError(ValueError):
    """Not an image reference; the message says which part is wrong."""


@dataclass(frozen=True)
class Reference:
    domain: str      # registry host[:port]; "" when the reference names none
    path: str        # repository path inside the registry
    tag: str = ""
    digest: str = ""

    @property
    def registry(self) -> str:
        """The registry as Docker names it: no domain, or `index.docker.io`, is docker.io."""
        return DOCKER_HUB if self.domain in ("", LEGACY_DOCKER_HUB) else self.domain

    @property
    def repository(self) -> str:
        """The path as the registry's API knows it (Docker Hub's official images under library/)."""
        if self.registry == DOCKER_HUB and "/" not in self.path:
            return f"library/{self.path}"
        return self.path

    @property
    def name(self) -> str:
        return f"{self.domain}/{self.path}" if self.domain else self.path

    @property
    def ref_in_repo(self) -> str:
        """What to ask the registry's manifests endpoint for: the digest, else the tag (latest)."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


REFERENCE_MAX = 512      # a name is at most NAME_MAX; tag and digest add at most 200
SHOWN_MAX = 80


def shown(text: str, limit: int = SHOWN_MAX) -> str:
    """A value as a message shows it: quoted, every non-ASCII or control character escaped (a Cyrillic `а` in
    `jаx` reads as `j\\u0430x`, not as `jax`), cut to `limit` characters with its length said. What stands before
    an `@` that introduces no digest (`user:password@host/...`) is never shown: `'***@host/...'`."""
    if _credentials(text):
        text = "***@" + text.partition("@")[2]
    if len(text) <= limit:
        return ascii(text)
    return f"{ascii(text[:limit])}... ({len(text)} characters)"


def shown_plain(value: object) -> str:
    """A foreign value in a message: as it is when it is short plain ASCII text (a digest prints as ever), else
    `shown` (quoted, escaped, cut with its length said)."""
    text = str(value)
    return text if len(text) <= SHOWN_MAX and ascii(text)[1:-1] == text else shown(text)


def _credentials(text: str) -> bool:
    """Whether `text` starts with credentials (`user[:password]@host/...`): an `@` that introduces no digest."""
    head, at, tail = text.partition("@")
    return bool(at) and "/" not in head and not _DIGEST_RE.match(tail)


def parse_reference(text: str) -> Reference:
    """Parse `text`; ReferenceError (a ValueError) names what is wrong, showing the text as `shown` does (cut,
    escaped), and never a password: a reference that carries credentials is refused without echoing them."""
    if not text:
        raise ReferenceError("an image reference is empty; write one like nvcr.io/nvidia/pytorch:25.10-py3")
    if len(text) > REFERENCE_MAX:
        raise ReferenceError(f"{shown(text)} is not an image reference: at most {REFERENCE_MAX} characters")
    if _credentials(text):
        raise ReferenceError("an image reference cannot carry credentials (user:password@ before the registry host; "
                             "not shown); log in with `docker login` (or a credential helper) instead")
    if any(c.isspace() for c in text):
        raise ReferenceError(f"{shown(text)} contains whitespace; an image reference is one word like "
                             "nvcr.io/nvidia/pytorch:25.10-py3")
    if _IDENTIFIER_RE.match(text):
        raise ReferenceError(f"{shown(text)} is an image ID (64 hex digits), which docker takes for a local image, "
                             "not a repository name; name the image by repository and tag or digest")
    rest, at, digest = text.partition("@")
    if at:
        if not _DIGEST_RE.match(digest):
            raise ReferenceError(f"{shown(text)}: digest {shown(digest)} is not algorithm:hex "
                                 "(e.g. sha256:<64 hex digits>)")
        algorithm, _, hexdigits = digest.partition(":")
        if algorithm not in DIGEST_HEX:
            raise ReferenceError(f"{shown(text)}: digest algorithm {shown(algorithm)} is not one of "
                                 f"{', '.join(DIGEST_HEX)}")
        if not re.fullmatch(f"[0-9a-f]{{{DIGEST_HEX[algorithm]}}}", hexdigits):
            raise ReferenceError(f"{shown(text)}: a {algorithm} digest has {DIGEST_HEX[algorithm]} lower-case hex "
                                 "digits")
    tag = ""
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = rest.rsplit(":", 1)
        if not tag:
            raise ReferenceError(f"{shown(text)} ends its name with ':' but names no tag; add the tag or remove "
                                 "the ':'")
        if not TAG_RE.match(tag):
            raise ReferenceError(f"{shown(text)}: tag {shown(tag)} is not a valid tag "
                                 "(letters, digits, '_', '.', '-'; at most 128; not starting with '.' or '-')")
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first.lower() != first):
        domain, path = first, remainder
        if not _DOMAIN_RE.match(domain):
            raise ReferenceError(f"{shown(text)}: registry host {shown(domain)} is not a host[:port]")
    else:
        domain, path = "", rest
    if not path:
        raise ReferenceError(f"{shown(text)}: no repository name")
    for component in path.split("/"):
        if not component:
            raise ReferenceError(f"{shown(text)}: the repository path has an empty part ('//' or a '/' at an end)")
        if not _PATH_COMPONENT_RE.match(component):
            hint = " (repository names are lower case)" if component.lower() != component else ""
            raise ReferenceError(f"{shown(text)}: repository part {shown(component)} is not valid{hint}; use "
                                 "lower-case letters, digits and single separators ('.', '_', '__', '-')")
    if len(f"{domain}/{path}" if domain else path) > NAME_MAX:
        raise ReferenceError(f"{shown(text)}: the name is longer than {NAME_MAX} characters")
    return Reference(domain, path, tag, digest)


def has_registry(text: str) -> bool:
    """Whether the reference names its registry (else it means Docker Hub or a local image)."""
    try:
        return bool(parse_reference(text).domain)
    except ReferenceError:
        return False


def split_reference(text: str) -> tuple[str, str, str]:
    """(registry, repository, tag or `@digest`), Docker Hub's implicit host and `library/` explicit."""
    ref = parse_reference(text)
    return ref.registry, ref.repository, ref.tag or (f"@{ref.digest}" if ref.digest else "latest")


def names_mirror_of(name: str, upstream: str) -> bool:
    """Whether `name` is `upstream` itself or its path in a mirror (`matrix.plan.mirror_base`: the
    same repository path, under the mirror's optional prefix, and the same tag)."""
    try:
        _, repo, tag = split_reference(name)
        _, up_repo, up_tag = split_reference(upstream)
    except ReferenceError:
        return False
    return name == upstream or (tag == up_tag and (repo == up_repo or repo.endswith(f"/{up_repo}")))


def split_repo(text: str) -> tuple[str, str, str]:
    """(host, repository path, digest or tag) of a reference that names its registry."""
    ref = parse_reference(text)
    return ref.registry, ref.repository, ref.ref_in_repo


def split_repo_path(repo: str) -> tuple[str, str]:
    """`host:port/team/name` (a repository with its host, no tag) -> (host, path)."""
    ref = parse_reference(repo)
    return ref.registry, ref.repository


def is_loopback_host(host: str) -> bool:
    """Whether a registry host (`host[:port]`) is this machine by its address, not by its name's
    spelling: an IP literal in 127.0.0.0/8, `::1` (bare or `[::1]`), or exactly `localhost`, each
    with an optional numeric port. `127.attacker.invalid` or `127.0.0.1.nip.io` are names anyone can
    point anywhere: not loopback. The one predicate for both `--trust-local-key` and plain HTTP."""
    import ipaddress

    # `[name]` with an optional numeric port, or `name:port` (one ':'); anything else is the name as it is: a bare
    # IPv6 `::1`, or text that never parses as an address (`localhost:`, `[::1]x`).
    match = _HOST_PORT_RE.fullmatch(host)
    name = host if match is None else match["bracketed"] if match["bracketed"] is not None else match["named"]
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    return address.is_loopback


def is_docker_hub(host: str) -> bool:
    """Whether a registry host is one of Docker Hub's names (the registry, its legacy name, its API host)."""
    return host.lower() in DOCKER_HUB_HOSTS


def api_host(host: str) -> str:
    """Where a registry's API answers: Docker Hub's names at registry-1.docker.io, any other host itself."""
    return DOCKER_HUB_API if is_docker_hub(host) else host
