"""SBOMs: the in-image probe, the CycloneDX document, reading it back and diffs (no engine)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.imagebuild import contents
from buildtool.sbom import document as sbom
from tests import sbom_probe

ROOT = Path(__file__).resolve().parents[1]
DIGEST = "sha256:" + "d" * 64
PROBE = sbom_probe.PROBE
REPOSITORY = "127.0.0.1:5000/x/pytorch-cpu-dev"
FACTS = {"framework": "pytorch 2.13.0+cpu", "python": "3.11.2", "base": "docker.io/library/debian:bookworm-slim",
         "cell": "pytorch-cpu:2.13"}


def test_probe_prints_one_json_object_with_python_and_apt_packages():
    run = subprocess.run([sys.executable, str(ROOT / contents.PROBE)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert found["python"] == ".".join(str(n) for n in sys.version_info[:3])
    assert found["python_packages"]["pytest"] == pytest.__version__
    assert isinstance(found["apt_packages"], dict)
    assert found["python_details"]["pytest"]["version"] == pytest.__version__
    assert any(r.startswith("pluggy") for r in found["python_details"]["pytest"]["requires_dist"])
    assert found["python_details"]["pytest"]["wheel_tags"] == ["py3-none-any"]
    assert found["marker_environment"]["python_version"] == "{}.{}".format(*sys.version_info[:2])
    debs = found["deb_packages"]
    if not shutil.which("dpkg-query"):
        assert debs == []
        return
    assert len(debs) == len(found["apt_packages"])       # this host is Debian: the same packages, more said
    libc6 = next(d for d in debs if d["Package"] == "libc6")
    assert libc6["source:Package"] == "glibc" and libc6["Architecture"] and libc6["Version"]


def test_sbom_is_valid_cyclonedx_and_deterministic():
    doc = _doc(PROBE)
    sbom.validate_sbom(doc)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    assert doc == _doc(PROBE)
    assert "timestamp" not in doc["metadata"]
    purls = {c["purl"] for c in doc["components"]}
    # torch 2.13.0+cpu is not PyPI's (a local version): its purl names the index it came from (issue 40).
    assert "pkg:pypi/torch@2.13.0%2Bcpu?repository_url=https://download.pytorch.org/whl/cpu" in purls
    assert all("repository_url" not in p for p in purls if p.startswith("pkg:pypi/") and "%2B" not in p)
    assert "pkg:deb/debian/libc6@2.36-9%2Bdeb12u10?arch=amd64&distro=debian-12&upstream=glibc" in purls
    assert doc["metadata"]["component"]["version"] == DIGEST


def test_invalid_document_is_refused():
    with pytest.raises(ValueError, match="not valid CycloneDX"):
        sbom.validate_sbom({"bomFormat": "CycloneDX", "specVersion": "1.6", "components": [{"name": 1}]})


def test_contents_and_diff_put_the_headline_first():
    old = sbom.contents(sbom.make_sbom(PROBE, repository="r/a", digest=DIGEST, facts=FACTS, locks={}, identified={},
                                       indexes=sbom_probe.INDEXES))
    probe = sbom_probe.probe()
    sbom_probe.set_python(probe, "pyyaml", None)
    sbom_probe.set_python(probe, "werkzeug", "3.2.0")
    sbom_probe.set_python(probe, "pillow", "13.0.0")
    sbom_probe.set_deb(probe, "openssl", "3.0.18-1~deb12u1")
    new_facts = dict(FACTS, python="3.11.3", framework="pytorch 2.13.1+cpu")
    new = sbom.contents(sbom.make_sbom(probe, repository="r/a", digest="sha256:" + "e" * 64, facts=new_facts,
                                       locks={}, identified={}, indexes=sbom_probe.INDEXES))
    assert new.python["werkzeug"] == "3.2.0" and new.apt["openssl"] == "3.0.18-1~deb12u1"
    lines = [c.line() for c in sbom.diff(old, new)]
    assert lines == [
        "framework: pytorch 2.13.0+cpu -> pytorch 2.13.1+cpu",
        "python: 3.11.2 -> 3.11.3",
        "removed pyyaml (python) 6.0.3",
        "werkzeug (python): 3.1.9 -> 3.2.0",
        "openssl (apt): 3.0.17-1~deb12u2 -> 3.0.18-1~deb12u1",
        "added pillow (python) 13.0.0",
    ]
    assert sbom.diff(old, old) == []


# -- completeness (issue 25): hashes, Debian purls, licenses, tools, the dependency graph --------------

def _doc(probe: dict | None = None, locks: dict | None = None, identified: dict | None = None) -> dict:
    return sbom.make_sbom(probe or sbom_probe.probe(), repository=REPOSITORY, digest=DIGEST, facts=FACTS,
                          locks=sbom_probe.LOCKS if locks is None else locks, identified=identified or {},
                          indexes=sbom_probe.INDEXES)


def _by_name(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["components"]}


def _props(component: dict) -> dict[str, str]:
    return {p["name"].split(":", 1)[1]: p["value"] for p in component.get("properties", [])}


def test_python_components_carry_the_sha256_their_lock_admits():
    doc = _doc()
    sbom.validate_sbom(doc)
    found = _by_name(doc)
    assert found["torch"]["hashes"] == [{"alg": "SHA-256", "content": sbom_probe.TORCH_SHA}]
    assert _props(found["torch"])["installed-from"] == "pylock.framework.toml"
    assert _props(found["werkzeug"])["installed-from"] == "pylock.tools.toml"
    hashed = sorted(c["name"] for c in doc["components"] if c.get("hashes"))
    assert hashed == ["markdown", "mpmath", "sympy", "tensorboard", "torch", "typing-extensions", "werkzeug"]
    # Several files admitted (wheels per platform, the sdist): which one was installed is not recorded.
    assert "hashes" not in found["markupsafe"] and "admits 3 files" in _props(found["markupsafe"])["hash"]
    assert "hashes" not in found["filelock"] and "admits 2 files" in _props(found["filelock"])["hash"]
    # Not from a lock (an NGC base's own packages): said so, no hash invented.
    assert "hashes" not in found["pyyaml"]
    assert _props(found["pyyaml"]) == {"installed-from": "no lock (the base image's own)",
                                       "hash": "not recorded: not installed from a lock"}
    assert "hashes" not in found["libc6"] and "md5sums" in _props(found["libc6"])["hash"]


def test_a_lock_at_another_version_than_the_image_is_refused():
    probe = sbom_probe.probe()
    probe["python_packages"]["torch"] = probe["python_details"]["torch"]["version"] = "2.13.1+cpu"
    with pytest.raises(ValueError, match=r"torch 2.13.1\+cpu in the image, 2.13.0\+cpu in pylock.framework.toml"):
        _doc(probe)


def test_every_deb_purl_has_arch_distro_and_its_source_package():
    doc = _doc()
    debs = {c["name"]: c["purl"] for c in doc["components"] if c["purl"].startswith("pkg:deb/")}
    assert len(debs) == len(sbom_probe.DEBIAN)
    assert all("arch=" in p and "distro=debian-12" in p for p in debs.values())
    # bash is Multi-Arch: foreign (dpkg's ${binary:Package} says "bash"): it gets its arch all the same.
    assert debs["bash"] == "pkg:deb/debian/bash@5.2.15-2%2Bb8?arch=amd64&distro=debian-12&upstream=bash%405.2.15-2"
    assert debs["libc6"] == "pkg:deb/debian/libc6@2.36-9%2Bdeb12u10?arch=amd64&distro=debian-12&upstream=glibc"
    assert debs["debconf"] == "pkg:deb/debian/debconf@1.5.82?arch=all&distro=debian-12"   # its own source
    from packageurl import PackageURL
    assert PackageURL.from_string(debs["bash"]).qualifiers["upstream"] == "bash@5.2.15-2"
    # The distro comes from the image's /etc/os-release, not from a constant.
    probe = sbom_probe.probe()
    probe["os_release"]["VERSION_ID"] = "13"
    assert "distro=debian-13" in _by_name(_doc(probe))["libc6"]["purl"]
    del probe["os_release"]["VERSION_ID"]
    with pytest.raises(ValueError, match="names no ID and VERSION_ID"):
        _doc(probe)


def test_licenses_where_the_metadata_declares_them():
    found = _by_name(_doc())
    assert found["torch"]["licenses"] == [{"expression": "BSD-3-Clause"}]           # License-Expression
    assert found["tensorboard"]["licenses"] == [{"license": {"name": "Apache 2.0"}}]  # License
    assert found["mpmath"]["licenses"] == [{"license": {"name": "BSD License"}}]     # classifiers
    assert "licenses" not in found["typing-extensions"] and "licenses" not in found["werkzeug"]
    # Debian's names: SPDX where they map (GPL-2+), Debian's text where not (SMAIL-GPL), issue 40.
    assert found["debianutils"]["licenses"] == [{"license": {"id": "GPL-2.0-or-later"}},
                                                {"license": {"name": "SMAIL-GPL"}}]
    assert _props(found["debianutils"])["license"] == "Debian: GPL-2+; SMAIL-GPL"
    assert "licenses" not in found["bash"]                                  # copyright not machine-readable
    assert _props(found["bash"])["license"] == sbom.LICENSE_NONE


def test_a_debian_package_whose_names_all_map_gets_one_spdx_expression_and_the_unlicensed_are_listed():
    probe = sbom_probe.probe()
    rows = {r["Package"]: r for r in probe["deb_packages"]}
    rows["debianutils"]["licenses"] = ["GPL-2+", "BSD-3-clause or GPL-2"]
    rows["dpkg"]["licenses"] = ["Expat"]
    doc = _doc(probe)
    sbom.validate_sbom(doc)
    found = _by_name(doc)
    assert found["debianutils"]["licenses"] == [{"expression": "(BSD-3-Clause OR GPL-2.0-only) AND GPL-2.0-or-later"}]
    assert found["dpkg"]["licenses"] == [{"license": {"id": "MIT"}}]
    no_license = sorted(r["Package"] for r in probe["deb_packages"] if not r.get("licenses"))
    assert "bash" in no_license and sbom.unlicensed(doc) == no_license


def test_a_local_version_with_no_index_but_pypi_is_refused_naming_the_package():
    with pytest.raises(ValueError, match=r"torch 2.13.0\+cpu is not on PyPI \(a local version\) and the cell names "
                                         "no other index"):
        sbom.make_sbom(sbom_probe.probe(), repository=REPOSITORY, digest=DIGEST, facts=FACTS, locks=sbom_probe.LOCKS,
                       identified={}, indexes=("https://pypi.org/simple",))
    # A cell whose own index is not PyPI names it on every Python package.
    assert sbom.python_repository("filelock", "3.20.0", ("https://mirror.example.invalid/simple",)) == \
        "https://mirror.example.invalid/simple"
    assert sbom.python_repository("filelock", "3.20.0", sbom_probe.INDEXES) == ""


def test_a_local_version_the_base_image_installed_names_no_index_and_says_why():
    """An NGC base's torch (2.9.0a0+...nv25.10) or a stand-in's 2.13.0+cpu was not installed from the cell's
    locks: it names no index (none is known) and is no error (CI: every pytorch-ngc SBOM failed so)."""
    doc = sbom.make_sbom(sbom_probe.probe(), repository=REPOSITORY, digest=DIGEST, facts=FACTS, locks={},
                         identified={}, indexes=("https://pypi.org/simple",))
    torch = next(c for c in doc["components"] if c["name"] == "torch")
    assert torch["purl"] == "pkg:pypi/torch@2.13.0%2Bcpu"
    assert {"name": f"{sbom.PROPERTY}:repository", "value": sbom.BASE_REPOSITORY_NOTE} in torch["properties"]
    filelock = next(c for c in doc["components"] if c["name"] == "filelock")
    assert all(p["name"] != f"{sbom.PROPERTY}:repository" for p in filelock["properties"])


def test_dep5_copyright_files_give_license_short_names_and_free_text_gives_none(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("packages_probe", ROOT / contents.PROBE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dep5 = tmp_path / "dep5"
    dep5.write_text("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
                    "Upstream-Name: x\nLicense: GPL-2+\n\nFiles: *\nCopyright: 2020 A\nLicense: GPL-2+\n\n"
                    "Files: lib/*\nCopyright: 2021 B\nLicense: BSD-3-clause or MIT\n\n"
                    "License: Apache-2.0\n full text of a license no Files paragraph uses\n")
    assert module.dep5_licenses(str(dep5)) == ["BSD-3-clause or MIT", "GPL-2+"]
    free = tmp_path / "free"
    free.write_text("This is Debian's prepackaged version of bash.\n\nLicense: GPL-3+ (not DEP-5)\n")
    assert module.dep5_licenses(str(free)) is None
    assert module.dep5_licenses(str(tmp_path / "missing")) is None


def test_tools_name_this_generator_and_its_version():
    from importlib.metadata import version
    tools = _doc()["metadata"]["tools"]["components"]
    assert {"type": "application", "name": "dl-images-buildtool",
            "version": version("dl-images-buildtool")} in tools


def test_dependency_graph_comes_from_the_packages_metadata():
    doc = _doc()
    refs = {c["bom-ref"]: c["name"] for c in doc["components"]}
    refs[doc["metadata"]["component"]["bom-ref"]] = "ROOT"
    graph = {refs[d["ref"]]: sorted(refs[t] for t in d.get("dependsOn", [])) for d in doc["dependencies"]}
    assert graph["ROOT"] == ["bash", "ca-certificates", "tensorboard", "torch"]   # not all 24
    assert graph["torch"] == ["filelock", "sympy", "typing-extensions"]        # no extras asked: no triton
    assert graph["tensorboard"] == ["markdown", "werkzeug"]                    # colorama is win32 only
    assert graph["markdown"] == ["pyyaml"]                                     # markdown[extra], asked for
    assert graph["sympy"] == ["mpmath"] and graph["mpmath"] == []
    assert graph["ca-certificates"] == ["debconf", "openssl"]                  # `debconf | debconf-2.0`
    assert graph["bash"] == ["base-files", "debianutils", "libc6", "libtinfo6"]  # Pre-Depends too
    assert graph["libssl3"] == ["libc6"]                                       # libc6:any
    assert graph["libc6"] == ["libgcc-s1"] and "libc6" in graph["libgcc-s1"]   # a cycle, reached from bash
    assert all(not _props(c).get("unresolved-dependency") for c in doc["components"])


def test_provides_resolve_and_unsatisfied_relations_are_named():
    probe = sbom_probe.probe()
    probe["deb_packages"] = [d for d in probe["deb_packages"] if d["Package"] != "debconf"]
    probe["deb_packages"].append(dict(probe["deb_packages"][0], Package="cdebconf", Version="0.270",
                                      Depends="", **{"Pre-Depends": "", "source:Package": "cdebconf",
                                                     "source:Version": "0.270", "Provides": "debconf-2.0"}))
    doc = _doc(probe)
    found = _by_name(doc)
    dep = next(d for d in doc["dependencies"] if d["ref"] == found["ca-certificates"]["bom-ref"])
    assert found["cdebconf"]["bom-ref"] in dep["dependsOn"]
    probe["deb_packages"] = [d for d in probe["deb_packages"] if d["Package"] != "libtinfo6"]
    assert _props(_by_name(_doc(probe))["bash"])["unresolved-dependency"] == "libtinfo6"


def test_cycles_nothing_else_reaches_get_one_root_edge_each():
    from buildtool.sbom.components import top_level
    assert top_level({"a": {"b"}, "b": {"a"}, "c": {"b"}, "d": set()}) == ["c", "d"]
    assert top_level({"z": {"y"}, "y": {"z", "x"}, "x": set(), "w": {"v"}, "v": {"w"}}) == ["v", "y"]


def test_same_image_same_bytes_whatever_order_the_probe_lists():
    shuffled = sbom_probe.probe()
    shuffled["deb_packages"].reverse()
    shuffled["python_details"] = dict(reversed(list(shuffled["python_details"].items())))
    assert json.dumps(_doc(), sort_keys=True) == json.dumps(_doc(shuffled), sort_keys=True)
    assert json.dumps(_doc()) == json.dumps(_doc())


def test_an_old_probe_output_is_refused_not_turned_into_a_thin_sbom():
    probe = sbom_probe.probe()
    del probe["deb_packages"]
    with pytest.raises(ValueError, match="no deb_packages"):
        _doc(probe)
    probe = sbom_probe.probe()
    probe["python_details"]["sympy"]["requires_dist"] = ["mpmath>=>1"]
    with pytest.raises(ValueError, match="sympy 1.14.0: unparseable Requires-Dist"):
        _doc(probe)


SYMPY = sbom_probe.PYTHON["sympy"]


@pytest.mark.parametrize(("detail", "cause"), [
    ({}, "the probe gave no version (text; found None)"),
    ({**SYMPY, "license": None}, "the probe gave no license (text; found None)"),
    ({**SYMPY, "requires_dist": "mpmath"}, "the probe gave no requires_dist (a list of text; found 'mpmath')"),
    ({**SYMPY, "version": ""}, "the probe gave an empty version"),
    (None, "its python_details entry is None, not an object"),
])
def test_python_metadata_missing_or_of_another_type_is_a_probe_error_naming_the_package(detail, cause):
    """A distribution whose probe metadata lacks a field or holds another type: the module's ProbeError naming the
    package and the field (was a KeyError or AttributeError traceback)."""
    from buildtool.sbom.components import ProbeError, dists

    probe = sbom_probe.probe()
    probe["python_details"]["sympy"] = detail
    with pytest.raises(ProbeError, match=re.escape(f"Python distribution sympy: {cause}")):
        dists(probe)


def test_debian_components_carry_the_deb_sha256_make_lock_recorded():
    """debs.sha256 (buildtool.imagebuild.aptlock) gives each Debian package its .deb's sha256; a version the archive
    no longer served says so, and an image without that file (probed, NGC) says why it has none."""
    probe = sbom_probe.probe()
    hashes = {"bash=5.2.15-2+b8": "a" * 64, "libc6=2.36-9+deb12u10": "-"}
    doc = sbom.make_sbom(probe, repository=REPOSITORY, digest=DIGEST, facts=FACTS, locks=sbom_probe.LOCKS,
                         identified={}, deb_hashes=hashes, indexes=sbom_probe.INDEXES)
    found = _by_name(doc)
    assert found["bash"]["hashes"] == [{"alg": "SHA-256", "content": "a" * 64}] and "hash" not in _props(found["bash"])
    assert "hashes" not in found["libc6"] and _props(found["libc6"])["hash"] == sbom.DEB_NOT_SERVED_NOTE
    assert "hashes" not in found["debconf"] and _props(found["debconf"])["hash"] == sbom.DEB_HASH_NOTE
    sbom.validate_sbom(doc)


def test_lock_mismatches_compare_and_name_packages_by_their_normalised_name():
    """`Foo_Bar` locked and `foo-bar` installed are one package: its installed version is named (was: "nothing
    installed"), by the normalised name."""
    assert contents.lock_mismatches({"Foo_Bar": "1"}, {"foo-bar": "2"}) == ["foo-bar: locked 1, image has 2"]
    assert contents.lock_mismatches({"Foo_Bar": "1"}, {"foo.bar": "1"}) == []
    assert contents.lock_mismatches({"Foo_Bar": "1"}, {}) == ["foo-bar: locked 1, image has nothing installed"]


@pytest.mark.parametrize(("declared", "licenses", "note"), [
    ("mit or apache-2.0", [{"expression": "MIT OR Apache-2.0"}], None),
    ("LicenseRef-Proprietary", [{"expression": "LicenseRef-Proprietary"}], None),
    ("Apache 2.0", [{"license": {"name": "Apache 2.0"}}], "not SPDX: "),
    ("MIT OR", [{"license": {"name": "MIT OR"}}], "not SPDX: "),
])
def test_a_license_expression_that_is_not_spdx_is_given_as_a_name_not_as_an_spdx_expression(declared, licenses, note):
    """A Python License-Expression goes in as an SPDX expression only when it is one (SPDX's canonical spelling);
    `Apache 2.0` was written as {"expression": "Apache 2.0"}, which scanners read as SPDX."""
    probe = sbom_probe.probe()
    probe["python_details"]["sympy"]["license_expression"] = declared
    doc = _doc(probe)
    sbom.validate_sbom(doc)
    sympy = _by_name(doc)["sympy"]
    assert sympy["licenses"] == licenses
    assert (_props(sympy).get("license") or "").startswith(note) if note else "license" not in _props(sympy)


@pytest.mark.parametrize(("shape", "problem"), [
    ({"components": [1]}, "components is not a list of objects with a text purl"),
    ({"components": "pkg:pypi/a@1"}, "components is not a list of objects with a text purl"),
    ({"metadata": {"component": {"version": DIGEST, "properties": [1]}}},
     "metadata.component.properties is not a list of objects with a text name and value"),
    ({"metadata": {"component": {"version": DIGEST, "properties": {"a": 1}}}},
     "metadata.component.properties is not a list of objects with a text name and value"),
])
def test_a_stored_sbom_of_another_shape_is_refused_naming_the_part(monkeypatch, shape, problem):
    """The plain SBOM artifact is anyone's who may push (release notes and `buildtool diff` read it): components or
    properties of another type were an AttributeError traceback in sbom.contents; now load_sbom refuses it
    (RegistryError, which release notes turn into "could not be read"), and a signed one is rejected, naming it."""
    from buildtool.attest import referrers
    from buildtool.registry.client import RegistryError
    from buildtool.sbom import signing

    document = {"bomFormat": "CycloneDX", "specVersion": "1.6", "metadata": {"component": {"version": DIGEST}},
                **shape}
    referrer = referrers.Referrer(digest="sha256:" + "a" * 64, artifact_type=sbom.SBOM_TYPE, size=1)
    monkeypatch.setattr(referrers, "referrers", lambda client, repo, digest, kind: [referrer])
    monkeypatch.setattr(referrers, "fetch", lambda client, repo, ref, digest: [
        referrers.Payload(sbom.SBOM_TYPE, json.dumps(document).encode())])
    with pytest.raises(RegistryError, match=re.escape(f"SBOM {referrer.digest} of r/a@{DIGEST} is malformed: "
                                                      f"{problem}")):
        sbom.load_sbom(None, "r/a", DIGEST)  # type: ignore[arg-type]
    assert signing._cyclonedx(document, DIGEST) == f"malformed: the predicate's {problem}"


@pytest.mark.parametrize("licenses", ["GPL-2+", [""], ["GPL-2+", 3], {"GPL-2+": 1}])
def test_debian_licenses_of_another_shape_are_a_probe_error_naming_the_package(licenses):
    """A deb_packages row's licenses that are not None or a list of names: a ProbeError naming the package (a text
    became one license per letter, G, P, L...; an empty name was a cyclonedx exception, a number an AttributeError)."""
    from buildtool.sbom.components import ProbeError

    probe = sbom_probe.probe()
    next(r for r in probe["deb_packages"] if r["Package"] == "dpkg")["licenses"] = licenses
    with pytest.raises(ProbeError, match=re.escape(f"Debian package dpkg: the probe gave licenses {licenses!r}, "
                                                   "not a list of license names")):
        _doc(probe)


def test_a_stored_sbom_that_repeats_a_key_is_refused(monkeypatch):
    """A plain SBOM `{"components": [<other packages>], ..., "components": [<the signed ones>]}` read here as the
    signed document (Python keeps the last key), so release and verify found it unchanged, while a reader that keeps
    the first key showed other packages; now load_sbom refuses it, naming the key."""
    from buildtool.attest import referrers
    from buildtool.registry.client import RegistryError

    signed = json.dumps(_doc())
    data = ('{"components": [{"type": "library", "name": "openssl", "purl": "pkg:deb/debian/openssl@9.9"}], '
            + signed[1:]).encode()
    assert json.loads(data) == _doc()
    referrer = referrers.Referrer(digest="sha256:" + "a" * 64, artifact_type=sbom.SBOM_TYPE, size=1)
    monkeypatch.setattr(referrers, "referrers", lambda client, repo, digest, kind: [referrer])
    monkeypatch.setattr(referrers, "fetch", lambda client, repo, ref, digest: [referrers.Payload(sbom.SBOM_TYPE, data)])
    with pytest.raises(RegistryError, match=re.escape(f"SBOM {referrer.digest} of r/a@{DIGEST} repeats the key "
                                                      "'components' in one JSON object")):
        sbom.load_sbom(None, "r/a", DIGEST)  # type: ignore[arg-type]
    monkeypatch.setattr(referrers, "fetch", lambda client, repo, ref, digest: [
        referrers.Payload(sbom.SBOM_TYPE, signed.encode())])
    assert sbom.load_sbom(None, "r/a", DIGEST) == (_doc(), referrer.digest)  # type: ignore[arg-type]


def test_a_wheel_built_from_the_locks_sdist_is_not_given_the_hash_of_the_locks_one_wheel():
    """An entry with one wheel and its sdist (pillow: one manylinux_2_27 wheel): where the wheel does not fit the base,
    uv builds the sdist, and the image holds a wheel no index served. The SBOM gave that package the one wheel's
    sha256 anyway (a file the image never installed, as a fact); now it has the hash only when the installed tags
    are the wheel's, and otherwise says why it has none."""
    from buildtool.contracts.locks import FRAMEWORK_LOCK, TOOLS_LOCK, installed_files, parse_lock

    wheel, sdist = "9" * 64, "8" * 64
    text = sbom_probe.TOOLS_LOCK.replace(
        'name = "werkzeug"\nversion = "3.1.9"\n',
        f'name = "werkzeug"\nversion = "3.1.9"\nsdist = {{ url = "https://files.example/werkzeug-3.1.9.tar.gz", '
        f'hashes = {{ sha256 = "{sdist}" }} }}\n').replace("2" * 64, wheel)
    locks = {FRAMEWORK_LOCK: sbom_probe.LOCKS[FRAMEWORK_LOCK], TOOLS_LOCK: parse_lock(text)}
    assert locks[TOOLS_LOCK].entries["werkzeug"].sdist is not None

    def werkzeug(tags: list[str]) -> dict:
        probe = sbom_probe.probe()
        probe["python_details"]["werkzeug"]["wheel_tags"] = tags
        identified = installed_files(probe["python_details"], locks)
        return _by_name(_doc(probe, locks, identified))["werkzeug"]

    built = werkzeug(["cp311-cp311-linux_x86_64"])
    assert "hashes" not in built
    assert _props(built)["hash"] == ("not recorded: pylock.tools.toml admits one wheel and the sdist, and the "
                                     "installed wheel's tags are not the wheel's (uv built it from the sdist)")
    assert werkzeug(["py3-none-any"])["hashes"] == [{"alg": "SHA-256", "content": wheel}]


def test_held_packages_are_installed_packages_of_the_probe(tmp_path: Path):
    """dpkg's status of an installed package on hold (apt-mark hold, as CUDA images hold libcudnn) is `hi `,
    and the probe kept only `ii` rows: held packages were left out of the SBOM and the image's package list."""
    fake = tmp_path / "dpkg-query"
    fake.write_text("#!/bin/sh\ncase \"$3\" in\n"
                    "*source:Package*) printf 'hi \\tlibcudnn9\\t9.1-1\\tamd64\\tcudnn\\t9.1-1\\t\\t\\t\\n"
                    "rc \\told\\t1\\tamd64\\told\\t1\\t\\t\\t\\n' ;;\n"
                    "*) printf 'hi \\tlibcudnn9\\t9.1-1\\nrc \\told\\t1\\n' ;;\nesac\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    run = subprocess.run([sys.executable, str(ROOT / contents.PROBE)], capture_output=True, text=True, timeout=60,
                         env=env)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert found["apt_packages"] == {"libcudnn9": "9.1-1"}
    assert [d["Package"] for d in found["deb_packages"]] == ["libcudnn9"]


@pytest.mark.parametrize(("field", "value"), [("Version", 5), ("Depends", ["libc6"]), ("Provides", ["x"]),
                                              ("Architecture", {"a": 1}), ("Pre-Depends", 3)])
def test_debian_fields_of_another_type_are_a_probe_error_naming_the_package_and_field(field, value):
    """A deb_packages row whose field is not text: a ProbeError naming the package and the field (was a TypeError,
    ValueError or AttributeError traceback, and a list of Provides was read as its repr)."""
    from buildtool.sbom.components import ProbeError

    probe = sbom_probe.probe()
    next(r for r in probe["deb_packages"] if r["Package"] == "dpkg")[field] = value
    with pytest.raises(ProbeError, match=re.escape(f"Debian package dpkg: the probe gave {field} {value!r}, not "
                                                   "text")):
        _doc(probe)


@pytest.mark.parametrize(("key", "value", "cause"), [
    ("os_release", ["debian"], "the image's /etc/os-release names no ID and VERSION_ID (['debian'])"),
    ("os_release", {"ID": 5, "VERSION_ID": "12"}, "the image's /etc/os-release names no ID and VERSION_ID"),
    ("marker_environment", ["linux"], "the probe's output has no marker_environment"),
])
def test_os_release_and_marker_environment_of_another_shape_are_a_probe_error(key, value, cause):
    """An os_release or marker_environment that is not an object of texts: a ProbeError naming it (was an
    AttributeError, a TypeError or packageurl's ValueError traceback)."""
    from buildtool.sbom.components import ProbeError

    probe = sbom_probe.probe()
    probe[key] = value
    with pytest.raises(ProbeError, match=re.escape(cause)):
        _doc(probe)


def test_license_classifiers_with_one_level_are_kept_and_categories_left_out(tmp_path: Path, monkeypatch):
    """Trove's `License :: Other/Proprietary License`, `License :: Public Domain` and `License :: Freeware` name a
    license with one `::`: the probe kept only classifiers with two, so such a package's SBOM declared none."""
    spec = importlib.util.spec_from_file_location("packages_probe", ROOT / contents.PROBE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    info = tmp_path / "x-1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: x\nVersion: 1\n"
                                   "Classifier: License :: Other/Proprietary License\n"
                                   "Classifier: License :: Public Domain\nClassifier: License :: OSI Approved\n"
                                   "Classifier: License :: OSI Approved :: MIT License\n"
                                   "Classifier: License :: DFSG approved\nClassifier: Topic :: Utilities\n")
    monkeypatch.setattr(module.md, "distributions", lambda: [module.md.PathDistribution(info)])
    assert module.python_details()["x"]["license_classifiers"] == ["MIT License", "Other/Proprietary License",
                                                                   "Public Domain"]


def test_a_copyright_path_that_is_no_regular_file_or_is_huge_gives_no_licenses(tmp_path: Path):
    """An image's /usr/share/doc/<package>/copyright that is a FIFO (or a link to /dev/zero) blocked the probe
    (or read until memory ran out), and a huge one was read whole: now each is read as no DEP-5 file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge"
    huge.write_text("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\nLicense: MIT\n"
                    + " x\n" * (6 << 20))
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('p', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "print(m.dep5_licenses(sys.argv[2]), m.dep5_licenses(sys.argv[3]), m.dep5_licenses('/dev/zero'))")
    run = subprocess.run([sys.executable, "-c", code, str(ROOT / contents.PROBE), str(fifo), str(huge)],
                         capture_output=True, text=True, timeout=30)
    assert run.stdout.split() == ["None", "None", "None"], run.stderr


def test_a_files_paragraph_without_a_license_name_makes_the_copyright_file_not_machine_readable(tmp_path: Path):
    """DEP-5 requires a License short name in every Files paragraph: one without (no field, or the name left to a
    continuation line) was skipped, so the package was said to be under the other paragraphs' licenses alone."""
    spec = importlib.util.spec_from_file_location("packages_probe", ROOT / contents.PROBE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    head = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\nFiles: *\nLicense: MIT\n\n"
    for last in ("Files: lib/*\nCopyright: 2021 B\n", "Files: lib/*\nLicense:\n GPL-2+\n"):
        (tmp_path / "copyright").write_text(head + last)
        assert module.dep5_licenses(str(tmp_path / "copyright")) is None


@pytest.mark.parametrize("name", ["libc6:amd64", "a b", "x\n", ""])
def test_a_python_distribution_name_that_is_no_normalised_name_is_a_probe_error(name):
    """python_details' names were taken as they came: `libc6:amd64` (a METADATA Name the probe keeps) is a Debian
    component's key, so that distribution was silently replaced by libc6 and left out of the SBOM."""
    from buildtool.sbom.components import ProbeError

    probe = sbom_probe.probe()
    probe["python_details"][name] = sbom_probe.PYTHON["sympy"]
    probe["python_packages"][name] = sbom_probe.PYTHON["sympy"]["version"]
    with pytest.raises(ProbeError, match=re.escape(f"Python distribution {name!r}: not a normalised (PEP 503) "
                                                   "distribution name")):
        _doc(probe)


def test_a_marker_that_cannot_be_compared_is_a_probe_error_naming_the_requirement():
    """A Requires-Dist marker packaging cannot compare (`os_name ~= 'posix'`) raised packaging's UndefinedComparison
    as a traceback; an InvalidMarker or UndefinedEnvironmentName was already a ProbeError."""
    from buildtool.sbom.components import ProbeError

    probe = sbom_probe.probe()
    probe["python_details"]["sympy"]["requires_dist"] = ["mpmath; os_name ~= 'posix'"]
    with pytest.raises(ProbeError, match=re.escape("sympy: marker of 'mpmath; os_name ~= \"posix\"' cannot be "
                                                   "evaluated: Undefined")):
        _doc(probe)


def test_a_marker_environment_value_that_is_not_text_is_named_as_such():
    """A marker_environment value of another type (python_version: 3) was blamed on the first marker that read it
    (`marker of 'mpmath; ...' cannot be evaluated`), not on the probe's environment."""
    from buildtool.sbom.components import ProbeError

    probe = sbom_probe.probe()
    probe["marker_environment"]["python_version"] = 3
    with pytest.raises(ProbeError, match=re.escape("the probe's marker_environment gives python_version 3, not text")):
        _doc(probe)


def test_python_details_or_packages_that_are_not_objects_are_a_probe_error():
    """python_details and python_packages given as the same list passed the name comparison and then failed with an
    AttributeError traceback (list has no items)."""
    from buildtool.sbom.components import ProbeError

    probe = sbom_probe.probe()
    probe["python_details"] = probe["python_packages"] = ["sympy"]
    with pytest.raises(ProbeError, match=re.escape("the probe's python_details and python_packages are not both "
                                                   "objects (name -> metadata, name -> version)")):
        _doc(probe)


def _cdx(*purls: str) -> dict:
    return {"metadata": {"component": {"properties": []}}, "components": [{"purl": p} for p in purls]}


def test_multi_arch_debian_packages_are_kept_apart_in_contents_and_diff():
    """contents keyed Debian packages by name only: libc6:amd64 and libc6:i386 collapsed into one (the last read),
    so an i386 libc6 update read as no change or as the amd64 one's."""
    before = sbom.contents(_cdx("pkg:deb/debian/libc6@2.36-9?arch=amd64", "pkg:deb/debian/libc6@2.36-9?arch=i386",
                                "pkg:deb/debian/bash@5.2?arch=amd64"))
    after = sbom.contents(_cdx("pkg:deb/debian/libc6@2.36-9?arch=amd64", "pkg:deb/debian/libc6@2.36-10?arch=i386",
                               "pkg:deb/debian/bash@5.2?arch=amd64"))
    assert before.apt == {"bash": "5.2", "libc6:amd64": "2.36-9", "libc6:i386": "2.36-9"}
    assert [c.line() for c in sbom.diff(before, after)] == ["libc6:i386 (apt): 2.36-9 -> 2.36-10"]


def test_python_names_of_other_tools_sboms_are_compared_by_their_pep_503_name():
    """contents took a pypi purl's name as written: another tool's `Typing_Extensions` and ours `typing-extensions`
    read as one package removed and another added, not as one package at two versions."""
    before = sbom.contents(_cdx("pkg:pypi/Typing_Extensions@4.15.0", "pkg:pypi/zope.interface@7.0"))
    after = sbom.contents(_cdx("pkg:pypi/typing-extensions@4.16.0", "pkg:pypi/zope-interface@7.0"))
    assert before.python == {"typing-extensions": "4.15.0", "zope-interface": "7.0"}
    assert [c.line() for c in sbom.diff(before, after)] == ["typing-extensions (python): 4.15.0 -> 4.16.0"]


def test_a_dist_info_without_a_name_is_reported_not_skipped(tmp_path: Path, monkeypatch):
    """A dist-info whose METADATA had no Name was left out of the probe's lists without a word, so the SBOM listed
    the image without that installed distribution; the probe now lists its folder and the SBOM step refuses it."""
    from buildtool.sbom.components import ProbeError

    spec = importlib.util.spec_from_file_location("packages_probe", ROOT / contents.PROBE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    named, unnamed = tmp_path / "x-1.dist-info", tmp_path / "y-2.dist-info"
    for info, text in ((named, "Metadata-Version: 2.1\nName: x\nVersion: 1\n"), (unnamed, "Metadata-Version: 2.1\n"
                                                                                 "Version: 2\n")):
        info.mkdir()
        (info / "METADATA").write_text(text)
    monkeypatch.setattr(module.md, "distributions", lambda: [module.md.PathDistribution(p) for p in (named, unnamed)])
    assert module.python_unnamed() == [str(unnamed)]
    assert list(module.python_details()) == ["x"]
    probe = sbom_probe.probe()
    probe["python_unnamed"] = [str(unnamed)]
    with pytest.raises(ProbeError, match=re.escape(f"Python distribution metadata {str(unnamed)!r} has no Name")):
        _doc(probe)
    del probe["python_unnamed"]
    with pytest.raises(ProbeError, match="the probe's output has no python_unnamed"):
        _doc(probe)


def test_a_component_whose_purl_does_not_parse_is_named_not_left_out_of_the_contents():
    """contents passed over a component whose purl did not parse (`pkg:pypi/@1`), so `buildtool diff` and the
    release notes showed the image without that package; shape_problem now names it, so its readers refuse it."""
    document = _cdx("pkg:pypi/torch@2.13.0", "pkg:pypi/@1")
    assert sbom.shape_problem(document) == "components[1].purl 'pkg:pypi/@1' is not a package URL"
    assert sbom.shape_problem(_cdx("pkg:pypi/torch@2.13.0", "")) == ""   # no purl: a component of another kind


def test_a_debian_purl_without_arch_is_keyed_by_its_name():
    """Another tool's Debian purl without an `arch` qualifier beside one with it was keyed `libc6:` (an empty
    architecture) and `libc6:amd64`, two packages of one; a purl without arch now counts no architecture: its key is
    the name, one package with the arch'd one at the same version, apart from a multi-arch pair."""
    found = sbom.contents(_cdx("pkg:deb/debian/libc6@2.36-9", "pkg:deb/debian/libc6@2.36-9?arch=amd64",
                               "pkg:deb/debian/zlib1g@1.2", "pkg:deb/debian/bash@5.2?arch=amd64",
                               "pkg:deb/debian/libgcc-s1@12?arch=amd64", "pkg:deb/debian/libgcc-s1@12?arch=i386",
                               "pkg:deb/debian/libgcc-s1@12"))
    assert found.apt == {"bash": "5.2", "libc6": "2.36-9", "libgcc-s1": "12", "libgcc-s1:amd64": "12",
                         "libgcc-s1:i386": "12", "zlib1g": "1.2"}


@pytest.mark.parametrize(("purls", "problem"), [
    (("pkg:pypi/torch@2.13.0", "pkg:pypi/NumPy@2.0.1", "pkg:pypi/numpy@1.26.4"),
     "components[1].purl 'pkg:pypi/NumPy@2.0.1' and components[2].purl 'pkg:pypi/numpy@1.26.4' are one package "
     "(python numpy) at two versions; a listing holds one version of each"),
    (("pkg:deb/debian/libc6@2.36-10?arch=amd64", "pkg:deb/debian/libc6@2.36-9"),
     "components[0].purl 'pkg:deb/debian/libc6@2.36-10?arch=amd64' and components[1].purl "
     "'pkg:deb/debian/libc6@2.36-9' are one package (apt libc6) at two versions; a listing holds one version of each"),
])
def test_one_package_at_two_versions_is_named_not_one_kept(purls: tuple[str, ...], problem: str):
    """Two components of one package (one PEP 503 Python name; one Debian name and architecture) at two versions
    kept the last read, silently, so a diff or release notes showed one of them; shape_problem now names both, so
    their readers refuse the document. One listed twice at one version is one package."""
    assert sbom.shape_problem(_cdx(*purls)) == problem
    assert sbom.shape_problem(_cdx("pkg:pypi/NumPy@2.0.1", "pkg:pypi/numpy@2.0.1")) == ""
    assert sbom.contents(_cdx("pkg:pypi/NumPy@2.0.1", "pkg:pypi/numpy@2.0.1")).python == {"numpy": "2.0.1"}


@pytest.mark.parametrize("version", [f"{DIGEST}\nresult: passed", "sha256:" + "b" * 5000, {"digest": DIGEST}])
def test_a_stored_sbom_describing_another_image_is_named_in_one_bounded_line(monkeypatch, version):
    """The plain SBOM artifact is anyone's who may push: the version it describes went into the refusal as written,
    so a newline in it forged a line of the log below it and 5,000 characters made the message 5,000 longer; now it
    is shown as a bounded repr, on one line."""
    from buildtool.attest import referrers
    from buildtool.registry.client import RegistryError

    document = {"bomFormat": "CycloneDX", "specVersion": "1.6", "metadata": {"component": {"version": version}}}
    referrer = referrers.Referrer(digest="sha256:" + "a" * 64, artifact_type=sbom.SBOM_TYPE, size=1)
    monkeypatch.setattr(referrers, "referrers", lambda client, repo, digest, kind: [referrer])
    monkeypatch.setattr(referrers, "fetch", lambda client, repo, ref, digest: [
        referrers.Payload(sbom.SBOM_TYPE, json.dumps(document).encode())])
    with pytest.raises(RegistryError) as refused:
        sbom.load_sbom(None, "r/a", DIGEST)  # type: ignore[arg-type]
    assert str(refused.value) == f"SBOM {referrer.digest} describes {repr(version)[:100]}, not {DIGEST}"
