"""in-toto Statements v1 about one image digest, the form every attestation here takes
(the verdict: buildtool.attest.verdict_statement; the provenance: buildtool.attest.provenance_model;
the SBOM attestation: CycloneDX's predicate type).

    Statement {"_type": STATEMENT_TYPE,
               "subject": [{"name": <repository>, "digest": {"sha256": <hex of the image digest>}}],
               "predicateType": <what the predicate is>, "predicate": {...}}

The statement's bytes are canonical JSON (sorted keys, no spaces), signed in a DSSE envelope whose
payloadType is PAYLOAD_TYPE (buildtool.attest.dsse). The signed subject is what ties an attestation to
a digest: an OCI artifact's own `subject` field and the registry's referrer lists are not signed.
"""

from __future__ import annotations

import json
from typing import Any

from buildtool.common import strict_json
from buildtool.common.refs import shown, shown_plain

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
DSSE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
PREDICATE_ANNOTATION = "in-toto.io/predicate-type"     # on the artifact manifest, as BuildKit and cosign name it


class StatementError(ValueError):
    """A statement that is not the expected attestation about the expected digest; the message names why."""


def statement(repository: str, digest: str, predicate_type: str, predicate: dict[str, Any]) -> bytes:
    algorithm, _, hexdigest = digest.partition(":")
    body = {"_type": STATEMENT_TYPE,
            "subject": [{"name": repository, "digest": {algorithm: hexdigest}}],
            "predicateType": predicate_type,
            "predicate": predicate}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def load_statement(payload: bytes) -> dict[str, Any]:
    """A verified payload -> the statement's JSON object; StatementError when it is not a Statement v1."""
    try:
        body = strict_json.loads(payload)
    except strict_json.RepeatedKey as exc:
        raise StatementError(f"malformed: the signed statement repeats the key {exc} in one JSON object (JSON "
                             "readers disagree on which one counts)") from None
    except ValueError:
        raise StatementError("malformed: the signed payload is not JSON") from None
    if not isinstance(body, dict) or body.get("_type") != STATEMENT_TYPE:
        kind = body.get("_type") if isinstance(body, dict) else "?"
        raise StatementError(f"not an in-toto Statement v1 (_type {shown(str(kind))})")
    return body


def check_subject(body: dict[str, Any], digest: str) -> None:
    """StatementError unless the statement's signed subject names `digest` (else it is a replay)."""
    subject = body.get("subject")
    subjects: list[Any] = subject if isinstance(subject, list) else []
    named = [f"{k}:{v}" for s in subjects if isinstance(s, dict) and isinstance(s.get("digest"), dict)
             for k, v in s["digest"].items()]
    if digest not in named:
        listed = ", ".join(map(shown_plain, named[:3])) + (f" and {len(named) - 3} more" if len(named) > 3 else "")
        raise StatementError(f"replayed: signed for {listed or 'no digest'}, not for {digest}")


def read_statement(payload: bytes, digest: str, predicate_type: str) -> dict[str, Any]:
    """The predicate of a verified statement, checked to be of `predicate_type` and about `digest`
    (a statement signed for another digest is a replay); StatementError naming the cause otherwise."""
    body = load_statement(payload)
    if body.get("predicateType") != predicate_type:
        raise StatementError(f"predicateType {shown(str(body.get('predicateType')))}, not {predicate_type}")
    check_subject(body, digest)
    predicate = body.get("predicate")
    if not isinstance(predicate, dict):
        raise StatementError("malformed: the predicate is not an object")
    return predicate
