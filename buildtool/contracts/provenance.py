"""SLSA provenance v1 (https://slsa.dev/spec/v1.0/provenance) of a dev image: how it was built.

The predicate of an in-toto Statement about the image digest (buildtool.contracts.intoto), signed by
the builder's key (buildtool.validate.keys, role builder) and attached to the digest as a referrer.
Typed here once; the push writes it, release gates on it, `buildtool verify` prints it. Parsing is
strict: an unknown field, a missing one or a wrong type is a ProvenanceError naming it, never a default.

    buildDefinition:
      buildType:           BUILD_TYPE
      externalParameters:  cell, matrix_digest (sha256 of matrix.yaml as built), revision (the full commit,
                           `-dirty.<hash>` when built from a dirty tree), source (the repository's URL, "" when
                           it has none), dockerfile (its path in the repository), platform
      internalParameters:  {} (nothing the builder chose that a user could not see)
      resolvedDependencies: the base (name BASE: uri `oci://<ref>`, digest {sha256}, annotations
                           {"standin": bool}), each lock file (name `lock:<path>`, digest {sha256}), each
                           tool (name `tool:<name>`, annotations {"version": ...})
    runDetails:
      builder:  {id: the builder's id (BUILDER_ID_ENV, else `local:<user>@<host>`), version: {buildtool: ...}}
      metadata: {invocationId, startedOn, finishedOn} (RFC 3339 UTC)
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/dl-images/dl-images/buildtypes/cell-build/v1"
BUILDER_ID_ENV = "DL_IMAGES_BUILDER_ID"     # e.g. https://github.com/<org>/<repo>/actions/runs/<id>
BASE = "base"
LOCK_PREFIX = "lock:"
TOOL_PREFIX = "tool:"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResourceDescriptor(_Model):
    name: str
    uri: str = ""
    digest: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, Any] = Field(default_factory=dict)


class ExternalParameters(_Model):
    cell: str
    matrix_digest: str
    revision: str
    source: str
    dockerfile: str
    platform: str


class BuildDefinition(_Model):
    buildType: str
    externalParameters: ExternalParameters
    internalParameters: dict[str, Any] = Field(default_factory=dict)
    resolvedDependencies: list[ResourceDescriptor]


class Builder(_Model):
    id: str
    version: dict[str, str] = Field(default_factory=dict)


class BuildMetadata(_Model):
    invocationId: str = ""
    startedOn: str
    finishedOn: str


class RunDetails(_Model):
    builder: Builder
    metadata: BuildMetadata
    byproducts: list[ResourceDescriptor] = Field(default_factory=list)


class Provenance(_Model):
    buildDefinition: BuildDefinition
    runDetails: RunDetails

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def dependency(self, name: str) -> ResourceDescriptor | None:
        return next((d for d in self.buildDefinition.resolvedDependencies if d.name == name), None)

    @property
    def base(self) -> ResourceDescriptor | None:
        return self.dependency(BASE)

    @property
    def locks(self) -> list[ResourceDescriptor]:
        return [d for d in self.buildDefinition.resolvedDependencies if d.name.startswith(LOCK_PREFIX)]

    @property
    def tools(self) -> list[ResourceDescriptor]:
        return [d for d in self.buildDefinition.resolvedDependencies if d.name.startswith(TOOL_PREFIX)]


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
    if provenance.buildDefinition.buildType != BUILD_TYPE:
        raise ProvenanceError(f"{where}: buildType {provenance.buildDefinition.buildType!r} is not {BUILD_TYPE}")
    if provenance.base is None:
        raise ProvenanceError(f"{where}: no resolved dependency named {BASE!r} (the base image)")
    return provenance
