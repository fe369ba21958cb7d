"""SBOMs in the local registry (no engine, about 3 s): attached to an image digest, printed by
`buildtool sbom`, compared by `buildtool diff`, read by skopeo (a client other than buildtool),
copied to a release repository, and turned into the package part of release notes."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from buildtool.attest.keys import BUILDER, signing_key
from buildtool.attest.referrers import add_referrers, copy_artifact
from buildtool.registry.client import EMPTY_JSON, EMPTY_JSON_TYPE, OCI_MANIFEST, RegistryClient
from buildtool.release.package_changes import Subject, package_notes, package_section
from buildtool.sbom.document import contents, find_sbom, load_sbom, make_sbom, store_sbom, validate_sbom
from buildtool.sbom.signing import attest_sbom
from tests import sbom_probe

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]
HOST = "127.0.0.1:5000"
PROBE = sbom_probe.minimal({"torch": "2.13.0+cpu", "numpy": "2.4.6", "torch-tb-profiler": "0.4.3"},
                           {"python3.11": "3.11.2-6+deb12u6", "bash": "5.2.15-2+b13"})
FACTS = {"framework": "pytorch 2.13.0+cpu", "python": "3.11.2", "base": "docker.io/library/debian:bookworm-slim"}


def _image(client: RegistryClient, repo: str, tag: str) -> str:
    layer = secrets.token_bytes(64)
    layer_digest = client.put_blob(repo, layer)
    config = client.put_blob(repo, EMPTY_JSON)
    raw = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                      "config": {"mediaType": EMPTY_JSON_TYPE, "digest": config, "size": 2},
                      "layers": [{"mediaType": "application/octet-stream", "digest": layer_digest, "size": 64}]},
                     sort_keys=True).encode()
    return client.put_manifest(repo, tag, raw, OCI_MANIFEST)


def test_sbom_by_digest_read_by_buildtool_and_skopeo_diffed_copied_and_noted(run_cli, tmp_path: Path):
    client = RegistryClient(HOST)
    space = f"t-sbom-{secrets.token_hex(4)}"
    dev, rel = f"{space}/pytorch-cpu-dev", f"{space}/pytorch-cpu"
    old_digest, new_digest = _image(client, dev, "old"), _image(client, dev, "new")
    old_doc = make_sbom(PROBE, repository=f"{HOST}/{dev}", digest=old_digest, facts=FACTS, locks={}, identified={})
    changed = sbom_probe.probe_copy(PROBE)
    sbom_probe.set_python(changed, "torch-tb-profiler", None)          # a release that lost the plugin
    sbom_probe.set_python(changed, "numpy", "2.5.0")
    sbom_probe.set_deb(changed, "python3.11", "3.11.2-6+deb12u7")
    new_doc = make_sbom(changed, repository=f"{HOST}/{dev}", digest=new_digest, facts=dict(FACTS, python="3.11.3"),
                        locks={}, identified={})
    validate_sbom(new_doc)
    old_artifact = store_sbom(client, dev, old_digest, old_doc)
    new_artifact = store_sbom(client, dev, new_digest, new_doc)
    # As push does: each SBOM signed by the builder key too (`sbom` and `diff` show only a signed SBOM).
    builder = signing_key(lambda _: None, role=BUILDER)
    attest_sbom(client, dev, old_digest, old_doc, builder.key)
    signed = attest_sbom(client, dev, new_digest, new_doc, builder.key)
    assert load_sbom(client, dev, new_digest) == (new_doc, new_artifact)

    code, out, err = run_cli("sbom", f"{HOST}/{dev}:new")
    assert code == 0, err
    assert json.loads(out) == new_doc and signed.digest in err

    code, out, err = run_cli("diff", f"{HOST}/{dev}:old", f"{HOST}/{dev}@{new_digest}")
    assert code == 0, err
    assert out.splitlines() == ["python: 3.11.2 -> 3.11.3", "removed torch-tb-profiler (python) 0.4.3",
                                "numpy (python): 2.4.6 -> 2.5.0",
                                "python3.11 (apt): 3.11.2-6+deb12u6 -> 3.11.2-6+deb12u7"]
    code, out, err = run_cli("diff", "--json", f"{HOST}/{dev}:old", f"{HOST}/{dev}:new")
    assert code == 0 and {"kind": "removed", "scope": "python", "name": "torch-tb-profiler", "before": "0.4.3",
                          "after": None} in json.loads(out)["changes"]

    # A client other than buildtool: skopeo reads the OCI 1.1 fallback index and the artifact.
    skopeo = shutil.which("skopeo")
    assert skopeo, "skopeo is installed by scripts/setup.sh"
    tag = new_digest.replace(":", "-")
    index = json.loads(subprocess.run([skopeo, "inspect", "--tls-verify=false", "--raw",
                                       f"docker://{HOST}/{dev}:{tag}"], capture_output=True, text=True,
                                      timeout=60, check=True).stdout)
    [listed] = [d for d in index["manifests"] if d["artifactType"] == "application/vnd.cyclonedx+json"]
    assert listed["digest"] == new_artifact
    subprocess.run([skopeo, "copy", "--src-tls-verify=false", f"docker://{HOST}/{dev}@{new_artifact}",
                    f"dir:{tmp_path / 'sbom'}"], capture_output=True, text=True, timeout=120, check=True)
    manifest = json.loads((tmp_path / "sbom" / "manifest.json").read_text())
    blob = tmp_path / "sbom" / manifest["layers"][0]["digest"].split(":", 1)[1]
    assert json.loads(blob.read_text()) == new_doc

    # Release: the SBOMs travel to the release repository; notes list the package changes.
    assert copy_sbom(client, dev, rel, old_digest) == old_artifact   # the previous release, as release does
    section = package_section(client, Subject(new_digest, previous_release="0.1.0", previous_digest=old_digest),
                              f"{HOST}/{dev}", f"{HOST}/{rel}")
    assert section["sbom"] == f"{HOST}/{rel}@{new_artifact}"
    assert section["previous_sbom"] == f"{HOST}/{rel}@{old_artifact}"
    assert [c["name"] for c in section["changes"]] == ["python", "torch-tb-profiler", "numpy", "python3.11"]
    lines = package_notes(section, "0.1.0").splitlines()
    assert "- REMOVED torch-tb-profiler (python) 0.4.3" in lines and "- python: 3.11.2 -> 3.11.3" in lines
    assert copy_sbom(client, dev, rel, new_digest) == new_artifact
    assert load_sbom(client, rel, new_digest) == (new_doc, new_artifact)
    assert contents(load_sbom(client, rel, old_digest)[0]).python["torch-tb-profiler"] == "0.4.3"


def test_sbom_of_an_image_without_one_is_a_failure_and_a_bad_reference_is_bad_input(run_cli):
    client = RegistryClient(HOST)
    repo = f"t-sbom-{secrets.token_hex(4)}/img"
    _image(client, repo, "bare")
    code, _, err = run_cli("sbom", f"{HOST}/{repo}:bare")
    assert code == 1 and "has no SBOM attached" in err
    code, _, err = run_cli("sbom", "pytorch-cpu:2.13")
    assert code == 2 and "names no registry" in err
    code, _, err = run_cli("sbom", f"{HOST}/{repo}:missing")
    assert code == 2 and "no such tag" in err


def copy_sbom(client: RegistryClient, dev: str, rel: str, digest: str) -> str:
    """What a promotion does with an image's SBOM (release.execute.stage, then promote): the newest
    one of the dev repository becomes a referrer of the same digest in the release repository."""
    sbom = find_sbom(client, dev, digest)
    assert sbom is not None
    copy_artifact(client, dev, rel, sbom)
    add_referrers(client, rel, digest, [sbom])
    return sbom.digest
