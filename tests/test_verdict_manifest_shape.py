"""An artifact of the digest whose manifest is JSON but not of the shape OCI gives it (a subject or annotations that
is no object, layers that are no list of descriptors), pinned or listed by someone who may push: the reading of the
digest's verdicts blocks naming it, never a traceback (release and verify then refuse, naming it). In-memory
registry."""

from __future__ import annotations

import json

import pytest

from buildtool.contracts.names import ATTESTATION_TYPE, verdict_pin_tag
from buildtool.registry.client import OCI_MANIFEST, sha256_digest
from buildtool.validate.verdicts import find_verdicts
from tests import signing
from tests.memregistry import MemRegistry

REPO = "team/pytorch-cpu"


@pytest.mark.parametrize(("field", "value", "said"), [
    ("subject", "sha256:" + "0" * 64, "its 'subject' field is a JSON str, not an object"),
    ("annotations", ["a"], "its 'annotations' field is a JSON list, not an object"),
    ("layers", "x", "its layers are not a list of descriptors, each with its digest"),
    ("layers", ["x"], "its layers are not a list of descriptors, each with its digest"),
    ("layers", [{"mediaType": "application/vnd.dsse.envelope.v1+json", "size": 1}],
     "its layers are not a list of descriptors, each with its digest"),
    ("layers", [{"digest": "sha256:" + "1" * 64, "annotations": ["t"]}],
     "its layers are not a list of descriptors, each with its digest"),
])
@pytest.mark.parametrize("how", ["pinned", "listed"])
def test_a_malformed_artifact_manifest_of_the_digest_blocks_naming_what_is_wrong(field, value, said, how) -> None:
    client = MemRegistry()
    digest = client.push_image(REPO, "x")
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ATTESTATION_TYPE,
                "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": "sha256:" + "4" * 64,
                           "size": 2},
                "layers": [], "subject": {"mediaType": OCI_MANIFEST, "digest": digest, "size": 1}, field: value}
    raw = json.dumps(manifest).encode()
    artifact = client.put_manifest(REPO, sha256_digest(raw), raw, OCI_MANIFEST)
    if how == "pinned":
        client.put_manifest(REPO, verdict_pin_tag(digest, artifact), raw, OCI_MANIFEST)
    else:
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [{"mediaType": OCI_MANIFEST, "digest": artifact, "size": len(raw),
                                "artifactType": ATTESTATION_TYPE}]}
        client.put_manifest(REPO, digest.replace(":", "-"), json.dumps(index).encode(),
                            "application/vnd.oci.image.index.v1+json")
    findings = find_verdicts(client, REPO, digest, signing.trusted())   # type: ignore[arg-type]
    assert findings.found == [] and findings.rejected == []
    (blocking,) = findings.blocking
    assert blocking.startswith(f"{artifact}, ") and blocking.endswith(f"is no manifest this toolkit can read: {said}")


def test_more_verdict_pin_tags_than_the_bound_are_refused_before_any_is_read(monkeypatch) -> None:
    """Before, every verdict pin tag of a digest was looked up (a HEAD each) and its artifact read, however many
    there were: anyone who may push could add 100,000 of them to a digest release reads. Now more than
    MAX_REFERRERS (the bound on a digest's referrers, which its pins name) is one error naming the subject."""
    from buildtool.attest import referrers
    from buildtool.registry.client import RegistryError

    monkeypatch.setattr(referrers, "MAX_REFERRERS", 3)
    client = MemRegistry()
    digest = client.push_image(REPO, "x")
    for n in range(4):
        raw = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "n": n}).encode()
        client.put_manifest(REPO, verdict_pin_tag(digest, sha256_digest(raw)), raw, OCI_MANIFEST)
    looked: list[str] = []
    monkeypatch.setattr(client, "manifest_digest", lambda repo, ref: looked.append(ref))
    with pytest.raises(RegistryError) as refused:
        find_verdicts(client, REPO, digest, signing.trusted())  # type: ignore[arg-type]
    assert str(refused.value) == (f"{REPO}@{digest} has more than 3 verdict pin tags; refused, not read further (a "
                                  "list read in part could hide a signature or choose another)")
    assert looked == []
