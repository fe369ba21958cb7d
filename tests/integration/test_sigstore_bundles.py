"""Every Sigstore bundle the toolkit publishes, fetched from the local registry as any OCI 1.1 client fetches it
and verified by sigstore-js (@sigstore/verify, tools/sigstore-verify: a verifier the toolkit did not write)
with the public keys of a trusted keys file, offline (issue 40; the checks: tests/bundle_check.py).

A small image (one random layer, no build) gets what push and validate attach, by their own writers: the
provenance (buildtool.attest.provenance_store.attach_provenance, builder key), the SBOM attestation
(attest_sbom, builder key) and the verdict (buildtool.validate.verdicts.attest, tester key); each publishes
its envelope as a bundle too. The bundles are read through the fallback index `sha256-<hex>` (the local
registry, distribution 2.8, has no referrers API), then through the referrers API of tests/referrers_api.py
after release's copy of the image and its artifacts into a repository behind it. Each verifies, in its key's
role and about this digest; the same bundle with one payload byte changed is refused by sigstore-js's
signature check; a tester's bundle is refused where a builder's is wanted. test_build checks the bundles of
the dev images it pushes the same way.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from buildtool.attest.dsse import generate
from buildtool.attest.keys import trusted_entry
from buildtool.attest.provenance_model import PREDICATE_TYPE, parse_provenance
from buildtool.attest.provenance_store import attach_provenance
from buildtool.attest.verdict_statement import VERDICT_PREDICATE
from buildtool.registry.client import EMPTY_JSON, EMPTY_JSON_TYPE, OCI_MANIFEST, RegistryClient
from buildtool.sbom.signing import SBOM_PREDICATE
from tests import bundle_check, signing
from tests.conftest import fixture_matrix

pytestmark = [pytest.mark.integration, pytest.mark.registry]

HOST = "127.0.0.1:5000"
CPU = next(c for c in fixture_matrix().cells if c.key == "pytorch-cpu:2.13")
BUILDER = generate()
ROLE = {PREDICATE_TYPE: "builder", SBOM_PREDICATE: "builder", VERDICT_PREDICATE: "tester"}


def _image(client: RegistryClient, repo: str) -> str:
    layer = secrets.token_bytes(64)
    raw = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                      "config": {"mediaType": EMPTY_JSON_TYPE, "digest": client.put_blob(repo, EMPTY_JSON), "size": 2},
                      "layers": [{"mediaType": "application/octet-stream", "digest": client.put_blob(repo, layer),
                                  "size": 64}]}, sort_keys=True).encode()
    return client.put_manifest(repo, "v1", raw, OCI_MANIFEST)


def test_each_published_bundle_verifies_with_sigstore_js_both_ways_and_a_changed_byte_is_refused(
        tmp_path: Path) -> None:
    bundle_check.need_verifier()
    keys = tmp_path / "trusted-keys.yaml"
    keys.write_text("keys:\n" + trusted_entry("builder", BUILDER.public(), ("builder",))
                    + trusted_entry("tester", signing.KEY.public(), ("tester",)))
    client, repo = RegistryClient(HOST), f"t-bundles-{secrets.token_hex(4)}/img"
    digest = _image(client, repo)
    # what push (builder key) and validate (tester key) attach, by their writers
    attach_provenance(client, repo, digest, parse_provenance(signing.provenance(CPU), "the test provenance"), BUILDER)
    named = signing.attest_sbom(client, repo, digest, key=BUILDER)   # type: ignore[arg-type]
    signing.attest(client, repo, digest, signing.verdict(CPU, digest, sbom=named))   # type: ignore[arg-type]
    bundle_check.check_both_ways(repo, [digest], keys, ROLE, tmp_path, HOST)
    # A verdict bundle is not a builder's statement: the tester key is not trusted as builder.
    [verdict] = [d for d in bundle_check.listed(HOST, repo, digest, api=False)
                 if d["annotations"]["dev.sigstore.bundle.predicateType"] == VERDICT_PREDICATE]
    rc, [out] = bundle_check.run_verifier(keys, "builder", digest,
                                          bundle_check.fetch(HOST, repo, digest, verdict, tmp_path))
    assert rc == 1 and out["code"] == "PUBLIC_KEY_ERROR" and signing.KEY.keyid in out["reason"], out
