"""Every Sigstore bundle the toolkit publishes, fetched from the local registry as any OCI 1.1 client fetches it
and verified by sigstore-js (@sigstore/verify, tools/sigstore-verify: a verifier the toolkit did not write)
with the public keys of a trusted keys file, offline (issue 40).

A small image (one random layer, no build) gets what push and validate attach, by their own writers: the
provenance (buildtool.registry.provenance.attach_provenance, builder key), the SBOM attestation
(attest_sbom, builder key) and the verdict (buildtool.validate.verdicts.attest, tester key); each publishes
its envelope as a bundle too. Done twice: once through tests/referrers_api.py, which gives the local
registry (distribution 2.8, no referrers API) the OCI 1.1 referrers API, so the bundles are read through
`GET /v2/<repo>/referrers/<digest>` and no fallback tag is written; once straight to the registry, so they
are read through the fallback index `sha256-<hex>`. Each fetched bundle verifies, in its key's role and
about this digest; the same bundle with one payload byte changed is refused by sigstore-js's signature check.
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest
import requests

from buildtool.common.dsse import generate
from buildtool.contracts.attestation import VERDICT_PREDICATE
from buildtool.contracts.names import referrers_tag
from buildtool.contracts.provenance import PREDICATE_TYPE, parse_provenance
from buildtool.contracts.sigstore_bundle import BUNDLE_MEDIA_TYPE, PREDICATE_TYPE_ANNOTATION
from buildtool.registry.client import EMPTY_JSON, EMPTY_JSON_TYPE, OCI_INDEX, OCI_MANIFEST, RegistryClient
from buildtool.registry.provenance import attach_provenance
from buildtool.registry.sbom_attestation import SBOM_PREDICATE
from buildtool.validate.keys import trusted_entry
from tests import signing
from tests.conftest import fixture_matrix
from tests.referrers_api import ReferrersApi

pytestmark = [pytest.mark.integration, pytest.mark.registry]

ROOT = Path(__file__).resolve().parents[2]
VERIFIER = ROOT / "tools/sigstore-verify"
HOST = "127.0.0.1:5000"
CPU = next(c for c in fixture_matrix().cells if c.key == "pytorch-cpu:2.13")
BUILDER = generate()
ROLE = {PREDICATE_TYPE: "builder", SBOM_PREDICATE: "builder", VERDICT_PREDICATE: "tester"}


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("node") is None or not (VERIFIER / "node_modules/@sigstore/verify").is_dir():
        pytest.fail("this test needs node and tools/sigstore-verify/node_modules (bash scripts/setup.sh installs "
                    "both)", pytrace=False)
    path = tmp_path_factory.mktemp("keys") / "trusted-keys.yaml"
    path.write_text("keys:\n" + trusted_entry("builder", BUILDER.public(), ("builder",))
                    + trusted_entry("tester", signing.KEY.public(), ("tester",)))
    return path


def _image(client: RegistryClient, repo: str) -> str:
    layer = secrets.token_bytes(64)
    raw = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                      "config": {"mediaType": EMPTY_JSON_TYPE, "digest": client.put_blob(repo, EMPTY_JSON), "size": 2},
                      "layers": [{"mediaType": "application/octet-stream", "digest": client.put_blob(repo, layer),
                                  "size": 64}]}, sort_keys=True).encode()
    return client.put_manifest(repo, "v1", raw, OCI_MANIFEST)


def _attest(client: RegistryClient, repo: str, digest: str) -> None:
    """What push (provenance, SBOM: builder key) and validate (verdict: tester key) attach, by their writers."""
    provenance = parse_provenance(signing.provenance(CPU), "the test provenance")
    attach_provenance(client, repo, digest, provenance, BUILDER)
    named = signing.attest_sbom(client, repo, digest, key=BUILDER)   # type: ignore[arg-type]
    signing.attest(client, repo, digest, signing.verdict(CPU, digest, sbom=named))   # type: ignore[arg-type]


def _listed(host: str, repo: str, digest: str, api: bool) -> list[dict]:
    """The bundle descriptors of repo@digest, by plain HTTP: the referrers API, or the fallback tag."""
    path = f"referrers/{digest}" if api else f"manifests/{referrers_tag(digest)}"
    query = {"artifactType": BUNDLE_MEDIA_TYPE} if api else None
    answer = requests.get(f"http://{host}/v2/{repo}/{path}", params=query, headers={"Accept": OCI_INDEX}, timeout=30)
    answer.raise_for_status()
    assert answer.headers["Content-Type"].split(";")[0] == OCI_INDEX
    return [d for d in answer.json()["manifests"] if d.get("artifactType") == BUNDLE_MEDIA_TYPE]


def _fetch(host: str, repo: str, digest: str, descriptor: dict, folder: Path) -> Path:
    """The bundle of one descriptor, from its artifact manifest (checked to name the image as subject)."""
    manifest = requests.get(f"http://{host}/v2/{repo}/manifests/{descriptor['digest']}",
                            headers={"Accept": OCI_MANIFEST}, timeout=30).json()
    assert manifest["artifactType"] == BUNDLE_MEDIA_TYPE and manifest["subject"]["digest"] == digest
    [layer] = manifest["layers"]
    assert layer["mediaType"] == BUNDLE_MEDIA_TYPE
    data = requests.get(f"http://{host}/v2/{repo}/blobs/{layer['digest']}", timeout=30).content
    kind = descriptor["annotations"][PREDICATE_TYPE_ANNOTATION].rsplit("/", 2)[-2]
    path = folder / f"{kind}-{layer['digest'][7:19]}.json"
    path.write_bytes(data)
    return path


def _verify(keys: Path, role: str, digest: str, *bundles: Path) -> tuple[int, list[dict]]:
    done = subprocess.run(["node", str(VERIFIER / "verify.js"), "--keys", str(keys), "--role", role,
                           "--digest", digest, *map(str, bundles)], capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]


def _one_byte_changed(path: Path) -> Path:
    body = json.loads(path.read_bytes())
    payload = bytearray(base64.b64decode(body["dsseEnvelope"]["payload"]))
    payload[payload.index(b"sha256")] ^= 0x01     # one byte of the signed statement
    body["dsseEnvelope"]["payload"] = base64.b64encode(bytes(payload)).decode()
    changed = path.with_name("changed-" + path.name)
    changed.write_text(json.dumps(body))
    return changed


@pytest.mark.parametrize("api", [True, False], ids=["referrers-api", "fallback-tag"])
def test_each_published_bundle_verifies_with_sigstore_js_and_a_changed_byte_is_refused(
        api: bool, keys_file: Path, tmp_path: Path) -> None:
    repo = f"t-bundles-{secrets.token_hex(4)}/img"
    with ReferrersApi(HOST) as proxy:
        host = proxy.address if api else HOST
        client = RegistryClient(host)
        digest = _image(client, repo)
        _attest(client, repo, digest)
        listed = _listed(host, repo, digest, api)
        fetched = [_fetch(host, repo, digest, d, tmp_path) for d in listed]
    # Read the way the test meant: with the API no fallback tag was written; without, the registry has no API.
    fallback = requests.get(f"http://{HOST}/v2/{repo}/manifests/{referrers_tag(digest)}",
                            headers={"Accept": OCI_INDEX}, timeout=30)
    assert fallback.status_code == (404 if api else 200)
    if not api:
        assert requests.get(f"http://{HOST}/v2/{repo}/referrers/{digest}", timeout=30).status_code == 404
    by_type = {d["annotations"][PREDICATE_TYPE_ANNOTATION]: path for d, path in zip(listed, fetched, strict=True)}
    assert set(by_type) == set(ROLE) and len(listed) == 3
    for predicate_type, path in by_type.items():
        rc, [out] = _verify(keys_file, ROLE[predicate_type], digest, path)
        assert rc == 0 and out["verified"] is True, out
        assert out["predicateType"] == predicate_type
        rc, [out] = _verify(keys_file, ROLE[predicate_type], digest, _one_byte_changed(path))
        assert rc == 1 and out["verified"] is False, out
        assert (out["code"], out["reason"]) == ("SIGNATURE_ERROR", "signature verification failed"), out
    # A verdict bundle is not a builder's statement: the tester key is not trusted as builder.
    rc, [out] = _verify(keys_file, "builder", digest, by_type[VERDICT_PREDICATE])
    assert rc == 1 and out["code"] == "PUBLIC_KEY_ERROR" and signing.KEY.keyid in out["reason"], out
