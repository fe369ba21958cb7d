"""What CI checks of every Sigstore bundle an image carries (issue 40), shared by the integration tests: the
bundles are fetched by plain HTTP as any OCI 1.1 client fetches them, through the referrers API or through
the fallback tag `sha256-<hex>`, and verified by sigstore-js (tools/sigstore-verify/verify.js: @sigstore/verify,
a verifier the toolkit did not write) with the keys of a trusted keys file; the same bundle with one payload
byte changed must be refused by sigstore-js's signature check."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest
import requests

from buildtool.attest.referrers import copy, referrers
from buildtool.attest.sigstore_bundle import BUNDLE_MEDIA_TYPE, PREDICATE_TYPE_ANNOTATION
from buildtool.contracts.names import referrers_tag
from buildtool.registry.client import OCI_INDEX, OCI_MANIFEST, RegistryClient
from buildtool.release.execute import copy_manifest
from tests.referrers_api import ReferrersApi

ROOT = Path(__file__).resolve().parents[1]
VERIFIER = ROOT / "tools/sigstore-verify"
NODE = VERIFIER / "node_modules/.bin/node"     # the Node @sigstore/verify 4.x runs on (npm ci installs it)


def dev_key_file(folder: Path) -> Path:
    """A trusted keys file holding this machine's local dev key in both roles (what `make push validate` signs
    with when no CI key is set)."""
    from buildtool.attest.keys import dev_public_key, trusted_entry

    key = dev_public_key()
    assert key is not None, "no local dev key: push and validate make one on first use"
    path = folder / "trusted-keys.yaml"
    path.write_text("keys:\n" + trusted_entry("dev", key, ("builder", "tester")))
    return path


def attestation_roles() -> dict[str, str]:
    """predicate type -> the role whose key signs it: the provenance and the SBOM the builder's, verdicts the
    tester's."""
    from buildtool.attest.provenance_model import PREDICATE_TYPE
    from buildtool.attest.verdict_statement import VERDICT_PREDICATE
    from buildtool.sbom.signing import SBOM_PREDICATE

    return {PREDICATE_TYPE: "builder", SBOM_PREDICATE: "builder", VERDICT_PREDICATE: "tester"}


def need_verifier() -> None:
    if not NODE.is_file() or not (VERIFIER / "node_modules/@sigstore/verify").is_dir():
        pytest.fail("this test needs tools/sigstore-verify/node_modules with its Node (bash scripts/setup-tests.sh "
                    "runs npm ci there)", pytrace=False)


def listed(host: str, repo: str, digest: str, api: bool) -> list[dict]:
    """The bundle descriptors of repo@digest, by plain HTTP: the referrers API, or the fallback tag."""
    path = f"referrers/{digest}" if api else f"manifests/{referrers_tag(digest)}"
    query = {"artifactType": BUNDLE_MEDIA_TYPE} if api else None
    answer = requests.get(f"http://{host}/v2/{repo}/{path}", params=query, headers={"Accept": OCI_INDEX}, timeout=30)
    answer.raise_for_status()
    assert answer.headers["Content-Type"].split(";")[0] == OCI_INDEX
    return [d for d in answer.json()["manifests"] if d.get("artifactType") == BUNDLE_MEDIA_TYPE]


def fetch(host: str, repo: str, digest: str, descriptor: dict, folder: Path) -> Path:
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


def run_verifier(keys: Path, role: str, digest: str, *bundles: Path, tsa_certs: Path | None = None,
                 ) -> tuple[int, list[dict]]:
    """verify.js on `bundles` (with --tsa-certs: a timestamp by that authority is required of each)."""
    tsa = ["--tsa-certs", str(tsa_certs)] if tsa_certs else []
    done = subprocess.run([str(NODE), str(VERIFIER / "verify.js"), "--keys", str(keys), "--role", role,
                           "--digest", digest, *tsa, *map(str, bundles)], capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]


def one_byte_changed(path: Path) -> Path:
    body = json.loads(path.read_bytes())
    payload = bytearray(base64.b64decode(body["dsseEnvelope"]["payload"]))
    payload[payload.index(b"sha256")] ^= 0x01     # one byte of the signed statement
    body["dsseEnvelope"]["payload"] = base64.b64encode(bytes(payload)).decode()
    changed = path.with_name("changed-" + path.name)
    changed.write_text(json.dumps(body))
    return changed


def check_bundles(host: str, repo: str, digest: str, api: bool, keys: Path, roles: dict[str, str],
                  folder: Path) -> dict[str, Path]:
    """Every bundle of repo@digest (read the one way), each of a predicate type in `roles`, verifies with
    sigstore-js in that role and about this digest, and is refused with one payload byte changed (one
    verifier run per role and kind: node starts in about 0.3 s). Returns predicate type -> bundle file."""
    found: dict[str, Path] = {}
    for descriptor in listed(host, repo, digest, api):
        found[descriptor["annotations"][PREDICATE_TYPE_ANNOTATION]] = fetch(host, repo, digest, descriptor, folder)
    for role in sorted(set(roles.values())):
        mine = {t: path for t, path in found.items() if roles[t] == role}
        if not mine:
            continue
        rc, outs = run_verifier(keys, role, digest, *mine.values())
        assert rc == 0 and [(o["verified"], o["predicateType"]) for o in outs] == [(True, t) for t in mine], outs
        rc, outs = run_verifier(keys, role, digest, *map(one_byte_changed, mine.values()))
        assert rc == 1 and {(o["verified"], o["code"], o["reason"]) for o in outs} == {
            (False, "SIGNATURE_ERROR", "signature verification failed")} and len(outs) == len(mine), outs
    return found


def check_both_ways(repo: str, digests: list[str], keys: Path, roles: dict[str, str], folder: Path,
                    host: str = "127.0.0.1:5000", required: set[str] | None = None) -> None:
    """check_bundles on each of `digests` (platform manifests) of repo@digest in the registry `host` (no referrers
    API: the fallback tag), then on a copy of the image and all its artifacts, by release's own copy, into
    `<repo>-api` behind tests/referrers_api.py (the referrers API; no fallback tag is written there). Each
    digest must have a bundle of every predicate type in `required` (default: all of `roles`)."""
    need = set(roles) if required is None else required
    for digest in digests:
        assert need <= set(check_bundles(host, repo, digest, False, keys, roles, folder)), digest
    with ReferrersApi(host) as proxy:
        client, plain = RegistryClient(proxy.address), RegistryClient(host)
        mirror = f"{repo}-api"
        for digest in digests:
            raw, media_type, _ = plain.get_manifest(repo, digest)
            copy_manifest(client, repo, mirror, raw, media_type, digest)
            for ref in referrers(plain, repo, digest):
                copy(client, repo, mirror, ref, digest)
            assert need <= set(check_bundles(proxy.address, mirror, digest, True, keys, roles, folder)), digest
            assert plain.manifest_digest(mirror, referrers_tag(digest)) is None   # read through the API
