"""Every name one stage makes and another reads: its format and its parser, side by side.

- revision:     `<git sha, 12 hex>` or `<sha>-dirty.<8 hex>` (or any tag-safe word a CI passes)
- full revision: the commit in full, `<40 hex>` or `<40 hex>-dirty.<8 hex>` (the same dirty hash as the
                tag's): what the OCI revision label (label_keys.OCI_REVISION) says; `check_full_revision`
- dev image:    `<registry>/<name>-dev:<revision>-<cell version>`; tags `<dev tag>__<word>` beside it are never
                dev tags (a platform's image, a push before its attestations: PLATFORM_TAG_SEP)
- release tags: templates from the matrix with `{version}` (the cell's) and `{release}`, parsed back
                by `parse_release_tag`
- artifacts:    what is attached to an image digest in its repository (verdicts, SBOMs)

Change a format here and every stage follows; nothing else builds or splits these strings.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from buildtool.common.refs import TAG_RE as TAG_RE  # the one tag grammar (re-exported)

DEFAULT_REGISTRY = "127.0.0.1:5000"
DEV_SUFFIX = "-dev"

# Each ends in \Z, not $: `$` also matches before a final newline, so `<sha>\n` passed for a revision (a label's
# value, a tag) and went on, newline and all, into a provenance and a git command. Callers use .match.
# What `git_revision` produces; `--from`/`--revision` may abbreviate the sha to 7 digits.
GIT_REVISION_RE = re.compile(r"^(?P<sha>[0-9a-f]{7,40})(?:-dirty\.(?P<dirty>[0-9a-f]{8}))?\Z")
# The revision label: the whole commit sha (OCI's convention), a dirty tree's hash as in the tag.
FULL_REVISION_RE = re.compile(r"^[0-9a-f]{40}(?:-dirty\.[0-9a-f]{8})?\Z")
# A revision a pipeline names itself (e.g. a build number): tag-safe, no '-' last.
CUSTOM_REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,100}\Z")
RELEASE_PLACEHOLDERS = ("version", "release")


def dev_repo(registry: str, image: str) -> str:
    return f"{registry.rstrip('/')}/{image}{DEV_SUFFIX}"


def release_repo(registry: str, image: str) -> str:
    return f"{registry.rstrip('/')}/{image}"


def dev_tag(revision: str, cell_version: str) -> str:
    return f"{revision}-{cell_version}"


@dataclass(frozen=True)
class DevTag:
    """A dev image's tag: the revision it was built from and its cell's version."""

    revision: str
    version: str

    def __str__(self) -> str:
        return dev_tag(self.revision, self.version)


def _is_revision(text: str) -> bool:
    return bool(GIT_REVISION_RE.match(text) or CUSTOM_REVISION_RE.match(text))


# Tags beside a dev tag that are never one: `<dev tag>__<word>`. No PEP 440 version (so no cell version) contains
# "__", and no revision may (check_revision), so parse_dev_tag refuses every such tag, and nothing that looks for dev
# tags (build's "already built" lookup, release, report, launch) ever reads one as a dev tag.
# - `<dev tag>__<arch>`: one platform's image of a multi-platform dev tag (the index goes at the dev tag);
# - `<dev tag>__push`: where a single-platform push uploads the image before its SBOM and provenance are attached
#   to its digest; only then is the same manifest put at the dev tag (buildtool.imagebuild.builder).
PLATFORM_TAG_SEP = "__"
PUSH_STAGING_WORD = "push"


def platform_tag(dev_tag_text: str, architecture: str) -> str:
    return f"{dev_tag_text}{PLATFORM_TAG_SEP}{architecture}"


def push_staging_tag(dev_tag_text: str) -> str:
    """`0123abcd4567-2.13__push`: where a push uploads a dev tag's image before its attestations are attached."""
    return f"{dev_tag_text}{PLATFORM_TAG_SEP}{PUSH_STAGING_WORD}"


def parse_dev_tag(tag: str, cell_version: str | None = None) -> DevTag | None:
    """The dev tag `tag` as a DevTag, or None when it is not one (a platform tag is not). With `cell_version`,
    only a tag of that version whose head is a revision matches. Versions may contain '-', so without it only
    a git revision (`git_revision`'s form) splits the tag: no guess at the first '-'."""
    if PLATFORM_TAG_SEP in tag:
        return None
    if cell_version is not None:
        suffix = f"-{cell_version}"
        if not tag.endswith(suffix) or not _is_revision(tag[: -len(suffix)]):
            return None
        return DevTag(tag[: -len(suffix)], cell_version)
    match = re.match(r"^(?P<rev>[0-9a-f]{7,40}(?:-dirty\.[0-9a-f]{8})?)-(?P<ver>.+)\Z", tag)
    return DevTag(match.group("rev"), match.group("ver")) if match else None


def image_of_repo_path(path: str) -> str:
    """`team/pytorch-cpu-dev` -> `pytorch-cpu` (the matrix image a repository holds)."""
    return path.rsplit("/", 1)[-1].removesuffix(DEV_SUFFIX)


def check_revision(text: str) -> str:
    """A revision usable inside a dev tag, or ValueError naming the rule."""
    if PLATFORM_TAG_SEP in text:
        raise ValueError(f"revision {text!r} contains {PLATFORM_TAG_SEP!r}, which marks tags that are not dev tags "
                         "(a platform's image, a push before its attestations)")
    if _is_revision(text):
        return text
    raise ValueError(f"revision {text!r} cannot be part of an image tag (letters, digits, '.', '_', '-')")


def check_full_revision(text: str) -> str:
    """A revision label value: the full 40-hex commit, `-dirty.<8 hex>` after it for a dirty tree;
    ValueError naming the value for anything else (a short sha, a build number, upper case)."""
    if FULL_REVISION_RE.match(text):
        return text
    raise ValueError(f"revision {text!r} is not a full commit: the revision label is the 40-hex git sha "
                     "(with `-dirty.<8 hex>` for a tree with uncommitted changes)")


def template_fields(template: str) -> list[str]:
    """Placeholders named in a tag template; ValueError for a malformed one or one naming another placeholder
    than RELEASE_PLACEHOLDERS."""
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ValueError(f"tag template {template!r} is malformed ({exc}); use {{version}} and {{release}}") from None
    unknown = [f for f in fields if f not in RELEASE_PLACEHOLDERS]
    if unknown:
        raise ValueError(f"unknown placeholder {{{unknown[0]}}} in tag template {template!r}; "
                         "use {version} and {release}")
    return fields


def expand_tag(template: str, version: str, release: str) -> str:
    """Fill a release tag template; ValueError for a malformed template or an unknown placeholder (that the
    result is a Docker tag is checked where the matrix loads: matrix.values.rendered_tag)."""
    template_fields(template)
    return template.replace("{version}", version).replace("{release}", release)


@dataclass(frozen=True)
class ReleaseTag:
    """A tag made from a release tag template for a cell version: `{version}-{release}` -> `2.13-0.1.0`.
    `release` is "" for a template without `{release}` (a moving tag such as `{version}` or `latest`)."""

    tag: str
    template: str
    version: str
    release: str


def parse_release_tag(tag: str, template: str, cell_version: str) -> ReleaseTag | None:
    """The release tag `tag` made from `template` for `cell_version`, or None when the template
    does not make it (ValueError for a malformed template)."""
    template_fields(template)
    pattern = re.escape(template).replace(re.escape("{version}"), re.escape(cell_version))
    pattern = pattern.replace(re.escape("{release}"), "(?P<release>.+?)", 1)
    pattern = pattern.replace(re.escape("{release}"), "(?P=release)")
    match = re.fullmatch(pattern, tag)
    if match is None or not TAG_RE.match(tag):
        return None
    return ReleaseTag(tag, template, cell_version, match.groupdict().get("release") or "")


# -- artifacts attached to an image digest -------------------------------------------------------

VERDICT_TYPE = "application/vnd.dl-images.verdict.v1+json"
ATTESTATION_TYPE = "application/vnd.dl-images.attestation.v1+json"   # a DSSE envelope of an in-toto Statement
SBOM_TYPE = "application/vnd.cyclonedx+json"
# The build's SLSA provenance: a DSSE envelope (one layer) of an in-toto Statement signed by a builder key.
PROVENANCE_TYPE = "application/vnd.dl-images.provenance.v1+json"
# The SBOM as a signed in-toto attestation (a DSSE envelope, predicate type https://cyclonedx.org/bom).
SBOM_ATTESTATION_TYPE = "application/vnd.dl-images.sbom-attestation.v1+json"
RELEASE_LOCK_TYPE = "application/vnd.dl-images.release-lock.v1+json"
RELEASE_LOCK_TAG = "release-lock"


def referrers_tag(digest: str) -> str:
    """The OCI 1.1 referrers tag schema: `sha256:abc` -> `sha256-abc` (an index of referrers)."""
    algorithm, _, hexdigest = digest.partition(":")
    return f"{algorithm}-{hexdigest}"


def verdict_pin_tag(subject: str, attestation: str) -> str:
    """A tag per signed verdict, named by the subject's digest and the attestation's own digest
    (`sha256-<subject hex>.v-<32 hex of the attestation>`): anyone who may push can overwrite the
    `sha256-<hex>` index, but a tag named by its content cannot be pointed elsewhere unnoticed,
    and removing it takes delete permission."""
    return f"{referrers_tag(subject)}{VERDICT_PIN_INFIX}{attestation.partition(':')[2][:32]}"


VERDICT_PIN_INFIX = ".v-"


def parse_verdict_pin_tag(tag: str, subject: str) -> str | None:
    """The 32 hex digits of the attestation digest a verdict pin tag of `subject` names (`verdict_pin_tag`'s
    format), or None when `tag` is not such a tag."""
    prefix = f"{referrers_tag(subject)}{VERDICT_PIN_INFIX}"
    if not tag.startswith(prefix):
        return None
    named = tag[len(prefix):]
    return named if re.fullmatch(r"[0-9a-f]{32}", named) else None


def verdict_tag(digest: str) -> str:
    """The verdict's own tag (schema 1 verdicts; kept so older verdicts stay readable)."""
    return f"{referrers_tag(digest)}.verdict"
