"""A fixed signed provenance for the tests of `buildtool verify` (its printed chain names these values);
the predicate is what a push writes, by the contract buildtool.attest.provenance_model. Release tests use
tests/signing.py's `provenance`, which follows the cell and the checkout's HEAD."""

from __future__ import annotations

import json
from typing import Any

from buildtool.attest.dsse import PrivateKey, sign_envelope
from buildtool.attest.intoto import DSSE_MEDIA_TYPE, PAYLOAD_TYPE
from buildtool.attest.referrers import Payload, Referrer, attach
from buildtool.registry.client import RegistryClient
from tests.signing import KEY


def standin_provenance(digest: str, base: str = "127.0.0.1:5000/debian:bookworm-slim", standin: bool = False,
               revision: str = "a" * 40) -> dict[str, Any]:
    """A SLSA provenance predicate as push writes it (buildtool.attest.provenance_model)."""
    from buildtool.attest.provenance_model import BUILD_TYPE

    return {"buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"cell": "pytorch-cpu:2.13", "matrix_digest": "sha256:" + "6" * 64,
                                       "revision": revision, "source": "", "platform": "linux/amd64",
                                       "dockerfile": "dockerfiles/pytorch-cpu/2.13/Dockerfile",
                                       "context": "dockerfiles/pytorch-cpu/2.13",
                                       "buildArgs": {"BASE_IMAGE": f"{base}@sha256:{'7' * 64}"},
                                       "sourceDateEpoch": 0, "createdEpoch": 1767225600, "secrets": ["pip.conf"],
                                       "network": "host", "packageIndexes": []},
                "internalParameters": {},
                "resolvedDependencies": [
                    {"name": "source", "uri": f"git+https://example.invalid/dl-images@{revision}",
                     "digest": {"gitCommit": revision}},
                    {"name": "base", "uri": f"oci://{base}", "digest": {"sha256": "7" * 64},
                     "annotations": {"standin": standin}},
                    {"name": "lock:locks/pytorch-cpu-2.13.txt", "digest": {"sha256": "8" * 64}}]},
            "runDetails": {"builder": {"id": "https://ci.example/runs/1", "version": {"buildtool": "0.1"}},
                           "metadata": {"invocationId": "1", "startedOn": "2026-01-01T00:00:00Z",
                                        "finishedOn": "2026-01-01T00:01:00Z"}}}


def attest_provenance(client: RegistryClient, repo: str, digest: str, key: PrivateKey = KEY,
                      predicate: dict[str, Any] | None = None) -> Referrer:
    """Attach a signed provenance as the stand-in reader (buildtool.attest.provenance_store) finds it."""
    from buildtool.attest import intoto
    from buildtool.attest.provenance_model import PREDICATE_TYPE
    from buildtool.contracts.names import PROVENANCE_TYPE

    payload = intoto.statement(f"{client.host}/{repo}", digest, PREDICATE_TYPE, predicate or standin_provenance(digest))
    data = json.dumps(sign_envelope(key, PAYLOAD_TYPE, payload), sort_keys=True).encode()
    return attach(client, repo, digest, PROVENANCE_TYPE, [Payload(DSSE_MEDIA_TYPE, data, "provenance.intoto.jsonl")],
                  {intoto.PREDICATE_ANNOTATION: PREDICATE_TYPE})
