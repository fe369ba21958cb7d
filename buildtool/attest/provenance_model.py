"""SLSA provenance v1 (https://slsa.dev/spec/v1.0/provenance) of a dev image: how it was built.

The predicate of an in-toto Statement about the image digest (buildtool.attest.intoto), signed by
the builder's key (buildtool.attest.keys, role builder) and attached to the digest as a referrer.
Typed here once; the push writes it (buildtool.imagebuild.provenance), release gates on it, `buildtool verify`
prints it. Parsing is strict: an unknown field, a missing one or a wrong type is a ProvenanceError naming it,
never a default. The build type, every field and what it means, is documented in
docs/release-trust.md#cell-build-v3 (BUILD_TYPE is that address); a v2 provenance (#cell-build-v2, before
issue 52) is still read, by its own model, never written.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from buildtool.common.urls import public_url, shown_url

PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
DOCS = "https://github.com/dl-images/dl-images/blob/main/docs/release-trust.md"
BUILD_TYPE = f"{DOCS}#cell-build-v3"
BUILD_TYPE_V2 = f"{DOCS}#cell-build-v2"     # read, never written (before issue 52)
INDEX_ROLES = ("index-url", "extra-index-url", "find-links", "cell-index-url")
# A builder with a key of trusted-keys.yaml but no CI run to name: the documented page, the key by its id.
LOCAL_BUILDERS = DOCS
BUILDER_ID_ENV = "DL_IMAGES_BUILDER_ID"     # e.g. https://github.com/<org>/<repo>/actions/runs/<id>
BASE = "base"
SOURCE = "source"
LOCK_PREFIX = "lock:"
TOOL_PREFIX = "tool:"
ARCHIVE_PREFIX = "apt-archive:"
CACHE_PREFIX = "cache:"
INLINE_CACHE = "buildkit-inline-cache"
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:\S+\Z")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})\Z")


def local_builder_id(keyid: str) -> str:
    """The builder id of a machine that signs with builder key `keyid` and names no CI run."""
    return f"{LOCAL_BUILDERS}?keyid={keyid}#local-builders"


def builder_id_problem(value: str) -> str:
    """Why `value` is no builder id ("" when it is one): an https URL (a CI run, or local_builder_id)."""
    if not value.startswith("https://") or not _URI.match(value):
        return f"builder.id {value!r} is not an https URI (a CI run's URL, or {LOCAL_BUILDERS}?keyid=...)"
    if "@" in value.partition("://")[2]:   # user info, as common.urls reads it: a token the attestation would publish
        return f"builder.id {shown_url(value)!r} carries credentials (user info); name the CI run by its public URL"
    return ""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResourceDescriptor(_Model):
    """in-toto's ResourceDescriptor (https://github.com/in-toto/attestation/blob/main/spec/v1/resource_descriptor.md):
    at least one of uri, digest and content must be set (descriptor_problem)."""

    name: str
    uri: str = ""
    digest: dict[str, str] = Field(default_factory=dict)
    content: str = ""           # base64, as the spec's JSON form writes bytes
    annotations: dict[str, Any] = Field(default_factory=dict)


def descriptor_problem(descriptor: ResourceDescriptor) -> str:
    """Why a descriptor breaks the in-toto rule ("" when it keeps it): none of uri, digest, content."""
    if not (descriptor.uri or descriptor.digest or descriptor.content):
        return f"resource {descriptor.name!r} has none of uri, digest and content (in-toto ResourceDescriptor)"
    if descriptor.uri and not _URI.match(descriptor.uri):
        return f"resource {descriptor.name!r}: uri {descriptor.uri!r} is not a URI"
    return ""


class PackageIndex(_Model):
    url: str            # common.urls.public_url of what the settings named: never a credential
    role: str           # INDEX_ROLES


class ExternalParameters(_Model):
    """cell-build-v3."""

    cell: str
    matrix_digest: str
    revision: str
    source: str
    dockerfile: str
    context: str
    platform: str
    buildArgs: dict[str, str]
    sourceDateEpoch: int | None
    createdEpoch: int
    secrets: list[str]
    network: str
    packageIndexes: list[PackageIndex]


class ExternalParametersV2(_Model):
    """cell-build-v2 (read only): sourceDateEpoch was the commit time, which the config's times carry."""

    cell: str
    matrix_digest: str
    revision: str
    source: str
    dockerfile: str
    platform: str
    buildArgs: dict[str, str]
    sourceDateEpoch: int
    secrets: list[str]
    network: str


class BuildDefinition(_Model):
    buildType: str
    externalParameters: ExternalParameters | ExternalParametersV2
    internalParameters: dict[str, Any] = Field(default_factory=dict)
    resolvedDependencies: list[ResourceDescriptor]


class Builder(_Model):
    id: str
    version: dict[str, str] = Field(default_factory=dict)


class BuildMetadata(_Model):
    invocationId: str = ""
    startedOn: str      # RFC 3339 with its zone (a push writes UTC, `Z`), as finishedOn; checked by parse_provenance
    finishedOn: str

    def finished_at(self) -> datetime:
        """finishedOn as a time: what orders provenances (text would put `...T01:00:00+02:00` after `...T00:30:00Z`)."""
        return datetime.fromisoformat(self.finishedOn)


def time_problem(value: str, field: str) -> str:
    """Why `value` is no RFC 3339 time with its zone ("" when it is one)."""
    if _RFC3339.match(value):
        try:
            datetime.fromisoformat(value)
            return ""
        except ValueError:
            pass
    return f"runDetails.metadata.{field} {value[:40]!r} is not an RFC 3339 time with its zone (2026-01-01T00:00:00Z)"


class RunDetails(_Model):
    builder: Builder
    metadata: BuildMetadata
    byproducts: list[ResourceDescriptor] = Field(default_factory=list)


class Provenance(_Model):
    buildDefinition: BuildDefinition
    runDetails: RunDetails

    def to_json(self) -> dict[str, Any]:
        """The predicate as JSON; a descriptor's empty fields left out (in-toto writes only what is set)."""
        data = self.model_dump(mode="json")
        for descriptors in (data["buildDefinition"]["resolvedDependencies"], data["runDetails"]["byproducts"]):
            descriptors[:] = [{k: v for k, v in d.items() if k == "name" or v not in ("", {}, None)}
                              for d in descriptors]
        return data

    def dependency(self, name: str) -> ResourceDescriptor | None:
        return next((d for d in self.buildDefinition.resolvedDependencies if d.name == name), None)

    @property
    def base(self) -> ResourceDescriptor | None:
        return self.dependency(BASE)

    @property
    def source(self) -> ResourceDescriptor | None:
        return self.dependency(SOURCE)

    def named(self, prefix: str) -> list[ResourceDescriptor]:
        return [d for d in self.buildDefinition.resolvedDependencies if d.name.startswith(prefix)]

    @property
    def locks(self) -> list[ResourceDescriptor]:
        return self.named(LOCK_PREFIX)

    @property
    def tools(self) -> list[ResourceDescriptor]:
        return self.named(TOOL_PREFIX)

    @property
    def inline_cache(self) -> ResourceDescriptor | None:
        """The build's BuildKit inline cache, kept apart from the image (a byproduct), or None."""
        return next((d for d in self.runDetails.byproducts if d.name == INLINE_CACHE), None)


def pinned_reference(descriptor: ResourceDescriptor) -> str:
    """`name@sha256:<hex>` of an oci:// descriptor, whether its uri names the tag only (v2) or tag and digest (v3)."""
    name = descriptor.uri.removeprefix("oci://")
    digest = f"sha256:{descriptor.digest.get('sha256', '?')}"
    return name if name.endswith(f"@{digest}") else f"{name}@{digest}"


class ProvenanceError(ValueError):
    """A provenance predicate that does not parse; the message names where and the field."""


def parse_provenance(data: Any, where: str) -> Provenance:
    """A provenance predicate (JSON-decoded) -> Provenance, strictly; ProvenanceError naming `where`."""
    if not isinstance(data, dict):
        raise ProvenanceError(f"{where}: not a provenance predicate (a JSON {type(data).__name__})")
    try:
        provenance = Provenance.model_validate(data, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(p) for p in first["loc"])
        raise ProvenanceError(f"{where}: malformed provenance: `{path}`: {first['msg']}") from None
    definition = provenance.buildDefinition
    wanted = {BUILD_TYPE: ExternalParameters, BUILD_TYPE_V2: ExternalParametersV2}.get(definition.buildType)
    if wanted is None:
        raise ProvenanceError(f"{where}: buildType {definition.buildType!r} is not {BUILD_TYPE} (nor {BUILD_TYPE_V2})")
    if not isinstance(definition.externalParameters, wanted):
        raise ProvenanceError(f"{where}: externalParameters are not those of {definition.buildType} (a field of "
                              "another build type, or one missing)")
    if isinstance(definition.externalParameters, ExternalParameters):
        for index in definition.externalParameters.packageIndexes:
            if index.role not in INDEX_ROLES:
                raise ProvenanceError(f"{where}: packageIndexes role {index.role!r} is not one of {INDEX_ROLES}")
            if public_url(index.url) != index.url:
                raise ProvenanceError(f"{where}: a packageIndexes URL is not a plain URL without credentials, "
                                      "query or fragment (a provenance never records a credential)")
    for kind, descriptors in (("resolvedDependencies", provenance.buildDefinition.resolvedDependencies),
                              ("byproducts", provenance.runDetails.byproducts)):
        names = [d.name for d in descriptors]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:   # readers take the first of a name (dependency()): a second one would say something else unread
            raise ProvenanceError(f"{where}: {kind} names {', '.join(repr(n) for n in twice)} more than once")
    for name, what in ((BASE, "the base image"), (SOURCE, "the source, git+<URL>@<ref> with its gitCommit")):
        if provenance.dependency(name) is None:
            raise ProvenanceError(f"{where}: no resolved dependency named {name!r} ({what})")
    source = provenance.source
    assert source is not None
    if not source.uri.startswith("git+") or "gitCommit" not in source.digest:
        raise ProvenanceError(f"{where}: the source {source.uri!r} is not git+<URL>@<ref> with a gitCommit digest")
    metadata = provenance.runDetails.metadata
    every = (*provenance.buildDefinition.resolvedDependencies, *provenance.runDetails.byproducts)
    problems = [*map(descriptor_problem, every), builder_id_problem(provenance.runDetails.builder.id),
                time_problem(metadata.startedOn, "startedOn"), time_problem(metadata.finishedOn, "finishedOn")]
    if any(problems):
        raise ProvenanceError(f"{where}: {next(p for p in problems if p)}")
    if metadata.finished_at() < datetime.fromisoformat(metadata.startedOn):
        raise ProvenanceError(f"{where}: the build finished ({metadata.finishedOn}) before it started "
                              f"({metadata.startedOn})")
    return provenance
