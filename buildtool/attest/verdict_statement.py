"""A verdict as an attestation: an in-toto Statement v1 about one image digest (buildtool.attest.intoto) whose
predicate is the verdict (buildtool.contracts.verdict), in a DSSE envelope: the one layer (DSSE_MEDIA_TYPE) of an
OCI artifact (names.ATTESTATION_TYPE) attached to the image with buildtool.attest.referrers (append-only).

The predicate type names the schema of the verdict it carries: `.../verdict/v6` for what validate
writes now, `.../verdict/v5` and `/v4` for the schemas before it (still read). A statement whose predicate type
and verdict schema disagree, or whose predicate type names a schema not read, is refused naming it.

Also where the signing keys are found (SIGNING_KEY_ENV, BUILDER_KEY_ENV, else DEV_KEY_FILE); who signs what and
who is trusted is buildtool.attest.keys (docs/release-trust.md#keys).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The in-toto names, re-exported for the verdict's readers and writers.
from buildtool.attest.intoto import DSSE_MEDIA_TYPE as DSSE_MEDIA_TYPE
from buildtool.attest.intoto import PAYLOAD_TYPE as PAYLOAD_TYPE
from buildtool.attest.intoto import StatementError as StatementError
from buildtool.attest.intoto import check_subject, load_statement
from buildtool.attest.intoto import statement as intoto_statement
from buildtool.common.refs import shown, shown_plain
from buildtool.contracts.verdict import SCHEMA, Verdict, VerdictError, parse_verdict

VERDICT_PREDICATE_PREFIX = "https://github.com/dl-images/dl-images/attestations/verdict/v"


def verdict_predicate(schema: int) -> str:
    return f"{VERDICT_PREDICATE_PREFIX}{schema}"


VERDICT_PREDICATE = verdict_predicate(SCHEMA)     # what validate writes
ENVELOPE_TITLE = "verdict.intoto.jsonl"

SIGNING_KEY_ENV = "DL_IMAGES_SIGNING_KEY"      # the tester's key: validate signs verdicts with it
BUILDER_KEY_ENV = "DL_IMAGES_BUILDER_KEY"      # the builder's key: push signs provenance and SBOMs with it
TRUSTED_KEYS_FILE = "config/trusted-keys.yaml"
DEV_KEY_FILE = "dl-images/dev-signing-key.pem"     # under $XDG_CONFIG_HOME (default ~/.config)


def config_home() -> Path:
    from buildtool.common.files import xdg_home

    return xdg_home("XDG_CONFIG_HOME", ".config")


def dev_key_path() -> Path:
    return config_home() / DEV_KEY_FILE


def statement(repository: str, digest: str, verdict: dict[str, Any]) -> bytes:
    """The statement's bytes (canonical JSON: sorted keys, no spaces); the predicate type names the
    verdict's schema. `verdict` is JSON as signed (Verdict.to_json(); tests sign hand-made ones too)."""
    schema = verdict.get("schema")
    predicate_type = verdict_predicate(schema) if isinstance(schema, int) else VERDICT_PREDICATE
    return intoto_statement(repository, digest, predicate_type, verdict)


def read_statement(payload: bytes, digest: str) -> Verdict:
    """The verdict a verified statement carries, parsed (buildtool.contracts.verdict.parse_verdict)
    and checked to be about `digest`."""
    body = load_statement(payload)
    predicate_type = body.get("predicateType")
    if not isinstance(predicate_type, str) or not predicate_type.startswith(VERDICT_PREDICATE_PREFIX):
        raise StatementError(f"not a verdict: predicateType {shown(str(predicate_type))}")
    check_subject(body, digest)
    predicate = body.get("predicate")
    if not isinstance(predicate, dict):
        raise StatementError("malformed: the predicate is not a verdict object")
    if predicate.get("digest") != digest:
        raise StatementError(f"mismatched: the verdict inside names {shown_plain(predicate.get('digest'))}, "
                             f"not {digest}")
    try:
        verdict = parse_verdict(predicate, "the signed predicate")
    except VerdictError as exc:
        raise StatementError(str(exc)) from None
    if predicate_type != verdict_predicate(verdict.schema_):
        raise StatementError(f"mismatched: predicateType {predicate_type} carries a schema-{verdict.schema_} verdict "
                             f"(a schema-{verdict.schema_} verdict is signed as {verdict_predicate(verdict.schema_)})")
    return verdict
