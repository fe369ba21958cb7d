"""The SBOM of a real image: this commit's pytorch-cpu dev image (fixture_images, built or retagged by
buildtool), probed twice the way `buildtool build --push` does (buildtool.imagebuild.contents.probe), turned
into CycloneDX with the cell's committed locks (their wheels' sha256; of several for a package, the one with
the installed wheel's tags: no index is asked). About 10 s once the fixture exists; prints the counts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixture_images  # noqa: E402

from buildtool.contracts.locks import installed_files  # noqa: E402
from buildtool.imagebuild.contents import probe  # noqa: E402
from buildtool.imagebuild.lock import read_locks  # noqa: E402
from buildtool.matrix.loader import load_matrix  # noqa: E402
from buildtool.sbom.document import make_sbom, validate_sbom  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.engine]
REPO = Path(__file__).resolve().parents[2]
CELL = "pytorch-cpu:2.13"
DIGEST = "sha256:" + "0" * 64   # the SBOM's subject; the document does not depend on it otherwise


def test_real_image_sbom_is_complete_valid_and_byte_identical():
    image = fixture_images.ensure("pytorch")
    cell = next(c for c in load_matrix(REPO / "matrix.yaml", REPO / "templates").cells if c.key == CELL)
    locks = read_locks(REPO, cell)
    docs = []
    for _ in range(2):
        found = probe(REPO, image)
        identified = installed_files(found["python_details"], locks)
        docs.append(make_sbom(found, repository="127.0.0.1:5000/x/pytorch-cpu-dev", digest=DIGEST,
                              facts={"cell": CELL}, locks=locks, identified=identified,
                              indexes=(cell.index_url or "", *cell.extra_index_urls)))   # as the builder does
    assert json.dumps(docs[0]).encode() == json.dumps(docs[1]).encode()   # same image, same bytes
    doc = docs[0]
    validate_sbom(doc)
    components = doc["components"]
    python = [c for c in components if c["purl"].startswith("pkg:pypi/")]
    debs = [c for c in components if c["purl"].startswith("pkg:deb/")]
    assert len(python) + len(debs) == len(components)
    single = {n: e.wheels[0].sha256 for lock in locks.values() for n, e in lock.entries.items()
              if len(e.wheels) == 1}
    hashed = {c["name"]: c["hashes"][0]["content"] for c in components if c.get("hashes")}
    admitted = {n: {w.sha256 for w in e.wheels} for lock in locks.values() for n, e in lock.entries.items()}
    assert single.items() <= hashed.items()      # every package a lock lists one wheel of
    assert all(sha in admitted[name] for name, sha in hashed.items())   # the others: one the lock admits
    # Identified by the installed wheel's tags: every entry admitting several files (wheels, or one wheel and the
    # sdist uv builds where it does not fit); an entry of one wheel and no sdist is hashed without identifying.
    alone = {n for lock in locks.values() for n, e in lock.entries.items() if len(e.wheels) == 1 and e.sdist is None}
    assert set(identified) == set(hashed) - alone
    assert all("arch=" in c["purl"] and "distro=debian-12" in c["purl"] for c in debs)
    upstream = [c for c in debs if "upstream=" in c["purl"]]
    by_name = {c["name"]: c for c in components}
    assert "upstream=glibc" in by_name["libc6"]["purl"]
    assert by_name["ca-certificates"].get("licenses") and by_name["torch"]["licenses"][0]["expression"]
    root = next(d for d in doc["dependencies"] if d["ref"] == doc["metadata"]["component"]["bom-ref"])
    tops = sorted(c["name"] for c in components if c["bom-ref"] in root["dependsOn"])
    assert "torch-tb-profiler" in tops and "libc6" not in tops and "numpy" not in tops
    assert len(tops) < len(components) // 4
    print(json.dumps({"components": len(components), "python": len(python), "debian": len(debs),
                      "with_hashes": len(hashed), "python_without_hash": len(python) - len(hashed),
                      "deb_purls_with_arch": sum("arch=" in c["purl"] for c in debs),
                      "deb_purls_with_distro": sum("distro=" in c["purl"] for c in debs),
                      "deb_with_upstream": len(upstream),
                      "with_licenses": sum(bool(c.get("licenses")) for c in components),
                      "python_with_licenses": sum(bool(c.get("licenses")) for c in python),
                      "deb_with_licenses": sum(bool(c.get("licenses")) for c in debs),
                      "root_depends_on": tops,
                      "unresolved": sum(any(p["name"].endswith(":unresolved-dependency")
                                            for p in c.get("properties", [])) for c in components)},
                     indent=1))
