"""SBOMs: the in-image probe, the CycloneDX document, reading it back and diffs (no engine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.build import contents
from buildtool.registry import sbom

ROOT = Path(__file__).resolve().parents[1]
DIGEST = "sha256:" + "d" * 64
PROBE = {"python": "3.11.2", "os": "Debian GNU/Linux 12 (bookworm)", "arch": "x86_64", "cuda": "",
         "python_packages": {"torch": "2.13.0+cpu", "numpy": "2.4.6", "torch-tb-profiler": "0.4.3"},
         "apt_packages": {"python3.11": "3.11.2-6+deb12u6", "libc6:amd64": "2.36-9+deb12u10"}}
FACTS = {"framework": "pytorch 2.13.0+cpu", "python": "3.11.2", "base": "docker.io/library/debian:bookworm-slim",
         "cell": "pytorch-cpu:2.13"}


def test_probe_prints_one_json_object_with_python_and_apt_packages():
    run = subprocess.run([sys.executable, str(ROOT / contents.PROBE)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert found["python"] == ".".join(str(n) for n in sys.version_info[:3])
    assert found["python_packages"]["pytest"] == pytest.__version__
    assert isinstance(found["apt_packages"], dict)


def test_sbom_is_valid_cyclonedx_and_deterministic():
    doc = sbom.make_sbom(PROBE, repository="127.0.0.1:5000/x/pytorch-cpu-dev", digest=DIGEST, facts=FACTS)
    sbom.validate_sbom(doc)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    assert doc == sbom.make_sbom(PROBE, repository="127.0.0.1:5000/x/pytorch-cpu-dev", digest=DIGEST, facts=FACTS)
    assert "timestamp" not in doc["metadata"]
    purls = {c["purl"] for c in doc["components"]}
    assert "pkg:pypi/torch@2.13.0%2Bcpu" in purls
    assert "pkg:deb/debian/libc6@2.36-9%2Bdeb12u10?arch=amd64" in purls
    assert doc["metadata"]["component"]["version"] == DIGEST


def test_invalid_document_is_refused():
    with pytest.raises(ValueError, match="not valid CycloneDX"):
        sbom.validate_sbom({"bomFormat": "CycloneDX", "specVersion": "1.6", "components": [{"name": 1}]})


def test_contents_and_diff_put_the_headline_first():
    old = sbom.contents(sbom.make_sbom(PROBE, repository="r/a", digest=DIGEST, facts=FACTS))
    probe = json.loads(json.dumps(PROBE))
    del probe["python_packages"]["torch-tb-profiler"]
    probe["python_packages"]["numpy"] = "2.5.0"
    probe["python_packages"]["pillow"] = "13.0.0"
    probe["apt_packages"]["python3.11"] = "3.11.2-6+deb12u7"
    new_facts = dict(FACTS, python="3.11.3", framework="pytorch 2.13.1+cpu")
    new = sbom.contents(sbom.make_sbom(probe, repository="r/a", digest="sha256:" + "e" * 64, facts=new_facts))
    assert new.python["numpy"] == "2.5.0" and new.apt["python3.11"] == "3.11.2-6+deb12u7"
    lines = [c.line() for c in sbom.diff(old, new)]
    assert lines == [
        "framework: pytorch 2.13.0+cpu -> pytorch 2.13.1+cpu",
        "python: 3.11.2 -> 3.11.3",
        "numpy (python): 2.4.6 -> 2.5.0",
        "added pillow (python) 13.0.0",
        "removed torch-tb-profiler (python) 0.4.3",
        "python3.11 (apt): 3.11.2-6+deb12u6 -> 3.11.2-6+deb12u7",
    ]
    assert sbom.diff(old, old) == []
